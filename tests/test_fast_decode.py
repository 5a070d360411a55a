"""FastDecoder: the fused CPU decoder computes the model's own forward (fp32, to float rounding), in
HFPolicy's batched, prefix-reusing sampler too; in bf16 it stays close and records its own log-probs;
it refuses the models it does not know; it follows the weights (and LoRA adapters) as they change."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from treegym.agents.chat import chat_prompt_ids, text_ids
from treegym.agents.fast_decode import FastDecoder
from treegym.agents.hf_policy import HFPolicy
from treegym.agents.policy import SamplingParams

pytest_plugins = ["model_fixtures"]  # the session-scoped `smollm2` fixture

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8, stop=())


def _tiny(kind: str, seed: int = 0):
    """A random 2-layer model of ``kind`` with grouped-query attention (qwen2 adds q/k/v biases)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    shape = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256)  # fmt: skip
    if kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**shape, use_sliding_window=False))
        for layer in model.model.layers:  # Qwen2 initialises its biases to 0: make them matter
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                torch.nn.init.normal_(proj.bias, std=0.5)
    else:
        model = LlamaForCausalLM(LlamaConfig(**shape))
    return model.eval()


def _mask(key_valid: torch.Tensor, past_len: int, width: int) -> torch.Tensor:
    cols = torch.arange(past_len + width)
    causal = cols[None, :] <= (past_len + torch.arange(width))[:, None]
    return (causal[None] & key_valid[:, None, :])[:, None]


def _fast_logits(decoder: FastDecoder, model, rows: list[list[int]], steps: list[int]) -> list[torch.Tensor]:
    """Left-padded prefill of ``rows``, then one decode step per entry of ``steps`` (the same token
    for every row), through ``decoder``; the last position's logits after each forward."""
    from transformers import DynamicCache

    width = max(map(len, rows))
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    positions = torch.zeros_like(ids)
    valid = torch.zeros_like(ids, dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row)
        positions[i, width - len(row) :] = torch.arange(len(row))
        valid[i, width - len(row) :] = True
    mask = _mask(valid, 0, width)
    mask[:, 0, torch.arange(width), torch.arange(width)] = True  # padding attends to itself (never read)
    cache = DynamicCache(config=model.config)
    out = [decoder(ids, positions, mask, cache)]
    lengths = torch.tensor([len(r) for r in rows])
    for step, token in enumerate(steps):
        valid = torch.cat([valid, torch.ones((len(rows), 1), dtype=torch.bool)], dim=1)
        past = width + step
        out.append(decoder(torch.full((len(rows), 1), token), (lengths + step)[:, None], _mask(valid, past, 1), cache))
    return out


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_fp32_fast_decoder_equals_the_models_forward_on_ragged_rows(kind):
    model = _tiny(kind)
    decoder = FastDecoder.for_model(model, dtype=torch.float32)
    assert decoder is not None
    rows = [[5, 17, 33, 2, 9, 41], [7, 8], [100, 3, 3, 250]]
    steps = [11, 12, 13]
    got = _fast_logits(decoder, model, rows, steps)
    with torch.no_grad():
        for i, row in enumerate(rows):
            full = model(torch.tensor([row + steps])).logits[0]
            for j, logits in enumerate(got):
                torch.testing.assert_close(logits[i], full[len(row) - 1 + j], atol=1e-5, rtol=1e-5)


def test_bf16_fast_decoder_is_close_but_not_the_fp32_forward():
    model = _tiny("llama")
    rows = [[5, 17, 33, 2, 9, 41], [7, 8]]
    exact = _fast_logits(FastDecoder.for_model(model, dtype=torch.float32), model, rows, [11])
    half = _fast_logits(FastDecoder.for_model(model, dtype=torch.bfloat16), model, rows, [11])
    for a, b in zip(exact, half):
        diff = (torch.log_softmax(a, -1) - torch.log_softmax(b, -1)).abs()
        assert 0 < diff.max().item() < 0.1  # bf16 matmuls round: close to fp32, and really in bf16


def test_unsupported_models_run_their_own_forward():
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100))
    assert FastDecoder.for_model(gpt2) is None
    shape = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    assert FastDecoder.for_model(LlamaForCausalLM(LlamaConfig(**shape, attention_bias=True))) is None
    assert FastDecoder.for_model(LlamaForCausalLM(LlamaConfig(**shape, hidden_act="gelu"))) is None
    assert FastDecoder.for_model(LlamaForCausalLM(LlamaConfig(**shape)).to(torch.bfloat16)) is None
    model = _tiny("llama")
    policy = HFPolicy(model, _ByteTokenizer(), bf16=True)
    gpt2_policy = HFPolicy(gpt2, _ByteTokenizer(), bf16=True)
    params = SamplingParams(temperature=0.0, max_new_tokens=2, stop=())
    policy.generate([[1, 2, 3]], params)
    gpt2_policy.generate([[1, 2, 3]], params)
    assert policy._fast is not None and gpt2_policy._fast is None


