"""GPU check: rollout and update throughput of real model shapes, MFU, and CPU/GPU agreement.

    treegym bench gpu_check                 # on a GPU: at most about 8 minutes on one H200
    treegym bench gpu_check --cpu-smoke     # the same code paths at tiny shapes, on the CPU

It needs nothing but the source tree: the models are randomly initialised from their real
configs, written below (SHAPES), and the tokenizer is a synthetic word-level one of the same
vocabulary size. Random weights are fine for throughput: every turn generates a fixed number of
tokens (EOS ignored). It prints one table (markdown), with a row per measurement:

- rollout: HFPolicy tokens/s on a Tree-GRPO workload (m=2 trees per prompt, their chains of
  ``--turns`` turns, then l=1 round expanding n=2 nodes per tree; 64 prompts of about 1k
  tokens), without and with prefix KV reuse; target: reuse >= 2x;
- train: one Tree-GRPO update (the trainer's own ``update``: fp32 weights, bf16 autocast,
  AdamW) on k=3 leaves per tree: tokens/s, MFU against ``--peak-tflops`` (790: bf16 dense as
  measured on an H200) and peak memory; target: MFU >= 30% on the 1.5B shape;
- probe: the sparse probe (ProbeLock-v0, as in tests/test_probe_learning.py) trained with the
  same seed on CUDA and on the CPU: both must learn, and agree within noise.

Without a GPU (and without ``--cpu-smoke``) it prints "SKIPPED: no GPU" and exits 0.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import time
from dataclasses import dataclass
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


def word_tokenizer(vocab_size: int) -> Any:
    """A word-level tokenizer over ``vocab_size`` made-up words (decode costs what HFPolicy pays)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    words = ["[PAD]", "[EOS]", *(f"w{i}" for i in range(2, vocab_size))]
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
    from treegym.trainers.runtime import autocast

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
    from treegym.trainers import losses
    from treegym.trainers import runtime as rt
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
                   {"agg": "token-mean", "constant": 1024.0, "clip": 0.2, "dual_clip": 3.0}, cfg, rt.Dist(), device)
    n_micro = math.ceil(n / micro)

    def one_update() -> float:
        old = torch.zeros_like(data.mask)
        _sync(device)
        t0 = time.perf_counter()
        upd.update(u, data, old, None, list(range(n)), 1, n_micro)
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


def print_table(rows: list[tuple]) -> None:
    width = [max(len(str(r[i])) for r in [COLUMNS, *rows]) for i in range(len(COLUMNS))]
    for r in [COLUMNS, tuple("-" * w for w in width), *rows]:
        print("| " + " | ".join(str(v).ljust(w) for v, w in zip(r, width)) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shapes and counts on the CPU (CI)")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names from SHAPES")
    parser.add_argument("--prompts", type=int, default=64, help="prompts of the tree workload")
    parser.add_argument("--context", type=int, default=1024, help="prompt tokens")
    parser.add_argument("--turns", type=int, default=2, help="turns per chain")
    parser.add_argument("--turn-tokens", type=int, default=64, help="tokens generated per turn")
    parser.add_argument("--obs-tokens", type=int, default=96, help="observation tokens after each turn")
    parser.add_argument("--batch", type=int, default=128, help="HFPolicy rows per forward pass")
    parser.add_argument("--train-leaves", type=int, default=96, help="kept leaves trained by the update (16 prompts x 2 x 3)")
    parser.add_argument("--micro-batch", type=int, default=8, help="rollouts per forward/backward in the update")
    parser.add_argument("--peak-tflops", type=float, default=790.0, help="bf16 dense peak of the GPU (MFU's roofline)")
    parser.add_argument("--probe-chains", type=int, default=160, help="rollout budget of each probe run")
    parser.add_argument("--probe-eval", type=int, default=64, help="held-out prompts of each probe run")
    args = parser.parse_args()
    if not args.cpu_smoke and not torch.cuda.is_available():
        print("SKIPPED: no GPU")
        return 0
    smoke = args.cpu_smoke
    if smoke:  # the same paths, at sizes a CI runner does in seconds
        args.prompts, args.context, args.turns, args.turn_tokens, args.obs_tokens = 2, 24, 2, 3, 4
        args.batch, args.train_leaves, args.micro_batch, args.probe_chains, args.probe_eval = 8, 12, 4, 12, 4
        if args.shapes == ",".join(SHAPES):
            args.shapes = "smollm2-135m"
    device = torch.device("cpu" if smoke else "cuda")
    bf16 = device.type == "cuda"
    w = Workload(args.prompts, args.context, args.turns, args.turn_tokens, args.obs_tokens)
    print(f"device {torch.cuda.get_device_name(device) if bf16 else 'cpu'}, torch {torch.__version__}; tree workload: "
          f"{w.prompts} prompts x {w.trees} trees, {w.turns} turns of {w.turn_tokens} tokens, n={w.expand}, l=1, "
          f"k={w.leaves}, {w.context}-token prompts, {w.obs_tokens}-token observations", flush=True)
    rows: list[tuple] = []
    t0 = time.perf_counter()
    for name in [s for s in args.shapes.split(",") if s]:
        model = build_model(name, device, smoke)
        tok = word_tokenizer(model.config.vocab_size)
        got, leaves = rollout_rows(name, model, tok, w, device, args.batch, bf16)
        rows += got
        leaves = (leaves[0][: args.train_leaves], leaves[1][: args.train_leaves])
        rows += train_rows(name, model, leaves, device, args.micro_batch, args.peak_tflops, bf16)
        print(f"{name}: done at {time.perf_counter() - t0:.0f} s", flush=True)
        del model
        if bf16:
            torch.cuda.empty_cache()
    rows += probe_rows(["cpu", "cpu"] if smoke else ["cuda", "cpu"], args.probe_chains, args.probe_eval, smoke)
    if smoke:  # tiny shapes on a CPU measure nothing: the figures only show the code ran
        rows = [(*r[:5], "smoke") if r[0] != "probe" else r for r in rows]
    print(f"total {time.perf_counter() - t0:.0f} s")
    print_table(rows)
    return 1 if any(r[-1] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
