"""The held-out study's report: the choice made on selection tasks, the claim on report tasks.

The claim is the aggregate paired Δ over report tasks: the mean over tasks of each task's mean
per-seed difference to the baseline, with a 95% interval from a bootstrap over tasks and, within
each, seeds (``treegym.stats.task_seed_bootstrap``). Each report task has its own row, with its
properties, so that where trees pay can be read off the table; the diagnostics put trees and
chains side by side on each task.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from treegym.envs.probe_family import chance
from treegym.stats import task_seed_bootstrap
from treegym.study.heldout import Choice, Protocol, per_task_deltas
from treegym.study.report import _mean, _ok, _setting_str, bootstrap_ci, collapsed, fmt

DIAGNOSTICS = (("distinct_first", "distinct first moves / group", ".2f"),
               ("eff_traj_per_1k_tokens", "effective trajs / 1k tok", ".1f"),
               ("trajectories_per_1k_tokens", "trajs / 1k tok", ".1f"),
               ("zero_adv_frac", "zero-adv tokens", ".2f"), ("pg_weight", "step weight", ".3f"))


def _setting(choice: Choice, method: str) -> tuple:
    return choice.setting(method)


def aggregate_table(protocol: Protocol, choice: Choice, records: Sequence[dict[str, Any]]) -> str:
    """One row per reported method: the mean over report tasks of per-task paired Δ, bootstrapped
    over tasks and seeds, and the tasks whose own interval is below 0 or above 0."""
    base = protocol.baseline
    lines = [f"| method | setting (chosen on selection tasks) | report tasks | aggregate Δ vs {base} [95% CI, tasks × seeds] | "
             "tasks with Δ > 0 | tasks with Δ < 0 | worst task's Δ |", "|---|---|---|---|---|---|---|"]
    for method in _reported(protocol, choice):
        if method == base:
            continue
        deltas = per_task_deltas(records, method, _setting(choice, method), base, _setting(choice, base))
        iv = task_seed_bootstrap(list(deltas.values()))
        per = {t: bootstrap_ci(d) for t, d in deltas.items() if d}
        wins = sum(lo > 0 for _, lo, _ in per.values())
        losses = sum(hi < 0 for _, _, hi in per.values())
        worst = min(per.items(), key=lambda kv: kv[1][0], default=None)
        worst_s = f"{worst[0]}: {fmt(*worst[1], signed=True)}" if worst else "—"
        mark = " (**chosen**)" if method == choice.variant else ""
        lines.append(f"| {method}{mark} | {_setting_str(dict(_setting(choice, method)))} | {len(deltas)} | "
                     f"{fmt(iv.mean, iv.low, iv.high, signed=True)} | {wins} | {losses} | {worst_s} |")
    return "\n".join(lines)


def _reported(protocol: Protocol, choice: Choice) -> tuple[str, ...]:
    return tuple(dict.fromkeys((protocol.baseline, choice.variant, *protocol.also)))


def task_table(protocol: Protocol, choice: Choice, records: Sequence[dict[str, Any]]) -> str:
    """Each report task: its properties, the baseline's success and every method's paired Δ."""
    base = protocol.baseline
    others = [m for m in _reported(protocol, choice) if m != base]
    lines = [f"| task | properties | chance | {base} | " + " | ".join(f"Δ {m}" for m in others) + " |",
             "|---|---|---|---|" + "---|" * len(others)]
    deltas = {m: per_task_deltas(records, m, _setting(choice, m), base, _setting(choice, base)) for m in others}
    for task in protocol.split.report:
        params = dict(protocol.split.params).get(task.name)
        rs = [r for r in records if r["task"] == task.name and r["method"] == base]
        row = [task.name, protocol.split.describe(task.name), f"{chance(params):.3f}" if params else "—",
               fmt(*bootstrap_ci([r["success_t1"] for r in rs])) if rs else "—"]
        row += [fmt(*bootstrap_ci(deltas[m][task.name]), signed=True) if deltas[m].get(task.name) else "—" for m in others]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def selection_table(protocol: Protocol, choice: Choice) -> str:
    lines = ["| candidate | mean Δ vs baseline over selection tasks | setting |", "|---|---|---|"]
    for method, score in sorted(choice.scores, key=lambda kv: -kv[1]):
        mark = " (**chosen**)" if method == choice.variant else ""
        lines.append(f"| {method}{mark} | {score:+.3f} | {_setting_str(dict(choice.setting(method)))} |")
    return "\n".join(lines)


def diagnostics_table(protocol: Protocol, records: Sequence[dict[str, Any]]) -> str:
    """Per report task, each method's signal per batch: trees and chains side by side."""
    lines = ["| task | method | " + " | ".join(name for _, name, _ in DIAGNOSTICS) + " | collapse share |",
             "|---|---|" + "---|" * (len(DIAGNOSTICS) + 1)]
    for task in protocol.split.report:
        for method in sorted({r["method"] for r in records if r["task"] == task.name}):
            rs = [r for r in records if r["task"] == task.name and r["method"] == method]
            cells = [_mean(rs, key, f) for key, _, f in DIAGNOSTICS]
            lines.append(f"| {task.name} | {method} | " + " | ".join(cells)
                         + f" | {statistics.fmean(map(collapsed, rs)):.2f} |")
    return "\n".join(lines)


