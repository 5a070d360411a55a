"""``treegym study``: the equal-budget study of GRPO, Tree-GRPO and TreeOPSD on the probe envs.

Three phases, each resumable from the same results file:

1. tune: every method's search space (learning rate; TreeOPSD also β and ε), the same number
   of settings per method, on tuning seeds only, at the tuning budget;
2. ablate: each tree mechanism alone (expansion rule, prefix credit, tree shape, TreeOPSD's
   credit shape) at its base algorithm's tuned setting, on ablation seeds;
3. report: every method at its tuned setting, on report seeds never used to choose anything,
   at every budget; then report.md with tables, paired differences and plots.

``--held-out`` runs the task-held-out protocol instead (``treegym.study.heldout``): tasks drawn
from the parametric probe family, every choice made on selection tasks, the claim made once on
report tasks (default split: 12 + 12 tasks).
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from dataclasses import replace
from pathlib import Path

from treegym.errors import ConfigError
from treegym.study.grid import METHODS, TASKS, Grid, improved_methods, quick_grid
from treegym.study.heldout import (
    DEFAULT_ALSO,
    DEFAULT_CANDIDATES,
    Protocol,
    choose,
    default_split,
    family_split,
    quick_split,
    report_runs,
    selection_runs,
)
from treegym.study.heldout_report import write_held_out_report
from treegym.study.report import choose_settings, write_report
from treegym.study.run import run_all, stop_on_signals


def _csv(kind: str, valid: dict | None = None, cast: type = str, empty_ok: bool = False):  # noqa: ANN202
    def parse(text: str) -> tuple:
        try:
            items = tuple(cast(x.strip()) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{kind}s are comma-separated {cast.__name__}s, got {text!r}") from None
        if not items and not empty_ok:
            raise argparse.ArgumentTypeError(f"name at least one {kind} (got {text!r})")
        bad = [x for x in items if valid is not None and x not in valid]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {kind} {', '.join(map(str, bad))}; valid: {', '.join(valid or ())}")
        return items
    return parse


def _count(what: str):  # noqa: ANN202
    """An int >= 0, where 0 means the default."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be a whole number, got {text!r}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"{what} must be at least 1 (0 for the default), got {value}")
        return value
    return parse


def grid_from_args(args: argparse.Namespace) -> Grid:
    grid = quick_grid() if args.quick else Grid()
    changes = {}
    if args.tasks:
        changes["tasks"] = args.tasks
    if args.methods:
        changes["methods"] = args.methods
    if args.budgets:
        changes["budgets"] = args.budgets
    if args.seeds:
        changes["seeds"] = tuple(range(args.seeds))
    if args.tune_seeds:
        changes["tune_seeds"] = tuple(range(1000, 1000 + args.tune_seeds))
    if args.no_ablations:
        changes["ablations"] = ()
    if args.extra_tasks is not None:
        changes["extra_tasks"] = args.extra_tasks
    grid = replace(grid, **changes)
    if "grpo" not in grid.methods:
        raise ConfigError("the study compares every method with GRPO: keep grpo in --methods")
    if any(b < 2 or b % 2 for b in grid.budgets):
        raise ConfigError(f"budgets must be even and at least 2 (trees use B/2 per prompt), got {grid.budgets}")
    return grid


