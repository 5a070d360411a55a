"""The measurements of benchmarks/gpu_check.py, one function per section of its table.

Each ``*_rows`` function returns rows ``(section, shape, metric, value, target, status)``; the
models are random-weight ones of real shapes (``SHAPES``), built on the device from their configs.
"""

from __future__ import annotations

import contextlib
import math
import random
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# name -> (config class, its fields), copied from each model's published config.json.
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "smollm2-135m": ("LlamaConfig", dict(
        hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
        vocab_size=49152, rope_theta=100000.0, tie_word_embeddings=True, max_position_embeddings=8192,
        rms_norm_eps=1e-5)),
    "qwen2.5-0.5b": ("Qwen2Config", dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        vocab_size=151936, rope_theta=1000000.0, tie_word_embeddings=True, max_position_embeddings=32768,
        rms_norm_eps=1e-6)),
    "qwen2.5-1.5b": ("Qwen2Config", dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
        vocab_size=151936, rope_theta=1000000.0, tie_word_embeddings=True, max_position_embeddings=32768,
        rms_norm_eps=1e-6)),
}  # fmt: skip
COLUMNS = ("section", "shape", "metric", "value", "target", "status")


def shrink(fields: dict[str, Any]) -> dict[str, Any]:
    """A tiny model of the same family and head layout (``--cpu-smoke``)."""
    heads, kv = fields["num_attention_heads"], fields["num_key_value_heads"]
    head_dim = 8
    return {**fields, "hidden_size": heads * head_dim, "intermediate_size": 2 * heads * head_dim,
            "num_hidden_layers": 2, "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": 512}


def build_model(name: str, device: torch.device, smoke: bool, dtype: torch.dtype = torch.float32) -> Any:
    """A randomly initialised causal LM of ``name``'s shape, built on ``device``."""
    import transformers

    cls_name, fields = SHAPES[name]
    fields = shrink(fields) if smoke else dict(fields)
    theta = fields.pop("rope_theta")
    config = getattr(transformers, cls_name)(**fields, rope_parameters={"rope_type": "default", "rope_theta": theta},
                                             pad_token_id=0, eos_token_id=1, bos_token_id=None)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def word_tokenizer(vocab_size: int, first: Sequence[str] = ("[PAD]", "[EOS]")) -> Any:
    """A word-level tokenizer over ``vocab_size`` words: ``first`` (pad and EOS at 0 and 1), then
    made-up ones (decode costs what HFPolicy pays)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    words = [*first, *(f"w{i}" for i in range(len(first), vocab_size))]
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="[PAD]"))
    tok.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", eos_token="[EOS]")


@dataclass(frozen=True)
class Workload:
    prompts: int
    context: int  # prompt tokens
    turns: int  # turns per chain
    turn_tokens: int  # generated tokens per turn (EOS ignored)
    obs_tokens: int  # observation tokens after each turn
    trees: int = 2  # m
    expand: int = 2  # n (one round: l = 1)
    leaves: int = 3  # k


def tree_rollout(policy: Any, w: Workload, vocab: int, seed: int = 0) -> tuple[float, int, list[list[int]], list[list[int]]]:
    """Tree-GRPO's sampling calls for ``w``; (seconds, generated tokens, leaf contexts, their action masks)."""
    from treegym.agents.policy import SamplingParams

    rng = random.Random(seed)
    params = SamplingParams(temperature=1.0, max_new_tokens=w.turn_tokens, stop=(), ignore_eos=True, seed=seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(2, vocab) for _ in range(n)]

    prompts = [tokens(w.context) for _ in range(w.prompts)]
    obs = [tokens(w.obs_tokens) for _ in range(w.turns)]

    def grow(branches: list[tuple[list[int], list[int]]], first: list[int]) -> list[tuple[list[int], list[int]]]:
        """Run each branch (context, mask) from its turn ``first[i]`` to the last turn."""
        branches = list(branches)
        for t in range(w.turns):
            active = [i for i, f in enumerate(first) if f <= t]
            gens = policy.generate([branches[i][0] for i in active], params)
            for i, g in zip(active, gens):
                ctx, mask = branches[i]
                branches[i] = (ctx + list(g.token_ids) + obs[t], mask + [1] * len(g.token_ids) + [0] * len(obs[t]))
        return branches

    start = time.perf_counter()
    before = policy.stats.generated_tokens
    chains = grow([(p, [0] * len(p)) for p in prompts for _ in range(w.trees)], [0] * (w.prompts * w.trees))
    # One expansion round: n nodes per tree (a turn boundary of its chain), each continued to a leaf.
    forks, first, ends = [], [], []
    for c, (ctx, mask) in enumerate(chains):
        for _ in range(w.expand):
            t = rng.randrange(w.turns)
            cut = w.context + t * (w.turn_tokens + w.obs_tokens)
            forks.append((ctx[:cut], mask[:cut]))
            first.append(t)
            ends.append(c)
    leaves = chains + grow(forks, first)
    seconds = time.perf_counter() - start
    # k leaves per tree are trained: the chain and k - 1 of its expansions.
    kept = [leaves[c] for c in range(len(chains))] + leaves[len(chains) :][: len(chains) * (w.leaves - 1)]
    return seconds, policy.stats.generated_tokens - before, [k[0] for k in kept], [k[1] for k in kept]


