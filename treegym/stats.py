"""Intervals and paired gains: the statistics eval, the trainers and the study report with.

A leaf module: it imports no treegym layer, so every layer (and the face) can import it.
Wilson score intervals for 0/1 rates (success, EM), which stay inside [0, 1] and behave at
small n; a seeded percentile bootstrap for means (F1, turns, tool calls, well-formed share)
and for paired differences on the same tasks; Student's t for a mean over a few independent
runs (training seeds), where a bootstrap over 3 values is too narrow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Z95 = 1.959963984540054


@dataclass(frozen=True)
class Interval:
    """A mean with its 95% confidence interval."""

    mean: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.mean:.3f} [{self.low:.3f}, {self.high:.3f}]"


def wilson_interval(values: Sequence[float], z: float = Z95) -> Interval:
    """Wilson score interval of a rate of 0/1 outcomes (fractional values count as they are)."""
    n = len(values)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan)
    p = float(sum(values)) / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return Interval(p, max(0.0, centre - half), min(1.0, centre + half))


def bootstrap_interval(values: Sequence[float], resamples: int = 2000, seed: int = 0) -> Interval:
    """Percentile-bootstrap 95% interval of a mean."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    return Interval(float(x.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975)))


# Student's t, 97.5% quantile, by degrees of freedom (1..30); the normal's beyond.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_interval(values: Sequence[float]) -> Interval:
    """Student-t 95% interval of a mean over a few independent runs (e.g. training seeds); one
    value (or none) has no interval (nan bounds)."""
    x = np.asarray(values, dtype=float)
    if x.size < 2:
        m = float(x.mean()) if x.size else math.nan
        return Interval(m, math.nan, math.nan)
    t = _T975[x.size - 2] if x.size - 1 <= len(_T975) else Z95
    mean, half = float(x.mean()), t * float(x.std(ddof=1)) / math.sqrt(x.size)
    return Interval(mean, mean - half, mean + half)


def paired_difference(after: Sequence[float], before: Sequence[float]) -> Interval:
    """Mean of ``after[i] - before[i]`` over the same tasks, with its 95% bootstrap interval."""
    if len(after) != len(before):
        raise ValueError(f"a paired difference needs the same tasks: {len(after)} vs {len(before)}")
    return bootstrap_interval([a - b for a, b in zip(after, before)])


def task_seed_bootstrap(deltas: Sequence[Sequence[float]], resamples: int = 4000, seed: int = 0) -> Interval:
    """Mean over tasks of each task's mean paired difference (``deltas[t]``: one per seed), with a
    95% interval from a two-level bootstrap: tasks with replacement, then seeds within each task.
    Claims over tasks drawn from a family vary with the tasks as much as with the seeds."""
    rows = [np.asarray(d, dtype=float) for d in deltas if len(d)]
    if not rows:
        return Interval(math.nan, math.nan, math.nan)
    rng = np.random.default_rng(seed)
    point = float(np.mean([r.mean() for r in rows]))
    means = np.empty(resamples)
    for b in range(resamples):
        tasks = rng.integers(0, len(rows), size=len(rows))
        means[b] = np.mean([rows[t][rng.integers(0, rows[t].size, size=rows[t].size)].mean() for t in tasks])
    return Interval(point, float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975)))
