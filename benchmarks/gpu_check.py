"""GPU check: rollout and update throughput of real model shapes, MFU, bf16 agreement, one training step, the probe.

    treegym bench gpu_check                        # on a GPU: at most 8 minutes on one H200 (its own estimate)
    treegym bench gpu_check --out gpu-check.md     # the same, and the dated table into a file
    treegym bench gpu_check --cpu-smoke            # the same code paths at tiny shapes, on the CPU (CI)

It needs nothing but the source tree and torch + transformers (no vLLM, no network, no model
download): the models are randomly initialised from their real configs (``SHAPES`` in
``_gpu_sections.py``), the tokenizer is a synthetic word-level one of the same vocabulary size.
Random weights are fine for what it measures: every turn generates a fixed number of tokens (EOS
ignored). Before it starts it prints its plan, each part with its estimated seconds, and refuses a
plan over ``--budget`` (480 s); a part that would end past the budget is skipped (SKIPPED rows).
It prints one markdown table, a row per measurement:

- rollout: HFPolicy tokens/s on a Tree-GRPO workload (m=2 trees per prompt, their chains of
  ``--turns`` turns, then l=1 round expanding n=2 nodes per tree; 64 prompts of about 1k
  tokens), without and with prefix KV reuse; target: reuse >= 2x;
- train: one Tree-GRPO update (the trainer's own ``update``: fp32 weights, bf16 autocast,
  AdamW) on k=3 leaves per tree: tokens/s, MFU against ``--peak-tflops`` (790: bf16 dense as
  measured on an H200) and peak memory; target: MFU >= 30% on the 1.5B shape;
- bf16: the trainer's loss and gradient on one fixed seeded batch, fp32 vs bf16 autocast (same
  weights): loss and token NLL within 1%, mean |log-prob diff| <= 0.05, gradient cosine >= 0.99;
- step: one whole training step of the loop (setup, sample, train_step; Tree-GRPO on
  ProbeKeys-v0) with a random-weight ``--step-shape`` model saved as a model folder: the update
  is finite and moves the weights; seconds and peak memory;
- probe: the sparse probe (ProbeLock-v0, as in tests/test_probe_learning.py) trained with the
  same seed on CUDA and on the CPU: both must learn, and agree within noise;
- time: each part's measured seconds next to its estimate, and the total against the budget.

Without a GPU (and without ``--cpu-smoke``) it prints "SKIPPED: no GPU" and exits 0. Exit code 1
when a row FAILs or a part was SKIPPED.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from treegym.agents.policy import Generation, PolicyStats

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when run as ``treegym bench gpu_check``
from _gpu_sections import (  # noqa: E402
    COLUMNS,
    SHAPES,
    StepSize,
    Workload,
    bf16_rows,
    build_model,
    probe_rows,
    rollout_rows,
    step_rows,
    train_flops,
    train_rows,
    tree_rollout,
    word_tokenizer,
)

__all__ = ["COLUMNS", "SHAPES", "build_model", "main", "plan"]

# What the estimate assumes of one H200 (bf16 autocast, transformers eager kernels): guesses until
# the first GPU run. Its "time" rows print every part's measured seconds next to the estimate,
# so that run is what corrects these figures.
RATES = {
    "tflops": 200.0,  # dense bf16 throughput of a prefill or update forward/backward (25% of 790)
    "decode_s_per_layer": 6e-4,  # one decode step of an eager HF model: launches per decoder layer
    "build_s_per_gparam": 3.0,  # random init of a model on the GPU, per 1e9 parameters
    "disk_s_per_gb": 1.5,  # save_pretrained + from_pretrained of the step's model folder
    "probe_s_per_chain": {"cuda": 0.4, "cpu": 0.2},  # a probe run (CPU: 28 s for 160 chains on 2 cores)
    "probe_model_s": 20.0,  # the probe's tiny model learning its format, once
    "start_s": 15.0,  # imports, CUDA context, allocator warm-up
}
BUDGET_S = 480.0


@dataclass(frozen=True)
class Part:
    """One part of the run: its name, its estimated seconds, and what runs it (rows out)."""

    name: str
    estimate_s: float
    run: Callable[[], list[tuple]]


class _Counting:
    """A policy that samples nothing: the rollout's calls, for the estimate (a dry run)."""

    def __init__(self, turn_tokens: int) -> None:
        self.turn_tokens, self.stats, self.calls = turn_tokens, PolicyStats(), []

    def generate(self, contexts: list[list[int]], params: Any) -> list[Generation]:
        self.calls.append((len(contexts), sum(map(len, contexts))))
        self.stats.generated_tokens += len(contexts) * self.turn_tokens
        return [Generation((2,) * self.turn_tokens, (0.0,) * self.turn_tokens, "", "length") for _ in contexts]