PROPERTIES = {"visible failure": lambda p: p.failure == "visible", "move after an opening word": lambda p: p.opening,
              "tool": lambda p: p.tools, "distractors": lambda p: p.distractors > 0,
              "horizon ≥ 6": lambda p: p.horizon >= 6, "turns ≥ 8 tokens": lambda p: p.turn_tokens >= 8,
              "prior random": lambda p: p.prior == "random", "prior uses_tools": lambda p: p.prior == "uses_tools"}


def property_table(protocol: Protocol, choice: Choice, records: Sequence[dict[str, Any]]) -> str:
    """Which task properties go with a tree win: each reported method's mean per-task Δ over the report
    tasks that have each property, and over those that do not (the chosen variant first)."""
    params = dict(protocol.split.params)
    others = [m for m in _reported(protocol, choice) if m != protocol.baseline]
    per = {}
    for m in others:
        deltas = per_task_deltas(records, m, _setting(choice, m), protocol.baseline, _setting(choice, protocol.baseline))
        per[m] = {t: statistics.fmean(d) for t, d in deltas.items() if d and t in params}
    tasks = set().union(*per.values())
    f = lambda xs: f"{statistics.fmean(xs):+.3f}" if xs else "—"  # noqa: E731
    lines = ["| property | tasks with it | tasks without | "
             + " | ".join(f"Δ {m} with | Δ {m} without" for m in others) + " |",
             "|---|---|---|" + "---|---|" * len(others)]
    for name, has in PROPERTIES.items():
        yes = {t for t in tasks if has(params[t])}
        cells = [f"{f([d for t, d in per[m].items() if t in yes])} | {f([d for t, d in per[m].items() if t not in yes])}"
                 for m in others]
        lines.append(f"| {name} | {len(yes)} | {len(tasks) - len(yes)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_held_out_report(out: Path, protocol: Protocol, choice: Choice, report: Sequence[dict[str, Any]],
                          header: str) -> Path:
    """Write report.md for a held-out study into ``out``; return its path."""
    out.mkdir(parents=True, exist_ok=True)
    records = _ok(report)
    selection = "\n".join(f"- {t.name}: {protocol.split.describe(t.name)}" for t in protocol.split.selection)
    parts = [
        f"# Task-held-out study\n\n{header}\n",
        "## The choice (selection tasks and seeds only)\n",
        f"Each method's setting maximises the mean over selection tasks of its tuning score; the variant is the "
        f"candidate with the best mean over selection tasks of its paired Δ against {protocol.baseline}.\n",
        selection_table(protocol, choice), "", f"Selection tasks:\n\n{selection}\n",
        "## The claim (report tasks, run once after the choice)\n",
        "Aggregate Δ: the mean over report tasks of each task's mean paired difference of final held-out "
        "success (T=1) to the baseline on the same seeds; its interval resamples tasks, then seeds within each.\n",
        aggregate_table(protocol, choice, records), "", task_table(protocol, choice, records), "",
        "*chance*: the format-level policy's success rate (uniform legal moves), exact.\n",
        "## Where trees pay (report tasks)\n", property_table(protocol, choice, records), "",
        "## Diagnostics (report tasks)\n",
        "*distinct first moves*: distinct first-turn moves (the env's parsed move) among a group's kept "
        "trajectories; *effective trajs*: a group's trajectories discounted for the tokens siblings share "
        "(n² / Σ shared-token overlap), per 1,000 generated tokens; *zero-adv tokens*: share of action tokens "
        "with advantage 0; *step weight*: mean |∂loss/∂log π| per action token; *collapse share*: seeds "
        "whose last training rewards were all 0 and that did not learn.\n",
        diagnostics_table(protocol, records), "",
    ]
    path = out / "report.md"
    path.write_text("\n".join(parts) + "\n")
    return path