class _ByteTokenizer:
    """Just what HFPolicy reads of a tokenizer for token-id contexts without stop strings."""

    eos_token_id = 0
    pad_token_id = 0

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(chr(32 + int(i) % 90) for i in ids)


@pytest.fixture(scope="module")
def contexts(smollm2):
    _, tok = smollm2
    root = chat_prompt_ids(tok, [{"role": "user", "content": "Who wrote the novel Moby-Dick?"}])
    return [root, root + text_ids(tok, "<search>"), root + text_ids(tok, "I think"), text_ids(tok, "Once upon a")]


def _two_turns(policy: HFPolicy, tok, contexts: list[list[int]]):
    first = policy.generate(contexts, GREEDY)
    second_ctx = [c + list(g.token_ids) + text_ids(tok, " so the answer is") for c, g in zip(contexts, first)]
    return first + policy.generate(second_ctx, GREEDY), second_ctx


def test_sampler_through_the_fp32_fast_decoder_equals_the_plain_sampler(smollm2, contexts):
    """Batched ragged rows, prefix reuse across a second turn: the same greedy tokens, log-probs to 1e-4."""
    model, tok = smollm2
    plain, _ = _two_turns(HFPolicy(model, tok, bf16=False), tok, contexts)
    fast_policy = HFPolicy(model, tok, bf16=True)
    fast_policy.fast_dtype = torch.float32
    fast, _ = _two_turns(fast_policy, tok, contexts)
    assert fast_policy._fast is not None and fast_policy._fast.dtype == torch.float32
    assert fast_policy.stats.reused_tokens > 0
    for a, b in zip(plain, fast):
        assert a.token_ids == b.token_ids
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)


def test_bf16_sampler_records_the_log_probs_of_what_it_sampled_from(smollm2, contexts):
    """In bf16 the tokens may differ in rare near-ties; the recorded log-probs are the bf16 decoder's
    own, close to the fp32 model's on the same tokens (what the trainer's importance ratio sees)."""
    model, tok = smollm2
    policy = HFPolicy(model, tok, bf16=True)
    gens, second_ctx = _two_turns(policy, tok, contexts)
    assert policy._fast is not None and policy._fast.dtype == torch.bfloat16
    ctxs = contexts + second_ctx
    diffs = []
    with torch.no_grad():
        for ctx, gen in zip(ctxs, gens):
            logp = torch.log_softmax(model(torch.tensor([ctx + list(gen.token_ids)])).logits[0].float(), -1)
            expected = [logp[len(ctx) - 1 + j, t].item() for j, t in enumerate(gen.token_ids)]
            diffs.extend(abs(a - b) for a, b in zip(gen.logprobs, expected))
    assert 0 < float(np.mean(diffs)) < 0.1 and max(diffs) < 1.0