def rollout_rows(name: str, model: Any, tok: Any, w: Workload, device: torch.device, batch: int,
                 bf16: bool) -> tuple[list[tuple], tuple[list[list[int]], list[list[int]]]]:
    from treegym.agents.hf_policy import HFPolicy
    from treegym.trainers.parallel import autocast

    speed: dict[bool, float] = {}
    leaves: tuple[list[list[int]], list[list[int]]] = ([], [])
    for reuse in (False, True):
        policy = HFPolicy(model, tok, reuse_prefix=reuse, max_batch_size=batch, cache_bytes=48 << 30)
        with torch.no_grad(), autocast(device, bf16):
            seconds, generated, ctxs, masks = tree_rollout(policy, w, tok.vocab_size)
        speed[reuse] = generated / seconds
        leaves = (ctxs, masks)
    ratio = speed[True] / speed[False]
    return [("rollout", name, "tokens/s, no prefix reuse", f"{speed[False]:.0f}", "", ""),
            ("rollout", name, "tokens/s, prefix reuse", f"{speed[True]:.0f}", ">= 2x no reuse",
             f"{'ok' if ratio >= 2 else 'SHORT'} ({ratio:.2f}x)")], leaves


def train_flops(model: Any, lengths: list[int], actions: int) -> float:
    """Forward+backward FLOPs of one pass: 6 x matmul params per token, causal attention, and the
    LM head at action tokens only (the scorer applies it there alone)."""
    cfg = model.config
    emb = cfg.vocab_size * cfg.hidden_size
    body = sum(p.numel() for p in model.parameters()) - emb * (1 if cfg.tie_word_embeddings else 2)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    attn = sum(2 * cfg.num_hidden_layers * n * n * cfg.num_attention_heads * head_dim for n in lengths)  # QK + AV, causal
    return 3 * (2 * body * sum(lengths) + attn + 2 * emb * actions)


