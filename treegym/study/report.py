"""The study's report: means with bootstrap intervals, paired differences, plots, report.md.

All statistics are over seeds. A cell's interval is the 95% percentile bootstrap of the mean
over its seeds; a comparison with GRPO is the mean of per-seed differences (the same seed
gives both runs the same prompts and initial model) with its own bootstrap interval.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from treegym.stats import bootstrap_interval

BOOTSTRAP = 4000


def bootstrap_ci(xs: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): the mean over seeds and its 95% percentile bootstrap interval."""
    iv = bootstrap_interval([float(x) for x in xs], resamples=BOOTSTRAP)
    return iv.mean, iv.low, iv.high


def paired(a: dict[int, float], b: dict[int, float]) -> tuple[float, float, float, int]:
    """Mean of a[s] - b[s] over the seeds both have, its interval, and the number of pairs."""
    seeds = sorted(set(a) & set(b))
    m, lo, hi = bootstrap_ci([a[s] - b[s] for s in seeds])
    return m, lo, hi, len(seeds)


def fmt(m: float, lo: float, hi: float, signed: bool = False) -> str:
    if m != m:  # NaN
        return "n/a"
    f = "+.3f" if signed else ".3f"
    return f"{m:{f}} [{lo:{f}}, {hi:{f}}]"


def _ok(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if "error" not in r and r.get("success_t1") is not None]


LEARNED = 0.5  # held-out success (T=1) at or above which a seed counts as having learnt the task
COLLAPSE_PENALTY = 0.5  # tuning score = mean success - this x the share of seeds that collapsed


def learned(r: dict[str, Any]) -> bool:
    return r["success_t1"] >= LEARNED


def collapsed(r: dict[str, Any]) -> bool:
    """The run ended on a deterministic wrong policy: its last training rewards are all 0."""
    return r.get("reward_last") is not None and r["reward_last"] <= 0.0 and r["success_t1"] < LEARNED


def tuning_score(rs: Sequence[dict[str, Any]], metric: str = "success_t1") -> float:
    """What tuning maximises: the tuning seeds' mean success, less ``COLLAPSE_PENALTY`` x the share
    of them that collapsed, so that no method is tuned into a setting where it seldom moves."""
    return statistics.fmean(r[metric] for r in rs) - COLLAPSE_PENALTY * statistics.fmean(map(collapsed, rs))


