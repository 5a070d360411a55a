"""The tree-packed update equals the per-leaf one: log-probs, entropies, the loss and its gradients,
on real sampled trees (Tree-GRPO, TreeOPSD) and chains (GRPO) from a real tiny model.

The batches are grown by the samplers themselves from TinyKeysEnv with a real 1-layer Llama, with
3-turn episodes cut at 2 turns (truncated leaves) and trees whose nodes are expanded once
(single-child chains). Plain attention runs run by run (each row's new tokens over the row's own
keys); the ``[P, P]`` ancestor mask, which a model with a sliding window gets instead, is checked
against it and against the per-leaf update under SDPA (bool mask) and eager attention (additive).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_task import TinyKeysEnv, build_tiny_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from treegym.agents.hf_policy import HFPolicy
from treegym.agents.rollout.context import resolve_mode
from treegym.paths import cache_dir
from treegym.trainers import update as upd
from treegym.trainers.algorithms import get_algorithm
from treegym.trainers.config import TrainConfig, load_config
from treegym.trainers.logprobs import PaddedBatch, TokenScorer, packed_logits, pad_rollouts
from treegym.trainers.packing import pack_rows, runs_supported
from treegym.trainers.prompts import sampling_params


@pytest.fixture(scope="module")
def tiny_model() -> Path:
    return build_tiny_model(cache_dir("test-models") / "tiny-keys-v1")


def _config(algo: str, **extra: Any) -> TrainConfig:
    over = {"algo": algo, "env": "tiny_task:TinyKeysEnv", "model": "x", "sampler.max_new_tokens": 2,
            "sampler.max_turns": 2, "sampler.temperature": 1.5, "sampler.group_size": 4, "sampler.trees": 2,
            "sampler.leaves": 4, "sampler.expand_nodes": 2, "sampler.rounds": 2, **extra}
    return load_config(overrides=[(k, str(v)) for k, v in over.items()])


def _batch(algo: str, folder: Path, seed: int = 0) -> tuple[TrainConfig, Any, PaddedBatch, list[Any]]:
    cfg = _config(algo)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    torch.manual_seed(seed)
    policy = HFPolicy(model, tokenizer, seed=seed)
    algorithm = get_algorithm(algo)
    batch = algorithm.sample(policy, lambda: TinyKeysEnv(max_turns=3), [0, 1], cfg, sampling_params(cfg),
                             resolve_mode("auto", tokenizer), seed)
    adv = algorithm.advantage(batch.rollouts, **algorithm.advantage_options(cfg))
    data = pad_rollouts(batch.rollouts, 0, {"advantages": adv.advantages, "weights": adv.weights})
    return cfg, algorithm, data, batch.rollouts


def _loss_and_grads(model: torch.nn.Module, algorithm: Any, cfg: TrainConfig, data: PaddedBatch,
                    pack: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    rows = list(range(len(data.input_ids)))
    ids, attn, tgt, mask, n, packed = upd.take(data, rows, torch.device("cpu"), pack)
    logp, entropy = TokenScorer(model)(ids, attn, tgt, mask, with_entropy=True, packed=packed)
    old = logp.detach() + 0.05 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(1)) * mask
    loss, _ = upd.loss_step(algorithm.loss, algorithm.loss_options(cfg), cfg.loss, logp, entropy, old,
                            data.extras["advantages"][:, :n], data.extras["weights"][:, :n], mask, old - 0.1)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    return logp.detach(), entropy.detach(), loss.detach(), grads


def _assert_same(a: tuple, b: tuple) -> None:
    torch.testing.assert_close(a[0], b[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(a[1], b[1], atol=1e-5, rtol=0)
    torch.testing.assert_close(a[2], b[2], atol=1e-5, rtol=0)
    assert len(a[3]) == len(b[3]) > 0
    for ga, gb in zip(a[3], b[3]):
        torch.testing.assert_close(ga, gb, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("algo", ["tree-grpo", "treeopsd", "grpo"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_update_equals_the_per_leaf_update(algo: str, attention: str, tiny_model: Path) -> None:
    cfg, algorithm, data, _ = _batch(algo, tiny_model)
    packed = pack_rows(data.input_ids, data.attention_mask, data.mask)
    assert packed.total < int(data.attention_mask.sum())  # the batch shares prefixes: otherwise this shows nothing
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation=attention)
    _assert_same(_loss_and_grads(model, algorithm, cfg, data, pack=False),
                 _loss_and_grads(model, algorithm, cfg, data, pack=True))


def test_the_sampled_trees_hold_single_child_chains_and_truncated_leaves(tiny_model: Path) -> None:
    _, _, data, rollouts = _batch("tree-grpo", tiny_model)
    paths = [tuple(r.node_path) for r in rollouts]
    prefixes = [p[:d] for p in paths for d in range(1, len(p))]
    children: dict[tuple, set] = {}
    for p in paths:
        for d in range(1, len(p)):
            children.setdefault(p[:d], set()).add(p[d])
    assert any(len(c) == 1 for c in children.values()) and prefixes  # a node with one child
    assert all(len(p) == 2 for p in paths)  # every leaf stopped by the 2-turn limit in a 3-turn task


def test_packing_tells_scored_from_unscored_tokens(tiny_model: Path) -> None:
    """Two rows with the same tokens but a different loss mask may not share a packed token:
    one row's observation token would otherwise be scored (or not) by the other's mask."""
    ids = torch.tensor([[2, 3, 4, 5], [2, 3, 4, 5]])
    attn = torch.ones_like(ids)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    packed = pack_rows(ids, attn, mask)
    assert packed.total == 6  # "2 3" shared; "4" scored in row 0 only, so "4 5" twice
    assert packed.src.tolist() == [0, 1] and packed.tgt.tolist() == [3, 4]  # row 1 scores "3" only
    assert packed.index[0, :2].tolist() == [0, 1] and packed.index[1, 0].item() == 0
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    target = ids[:, 1:]
    plain = TokenScorer(model)(ids, attn, target, mask)
    with_pack = TokenScorer(model)(ids, attn, target, mask, packed=packed)
    torch.testing.assert_close(plain[0], with_pack[0], atol=1e-6, rtol=0)


def test_packed_lora_update_equals_the_per_leaf_one(tiny_model: Path) -> None:
    peft = pytest.importorskip("peft")
    cfg, algorithm, data, _ = _batch("tree-grpo", tiny_model, seed=3)
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    torch.manual_seed(0)
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                      init_lora_weights=False))
    _assert_same(_loss_and_grads(model, algorithm, cfg, data, pack=False),
                 _loss_and_grads(model, algorithm, cfg, data, pack=True))


def test_a_full_packed_update_steps_to_the_same_weights(tiny_model: Path) -> None:
    """``update`` with micro-batches that split trees, packing on and off: the same weights after."""
    cfg, algorithm, data, rollouts = _batch("treeopsd", tiny_model, seed=5)
    trees = [r.prompt_index * 100_000 + r.tree_index for r in rollouts]
    weights = []
    for pack in (False, True):
        c = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, pack=pack, micro_batch_size=5,
                                                               mini_batch_size=12, lr=1e-2))
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
        params = [p for p in model.parameters() if p.requires_grad]
        u = upd.Update(TokenScorer(model), torch.optim.AdamW(params, lr=1e-2), params, algorithm.loss,
                       algorithm.loss_options(c), c, upd.parallel.Dist(), torch.device("cpu"))
        order = list(range(len(rollouts)))
        n_mini = -(-len(order) // 12)
        stats, bad = upd.update(u, data, torch.zeros_like(data.mask), None, order, n_mini, trees)
        assert not bad
        if pack:
            assert sum(stats["packed_tokens"]) < sum(stats["row_tokens"])
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    torch.testing.assert_close(weights[0], weights[1], atol=1e-5, rtol=0)


def test_each_run_is_a_rows_new_tokens_and_attends_to_that_rows_tokens_only(tiny_model: Path) -> None:
    _, _, data, _ = _batch("tree-grpo", tiny_model)
    packed = pack_rows(data.input_ids, data.attention_mask, data.mask)
    covered = [i for run in packed.runs for i in range(run.start, run.end)]
    assert covered == list(range(packed.total))  # the runs tile the packed sequence, in order
    ancestors = packed.ancestors()
    for run in packed.runs:
        keys = run.keys.tolist()
        # the run's keys are one row's tokens, root first: each key's parent is the key before it
        assert packed.parent[keys[0]] == -1 and all(packed.parent[b] == a for a, b in zip(keys, keys[1:]))
        assert keys[-(run.end - run.start):] == list(range(run.start, run.end))
        for i, query in enumerate(range(run.start, run.end)):  # the causal mask sees the query's ancestors
            seen = {keys[j] for j in run.mask[i].nonzero().flatten().tolist()}
            assert seen == set(ancestors[query].nonzero().flatten().tolist())
    area = sum((run.end - run.start) * len(run.keys) for run in packed.runs)
    assert area < packed.total ** 2  # what the runs save over the [P, P] mask


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_run_attention_equals_the_ancestor_mask(attention: str, tiny_model: Path) -> None:
    _, _, data, _ = _batch("treeopsd", tiny_model, seed=2)
    packed = pack_rows(data.input_ids, data.attention_mask, data.mask)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation=attention)
    by_runs = packed_logits(model, packed, runs=True)
    by_mask = packed_logits(model, packed, runs=False)
    torch.testing.assert_close(by_runs, by_mask, atol=1e-5, rtol=0)
    assert model.config._attn_implementation == attention  # restored after the packed forward


def test_a_sliding_window_model_is_packed_with_the_ancestor_mask() -> None:
    from transformers import Qwen2Config

    plain = Qwen2Config(num_hidden_layers=2)
    windowed = Qwen2Config(num_hidden_layers=2, use_sliding_window=True, sliding_window=16, max_window_layers=0)
    assert runs_supported(plain) and not runs_supported(windowed)


def _shared_prefix_rows() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Four right-padded rows: a 12-token shared prompt, two pairs sharing a first turn, then apart."""
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(5, 50, (12,), generator=g).tolist()
    turns = [torch.randint(5, 50, (6,), generator=g).tolist() for _ in range(2)]
    tails = [torch.randint(5, 50, (n,), generator=g).tolist() for n in (4, 7, 3, 5)]
    rows = [prompt + turns[i // 2] + tails[i] for i in range(4)]
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    attn = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return ids, attn, attn[:, 1:].clone()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_run_attention_fast_paths_equal_the_masked_kernel_forward_and_backward(dtype: torch.dtype,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # each run's queries over its row's keys three ways: the old per-run SDPA (gathered keys, repeated
    # GQA heads, bool mask), and run_attention with masked runs through SDPA or through plain products
    from torch.nn import functional as F

    from treegym.trainers import packing

    packed = pack_rows(*_shared_prefix_rows())
    assert packed.runs[0].causal and not any(run.causal for run in packed.runs[1:])
    assert all(len(run.segments) >= 2 for run in packed.runs[1:])  # keys are shared stretches plus own tokens
    g = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, total = 6, 2, 8, packed.total
    leaves = [torch.randn(1, h, total, dim, generator=g) for h in (heads, kv_heads, kv_heads)]

    def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k, v = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
        outs = [F.scaled_dot_product_attention(q[:, :, r.start:r.end], k[:, :, r.keys], v[:, :, r.keys], attn_mask=r.mask)
                for r in packed.runs]
        return torch.cat(outs, dim=2).transpose(1, 2)

    def run(fn: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
        q, k, v = (t.clone().requires_grad_() for t in leaves)
        out = fn(q.to(dtype), k.to(dtype), v.to(dtype))
        (out.float() * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
        return out.detach().float(), [t.grad for t in (q, k, v)]

    expected = run(reference)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 3e-2}
    for bound in (0, 10**9):  # every masked run through SDPA, then every one through plain products
        monkeypatch.setattr(packing, "MATH_ATTENTION_MAX", bound)
        got = run(lambda q, k, v: packing.run_attention(None, q, k, v, None, tree_runs=packed.runs)[0])
        torch.testing.assert_close(got[0], expected[0], **tol)
        for a, b in zip(got[1], expected[1]):
            torch.testing.assert_close(a, b, **tol)


def test_an_entropy_without_a_bonus_is_a_metric_outside_the_graph(tiny_model: Path) -> None:
    cfg, algorithm, data, _ = _batch("grpo", tiny_model)
    assert cfg.loss.entropy_coef == 0
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    rows = list(range(len(data.input_ids)))
    ids, attn, tgt, mask, _, packed = upd.take(data, rows, torch.device("cpu"), True)
    in_graph = TokenScorer(model)(ids, attn, tgt, mask, packed=packed)
    metric = TokenScorer(model)(ids, attn, tgt, mask, packed=packed, entropy_grad=False)
    assert in_graph[1].requires_grad and not metric[1].requires_grad and metric[0].requires_grad
    torch.testing.assert_close(metric[1], in_graph[1].detach(), atol=0, rtol=0)
    assert float(metric[1].sum()) > 0
    # the update's gradients are those of the loss with the (zero) entropy term in the graph
    with_term = _loss_and_grads(model, algorithm, cfg, data, pack=True)
    model.zero_grad(set_to_none=True)
    logp, entropy = TokenScorer(model)(ids, attn, tgt, mask, packed=packed, entropy_grad=False)
    old = logp.detach() + 0.05 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(1)) * mask
    n = logp.shape[1]
    loss, _ = upd.loss_step(algorithm.loss, algorithm.loss_options(cfg), cfg.loss, logp, entropy, old,
                            data.extras["advantages"][:, :n], data.extras["weights"][:, :n], mask, old - 0.1)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert len(grads) == len(with_term[3])
    for a, b in zip(grads, with_term[3]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
