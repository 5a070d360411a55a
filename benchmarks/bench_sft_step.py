"""One SFT step on real expert episodes, fp32 against bf16 autocast, side by side.

A warm start's cost is its SFT passes: on TextHousehold-v0 an episode is ~1,350 SmolLM2 tokens
(the listed commands on every turn), and the default imitates ~80 of them. This benchmark plays
``--episodes`` episodes of the env family's expert on its training variant, builds the SFT
examples as ``treegym sft`` does (``select_examples``, the run's context and stops) except that
every episode is kept, solved or not (a step's cost is its tokens, not its outcome), and
times the forward and backward of SFT's loss over them (``sft.batch_nll``, ``--micro`` episodes
per forward), alternating the variants ``--reps`` times, in wall and CPU seconds:

- fp32: what SFT ran before;
- bf16: the same under bf16 autocast, weights in fp32 (``parallel.train_bf16``, the default where
  the CPU has bf16 matmul units).

It also prints each variant's summed NLL and gradient norm, so that a faster variant that learns
something else shows it.

    python benchmarks/bench_sft_step.py --env TextHousehold-v0 --episodes 8 --reps 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

import treegym  # noqa: F401  (registers the envs)
from treegym.agents.experts import make_expert
from treegym.agents.rollout.context import TokenContext, resolve_mode
from treegym.envs import registry as env_registry
from treegym.trainers import parallel
from treegym.trainers.config import load_config
from treegym.trainers.logprobs import TokenScorer
from treegym.trainers.model import load_trainable_model
from treegym.trainers.prompts import make_env, sampling_params, train_prompts
from treegym.trainers.sft import batch_nll, expert_name
from treegym.trainers.sft_data import collect_episodes, select_examples


def step(scorer: TokenScorer, examples: list, micro: int, bf16: bool) -> tuple[float, float, float, float]:
    """Wall s, CPU s, summed NLL and gradient norm of one forward+backward over ``examples``."""
    scorer.model.zero_grad(set_to_none=True)
    wall, cpu, total = time.perf_counter(), time.process_time(), 0.0
    for m in range(0, len(examples), micro):
        with parallel.autocast(torch.device("cpu"), bf16):
            nll, _ = batch_nll(scorer, examples[m : m + micro], 0, torch.device("cpu"))
        (nll / 1000).backward()
        total += float(nll.detach())
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    grads = [p.grad.float().norm() ** 2 for p in scorer.model.parameters() if p.grad is not None]
    return wall, cpu, total, float(sum(grads)) ** 0.5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="TextHousehold-v0")
    ap.add_argument("--episodes", type=int, default=8, help="expert episodes played, all of them the step's batch (solved or not)")
    ap.add_argument("--micro", type=int, default=0, help="episodes per forward (0: the family's SFT micro-batch)")
    ap.add_argument("--reps", type=int, default=2, help="runs per variant, alternating (min and median reported)")
    ap.add_argument("--json", default="", help="also write the figures here")
    args = ap.parse_args()
    cfg = load_config(None, [("env", args.env), ("model_opts.device", "cpu")])
    micro = args.micro or cfg.sft.micro_batch_size
    env = make_env(cfg, cfg.run.train_split)
    expert = make_expert(cfg.env, expert_name(cfg), cfg.sampler.max_turns)
    prompts = train_prompts(env_registry.task_ids(env), cfg.seed, 0, args.episodes)
    episodes = collect_episodes(env, expert, prompts, False, max_turns=cfg.sampler.max_turns)
    model, tok = load_trainable_model(cfg, torch.device("cpu"))
    ctx = TokenContext(tok, resolve_mode(cfg.sampler.context_mode, tok))  # type: ignore[arg-type]
    stops = sampling_params(cfg).with_stops(env_registry.family(cfg.env).action_stops)
    examples, dropped = select_examples(ctx, episodes, only_correct=False, params=stops)
    tokens = sum(len(e.token_ids) for e in examples)
    print(f"{args.env}: {len(examples)} episodes kept of {len(episodes)} ({dropped}), {tokens:,} tokens, "
          f"{sum(e.n_labels for e in examples):,} labelled; micro-batch {micro}; "
          f"bf16 units on this CPU: {parallel.cpu_has_bf16()}; load {os.getloadavg()[0]:.2f}")
    scorer = TokenScorer(model)
    model.train()
    runs: dict[str, list[tuple[float, float, float, float]]] = {"fp32": [], "bf16": []}
    for _ in range(args.reps):
        for name in runs:
            runs[name].append(step(scorer, examples, micro, name == "bf16"))
    rows = {}
    for name, got in runs.items():
        walls = [g[0] for g in got]
        rows[name] = {"wall_min": min(walls), "wall_median": statistics.median(walls), "cpu_median": statistics.median(g[1] for g in got),
                      "nll": got[-1][2], "grad_norm": got[-1][3], "tokens_per_s": tokens / min(walls)}
        r = rows[name]
        print(f"  {name}: {r['wall_min']:.1f} s min, {r['wall_median']:.1f} s median ({r['cpu_median']:.1f} CPU s), "
              f"{r['tokens_per_s']:.0f} tokens/s; NLL {r['nll']:.2f}, grad norm {r['grad_norm']:.4f}")
    speedup = rows["fp32"]["wall_median"] / rows["bf16"]["wall_median"]
    print(f"  bf16 / fp32: {speedup:.2f}x faster (median wall); NLL differs by "
          f"{abs(rows['bf16']['nll'] - rows['fp32']['nll']) / rows['fp32']['nll']:.2%}; load {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"env": args.env, "episodes": len(examples), "tokens": tokens, "micro": micro,
                                               "variants": rows, "speedup": speedup}, indent=2) + "\n")


if __name__ == "__main__":
    main()
