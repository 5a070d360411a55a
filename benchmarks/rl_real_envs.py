"""RL on the real envs, judged across training seeds at equal generated tokens (issue "Cash in the fork").

For each method (an algorithm with its overrides) and each training seed, the RL phase runs from
the env's cached warm start (``treegym train --model WARM --warm_start off --seed S``) until it
has generated ``--budget`` tokens (``token_budget``; ``--steps`` only caps it), scoring
held-out EM on ``--eval-n`` prompts before, every ``--eval-every`` steps, and after. Per method it
reports the mean RL-phase gain over seeds with its 95% t-interval, the paired difference against
the first method over seeds (the same seed: the same warm start, eval prompts and first prompts),
wall seconds and tokens, and it plots held-out EM and training reward against tokens and against
wall time (``curves.png``).

    python benchmarks/rl_real_envs.py --seeds 0 1 2 --budget 12000 --eval-n 128
    python benchmarks/rl_real_envs.py --env WebSearchQA-v0 --methods grpo tree-grpo
    python benchmarks/rl_real_envs.py --quick        # 2 methods, 1 seed, a small budget: the pipeline

Give each method its own tuned learning rate with ``--lr grpo=5e-6 tree-grpo=2e-6``.
Runs that finished are read back, not rerun, so an interrupted benchmark resumes. ``--jobs 2``
runs two ``treegym train`` processes side by side, each on its share of the cores
(``OMP_NUM_THREADS``), with a log per run in ``--out``; every run records the load average at
its start and end beside its wall time. Extra
``--field=value`` arguments reach every run (for example ``--optim.lr=1e-5``); tune each method's
learning rate with the same effort on seeds you do not report.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import treegym  # noqa: F401  (registers the envs)
from treegym.cli import main as treegym_main
from treegym.errors import TreegymError
from treegym.stats import t_interval
from treegym.trainers.config import load_config, parse_overrides
from treegym.trainers.recipe import rl_phase_gain, warm_start

# name -> overrides; the first method named is the baseline of the paired differences
METHODS: dict[str, list[str]] = {
    "grpo": ["--algo=grpo"],
    "tree-grpo": ["--algo=tree-grpo"],
    "treeopsd": ["--algo=treeopsd"],
    "fork+moves": ["--algo=tree-grpo", "--sampler.expansion=adaptive", "--sampler.distinct_actions=true"],
    # several trees a step: two prompts' trees, so one unlucky tree moves the policy half as far
    "tree-grpo-2p": ["--algo=tree-grpo", "--prompts_per_step=2"],
}


def config_args(method: str, args: argparse.Namespace, rest: list[str]) -> list[str]:
    """The config fields of one run, as ``treegym train`` takes them (``--field=value``)."""
    tuned = [f"--optim.lr={args.lr[method]}"] if method in args.lr else []
    return ["--warm_start=off", f"--steps={args.steps}", f"--token_budget={args.budget}",
            f"--run.eval_n={args.eval_n}", f"--run.eval_every={args.eval_every}", *METHODS[method], *rest, *tuned]


def method_lrs(pairs: list[str]) -> dict[str, float]:
    """``["grpo=5e-6", ...]`` -> {method: lr}, each method's tuned learning rate."""
    out = {}
    for pair in pairs:
        method, _, value = pair.partition("=")
        if method not in METHODS:
            raise SystemExit(f"rl_real_envs: --lr {pair!r}: no method {method!r} (one of {', '.join(METHODS)})")
        try:
            out[method] = float(value)
        except ValueError:
            raise SystemExit(f"rl_real_envs: --lr {pair!r}: {value!r} is not a number (write METHOD=LR, e.g. grpo=5e-6)") from None
    return out


def run_name(method: str, seed: int) -> str:
    return f"{method}-seed-{seed}"