def protocol_from_args(args: argparse.Namespace) -> Protocol:
    """The held-out protocol of ``--held-out`` (and ``--quick``, ``--split``, ``--methods``, seeds, budget)."""
    if args.tasks or args.extra_tasks:
        raise ConfigError("--held-out draws its tasks from the probe family: use --split N,M, not --tasks")
    quick = args.quick
    if args.split:
        if len(args.split) != 2 or min(args.split) < 1:
            raise ConfigError(f"--split takes two counts, selection and report tasks (e.g. 12,12), got {args.split}")
        split = family_split(*args.split, **({"chains": 96, "max_chain_tokens": 8} if quick else {}))
    else:
        split = quick_split() if quick else default_split()
    methods = args.methods or (("grpo", "fork") if quick else ("grpo", *DEFAULT_CANDIDATES))
    if "grpo" not in methods:
        raise ConfigError("the study compares every method with GRPO: keep grpo in --methods")
    if any(m.endswith("+") for m in methods):
        raise ConfigError("the + methods are built from ablations, which --held-out does not run")
    if args.budgets and len(args.budgets) != 1 or any(b < 2 or b % 2 for b in args.budgets or ()):
        raise ConfigError(f"--held-out runs one even budget B >= 2, got {args.budgets}")
    return Protocol(
        split=split, candidates=tuple(m for m in methods if m != "grpo"),
        also=tuple(m for m in DEFAULT_ALSO if m in methods), budget=(args.budgets or (4,))[0],
        select_seeds=tuple(range(1000, 1000 + (args.tune_seeds or (1 if quick else 3)))),
        report_seeds=tuple(range(args.seeds or (4 if quick else 16))), max_settings=2 if quick else 0,
        eval_n=32 if quick else 64,
    )  # fmt: skip


def _held_out(args: argparse.Namespace, out: Path, results: Path) -> int:
    protocol = protocol_from_args(args)
    workers = args.workers or max(1, min(os.cpu_count() or 1, 8))
    runs_dir, quiet, t0 = out / "runs", args.quiet, time.time()
    split = protocol.split
    print(f"study (held-out): {len(split.selection)} selection tasks, {len(split.report)} report tasks; "
          f"candidates {', '.join(protocol.candidates)} against {protocol.baseline}; B={protocol.budget}; "
          f"{workers} workers; results in {results}")
    methods = {m: METHODS[m] for m in protocol.methods}
    select = run_all(selection_runs(protocol, methods), results, runs_dir, workers, "select", progress=not quiet)
    choice = choose(protocol, select)
    print(f"chosen on the selection tasks: {choice.variant}")
    report = run_all(report_runs(protocol, choice, methods), results, runs_dir, workers, "report", progress=not quiet)
    header = (f"`treegym study --held-out{' --quick' if args.quick else ''}`: {len(select) + len(report)} runs, "
              f"{workers} workers, {time.time() - t0:.0f} s for this invocation (finished runs are reused). "
              f"Selection seeds {', '.join(map(str, protocol.select_seeds))}; report seeds "
              f"{protocol.report_seeds[0]}-{protocol.report_seeds[-1]}; B={protocol.budget} at equal generated "
              f"tokens ({split.report[0].chains} chain-equivalents a run). Tasks: `ProbeTask-v0` "
              "(treegym.envs.probe_family), drawn by seed.")
    path = write_held_out_report(out, protocol, choice, report, header)
    print(f"report: {path} ({time.time() - t0:.0f} s)")
    return 0