def choose_settings(records: Sequence[dict[str, Any]], metric: str = "success_t1") -> dict[str, dict[str, dict[str, Any]]]:
    """task -> method -> the tuning setting with the best ``tuning_score`` over tuning seeds."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    settings: dict[str, dict[str, Any]] = {}
    for r in _ok(records):
        sk = repr(sorted(r["setting"].items()))
        settings[sk] = r["setting"]
        groups[(r["task"], r["method"], sk)].append(r)
    best: dict[str, dict[str, tuple[float, str]]] = defaultdict(dict)
    for (task, method, sk), rs in groups.items():
        score = tuning_score(rs, metric)
        if method not in best[task] or score > best[task][method][0]:
            best[task][method] = (score, sk)
    return {t: {m: settings[sk] for m, (_, sk) in ms.items()} for t, ms in best.items()}


def tuning_table(records: Sequence[dict[str, Any]], chosen: dict[str, dict[str, dict[str, Any]]]) -> str:
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in _ok(records):
        groups[(r["task"], r["method"], _setting_str(r["setting"]))].append(r)
    lines = ["| task | method | setting | tuning runs | success (T=1) | collapsed | score | chosen |",
             "|---|---|---|---|---|---|---|---|"]
    for (task, method, s), rs in sorted(groups.items()):
        mark = "**yes**" if _setting_str(chosen.get(task, {}).get(method, {})) == s else ""
        lines.append(f"| {task} | {method} | {s} | {len(rs)} | {statistics.fmean(r['success_t1'] for r in rs):.3f} | "
                     f"{statistics.fmean(map(collapsed, rs)):.2f} | {tuning_score(rs):.3f} | {mark} |")
    return "\n".join(lines)


def _setting_str(setting: dict[str, Any]) -> str:
    short = {"optim.lr": "lr", "loss.beta": "β", "loss.eps": "ε", "advantage.opsd_lambda": "λ"}
    return ", ".join(f"{short.get(k, k)}={v:g}" if isinstance(v, float) else f"{short.get(k, k)}={v}"
                     for k, v in sorted(setting.items())) or "(defaults)"


def cells(records: Sequence[dict[str, Any]]) -> dict[tuple[str, int, str], list[dict[str, Any]]]:
    out: dict[tuple[str, int, str], list[dict[str, Any]]] = defaultdict(list)
    for r in _ok(records):
        out[(r["task"], r["budget"], r["method"])].append(r)
    return out


def results_table(records: Sequence[dict[str, Any]], baseline: str = "grpo") -> str:
    """Final held-out success per (task, budget, method), and the paired difference to GRPO."""
    by = cells(records)
    lines = [f"| task | B | method | seeds | success T=1 [95% CI] | Δ vs {baseline} (paired) | learnt | collapsed | "
             "greedy success | trajs / 1k tok | distinct | tool calls | zero-adv tokens | single-child | step weight |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (task, budget, method), rs in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1], _order(kv[0][2]))):
        t1 = {r["seed"]: r["success_t1"] for r in rs}
        base = {r["seed"]: r["success_t1"] for r in by.get((task, budget, baseline), [])}
        diff = "—" if method == baseline else fmt(*paired(t1, base)[:3], signed=True)
        lines.append(
            f"| {task} | {budget} | {method} | {len(rs)} | {fmt(*bootstrap_ci(list(t1.values())))} | {diff} | "
            f"{statistics.fmean(map(learned, rs)):.2f} | {statistics.fmean(map(collapsed, rs)):.2f} | "
            f"{fmt(*bootstrap_ci([r['success'] for r in rs]))} | "
            f"{statistics.fmean(r['trajectories_per_1k_tokens'] for r in rs):.1f} | {_mean(rs, 'distinct_frac', '.2f')} | "
            f"{statistics.fmean(r['tool_calls'] for r in rs):.0f} | "
            f"{statistics.fmean(r['zero_adv_frac'] for r in rs):.2f} | {_mean(rs, 'single_child_frac', '.2f')} | "
            f"{statistics.fmean(r['pg_weight'] for r in rs):.3f} |"
        )
    return "\n".join(lines)


def _mean(rs: Sequence[dict[str, Any]], key: str, f: str) -> str:
    xs = [r[key] for r in rs if isinstance(r.get(key), (int, float)) and r[key] == r[key]]
    return f"{statistics.fmean(xs):{f}}" if xs else "—"


CURRENCIES = {"tokens": "generated tokens", "tool_calls": "tool calls", "trainer_tokens": "trainer tokens",
              "modelled_seconds": "wall seconds (0.5 s per tool call)"}


def success_at(r: dict[str, Any], currency: str, x: float) -> float:
    """Held-out success (T=1) of run ``r`` once it had spent ``x`` of ``currency``: linear between
    its evaluations (its last one beyond them)."""
    pts = sorted((p[currency], p["success_t1"]) for p in r.get("currency_curve", []) if p.get("success_t1") is not None)
    if not pts:
        return float("nan")
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
    return pts[-1][1]


def at_equal_spend(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]], currency: str) -> tuple[float, tuple]:
    """The spend both methods reached on every seed (the least final spend of any run of either),
    and the paired difference a - b of success at that spend."""
    finals = [max((p[currency] for p in r.get("currency_curve", [])), default=0) for r in (*a, *b)]
    x = min(finals) if finals else 0
    sa = {r["seed"]: success_at(r, currency, x) for r in a}
    sb = {r["seed"]: success_at(r, currency, x) for r in b}
    return x, paired(sa, sb)


def currency_table(records: Sequence[dict[str, Any]], baseline: str = "grpo") -> str:
    """Each method against the baseline at equal spend, in every budget currency."""
    by = cells(records)
    head = " | ".join(f"Δ at equal {name}" for name in CURRENCIES.values())
    lines = [f"| task | B | method | {head} |", "|---|---|---|" + "---|" * len(CURRENCIES)]
    for (task, budget, method), rs in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1], _order(kv[0][2]))):
        base = by.get((task, budget, baseline), [])
        if method == baseline or not base or not all(r.get("currency_curve") for r in (*rs, *base)):
            continue
        row = []
        for currency in CURRENCIES:
            x, (m, lo, hi, _) = at_equal_spend(rs, base, currency)
            if not x:  # nothing of it spent (a task without tools): no comparison in that currency
                row.append("—")
                continue
            spent = f"{x:,.0f}" if currency != "modelled_seconds" else f"{x:,.0f} s"
            row.append(f"{fmt(m, lo, hi, signed=True)} at {spent}")
        lines.append(f"| {task} | {budget} | {method} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def diagnostics_table(records: Sequence[dict[str, Any]]) -> str:
    """Why a method wins or loses: its signal per batch, side by side."""
    by = cells(records)
    lines = ["| task | B | method | distinct trajs | zero-adv tokens | single-child turns | step weight | "
             "trajs / 1k tok | resampled heads | reward first → last |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (task, budget, method), rs in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1], _order(kv[0][2]))):
        lines.append(f"| {task} | {budget} | {method} | {_mean(rs, 'distinct_frac', '.2f')} | "
                     f"{_mean(rs, 'zero_adv_frac', '.2f')} | {_mean(rs, 'single_child_frac', '.2f')} | "
                     f"{_mean(rs, 'pg_weight', '.3f')} | {_mean(rs, 'trajectories_per_1k_tokens', '.1f')} | "
                     f"{_mean(rs, 'resampled', '.0f')} | {_mean(rs, 'reward_first', '.3f')} → {_mean(rs, 'reward_last', '.3f')} |")
    return "\n".join(lines)


def ablation_table(records: Sequence[dict[str, Any]]) -> str:
    by = cells(records)
    lines = ["| task | variant | seeds | success T=1 [95% CI] | trajs / 1k tok | zero-adv tokens | step weight |",
             "|---|---|---|---|---|---|---|"]
    for (task, _, method), rs in sorted(by.items()):
        lines.append(f"| {task} | {method} | {len(rs)} | {fmt(*bootstrap_ci([r['success_t1'] for r in rs]))} | "
                     f"{statistics.fmean(r['trajectories_per_1k_tokens'] for r in rs):.1f} | "
                     f"{statistics.fmean(r['zero_adv_frac'] for r in rs):.2f} | "
                     f"{statistics.fmean(r['pg_weight'] for r in rs):.3f} |")
    return "\n".join(lines)


_METHOD_ORDER = ("grpo", "tree-grpo", "tree-grpo+", "treeopsd", "treeopsd+", "fork", "treeopsd+distinct", "treeopsd+fork")  # also their colours


def _order(method: str) -> int:
    return _METHOD_ORDER.index(method) if method in _METHOD_ORDER else len(_METHOD_ORDER)


def plot_curves(records: Sequence[dict[str, Any]], path: Path, currency: str = "tokens") -> None:
    """Held-out success (T=1) against spend in ``currency`` (a key of ``CURRENCIES``), mean over
    seeds with a 95% band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = cells(records)
    panels = sorted({(t, b) for t, b, _ in by})
    cols = min(3, len(panels)) or 1
    rows = (len(panels) + cols - 1) // cols or 1
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, (task, budget) in zip(axes.flat, panels):
        for method in sorted({m for t, b, m in by if (t, b) == (task, budget)}, key=_order):
            rs = [r for r in by[(task, budget, method)] if r.get("currency_curve")]
            if not rs:
                continue
            n = min(len(r["currency_curve"]) for r in rs)
            xs, ms, los, his = [], [], [], []
            for i in range(n):
                xs.append(statistics.fmean(r["currency_curve"][i][currency] for r in rs))
                m, lo, hi = bootstrap_ci([r["currency_curve"][i]["success_t1"] for r in rs])
                ms.append(m), los.append(lo), his.append(hi)
            c = f"C{_order(method)}"
            ax.plot(xs, ms, marker=".", color=c, label=method)
            ax.fill_between(xs, los, his, color=c, alpha=0.15)
        ax.set_title(f"{task}, B={budget} per prompt")
        ax.set_xlabel(CURRENCIES[currency])
        ax.set_ylabel("held-out success (T=1)")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_budgets(records: Sequence[dict[str, Any]], path: Path) -> None:
    """Final held-out success (T=1) against the per-prompt budget B, with 95% intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = cells(records)
    tasks = sorted({t for t, _, _ in by})
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.2), squeeze=False)
    for ax, task in zip(axes.flat, tasks):
        methods = sorted({m for t, _, m in by if t == task}, key=_order)
        for j, method in enumerate(methods):
            budgets = sorted(b for t, b, m in by if t == task and m == method)
            stats = [bootstrap_ci([r["success_t1"] for r in by[(task, b, method)]]) for b in budgets]
            xs = [b * (1 + 0.04 * (j - len(methods) / 2)) for b in budgets]
            ax.errorbar(xs, [s[0] for s in stats], yerr=[[s[0] - s[1] for s in stats], [s[2] - s[0] for s in stats]],
                        marker="o", capsize=3, color=f"C{_order(method)}", label=method)
        ax.set_xscale("log", base=2)
        ax.set_title(task)
        ax.set_xlabel("rollout budget per prompt B (trajectory-equivalents)")
        ax.set_ylabel("final held-out success (T=1)")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(out: Path, tuning: Sequence[dict[str, Any]], chosen: dict[str, dict[str, dict[str, Any]]],
                 ablations: Sequence[dict[str, Any]], report: Sequence[dict[str, Any]], header: str) -> Path:
    """Write report.md and its plots into ``out``; return the report's path."""
    out.mkdir(parents=True, exist_ok=True)
    parts = [f"# Equal-budget study\n\n{header}\n"]
    if report:
        for currency in CURRENCIES:
            plot_curves(report, out / f"success_vs_{currency}.png", currency)
        plot_budgets(report, out / "success_vs_budget.png")
        parts += ["## Final held-out success\n",
                  "Success is measured on 64 held-out episodes at temperature 1 (T=1) and greedily, after the "
                  "run's last step. Intervals are 95% bootstrap intervals over seeds; Δ is the mean paired "
                  "difference to GRPO on the same seeds. *trajs / 1k tok*: trajectories trained on per 1,000 "
                  "generated tokens; *zero-adv tokens*: share of action tokens with advantage exactly 0; *step "
                  "weight*: mean |∂loss/∂log π| per action token at ratio 1 (PPO: |A|, TreeOPSD: |r*−1|).\n",
                  results_table(report), "",
                  f"*learnt*: share of seeds whose final success is at least {LEARNED}; *collapsed*: share whose "
                  "last training rewards were all 0 (a deterministic wrong policy, whose groups stay all-zero); "
                  "*distinct*: distinct move sequences per trajectory in a prompt's group; *single-child*: share "
                  "of tree turns whose parent has one child (TreeOPSD's credit is exactly 0 there).\n",
                  "## Every budget currency\n",
                  "Each method against GRPO on the same seeds, at the spend both reached on every seed, in each "
                  "currency: success is read off each run's held-out curve (linear between evaluations). Runs of "
                  "a task stop at equal generated tokens (or, for a tool-call task, at equal tool calls).\n",
                  currency_table(report), "",
                  "## Diagnostics\n", diagnostics_table(report), "",
                  *[f"![success against {name}](success_vs_{c}.png)\n" for c, name in CURRENCIES.items()],
                  "![final success against budget](success_vs_budget.png)\n"]
    if ablations:
        parts += [f"## Mechanisms (one change each, at B={ablations[0]['budget']} and the reference's tuned setting)\n",
                  ablation_table(ablations), ""]
    if tuning:
        parts += ["## Tuning (tuning seeds, disjoint from the report seeds)\n", tuning_table(tuning, chosen), ""]
    path = out / "report.md"
    path.write_text("\n".join(parts) + "\n")
    return path