def train_argv(env: str, model: str, method: str, seed: int, args: argparse.Namespace, rest: list[str],
               out: Path) -> list[str]:
    """The ``treegym train`` arguments of one run."""
    return ["train", "--env", env, "--model", model, "--seed", str(seed), "--out", str(out),
            "--name", run_name(method, seed), "--no-progress", *config_args(method, args, rest)]


def load_now() -> float:
    return round(os.getloadavg()[0], 2)


def train_once(argv: list[str], folder: Path, threads: int = 0) -> str:
    """Run one ``treegym train`` and record its wall time and the load at its start and end in
    ``wall.json``; in this process, or (``threads`` > 0) as a child process on that many threads with
    its output in ``FOLDER.log``. An error message, or "" when it finished."""
    load0, t0 = load_now(), time.perf_counter()
    if threads:
        log = folder.with_suffix(".log")
        with log.open("w") as fh:
            code = subprocess.run([sys.executable, "-c", "import sys; from treegym.cli import main; sys.exit(main(sys.argv[1:]))",
                                   *argv], stdout=fh, stderr=subprocess.STDOUT, check=False,
                                  env={**os.environ, "OMP_NUM_THREADS": str(threads)}).returncode
        where = f"its output is in {log}"
    else:
        code = treegym_main(argv)
        where = f"its log is in {folder}"
    if code:
        return f"{folder.name} failed (exit {code}); {where}"
    wall = {"seconds": time.perf_counter() - t0, "load_start": load0, "load_end": load_now(), "threads": threads or None}
    (folder / "wall.json").write_text(json.dumps(wall))
    print(f"{folder.name}: finished in {wall['seconds']:.0f} s (load {load0:.2f} -> {wall['load_end']:.2f})", flush=True)
    return ""