def _cmd_study(args: argparse.Namespace) -> int:
    grid = None if args.held_out else grid_from_args(args)
    if not args.out.strip():
        raise ConfigError("--out is empty; name the folder for results.jsonl and report.md")
    out = Path(args.out).expanduser()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; the study needs a folder for results.jsonl and report.md")
    try:  # made now, so that a folder that cannot be made (/proc/x, under a file) stops the study before any run
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot make --out {str(out)[:120]} ({exc.strerror or exc}); choose another folder") from None
    if not os.access(out, os.W_OK):
        raise ConfigError(f"--out {out} is not writable; choose another folder")
    results = out / "results.jsonl"
    if results.exists() and not results.is_file():
        raise ConfigError(f"{results} is not a file; choose another --out")
    previous = stop_on_signals(results)
    try:
        return _held_out(args, out, results) if grid is None else _study(args, grid, out, results)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _study(args: argparse.Namespace, grid: Grid, out: Path, results: Path) -> int:
    runs_dir = out / "runs"
    workers = args.workers or max(1, min(os.cpu_count() or 1, 8))
    t0 = time.time()
    print(f"study: tasks {', '.join(grid.tasks)}; methods {', '.join(grid.methods)}; budgets {grid.budgets}; "
          f"{len(grid.seeds)} report seeds; {workers} workers; results in {results}")
    quiet = args.quiet
    base = {m: METHODS[m] for m in grid.methods if not m.endswith("+")}
    tuning = run_all(grid.tuning_runs(base), results, runs_dir, workers, "tune", progress=not quiet)
    chosen = choose_settings(tuning)
    ablations = run_all(grid.ablation_runs(chosen), results, runs_dir, workers, "ablate", progress=not quiet) \
        if grid.ablations else []
    wanted = [m for m in grid.methods if m.endswith("+")]  # built from the ablations' winners
    plus = {m: v for m, v in improved_methods(ablations).items() if m in wanted} if wanted else {}
    tuning += run_all(grid.tuning_runs(plus), results, runs_dir, workers, "tune+", progress=not quiet) if plus else []
    chosen = choose_settings(tuning)
    methods = {**base, **plus}
    report = run_all(grid.report_runs(chosen, methods), results, runs_dir, workers, "report", progress=not quiet)
    header = (f"`treegym study{' --quick' if args.quick else ''}`: {len(tuning) + len(ablations) + len(report)} runs, "
              f"{workers} workers, {time.time() - t0:.0f} s for this invocation (finished runs are reused). "
              f"Report seeds {grid.seeds[0]}-{grid.seeds[-1]}; tuning seeds {', '.join(map(str, grid.tune_seeds))} "
              f"at B={grid.tune_budget}; ablation seeds {grid.ablation_seeds[0]}-{grid.ablation_seeds[-1]}.\n\n"
              + "Tasks: " + "; ".join(f"**{t}** = {TASKS[t].env} (horizon {TASKS[t].horizon}, {TASKS[t].choices} "
                                       f"choices, {TASKS[t].turn_tokens}-token turns, {TASKS[t].token_budget:,} "
                                       f"generated tokens per run)" for t in (*grid.tasks, *grid.extra_tasks)) + ".\n\n"
              + "Methods: " + "; ".join(f"**{m}** = {methods[m].algo}"
                                        + (f" with {', '.join(f'{k}={v}' for k, v in methods[m].overrides)}"
                                           if methods[m].overrides else " (reference)")
                                        for m in grid.methods) + ". "
              + ("The + methods combine the mechanisms that won the ablations below (ablation seeds only)."
                 if ablations else "The + methods use fixed mechanisms (this grid runs no ablations)."))  # fmt: skip
    path = write_report(out, tuning, chosen, ablations, report, header)
    print(f"report: {path} ({time.time() - t0:.0f} s)")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "study", help="equal-budget study: GRPO vs Tree-GRPO vs TreeOPSD on the probe envs, with CIs",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="a small grid (about 5 minutes on 2 cores)")
    p.add_argument("--out", default="runs/study", help="folder for results.jsonl, report.md and plots")
    p.add_argument("--workers", type=_count("--workers"), default=0, help="parallel training processes (default: CPU count, at most 8)")
    p.add_argument("--tasks", type=_csv("task", TASKS), help=f"comma-separated, of: {', '.join(TASKS)}")
    p.add_argument("--extra-tasks", type=_csv("task", TASKS, empty_ok=True), help="report-only tasks at the tuning budget, tuned as "
                   "the first task (default: none; e.g. lock-L1,lock-L16 for turn length)")
    p.add_argument("--methods", type=_csv("method", METHODS), help=f"comma-separated, of: {', '.join(METHODS)}")
    p.add_argument("--budgets", type=_csv("budget", None, int), help="per-prompt budgets B, e.g. 2,4,8")
    p.add_argument("--seeds", type=_count("--seeds"), default=0, help="report seeds per cell (default 16; --quick 6)")
    p.add_argument("--tune-seeds", type=_count("--tune-seeds"), default=0, help="tuning seeds per setting (default 5; --quick 1)")
    p.add_argument("--no-ablations", action="store_true", help="skip the mechanism ablations")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--held-out", action="store_true", help="the task-held-out protocol: choose on selection tasks "
                   "of the probe family, report once on report tasks")
    p.add_argument("--split", type=_csv("count", None, int), help="with --held-out: selection and report task "
                   "counts (default 12,12; --quick 2,2)")
    p.set_defaults(func=_cmd_study)