def train_rows(name: str, model: Any, leaves: tuple[list[list[int]], list[list[int]]], device: torch.device,
               micro: int, peak_tflops: float, bf16: bool) -> list[tuple]:
    """One Tree-GRPO update over the rollout's kept leaves, through ``treegym.trainers.update``."""
    from treegym.trainers import losses, parallel
    from treegym.trainers import update as upd
    from treegym.trainers.config import load_config
    from treegym.trainers.logprobs import PaddedBatch, TokenScorer

    ctxs, masks = leaves
    n, width = len(ctxs), max(map(len, ctxs))
    ids = torch.zeros((n, width), dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width))
    for i, (c, m) in enumerate(zip(ctxs, masks)):
        ids[i, : len(c)], attn[i, : len(c)], mask[i, : len(m)] = torch.tensor(c), 1, torch.tensor(m, dtype=torch.float)
    adv = torch.randn(n, 1).expand(n, width).contiguous() * mask
    data = PaddedBatch(ids, attn, ids[:, 1:], mask[:, 1:], torch.zeros((n, width - 1)),
                       {"advantages": adv[:, 1:], "weights": mask[:, 1:]})
    cfg = load_config(overrides=[("optim.mini_batch_size", n), ("optim.micro_batch_size", micro),
                                 ("model_opts.bf16", bf16)])
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-6)
    u = upd.Update(TokenScorer(model), optimizer, params, losses.ppo_clip_loss,
                   {"agg": "token-mean", "constant": 1024.0, "clip": 0.2, "dual_clip": 3.0}, cfg, parallel.Dist(), device)

    def one_update() -> float:
        old = torch.zeros_like(data.mask)
        _sync(device)
        t0 = time.perf_counter()
        upd.update(u, data, old, None, list(range(n)), 1)
        _sync(device)
        return time.perf_counter() - t0

    model.train()
    one_update()  # warm-up: allocator, kernels, AdamW state
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds = one_update()
    model.eval()
    tokens = int(attn.sum())
    mfu = train_flops(model, [len(c) for c in ctxs], int(mask.sum())) / seconds / (peak_tflops * 1e12)
    peak = f"{torch.cuda.max_memory_allocated(device) / 2**30:.1f}" if device.type == "cuda" else "n/a"
    target = ">= 30%" if name == "qwen2.5-1.5b" else ""
    status = ("ok" if mfu >= 0.30 else "SHORT") if target else ""
    return [("train", name, f"tokens/s ({n} leaves, {tokens} tokens)", f"{tokens / seconds:.0f}", "", ""),
            ("train", name, f"MFU vs {peak_tflops:g} TFLOP/s", f"{100 * mfu:.1f}%", target, status),
            ("train", name, "peak memory GiB", peak, "", "")]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def probe_rows(devices: list[str], chains: int, eval_n: int, smoke: bool) -> list[tuple]:
    """The sparse probe trained with the same seed on each device; both learn, and agree."""
    from treegym.study.grid import Method, RunSpec, Task
    from treegym.study.run import run_one

    task = Task("lock-gpu-check", "ProbeLock-v0", horizon=2, choices=2, turn_tokens=2, chains=chains)
    got = {}
    with tempfile.TemporaryDirectory() as out:
        for i, dev in enumerate(devices):
            setting = (("optim.lr", 3e-3), ("model_opts.device", dev))
            r = run_one(RunSpec(f"gpu-check-{i}", task, Method("tree-grpo", "tree-grpo"), budget=4, seed=0,
                                setting=setting, eval_n=eval_n, evals=1), out)
            if "error" in r:
                raise RuntimeError(f"probe run on {dev} failed: {r['error']}\n{r.get('trace', '')}")
            got[f"{dev}#{i}"] = r
    rows, finals = [], []
    for key, r in got.items():
        before, after = r["success_before_t1"], r["success_t1"]
        learned = after > before + 0.3
        finals.append(after)
        rows.append(("probe", f"ProbeLock on {key.split('#')[0]}", "held-out success (T=1) before -> after",
                     f"{before:.2f} -> {after:.2f}", "rises by > 0.3", "smoke" if smoke else ("ok" if learned else "FAIL")))
    noise = 3 * math.sqrt(0.25 / eval_n) * math.sqrt(2)  # 3 sigma of a difference of two rates at n
    gap = abs(finals[0] - finals[-1])
    rows.append(("probe", "ProbeLock", f"success gap, {devices[0]} vs {devices[-1]}", f"{gap:.2f}", f"<= {noise:.2f}",
                 "smoke" if smoke else ("ok" if gap <= noise else "FAIL")))
    return rows


