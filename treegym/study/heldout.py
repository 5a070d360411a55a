"""The task-held-out protocol: every choice on selection tasks, every claim on report tasks.

A study that picks its method among variants on the tasks it reports on has selected on its
test set, at the level of tasks, even when its seeds are disjoint. Here tasks are drawn from the
parametric probe family (``treegym.envs.probe_family``) and split in two:

1. select: every candidate method over its whole search space (the lr grid; a candidate's
   variant fixes its rule, λ, β, ε and tree shape), on the *selection* tasks and selection seeds.
   Each method's setting is the one with the best tuning score averaged over the selection
   tasks (one setting per method, since a report task cannot be tuned on); the variant is the
   candidate with the best mean over selection tasks of its paired Δ against the baseline.
2. report: the baseline, the chosen variant and the methods reported alongside it, each at its
   chosen setting, once, on the *report* tasks and report seeds.

The split is enforced here, not by convention: ``Split`` refuses a task on both sides, and every
selection step (``selection_runs``, ``choose``) goes through ``require_selection``, which raises
``HeldOutError`` on any report task. ``report_runs`` takes only a ``Choice``, which only
``choose`` makes.
"""

from __future__ import annotations

import random
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from treegym.envs.probe_family import ProbeTaskParams, sample_task
from treegym.errors import ConfigError
from treegym.study.grid import Method, RunSpec, Task
from treegym.study.report import _ok, tuning_score

FAMILY_ENV = "ProbeTask-v0"
SPLIT_SEEDS = 1000  # task seeds drawn for a split: 0, 1, 2, ... until it is full


# The fork-native variants a default held-out study chooses among, and the reference reported beside
# the choice whenever it is among the study's methods (TreeOPSD's target: within 0.05 of GRPO on the
# report tasks' aggregate).
DEFAULT_CANDIDATES = ("tree-grpo", "treeopsd", "fork", "treeopsd+distinct", "adaptive", "treeopsd+adaptive")
DEFAULT_ALSO = ("treeopsd",)


class HeldOutError(ConfigError):
    """A report task reached a selection step."""


@dataclass(frozen=True)
class Split:
    """Selection tasks and report tasks, disjoint by name and by parameters."""

    selection: tuple[Task, ...]
    report: tuple[Task, ...]
    params: tuple[tuple[str, ProbeTaskParams], ...] = ()  # task name -> family parameters, for the report

    def __post_init__(self) -> None:
        if not self.selection or not self.report:
            raise ConfigError("a held-out split needs at least one selection task and one report task")
        shared = {t.name for t in self.selection} & {t.name for t in self.report}
        same = set(self.selection) & set(self.report)
        if shared or same:
            raise HeldOutError(f"tasks on both sides of the split: {sorted(shared | {t.name for t in same})}")

    @property
    def report_names(self) -> frozenset[str]:
        return frozenset(t.name for t in self.report)

    def describe(self, name: str) -> str:
        return dict(self.params)[name].describe() if name in dict(self.params) else ""


def family_task(params: ProbeTaskParams, chains: int) -> Task:
    """The study's ``Task`` for one family task: ``chains`` chain-equivalents of generated tokens."""
    extra = {k: v for k, v in params.env_kwargs().items() if k not in ("horizon", "choices")}
    return Task(params.name, FAMILY_ENV, params.horizon, params.choices, params.turn_tokens, chains,
                env_kwargs=tuple(sorted(extra.items())), prior=params.prior)


def family_split(n_select: int, n_report: int, seed: int = 0, chains: int = 384,
                 max_chain_tokens: int | None = None) -> Split:
    """``n_select + n_report`` distinct family tasks (task seeds 0, 1, ...), dealt to the two sides
    by a shuffle seeded with ``seed``."""
    tasks: list[ProbeTaskParams] = []
    for task_seed in range(SPLIT_SEEDS):
        if len(tasks) == n_select + n_report:
            break
        params = sample_task(task_seed, max_chain_tokens)
        if all(replace(params, seed=0, max_chain_tokens=None) != replace(t, seed=0, max_chain_tokens=None)
               for t in tasks):
            tasks.append(params)
    if len(tasks) < n_select + n_report:
        raise ConfigError(f"the probe family gave {len(tasks)} distinct tasks in {SPLIT_SEEDS} seeds, "
                          f"fewer than the {n_select + n_report} the split asks for")
    random.Random(f"treegym-split:{seed}").shuffle(tasks)
    made = [family_task(p, chains) for p in tasks]
    return Split(tuple(made[:n_select]), tuple(made[n_select:]), tuple((p.name, p) for p in tasks))


def default_split() -> Split:
    """The shipped split: 12 selection and 12 report tasks of the family."""
    return family_split(12, 12)


def quick_split() -> Split:
    """``--held-out --quick``: 2 + 2 cheap tasks (chains of at most 8 tokens, 96 chains a run)."""
    return family_split(2, 2, chains=96, max_chain_tokens=8)