def test_fast_decoder_follows_weight_updates_and_lora_adapters(smollm2, contexts):
    """A LoRA adapter's delta is in the fused weights, and an optimizer step rebuilds them."""
    import peft

    model, tok = smollm2
    base = _tiny("llama", seed=1)
    lora = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                     init_lora_weights=False))
    rows = [[5, 17, 33, 2, 9, 41], [7, 8]]
    fast = _fast_logits(FastDecoder.for_model(lora, dtype=torch.float32), lora, rows, [11])
    with torch.no_grad():
        for i, row in enumerate(rows):
            full = lora(torch.tensor([row + [11]])).logits[0]
            torch.testing.assert_close(fast[0][i], full[len(row) - 1], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(fast[1][i], full[len(row)], atol=1e-5, rtol=1e-5)
        with lora.disable_adapter():
            plain = base(torch.tensor([rows[0]])).logits[0, -1]
    assert (plain - fast[0][0]).abs().max() > 1e-3  # the adapter is really in the fused weights

    policy = HFPolicy(lora, _ByteTokenizer(), bf16=True)
    policy.fast_dtype = torch.float32
    params = SamplingParams(temperature=0.0, max_new_tokens=1, stop=())
    before = policy.generate([rows[0]], params)[0]
    built = policy._fast
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.mul_(3.0)
    after = policy.generate([rows[0]], params)[0]
    assert policy._fast is not built
    with torch.no_grad():
        logits = lora(torch.tensor([rows[0]])).logits[0, -1]
    assert after.logprobs[0] == pytest.approx(torch.log_softmax(logits, -1)[after.token_ids[0]].item(), abs=1e-4)
    assert after.logprobs[0] != pytest.approx(before.logprobs[0], abs=1e-4)


@pytest.mark.parametrize("bf16", [True, False])
def test_the_sampler_sees_the_trainers_fused_adamw_step(bf16):
    """The trainer's AdamW is fused; that kernel writes weights without bumping their version counters,
    which is how the sampler knows its stored prefix KV and fused weights are stale. After a step the
    sampler's log-probs must be the new weights' (it once kept sampling the old ones: nothing learned)."""
    from treegym.trainers import parallel

    model = _tiny("llama", seed=2)
    opt = parallel.adamw([p for p in model.parameters() if p.requires_grad], lr=0.05, weight_decay=0.0)
    assert opt.defaults["fused"] is True
    policy = HFPolicy(model, _ByteTokenizer(), bf16=bf16)
    policy.fast_dtype = torch.float32
    row = [5, 17, 33, 2, 9, 41]
    params = SamplingParams(temperature=0.0, max_new_tokens=1, stop=())
    before = policy.generate([row], params)[0]  # stores the row's prefix KV
    model.train()
    loss = model(torch.tensor([row + [11]]), labels=torch.tensor([row + [11]])).loss
    loss.backward()
    opt.step()
    model.eval()
    after = policy.generate([row], params)[0]
    with torch.no_grad():
        logits = model(torch.tensor([row])).logits[0, -1]
    assert after.logprobs[0] == pytest.approx(torch.log_softmax(logits, -1)[after.token_ids[0]].item(), abs=1e-4)
    assert after.logprobs[0] != pytest.approx(before.logprobs[0], abs=1e-3)


def test_bf16_decoder_keeps_a_bf16_cache_and_decodes_like_fp32_attention_over_it():
    """The bf16 decoder stores keys and values in bf16; its decode step (SDPA on that cache) equals
    fp32 attention over the same bf16 keys and values, to bf16 output rounding."""
    from transformers import DynamicCache

    model = _tiny("llama")
    decoder = FastDecoder.for_model(model, dtype=torch.bfloat16)
    cache = DynamicCache(config=model.config)
    ids = torch.tensor([[5, 17, 33, 2, 9, 41]])
    decoder(ids, torch.arange(6)[None], _mask(torch.ones((1, 6), dtype=torch.bool), 0, 6), cache)
    keys, values = cache.layers[0].keys, cache.layers[0].values
    assert keys.dtype == values.dtype == torch.bfloat16
    assert decoder._attention(torch.randn(1, 4, 1, 16), keys, values, torch.ones((1, 1, 1, 6), dtype=torch.bool)).dtype == torch.bfloat16

    torch.manual_seed(3)
    q = torch.randn(2, 4, 1, 16)
    k, v = torch.randn(2, 2, 9, 16).to(torch.bfloat16), torch.randn(2, 2, 9, 16).to(torch.bfloat16)
    allowed = torch.ones((2, 1, 1, 9), dtype=torch.bool)
    allowed[1, ..., :4] = False  # the second row's left padding
    got = decoder._attention(q, k, v, allowed).float()
    qg = q.to(torch.bfloat16).float().reshape(2, 2, 2, 16)
    scores = (qg @ k.float().transpose(-1, -2)) * decoder.scaling
    scores = scores.masked_fill(~allowed[:, :, 0, None, :], float("-inf"))
    want = (torch.softmax(scores, -1) @ v.float()).reshape(2, 1, 64)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    assert (got - want).abs().max() < 0.02 and not torch.equal(got[1], decoder._attention(
        q, k, v, torch.ones((2, 1, 1, 9), dtype=torch.bool)).float()[1])  # the mask is applied


def test_policy_drops_bf16_prefixes_when_it_switches_to_the_fp32_forward(smollm2, contexts):
    """Prefix KV stored by the bf16 decoder is never read by the model's own fp32 forward: after a
    switch the policy's greedy tokens and log-probs are those of a fresh fp32 policy."""
    model, tok = smollm2
    policy = HFPolicy(model, tok, bf16=True)
    policy.generate(contexts, GREEDY)
    assert len(policy.prefix_cache) > 0
    policy.bf16, policy._built_version = False, -1
    switched = policy.generate(contexts, GREEDY)
    fresh = HFPolicy(model, tok, bf16=False).generate(contexts, GREEDY)
    for a, b in zip(switched, fresh):
        assert a.token_ids == b.token_ids
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
