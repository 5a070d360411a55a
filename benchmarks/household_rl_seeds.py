"""The household default run's RL phase, judged across training seeds, not prompts.

One run's paired interval is over its 32 held-out prompts; it hides the spread between
training seeds (about ±9 points in the last household measurements). This script runs the
default's RL phase (``treegym train --env TextHousehold-v0`` with its defaults) from the cached
warm start once per ``--seeds``, each with ``--model WARM_START --warm_start off --seed S``,
and reports each seed's RL gain (after RL - after the warm start, on the same prompts) and the
mean gain over seeds with its Student-t 95% interval, on the run's held-out split (``seen``) and
on ``--also-split`` (``unseen``).

    python benchmarks/household_rl_seeds.py --seeds 0 1 2 --out runs/household-seeds

Each run scores the second split itself (``run.also_eval_split``, its gains under ``also`` in
``phases.json``). The warm start is the one ``treegym train --env TextHousehold-v0`` caches
(built first when it is not cached yet). Extra ``--field=value`` arguments reach every run.

Every seed starts from the same warm start, so its greedy evaluation before RL is the same: the
first run scores it and the others read it back (``run.memo_before``, ``trainers/heldout.py``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import treegym  # noqa: F401  (registers the envs)
from treegym.cli import main as treegym_main
from treegym.envs.registry import resolve_split
from treegym.stats import t_interval
from treegym.trainers.config import load_config, parse_overrides
from treegym.trainers.recipe import rl_phase_gain, warm_start


def report_line(name: str, values: list[float]) -> tuple[str, list[float]]:
    iv = t_interval(values)
    return (f"mean RL gain over {len(values)} seeds on {name}: {100 * iv.mean:+.1f} pts "
            f"[{100 * iv.low:+.1f}, {100 * iv.high:+.1f}] (95% t-interval over seeds)"), [iv.mean, iv.low, iv.high]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="TextHousehold-v0")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default="runs/household-seeds")
    ap.add_argument("--also-split", default="unseen", help="the second held-out split, scored by each run ('' = none)")
    args, rest = ap.parse_known_args()
    cfg = load_config(None, [("env", args.env), *parse_overrides(rest)])
    ws = warm_start(cfg)  # the default run's warm start (seed 0), cached
    split = resolve_split(cfg.env, cfg.run.eval_split)
    also = resolve_split(cfg.env, args.also_split) if args.also_split else ""
    out = Path(args.out)
    rows = []
    for seed in args.seeds:
        name = f"seed-{seed}"
        folder = out / name
        if not (folder / "phases.json").exists():
            code = treegym_main(["train", "--env", args.env, "--model", str(ws.folder), "--seed", str(seed), "--out",
                                 str(out), "--name", name, "--no-progress", "--warm_start=off",
                                 f"--run.also_eval_split={also}", *rest])
            if code:
                raise SystemExit(code)
        phases = json.loads((folder / "phases.json").read_text())
        row = {"seed": seed, "gain": rl_phase_gain(phases), "after_rl": phases["phases"]["after RL"]["success"][0]}
        if also:
            row["gain_also"] = rl_phase_gain(phases["also"])
            row["after_rl_also"] = phases["also"]["phases"]["after RL"]["success"][0]
        rows.append(row)
        print(f"seed {seed}: RL gain {100 * row['gain']:+.1f} pts on {split}"
              + (f", {100 * row['gain_also']:+.1f} pts on {also}" if also else "")
              + f"; success after RL {100 * row['after_rl']:.1f}% on {split}", flush=True)
    line, iv = report_line(split, [r["gain"] for r in rows])
    print(line)
    report: dict[str, Any] = {"splits": [split, also], "seeds": rows, "mean_gain": iv}
    if also:
        line, iv = report_line(also, [r["gain_also"] for r in rows])
        print(line)
        report["mean_gain_also"] = iv
    (out / "seeds.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
