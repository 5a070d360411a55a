"""How a played episode is scored, and which tasks are held out to score it on.

One answer to each question: ``EpisodeScore`` is what ``treegym eval``, the trainer's
held-out evaluation and SFT's evaluation report per episode, and ``heldout_prompts`` picks
the tasks they all play, so that ``treegym eval --n 32`` and a train run's 32 held-out
prompts are the same tasks. ``HeldOut`` holds the scores of a set of episodes, with their
intervals.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from treegym.agents.rollout.types import Prompt, RolloutBatch, Tree
from treegym.envs.core import success
from treegym.stats import Interval, bootstrap_interval, wilson_interval

# Seeds of the held-out set of an env that draws its tasks from the seed alone: far from the
# training stream's seeds (``1_000_003 * (seed + 1) + position``) for every small seed.
HELDOUT_SEED = 10**9


@dataclass(frozen=True)
class EpisodeScore:
    """One played episode.

    success: the env's terminal ``success`` (0 when the episode ended without it).
    well_formed: the share of its actions the env could parse (0 for an episode with none);
        a set of episodes reports the mean of these shares, every episode weighing the same.
    tool_calls: the tool calls its actions made. turns: the actions taken.
    """

    success: float
    well_formed: float
    tool_calls: int
    turns: int


def episode_score(info: dict[str, Any], invalid: Sequence[bool], tool_calls: int) -> EpisodeScore:
    """The score of an episode that ended with ``info``, one ``invalid`` flag per action."""
    turns = len(invalid)
    good = sum(not bad for bad in invalid) / turns if turns else 0.0
    return EpisodeScore(success(info), good, int(tool_calls), turns)


def chain_score(tree: Tree, leaf: int) -> EpisodeScore:
    """The score of the path from ``tree``'s root to ``leaf`` (one played chain)."""
    turns = [t for t in (tree.nodes[i].turn for i in tree.path(leaf)) if t is not None]
    info = turns[-1].info if turns else {}
    return episode_score(info, [t.invalid for t in turns], sum(t.tool_calls for t in turns))


FIELDS = tuple(f.name for f in fields(EpisodeScore))


@dataclass(frozen=True)
class HeldOut:
    """One ``EpisodeScore`` per played task, in task order: what ``treegym eval`` reports and
    what each phase of a train run keeps, so that two evaluations on the same tasks pair up."""

    scores: tuple[EpisodeScore, ...]

    @property
    def n(self) -> int:
        return len(self.scores)

    def values(self, name: str) -> list[float]:
        """One figure (``success``, ``well_formed``, ``tool_calls`` or ``turns``) per prompt."""
        return [float(getattr(s, name)) for s in self.scores]

    def mean(self, name: str) -> float:
        return sum(self.values(name)) / self.n if self.n else float("nan")

    @property
    def success_rate(self) -> float:
        return self.mean("success")

    def intervals(self) -> dict[str, Interval]:
        """Wilson for the success rate, the bootstrap for the means."""
        return {name: (wilson_interval if name == "success" else bootstrap_interval)(self.values(name)) for name in FIELDS}

    def to_dict(self) -> dict[str, list[float]]:
        return {name: self.values(name) for name in FIELDS}

    @staticmethod
    def from_dict(data: Mapping[str, Sequence[float]]) -> HeldOut:
        """Read ``to_dict``'s output, or the older one that named success ``em`` and kept no turns."""
        wins = data["success"] if "success" in data else data["em"]
        turns = data.get("turns", [0] * len(wins))
        return HeldOut(tuple(EpisodeScore(float(s), float(w), int(c), int(t))
                             for s, w, c, t in zip(wins, data["well_formed"], data["tool_calls"], turns)))

    @staticmethod
    def merge(parts: Sequence[HeldOut | None]) -> HeldOut:
        """One evaluation in task order again, from the parts of its processes: process ``r`` of
        ``len(parts)`` played tasks ``r, r + len(parts), ...`` (None: it had none)."""
        got = [p.scores if p is not None else () for p in parts]
        return HeldOut(tuple(got[i % len(got)][i // len(got)] for i in range(sum(map(len, got)))))


def heldout_from_batch(batch: RolloutBatch) -> HeldOut:
    """One score per prompt from a batch of one chain per prompt."""
    trees = {(t.prompt_index, t.tree_index): t for t in batch.trees}
    ordered = sorted(batch.rollouts, key=lambda r: r.prompt_index)
    return HeldOut(tuple(chain_score(trees[(r.prompt_index, r.tree_index)], r.leaf) for r in ordered))


def heldout_prompts(task_ids: Sequence[Any] | None, n: int) -> list[Prompt]:
    """The held-out set of ``n`` tasks: the first ``n`` of the split, in the split's order (more
    than the split holds goes round again), or ``n`` fixed seeds for an env without task ids."""
    if task_ids is None:
        return [HELDOUT_SEED + i for i in range(n)]
    if not task_ids:
        return []
    return [{"task_id": task_ids[i % len(task_ids)]} for i in range(n)]