def shape_estimate(name: str, w: Workload, args: argparse.Namespace, smoke: bool) -> float:
    """Seconds for a shape's part: build, two rollout passes, two updates, the bf16 check."""
    model = build_model(name, torch.device("meta"), smoke)
    n_params, layers = sum(p.numel() for p in model.parameters()), model.config.num_hidden_layers
    dry = _Counting(w.turn_tokens)
    _, _, ctxs, masks = tree_rollout(dry, w, vocab=16)
    decode = sum(math.ceil(rows / args.batch) for rows, _ in dry.calls) * w.turn_tokens * layers * RATES["decode_s_per_layer"]
    prefill = sum(tokens for _, tokens in dry.calls) * 2 * n_params / (RATES["tflops"] * 1e12)
    ctxs, masks = ctxs[: args.train_leaves], masks[: args.train_leaves]
    update = 2 * train_flops(model, [len(c) for c in ctxs], sum(map(sum, masks))) / (RATES["tflops"] * 1e12)
    bf16 = 14 * n_params * args.bf16_rows * args.bf16_length / (RATES["tflops"] * 1e12)
    return n_params / 1e9 * RATES["build_s_per_gparam"] + 2 * (decode + prefill) + update + bf16


def step_estimate(name: str, size: StepSize, smoke: bool) -> float:
    model = build_model(name, torch.device("meta"), smoke)
    n_params, layers = sum(p.numel() for p in model.parameters()), model.config.num_hidden_layers
    # Tree-GRPO's calls: 2 turns of the chains (2 per prompt), then up to 2 of the 4 expansions
    # per prompt, at HFPolicy's 32 rows a batch; the update is small next to its AdamW step.
    batches = 2 * math.ceil(2 * size.prompts / 32) + 2 * math.ceil(4 * size.prompts / 32)
    decode = batches * size.turn_tokens * layers * RATES["decode_s_per_layer"]
    disk = 3 * 2 * n_params / 1e9 * RATES["disk_s_per_gb"]  # bf16 written, read, made fp32
    return n_params / 1e9 * RATES["build_s_per_gparam"] + disk + decode + 10.0


def probe_estimate(devices: list[str], chains: int) -> float:
    return RATES["probe_model_s"] + sum(RATES["probe_s_per_chain"][d] * chains for d in devices)


def plan(args: argparse.Namespace) -> list[Part]:
    """The run's parts, in order, each with its estimate (nothing runs until a part's ``run``)."""
    smoke = args.cpu_smoke
    device = torch.device("cpu" if smoke else "cuda")
    bf16 = device.type == "cuda"
    w = Workload(args.prompts, args.context, args.turns, args.turn_tokens, args.obs_tokens)

    def shape_part(name: str) -> list[tuple]:
        model = build_model(name, device, smoke)
        tok = word_tokenizer(model.config.vocab_size)
        rows, (ctxs, masks) = rollout_rows(name, model, tok, w, device, args.batch, bf16)
        leaves = (ctxs[: args.train_leaves], masks[: args.train_leaves])
        rows += train_rows(name, model, leaves, device, args.micro_batch, args.peak_tflops, bf16)
        rows += bf16_rows(name, model, device, args.bf16_rows, args.bf16_length)
        del model
        if bf16:
            torch.cuda.empty_cache()
        return rows

    size = StepSize(args.step_prompts, args.step_turn_tokens, args.micro_batch)
    probe_devices = ["cpu", "cpu"] if smoke else ["cuda", "cpu"]
    shapes = [s for s in args.shapes.split(",") if s]
    return [
        *(Part(f"{n}: rollout x2, update x2, bf16 check", shape_estimate(n, w, args, smoke),
               lambda n=n: shape_part(n)) for n in shapes),
        *([Part(f"{args.step_shape}: one training step", step_estimate(args.step_shape, size, smoke),
                lambda: step_rows(args.step_shape, device, smoke, size))] if args.step_shape else []),
        Part(f"ProbeLock on {' and '.join(probe_devices)}", probe_estimate(probe_devices, args.probe_chains),
             lambda: probe_rows(probe_devices, args.probe_chains, args.probe_eval, smoke)),
    ]  # fmt: skip


