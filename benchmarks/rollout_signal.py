"""The training signal each sampling temperature gives the RL phase, before any update.

For each ``--temperatures`` value, the run's own sampler and algorithm (``trainers.loop.setup`` /
``sample``) roll out ``--prompts`` training prompts from a model (default: the env's cached warm
start, built if missing) and this prints, over the rollouts: the mean reward, success (EM on QA),
the share of well-formed actions, the share of prompts whose rollouts do not all get the same
reward, and the share whose rollouts hold both a success and a failure. A prompt whose rollouts
tie has zero advantage under GRPO and Tree-GRPO: it teaches nothing; one whose rewards differ by
format alone teaches format, not the answer. It reads the training split only, so a temperature chosen here is not chosen on the
held-out prompts a run reports.

    python benchmarks/rollout_signal.py --temperatures 1.0 0.7 0.5 --prompts 8 --seed 9
    python benchmarks/rollout_signal.py --env WebSearchQA-v0 --algo=grpo

Extra ``--field=value`` arguments reach the run's config (e.g. ``--sampler.top_p=0.9``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

import treegym  # noqa: F401  (registers the envs)
from treegym.agents.rollout.scoring import chain_score
from treegym.envs.core import success
from treegym.errors import TreegymError
from treegym.trainers import loop
from treegym.trainers.config import load_config, parse_overrides
from treegym.trainers.parallel import Dist
from treegym.trainers.recipe import warm_start


def signal(batch) -> dict[str, float]:
    """Reward, success, well-formed share and the share of prompts with differing rewards."""
    trees = {(t.prompt_index, t.tree_index): t for t in batch.trees}
    rewards, wins = defaultdict(list), defaultdict(list)
    for r in batch.rollouts:
        rewards[r.prompt_index].append(r.reward)
        wins[r.prompt_index].append(success(r.info))
    formed = [chain_score(trees[(r.prompt_index, r.tree_index)], r.leaf).well_formed for r in batch.rollouts]
    return {"rollouts": len(batch.rollouts), "reward": statistics.mean(r.reward for r in batch.rollouts),
            "success": statistics.mean(success(r.info) for r in batch.rollouts),
            "well_formed": statistics.mean(formed),
            "prompts_with_signal": statistics.mean(len(set(v)) > 1 for v in rewards.values()),
            "prompts_with_a_win_and_a_loss": statistics.mean(len(set(v)) > 1 for v in wins.values()),
            "generated_tokens": batch.budget.generated_tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="TreeSearchQA-v0")
    ap.add_argument("--model", default="", help="model folder (default: the env's cached warm start)")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.7, 0.5])
    ap.add_argument("--prompts", type=int, default=8, help="training prompts per temperature (one sampler call)")
    ap.add_argument("--seed", type=int, default=9, help="seed of the prompt draw and sampling (default 9: not a reported seed)")
    ap.add_argument("--json", default="", help="also write the figures to this file")
    args, rest = ap.parse_known_args()
    try:
        base = load_config(None, [("env", args.env), *parse_overrides(rest)])
        model = args.model or str(warm_start(base).folder)
        cfg = load_config(None, [("env", args.env), ("model", model), ("warm_start", "off"), ("run.eval_n", 0),
                                 ("run.tensorboard", "false"), ("run.plots", "false"), ("run.trees_html", "false"),
                                 ("prompts_per_step", args.prompts), ("seed", args.seed), *parse_overrides(rest)])
    except TreegymError as exc:
        raise SystemExit(f"rollout_signal: {exc}") from None
    load = os.getloadavg()
    print(f"{args.env}, {cfg.algo}, model {model}: {args.prompts} training prompts per temperature, seed {args.seed}, "
          f"torch threads {torch.get_num_threads()}, load average {load[0]:.2f}", flush=True)
    print(f"{'temperature':>12}{'rollouts':>10}{'reward':>9}{'success':>9}{'well-formed':>13}{'prompts w/ signal':>19}"
          f"{'w/ win+loss':>13}{'tokens':>8}{'seconds':>9}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        run = loop.setup(cfg, Path(tmp), Dist(), torch.device("cpu"))
        for t in args.temperatures:
            run.cfg = dataclasses.replace(cfg, sampler=dataclasses.replace(cfg.sampler, temperature=t))
            run.state.data_position = 0  # the same prompts at every temperature
            t0 = time.perf_counter()
            row = {"temperature": t, **signal(loop.sample(run)), "seconds": time.perf_counter() - t0}
            rows.append(row)
            print(f"{t:>12.2f}{row['rollouts']:>10}{row['reward']:>9.3f}{row['success']:>9.1%}{row['well_formed']:>13.1%}"
                  f"{row['prompts_with_signal']:>19.1%}{row['prompts_with_a_win_and_a_loss']:>13.1%}"
                  f"{row['generated_tokens']:>8}{row['seconds']:>9.0f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"env": args.env, "algo": cfg.algo, "model": model, "seed": args.seed,
                                               "load_average": load, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