@dataclass(frozen=True)
class Protocol:
    """What the held-out study runs: the split, the baseline, the candidates, seeds and budget."""

    split: Split
    candidates: tuple[str, ...]  # fork-native variants; the selection step picks one
    baseline: str = "grpo"
    also: tuple[str, ...] = ()  # reported on the report tasks too, at their selected setting
    budget: int = 4
    select_seeds: tuple[int, ...] = (1000, 1001, 1002)
    report_seeds: tuple[int, ...] = tuple(range(16))
    max_settings: int = 0  # 0: each method's whole grid; n: its last n settings (``--quick``)
    eval_n: int = 64

    def __post_init__(self) -> None:
        if set(self.select_seeds) & set(self.report_seeds):
            raise HeldOutError("selection seeds and report seeds overlap")
        if not self.candidates:
            raise ConfigError("a held-out study needs at least one candidate besides the baseline")

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((self.baseline, *self.candidates, *self.also)))

    def settings(self, method: Method) -> tuple[tuple[tuple[str, Any], ...], ...]:
        grid = method.tune or ((),)
        return grid[-self.max_settings:] if self.max_settings else grid


def require_selection(split: Split, tasks: Iterable[str]) -> None:
    """Raise ``HeldOutError`` if any of ``tasks`` is a report task (or not in the split at all)."""
    names = set(tasks)
    leaked = names & split.report_names
    if leaked:
        raise HeldOutError(f"report task(s) {sorted(leaked)} used by a selection step: report tasks run once, "
                           "after every choice")
    unknown = names - {t.name for t in split.selection}
    if unknown:
        raise HeldOutError(f"task(s) {sorted(unknown)} are not selection tasks of this split")


def selection_runs(protocol: Protocol, methods: dict[str, Method]) -> list[RunSpec]:
    """Every method over its search space, on selection tasks and selection seeds only."""
    specs = [RunSpec("select", task, methods[m], protocol.budget, seed, setting, protocol.eval_n, evals=0)
             for task in protocol.split.selection for m in protocol.methods
             for setting in protocol.settings(methods[m]) for seed in protocol.select_seeds]
    require_selection(protocol.split, (s.task.name for s in specs))
    return specs


@dataclass(frozen=True)
class Choice:
    """What the selection tasks decided; the only input of the report phase besides the split."""

    variant: str
    settings: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]  # method -> its chosen setting
    scores: tuple[tuple[str, float], ...]  # candidate -> mean paired Δ vs the baseline on selection tasks
    selection_tasks: tuple[str, ...]

    def setting(self, method: str) -> tuple[tuple[str, Any], ...]:
        return dict(self.settings)[method]


def _key(setting: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(setting.items()))


def choose(protocol: Protocol, records: Sequence[dict[str, Any]]) -> Choice:
    """Each method's setting and the variant, from selection records alone (``HeldOutError`` on a
    record of a report task or of another phase)."""
    require_selection(protocol.split, (r["task"] for r in records))
    if any(r["phase"] != "select" for r in records):
        raise HeldOutError("a selection step was given records of another phase")
    ok = _ok(records)
    by: dict[tuple[str, tuple, str], list[dict[str, Any]]] = defaultdict(list)
    for r in ok:
        by[(r["method"], _key(r["setting"]), r["task"])].append(r)
    settings: dict[str, tuple[tuple[str, Any], ...]] = {}
    for method in protocol.methods:
        scored = defaultdict(list)
        for (m, setting, _), rs in by.items():
            if m == method:
                scored[setting].append(tuning_score(rs))
        if not scored:
            raise ConfigError(f"no finished selection run of {method}: rerun the study to retry failed runs")
        settings[method] = max(scored, key=lambda s: statistics.fmean(scored[s]))  # mean over selection tasks
    scores = {c: mean_task_delta(ok, c, settings[c], protocol.baseline, settings[protocol.baseline])
              for c in protocol.candidates}
    variant = max(protocol.candidates, key=lambda c: scores[c])
    return Choice(variant, tuple(settings.items()), tuple(scores.items()),
                  tuple(t.name for t in protocol.split.selection))


def per_task_deltas(records: Sequence[dict[str, Any]], method: str, setting: tuple, baseline: str,
                    base_setting: tuple) -> dict[str, list[float]]:
    """task -> paired differences of final held-out success (T=1), method - baseline, one per seed."""
    def table(m: str, s: tuple) -> dict[str, dict[int, float]]:
        out: dict[str, dict[int, float]] = defaultdict(dict)
        for r in records:
            if r["method"] == m and _key(r["setting"]) == s:
                out[r["task"]][r["seed"]] = r["success_t1"]
        return out

    a, b = table(method, setting), table(baseline, base_setting)
    return {t: [a[t][s] - b[t][s] for s in sorted(set(a[t]) & set(b.get(t, {})))] for t in a if t in b}


def mean_task_delta(records: Sequence[dict[str, Any]], method: str, setting: tuple, baseline: str,
                    base_setting: tuple) -> float:
    deltas = [statistics.fmean(d) for d in per_task_deltas(records, method, setting, baseline, base_setting).values()
              if d]
    return statistics.fmean(deltas) if deltas else float("-inf")


def report_runs(protocol: Protocol, choice: Choice, methods: dict[str, Method]) -> list[RunSpec]:
    """The baseline, the chosen variant and ``also``, at their chosen settings, once on each report task."""
    if choice.selection_tasks != tuple(t.name for t in protocol.split.selection):
        raise HeldOutError("this choice was made on other selection tasks than this split's")
    names = tuple(dict.fromkeys((protocol.baseline, choice.variant, *protocol.also)))
    return [RunSpec("report", task, methods[m], protocol.budget, seed, choice.setting(m), protocol.eval_n, evals=1)
            for task in protocol.split.report for m in names for seed in protocol.report_seeds]