def fixed_batch(vocab: int, rows: int, length: int, device: torch.device, seed: int = 0) -> dict[str, torch.Tensor]:
    """A seeded batch in the trainer's layout: random tokens, the last 3/4 of each row actions, and
    advantages around +1 per row (so that the PPO loss is far from 0 and a relative error means something)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab, (rows, length), generator=g)
    mask = torch.zeros((rows, length - 1))
    mask[:, length // 4 :] = 1.0
    adv = (1.0 + 0.5 * torch.randn((rows, 1), generator=g)).expand(rows, length - 1) * mask
    return {k: v.to(device) for k, v in {"ids": ids, "attn": torch.ones_like(ids), "targets": ids[:, 1:],
                                         "mask": mask, "advantages": adv}.items()}


def bf16_rows(name: str, model: Any, device: torch.device, rows: int, length: int) -> list[tuple]:
    """The trainer's loss and gradient on a fixed batch, fp32 weights with and without bf16 autocast.

    ``torch.autocast(device.type, bfloat16)`` is what the trainer runs under on CUDA
    (``parallel.autocast``); on the CPU (``--cpu-smoke``) the same call runs the CPU's bf16 kernels.
    The old log-probs of the ratio are the fp32 ones in both passes, as in a run whose old
    log-probs came from an fp32 scorer.
    """
    from treegym.trainers.algorithms import get_algorithm
    from treegym.trainers.config import load_config
    from treegym.trainers.logprobs import TokenScorer
    from treegym.trainers.update import loss_step

    cfg = load_config(overrides=[("algo", "tree-grpo")])
    algo = get_algorithm("tree-grpo")
    b = fixed_batch(model.config.vocab_size, rows, length, device)
    scorer, params = TokenScorer(model), [p for p in model.parameters() if p.requires_grad]
    with torch.no_grad():
        old, _ = scorer(b["ids"], b["attn"], b["targets"], b["mask"], with_entropy=False)

    def one_pass(bf16: bool) -> tuple[float, float, torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        scope = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with scope:
            logp, entropy = scorer(b["ids"], b["attn"], b["targets"], b["mask"], with_entropy=True)
            loss, _ = loss_step(algo.loss, algo.loss_options(cfg), cfg.loss, logp, entropy, old, b["advantages"],
                                b["mask"], b["mask"], None)
        loss.backward()
        nll = float(-(logp.detach() * b["mask"]).sum() / b["mask"].sum())
        grads = [p.grad.detach().clone() if not bf16 else p.grad.detach() for p in params]
        return float(loss.detach()), nll, logp.detach(), grads

    loss32, nll32, logp32, g32 = one_pass(False)  # eval mode, as the trainer's update runs (no dropout)
    loss16, nll16, logp16, g16 = one_pass(True)
    model.zero_grad(set_to_none=True)
    dot = sum(float((a.double() * c.double()).sum()) for a, c in zip(g32, g16))
    norms = math.sqrt(sum(float(a.double().square().sum()) for a in g32) * sum(float(c.double().square().sum()) for c in g16))
    cosine = dot / norms if norms else float("nan")
    where = b["mask"] > 0
    diff = (logp16 - logp32)[where].abs()
    rel_loss, rel_nll = abs(loss16 - loss32) / abs(loss32), abs(nll16 - nll32) / abs(nll32)
    tokens = f"{rows}x{length}"
    return [("bf16", name, f"trainer's loss fp32 -> bf16 ({tokens} tokens)", f"{loss32:.5f} -> {loss16:.5f}",
             "rel. diff <= 1%", _ok(rel_loss <= 0.01, f"{100 * rel_loss:.3f}%")),
            ("bf16", name, "token NLL fp32 -> bf16", f"{nll32:.4f} -> {nll16:.4f}", "rel. diff <= 1%",
             _ok(rel_nll <= 0.01, f"{100 * rel_nll:.3f}%")),
            ("bf16", name, "token log-prob abs. diff: mean (max)", f"{float(diff.mean()):.4f} ({float(diff.max()):.3f})",
             "mean <= 0.05", _ok(float(diff.mean()) <= 0.05)),
            ("bf16", name, "gradient cosine, bf16 vs fp32", f"{cosine:.4f}", ">= 0.99", _ok(cosine >= 0.99))]


def _ok(passed: bool, detail: str = "") -> str:
    return ("ok" if passed else "FAIL") + (f" ({detail})" if detail else "")


@dataclass(frozen=True)
class StepSize:
    prompts: int  # prompts per step (x 2 trees x 3 leaves = rollouts)
    turn_tokens: int  # tokens per turn (EOS ignored)
    micro: int  # rollouts per forward/backward


def step_rows(name: str, device: torch.device, smoke: bool, size: StepSize) -> list[tuple]:
    """One whole training step of the loop (``setup``, ``sample``, ``train_step``: Tree-GRPO on
    ProbeKeys-v0, HF sampling, bf16 autocast on CUDA) with a random-weight model of ``name``'s shape,
    saved as a local model folder so that the loop loads it the way it loads any model."""
    from treegym.envs.probes import VOCAB
    from treegym.trainers import loop, parallel
    from treegym.trainers.config import load_config

    with tempfile.TemporaryDirectory(prefix="gpu-check-step-") as tmp:
        folder = Path(tmp) / name
        model = build_model(name, device, smoke, dtype=torch.bfloat16)  # bf16 on disk; the loop loads fp32
        model.save_pretrained(folder)
        word_tokenizer(model.config.vocab_size, VOCAB).save_pretrained(folder)
        del model
        rollouts = size.prompts * 6
        cfg = load_config(overrides=[
            ("algo", "tree-grpo"), ("env", "ProbeKeys-v0"), ("model", str(folder)), ("sampler.backend", "hf"),
            ("sampler.max_new_tokens", size.turn_tokens), ("sampler.ignore_eos", True), ("sampler.max_turns", 2),
            ("prompts_per_step", size.prompts), ("optim.mini_batch_size", rollouts), ("optim.micro_batch_size", size.micro),
            ("optim.lr", 1e-5), ("optim.skip_empty_steps", False), ("loss.entropy_coef", 0.01),
            ("model_opts.device", device.type), ("run.eval_n", 0), ("run.tensorboard", False), ("run.save_every", 0),
            ("run.out_dir", tmp)])  # fmt: skip
        dist, dev = parallel.setup_distributed(cfg.model_opts.device)
        try:
            t0 = time.perf_counter()
            (Path(tmp) / "run").mkdir()
            run = loop.setup(cfg, Path(tmp) / "run", dist, dev)
            setup_s = time.perf_counter() - t0
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
            before = parallel.weights_digest(run.model)
            m = loop.train_step(run, loop.sample(run))
            _sync(dev)
            moved = parallel.weights_digest(run.model) != before
            peak = f"{torch.cuda.max_memory_allocated(dev) / 2**30:.1f}" if dev.type == "cuda" else "n/a"
        finally:
            parallel.teardown_distributed(dist)
    finite = m["skipped"] == 0 and math.isfinite(m["pg_loss"]) and math.isfinite(m["grad_norm"])
    return [("step", name, "load (setup) s; sample s; whole step s", f"{setup_s:.1f}; {m['time_sample']:.1f}; {m['time_step']:.1f}", "", ""),
            ("step", name, "rollouts, action tokens per rollout", f"{m['trajectories']}, {m['action_tokens_per_traj']:.0f}",
             f"{rollouts} rollouts", _ok(m["trajectories"] == rollouts)),
            ("step", name, "update: finite, and the weights moved", f"{finite}, {moved}", "True, True", _ok(finite and moved)),
            ("step", name, "peak memory GiB (sample + update)", peak, "", "")]
