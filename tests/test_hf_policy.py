"""HFPolicy on the real SmolLM2: batching, prefix KV reuse, log-probs, stop strings, limits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from treegym.agents.chat import chat_observation_ids, chat_prompt_ids, text_ids
from treegym.agents.hf_policy import HFPolicy
from treegym.agents.kv_cache import PrefixCache, branch_prefixes, common_prefix_length
from treegym.agents.policy import Policy, SamplingParams
from treegym.agents.sampling import find_stop, sample_tokens, top_p_filter
from treegym.errors import ConfigError

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6, stop=())

pytest_plugins = ["model_fixtures"]  # the session-scoped `smollm2` fixture


@pytest.fixture(scope="module")
def tree_contexts(smollm2):
    """A small tree: one chat prompt, three branches with different first turns, plus a raw text."""
    _, tok = smollm2
    root = chat_prompt_ids(tok, [{"role": "user", "content": "Name a large city in France."}])
    branches = [root + text_ids(tok, t) for t in ("<think>", "<search>", "I think")]
    return [root, *branches, text_ids(tok, "The quick brown fox")]


@pytest.fixture(scope="module")
def runs(smollm2, tree_contexts):
    """Greedy turn 1 and turn 2 over the tree, with and without prefix reuse."""
    model, tok = smollm2
    out = {}
    for reuse in (False, True):
        policy = HFPolicy(model, tok, reuse_prefix=reuse)
        first = policy.generate(tree_contexts, GREEDY)
        obs = chat_observation_ids(tok, "<information>Paris</information>", assistant_closed=False)
        second_ctx = [c + list(g.token_ids) + obs for c, g in zip(tree_contexts, first)]
        before = policy.stats.prefill_tokens
        second = policy.generate(second_ctx, GREEDY)
        out[reuse] = dict(
            policy=policy, first=first, second=second, second_ctx=second_ctx,
            second_prefill=policy.stats.prefill_tokens - before,
        )
    return out


def test_hf_policy_satisfies_the_policy_protocol(smollm2):
    assert isinstance(HFPolicy(*smollm2), Policy)


def test_converted_smollm2_keeps_its_chat_template(smollm2):
    _, tok = smollm2
    text = tok.decode(chat_prompt_ids(tok, [{"role": "user", "content": "hi"}]))
    assert "<|im_start|>user\nhi<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")


def test_batch_of_unequal_contexts_equals_one_at_a_time_greedy(smollm2, tree_contexts, runs):
    policy = HFPolicy(*smollm2, reuse_prefix=False)
    for ctx, batched in zip(tree_contexts[-2:], runs[False]["first"][-2:]):
        alone = policy.generate([ctx], GREEDY)[0]
        assert alone.token_ids == batched.token_ids
        np.testing.assert_allclose(alone.logprobs, batched.logprobs, atol=1e-4)


def test_prefix_reuse_generates_the_same_greedy_tokens_as_full_prefill(runs):
    for key in ("first", "second"):
        assert [g.token_ids for g in runs[True][key]] == [g.token_ids for g in runs[False][key]]


def test_prefix_reuse_prefills_shared_prefix_once_and_reuses_previous_turns(runs, tree_contexts):
    with_reuse, without = runs[True], runs[False]
    assert without["policy"].stats.reused_tokens == 0
    assert with_reuse["policy"].stats.reused_tokens > 0
    # Turn 1: the chat prompt is shared by 4 contexts and should be computed about once.
    root = len(tree_contexts[0])
    assert without["policy"].stats.prefill_tokens - without["second_prefill"] >= 4 * root
    assert with_reuse["policy"].stats.prefill_tokens - with_reuse["second_prefill"] < 2 * root
    # Turn 2: only the last sampled token and the observation are new per branch.
    new_tokens = sum(len(c) - len(p) - len(g.token_ids) + 1 for c, p, g in zip(
        with_reuse["second_ctx"], tree_contexts, with_reuse["first"]))
    assert with_reuse["second_prefill"] == new_tokens


def test_logprobs_with_reuse_match_a_fresh_full_forward_pass(smollm2, runs):
    model, _ = smollm2
    for ctx, gen in zip(runs[True]["second_ctx"][:3], runs[True]["second"][:3]):
        with torch.no_grad():
            logits = model(torch.tensor([ctx + list(gen.token_ids)])).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1)
        expected = [logp[len(ctx) - 1 + j, t].item() for j, t in enumerate(gen.token_ids)]
        np.testing.assert_allclose(gen.logprobs, expected, atol=1e-4)


def test_stop_string_ends_the_turn_and_cuts_the_text_after_it(smollm2, tree_contexts, runs):
    full = runs[False]["first"][-1].text  # greedy continuation of the raw text
    stop = full[2:5]
    gen = HFPolicy(*smollm2).generate([tree_contexts[-1]], SamplingParams(0.0, max_new_tokens=6, stop=(stop,)))[0]
    assert gen.finish_reason == "stop"
    assert gen.text.endswith(stop) and full.startswith(gen.text)
    assert len(gen.token_ids) == len(gen.logprobs) < 6


def test_max_new_tokens_ends_with_length(runs):
    gen = runs[False]["first"][-1]
    assert gen.finish_reason == "length" and len(gen.token_ids) == GREEDY.max_new_tokens


def test_seeded_sampling_is_reproducible(smollm2, tree_contexts):
    params = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=4, stop=(), seed=7)
    policy = HFPolicy(*smollm2)
    a = policy.generate(tree_contexts[-1:] * 2, params)
    b = policy.generate(tree_contexts[-1:] * 2, params)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert all(lp <= 0 for g in a for lp in g.logprobs)


def test_empty_context_is_a_config_error(smollm2):
    with pytest.raises(ConfigError, match="at least one token"):
        HFPolicy(*smollm2).generate([[]], GREEDY)


def test_context_longer_than_the_model_positions_is_a_config_error(smollm2):
    with pytest.raises(ConfigError, match="positions"):
        HFPolicy(*smollm2).generate([[1] * 9000], GREEDY)


def test_top_p_keeps_the_smallest_set_reaching_p():
    logp = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(top_p_filter(logp, 0.8))[0].tolist()
    assert kept == [True, True, False, False]
    assert torch.isfinite(top_p_filter(logp, 0.1))[0].tolist() == [True, False, False, False]


def test_greedy_logprob_is_the_untempered_log_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    token, lp = sample_tokens(logits, 0.0, 1.0, None)
    assert token.item() == 0
    assert lp.item() == pytest.approx(torch.log_softmax(logits, -1)[0, 0].item())


def test_find_stop_returns_the_end_of_the_earliest_stop():
    assert find_stop("<search>q</search> more</answer>", ("</answer>", "</search>")) == len("<search>q</search>")
    assert find_stop("no stop here", ("</answer>",)) == -1


def test_branch_prefixes_finds_every_branch_point():
    contexts = [[1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2, 3, 9, 9], [7, 7]]
    assert branch_prefixes(contexts, min_length=2) == [(1, 2, 3), (1, 2, 3, 4)]
    assert branch_prefixes([[1, 2, 3], [1, 2, 3]], min_length=1) == [(1, 2)]


def test_prefix_cache_serves_the_longest_common_prefix_and_drops_covered_entries():
    cache = PrefixCache()
    kv = lambda n: [(torch.arange(n, dtype=torch.float)[None, :, None], torch.zeros(1, n, 1))]  # noqa: E731
    cache.insert([1, 2, 3], kv(3))
    cache.insert([1, 2, 3, 4, 5], kv(5))
    assert len(cache) == 1
    n, got = cache.lookup([1, 2, 3, 4, 9])
    assert n == 4 and got[0][0].shape[1] == 4
    assert cache.lookup([1, 2, 3, 4, 5], max_length=2)[0] == 2
    assert common_prefix_length(np.array([1, 2]), np.array([3])) == 0


def test_prefix_cache_evicts_least_recently_used_past_its_budget():
    one = 4 * 10 * 2  # bytes of one 10-token entry (float32 keys and values)
    cache = PrefixCache(max_bytes=2 * one)
    kv = [(torch.zeros(1, 10, 1), torch.zeros(1, 10, 1))]
    for first in (1, 2, 3):
        cache.insert([first] * 10, kv)
    assert len(cache) == 2 and cache.lookup([1] * 10)[0] == 0 and cache.lookup([3] * 10)[0] == 10


def test_stored_prefixes_are_dropped_when_the_weights_change(smollm2, tree_contexts):
    model, tok = smollm2
    policy = HFPolicy(model, tok)
    params = SamplingParams(temperature=0.0, max_new_tokens=1, stop=())
    policy.generate(tree_contexts[-1:], params)
    policy.generate(tree_contexts[-1:], params)
    reused = policy.stats.reused_tokens
    assert reused > 0
    with torch.no_grad():
        next(model.parameters()).mul_(1.0)  # an in-place update, as an optimizer step makes
    policy.generate(tree_contexts[-1:], params)
    assert policy.stats.reused_tokens == reused


def test_chat_observation_closes_the_turn_and_opens_the_next_assistant_turn(smollm2):
    _, tok = smollm2
    obs = "<information>Paris</information>"
    cut = tok.decode(chat_observation_ids(tok, obs, assistant_closed=False))
    closed = tok.decode(chat_observation_ids(tok, obs, assistant_closed=True))
    assert cut == "<|im_end|>\n<|im_start|>user\n" + obs + "<|im_end|>\n<|im_start|>assistant\n"
    assert closed == cut[len("<|im_end|>") :]
    assert tok.decode(text_ids(tok, obs)) == obs  # raw mode: inlined as is


def test_a_call_keeps_every_rows_kv_for_its_next_turn_past_a_small_budget(smollm2, tree_contexts):
    """With a budget far below one call's rows, the store grows to hold each row's context, so
    the next turn of every row prefills only its new tokens (not the whole context again)."""
    from treegym.agents.kv_cache import kv_bytes_per_token

    model, tok = smollm2
    policy = HFPolicy(model, tok, cache_bytes=1 << 10)
    params = SamplingParams(temperature=0.0, max_new_tokens=2, stop=())
    rows = [list(c) for c in tree_contexts[:3]]
    first = policy.generate(rows, params)
    per_token = kv_bytes_per_token(model.config, next(model.parameters()).element_size())
    assert per_token > 0 and policy.prefix_cache.max_bytes >= per_token * sum(len(r) for r in rows)
    before = policy.stats.prefill_tokens
    nxt = [r + list(g.token_ids) + [tok.eos_token_id] for r, g in zip(rows, first)]
    policy.generate(nxt, params)
    # Each row ran only what the previous turn had not fed: its last sampled token and the new one.
    assert policy.stats.prefill_tokens - before <= 2 * len(rows)


def test_the_store_grows_no_further_than_its_cap(smollm2, tree_contexts):
    model, tok = smollm2
    policy = HFPolicy(model, tok, cache_bytes=1 << 10, max_cache_bytes=1 << 12)
    policy.generate([list(tree_contexts[0])], SamplingParams(temperature=0.0, max_new_tokens=1, stop=()))
    assert policy.prefix_cache.max_bytes == 1 << 12


def test_the_packed_head_and_the_reserved_cache_decode_what_the_plain_model_does(smollm2, tree_contexts):
    """oneDNN's reordered LM head and the in-place KV cache change float rounding, not the tokens:
    the same greedy turns, log-probs to 1e-4 (as a batch against one row), over two turns with prefix reuse (reserved room is
    outgrown too: max_new_tokens 1 reserves 1 token, the second turn's suffix is longer)."""
    model, tok = smollm2
    outs = {}
    for fast in (False, True):
        policy = HFPolicy(model, tok, packed_head=fast)
        first = policy.generate(tree_contexts, GREEDY)
        second_ctx = [c + list(g.token_ids) + text_ids(tok, " and then") for c, g in zip(tree_contexts, first)]
        second = policy.generate(second_ctx, GREEDY)
        outs[fast] = (first + second, policy._head is not None)
    assert outs[True][1] and not outs[False][1]  # the packed head ran on this CPU, and only when asked
    for plain, fast in zip(outs[False][0], outs[True][0]):
        assert plain.token_ids == fast.token_ids
        np.testing.assert_allclose(plain.logprobs, fast.logprobs, atol=1e-4)


def test_the_packed_head_is_rebuilt_after_the_weights_change(smollm2, tree_contexts):
    model, tok = smollm2
    policy = HFPolicy(model, tok)
    params = SamplingParams(temperature=0.0, max_new_tokens=1, stop=())
    before = policy.generate(tree_contexts[-1:], params)[0]
    head = policy._head
    weight = model.get_output_embeddings().weight
    try:
        with torch.no_grad():
            weight.mul_(2.0)
        after = policy.generate(tree_contexts[-1:], params)[0]
        assert policy._head is not head  # a new reordered copy, from the new weights
        with torch.no_grad():
            logits = model(torch.tensor([tree_contexts[-1]])).logits[0, -1].float()
        assert after.logprobs[0] == pytest.approx(torch.log_softmax(logits, -1)[after.token_ids[0]].item(), abs=1e-4)
        assert after.logprobs[0] != pytest.approx(before.logprobs[0], abs=1e-3)
    finally:
        with torch.no_grad():
            weight.div_(2.0)


def test_draw_follows_the_distribution_and_never_draws_a_zero():
    from treegym.agents.sampling import draw

    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0]]).repeat(20_000, 1)
    tokens = draw(probs, torch.Generator().manual_seed(0))
    counts = torch.bincount(tokens, minlength=6).double() / len(tokens)
    assert counts[[0, 2, 5]].sum() == 0
    torch.testing.assert_close(counts, probs[0].double(), atol=0.015, rtol=0)
    again = draw(probs[:50], torch.Generator().manual_seed(0))
    assert torch.equal(again, tokens[:50])  # one generator stream: reproducible
    edge = torch.tensor([[0.0, 1.0, 0.0]])  # all the mass on one token, zeros around it
    assert draw(edge.repeat(100, 1), torch.Generator().manual_seed(1)).eq(1).all()