def run_pending(env: str, model: str, runs: list[tuple[str, int]], args: argparse.Namespace, rest: list[str],
                out: Path) -> None:
    """Train every (method, seed) in ``runs`` that has no ``phases.json`` yet, ``args.jobs`` at a time."""
    todo = [(m, s) for m, s in runs if not (out / run_name(m, s) / "phases.json").exists()]
    if not todo:
        return
    threads = max(1, (os.cpu_count() or 1) // args.jobs) if args.jobs > 1 else 0

    def one(run: tuple[str, int]) -> str:
        method, seed = run
        return train_once(train_argv(env, model, method, seed, args, rest, out), out / run_name(method, seed), threads)

    if threads:
        print(f"{len(todo)} runs, {args.jobs} at a time on {threads} thread(s) each", flush=True)
        with ThreadPoolExecutor(args.jobs) as pool:
            failures = [f for f in pool.map(one, todo) if f]
    else:
        failures = []
        for run in todo:
            failure = one(run)
            if failure:
                failures.append(failure)
                break
    if failures:
        raise SystemExit("\n".join(failures))


def read_run(method: str, seed: int, out: Path) -> dict[str, Any]:
    """One finished run's row: its RL-phase gain, EM after, wall time (and load), tokens, steps."""
    folder = out / run_name(method, seed)
    phases = json.loads((folder / "phases.json").read_text())
    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    wall = json.loads((folder / "wall.json").read_text())
    return {"method": method, "seed": seed, "gain": rl_phase_gain(phases),
            "after_rl": phases["phases"]["after RL"]["success"][0], "seconds": wall["seconds"],
            "load": [wall.get("load_start"), wall.get("load_end")],
            "tokens": max((m.get("tokens_total", 0) for m in metrics), default=0),
            "steps": max((m.get("step", 0) for m in metrics), default=0), "metrics": metrics}


def summarise(rows: list[dict[str, Any]], methods: list[str]) -> dict[str, Any]:
    base = methods[0]
    by = {m: {r["seed"]: r for r in rows if r["method"] == m} for m in methods}
    report: dict[str, Any] = {}
    for m in methods:
        gains = [r["gain"] for r in by[m].values()]
        iv = t_interval(gains)
        entry = {"gain": [iv.mean, iv.low, iv.high], "seeds": len(gains),
                 "seconds": sum(r["seconds"] for r in by[m].values()) / len(gains),
                 "tokens": sum(r["tokens"] for r in by[m].values()) / len(gains)}
        shared = sorted(set(by[m]) & set(by[base]))
        if m != base and shared:
            d = t_interval([by[m][s]["gain"] - by[base][s]["gain"] for s in shared])
            entry["vs_" + base] = [d.mean, d.low, d.high]
        report[m] = entry
    return report


# what a step of each method did, from its runs' metrics.jsonl: why one method learns more than another
STEP_FIELDS = {"generated_tokens": "generated tokens a step", "distinct_action_share": "siblings differing in parsed action",
               "adv_abs": "mean |advantage|", "grad_norm": "gradient norm before clipping",
               "update_unique_ratio": "update's unique/total tokens", "time_step": "seconds a step"}


def step_profile(rows: list[dict[str, Any]], methods: list[str]) -> dict[str, dict[str, list[float]]]:
    """Per method and step field, [lowest, highest] over its runs of the run's mean over its steps,
    and the steps a run took."""
    out: dict[str, dict[str, list[float]]] = {}
    for m in methods:
        runs = [r for r in rows if r["method"] == m]
        entry = {"steps": [min(r["steps"] for r in runs), max(r["steps"] for r in runs)]}
        for key in STEP_FIELDS:
            means = []
            for r in runs:
                values = [float(x[key]) for x in r["metrics"] if key in x]
                if values:
                    means.append(sum(values) / len(values))
            if means:
                entry[key] = [min(means), max(means)]
        out[m] = entry
    return out


def print_profile(profile: dict[str, dict[str, list[float]]]) -> None:
    methods = list(profile)
    print("\nper step, lowest-highest over seeds of each run's mean:")
    print(f"{'':38}" + "".join(f"{m:>16}" for m in methods))
    for key, label in {"steps": "steps in the budget", **STEP_FIELDS}.items():
        cells = []
        for m in methods:
            lo, hi = profile[m].get(key, [float("nan")] * 2)
            digits = 0 if key in ("steps", "generated_tokens") else (1 if key == "time_step" else 2 if key != "adv_abs" else 3)
            cells.append(f"{lo:.{digits}f}-{hi:.{digits}f}")
        print(f"{label:38}" + "".join(f"{c:>16}" for c in cells))


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    colours: dict[str, Any] = {}
    for r in rows:
        colour = colours.setdefault(r["method"], f"C{len(colours)}")
        evals = [m for m in r["metrics"] if "eval_success" in m]
        steps = [m for m in r["metrics"] if "reward" in m]
        label = r["method"] if r["seed"] == min(x["seed"] for x in rows if x["method"] == r["method"]) else None
        for col, key in ((0, "tokens_total"), (1, "seconds_total")):
            xs = [m.get(key, 0) for m in evals]
            axes[0, col].plot(xs, [100 * m["eval_success"] for m in evals], "o-", color=colour, alpha=0.6, label=label)
        axes[1, 0].plot([m["tokens_total"] for m in steps], [m["reward"] for m in steps], color=colour, alpha=0.6,
                        label=label)
        elapsed = [sum(m.get("time_step", 0) for m in steps[: i + 1]) for i in range(len(steps))]
        axes[1, 1].plot(elapsed, [m["reward"] for m in steps], color=colour, alpha=0.6, label=label)
    for ax, (x, y) in zip(axes.flat, (("generated tokens", "held-out EM (%)"), ("training seconds", "held-out EM (%)"),
                                      ("generated tokens", "training reward"), ("training seconds", "training reward"))):
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
    axes[0, 0].legend()
    fig.suptitle("RL phase from the warm start: each line one training seed")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="TreeSearchQA-v0")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS),
                    help="the first is the baseline of the paired differences (default: all, GRPO first)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--budget", type=int, default=12_000, help="generated tokens per run (equal for every method)")
    ap.add_argument("--steps", type=int, default=1000, help="a cap on steps; the token budget ends a run first")
    ap.add_argument("--eval-n", type=int, default=128, help="held-out prompts scored before, during and after")
    ap.add_argument("--eval-every", type=int, default=4, help="steps between held-out scorings (0: before/after only)")
    ap.add_argument("--lr", nargs="+", default=[], metavar="METHOD=LR",
                    help="a method's own tuned learning rate (e.g. grpo=5e-6 tree-grpo=2e-6); over --optim.lr")
    ap.add_argument("--out", default="runs/rl-real-envs")
    ap.add_argument("--jobs", type=int, default=1, help="runs side by side, each a process on its share of the "
                    "cores (default 1: one run at a time, in this process)")
    ap.add_argument("--quick", action="store_true", help="grpo and tree-grpo, seed 0, 1,500 tokens, 16 prompts")
    args, rest = ap.parse_known_args()
    args.lr = method_lrs(args.lr)
    if args.jobs < 1:
        raise SystemExit(f"rl_real_envs: --jobs {args.jobs}: give at least 1")
    if args.quick:
        args.methods, args.seeds, args.budget, args.eval_n, args.eval_every = ["grpo", "tree-grpo"], [0], 1500, 16, 0
    # every run's fields are checked before the warm start, so a typo costs seconds, not a warm start
    try:
        for method in args.methods:
            load_config(None, [("env", args.env), *parse_overrides(config_args(method, args, rest))])
    except TreegymError as exc:
        raise SystemExit(f"rl_real_envs: {exc}") from None
    cfg = load_config(None, [("env", args.env), *parse_overrides(rest)])
    ws = warm_start(cfg)  # the env's default warm start (seed 0), cached
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    print(f"{args.env} from {ws.folder}: {len(args.methods)} methods x {len(args.seeds)} seeds, {args.budget} tokens "
          f"per run, {args.eval_n} held-out prompts; load average {load[0]:.2f}", flush=True)
    runs = [(method, seed) for seed in args.seeds for method in args.methods]
    run_pending(args.env, str(ws.folder), runs, args, rest, out)
    rows = [read_run(method, seed, out) for method, seed in runs]
    for row in rows:
        print(f"{row['method']:>12} seed {row['seed']}: RL gain {100 * row['gain']:+.1f} pts, EM after "
              f"{100 * row['after_rl']:.1f}%, {row['steps']} steps, {row['tokens']} tokens, {row['seconds']:.0f} s", flush=True)
    report = summarise(rows, args.methods)
    for m, e in report.items():
        g = e["gain"]
        line = (f"{m:>12}: RL-phase gain {100 * g[0]:+.1f} pts [{100 * g[1]:+.1f}, {100 * g[2]:+.1f}] over {e['seeds']} "
                f"seeds, {e['seconds']:.0f} s and {e['tokens']:.0f} tokens per run")
        if "vs_" + args.methods[0] in e:
            d = e["vs_" + args.methods[0]]
            line += f"; vs {args.methods[0]} {100 * d[0]:+.1f} [{100 * d[1]:+.1f}, {100 * d[2]:+.1f}] (paired by seed)"
        print(line)
    profile = step_profile(rows, args.methods)
    print_profile(profile)
    (out / "report.json").write_text(json.dumps({"env": args.env, "budget": args.budget, "eval_n": args.eval_n,
                                                  "load_average": load, "methods": report, "step_profile": profile,
                                                  "runs": [{k: v for k, v in r.items() if k != "metrics"} for r in rows]},
                                                 indent=2) + "\n")
    plot(rows, out / "curves.png")
    print(f"report: {out / 'report.json'}, curves: {out / 'curves.png'}")


if __name__ == "__main__":
    main()