def run_parts(parts: list[Part], budget_s: float, spent_s: float) -> list[tuple]:
    """Each part in turn, unless it would end past the budget; then the time rows."""
    rows: list[tuple] = []
    t0 = time.perf_counter() - spent_s
    for part in parts:
        start = time.perf_counter()
        if start - t0 + part.estimate_s > budget_s:
            rows.append(("skipped", part.name, "not run", "", "", f"SKIPPED: {start - t0:.0f} s + {part.estimate_s:.0f} s "
                                                                    f"estimate > {budget_s:.0f} s budget"))
            continue
        rows += part.run()
        took = time.perf_counter() - start
        print(f"{part.name}: {took:.0f} s (estimate {part.estimate_s:.0f} s), at {time.perf_counter() - t0:.0f} s", flush=True)
        rows.append(("time", part.name, "seconds: measured (estimate)", f"{took:.0f} ({part.estimate_s:.0f})", "", ""))
    total = time.perf_counter() - t0
    rows.append(("time", "total", "seconds, start to table", f"{total:.0f}", f"<= {budget_s:.0f}",
                 "ok" if total <= budget_s else "OVER"))
    return rows


def table(rows: list[tuple]) -> str:
    width = [max(len(str(r[i])) for r in [COLUMNS, *rows]) for i in range(len(COLUMNS))]
    return "\n".join("| " + " | ".join(str(v).ljust(w) for v, w in zip(r, width)) + " |"
                     for r in [COLUMNS, tuple("-" * w for w in width), *rows])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shapes and counts on the CPU (CI)")
    parser.add_argument("--out", type=Path, help="also write the dated table (markdown) to this file")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds the whole run may take (by its estimate)")
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
    parser.add_argument("--bf16-rows", type=int, default=16, help="rows of the fixed batch of the bf16 check")
    parser.add_argument("--bf16-length", type=int, default=1024, help="tokens per row of that batch")
    parser.add_argument("--step-shape", default="qwen2.5-1.5b", help="shape of the training step's model ('' skips the step)")
    parser.add_argument("--step-prompts", type=int, default=16, help="prompts of that step (x 6 rollouts)")
    parser.add_argument("--step-turn-tokens", type=int, default=32, help="tokens per turn in that step")
    parser.add_argument("--probe-chains", type=int, default=160, help="rollout budget of each probe run")
    parser.add_argument("--probe-eval", type=int, default=64, help="held-out prompts of each probe run")
    args = parser.parse_args(argv)
    if args.cpu_smoke:  # the same paths, at sizes a CI runner does in seconds
        args.prompts, args.context, args.turns, args.turn_tokens, args.obs_tokens = 2, 24, 2, 3, 4
        args.batch, args.train_leaves, args.micro_batch, args.probe_chains, args.probe_eval = 8, 12, 4, 12, 4
        args.bf16_rows, args.bf16_length, args.step_prompts, args.step_turn_tokens = 2, 16, 2, 2
        if args.shapes == ",".join(SHAPES):
            args.shapes = "smollm2-135m"
        if args.step_shape == "qwen2.5-1.5b":
            args.step_shape = "smollm2-135m"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.cpu_smoke and not torch.cuda.is_available():
        print("SKIPPED: no GPU")
        return 0
    import transformers

    t0 = time.perf_counter()
    smoke = args.cpu_smoke
    device = "cpu" if smoke else torch.cuda.get_device_name(0)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = (f"gpu_check {when}: {device}, torch {torch.__version__}, transformers {transformers.__version__}; "
              f"command: treegym bench gpu_check {' '.join(sys.argv[1:] if argv is None else argv)}".rstrip())
    print(header)
    print(f"tree workload: {args.prompts} prompts x 2 trees, {args.turns} turns of {args.turn_tokens} tokens, n=2, l=1, "
          f"k=3, {args.context}-token prompts, {args.obs_tokens}-token observations", flush=True)
    parts = plan(args)
    estimate = RATES["start_s"] + sum(p.estimate_s for p in parts)
    print("plan" + (" (rates assumed for one H200; --cpu-smoke runs tiny shapes)" if smoke else "") + ":")
    for p in parts:
        print(f"  {p.estimate_s:6.0f} s  {p.name}")
    print(f"  {estimate:6.0f} s  in all, estimated (budget {args.budget:.0f} s)", flush=True)
    if estimate > args.budget:
        print(f"the plan's estimate ({estimate:.0f} s) is over --budget {args.budget:.0f} s: shrink the workload flags")
        return 2
    rows = run_parts(parts, args.budget, time.perf_counter() - t0)
    if smoke:  # tiny shapes on a CPU measure nothing: the figures only show the code ran
        rows = [(*r[:5], "smoke") if r[0] not in ("probe", "skipped") else r for r in rows]
    text = table(rows)
    print(text)
    if args.out:
        args.out.write_text(f"{header}\n\n{text}\n", encoding="utf-8")
        print(f"wrote {args.out}")
    return 1 if any(r[-1] == "FAIL" or str(r[-1]).startswith("SKIPPED") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
