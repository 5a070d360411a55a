"""Held-out evaluation of a policy, per prompt, so that before/after can be compared pairwise.

One protocol for every phase of a run (the untrained model, the warm start, the end of RL):
one chain per held-out prompt, greedy by default, the trainer's turn budget and context. The
result keeps one value per prompt, in prompt order, so that two evaluations on the same
prompts give a paired difference with its interval (``paired_difference``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from treegym.agents.eval import Interval, bootstrap_interval, wilson_interval
from treegym.agents.policy import Policy
from treegym.agents.rollout.types import RolloutBatch
from treegym.envs.core import success
from treegym.trainers import runtime as rt
from treegym.trainers.config import TrainConfig


@dataclass(frozen=True)
class HeldOut:
    """Per held-out prompt: EM (success for envs without an answer), well-formed share of its
    actions, and tool calls of its episode."""

    em: tuple[float, ...]
    well_formed: tuple[float, ...]
    tool_calls: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.em)

    @property
    def em_rate(self) -> float:
        return sum(self.em) / self.n if self.n else float("nan")

    def intervals(self) -> dict[str, Interval]:
        return {"em": wilson_interval(self.em), "well_formed": bootstrap_interval(self.well_formed),
                "tool_calls": bootstrap_interval(self.tool_calls)}  # fmt: skip

    def to_dict(self) -> dict[str, list[float]]:
        return {k: list(v) for k, v in asdict(self).items()}

    @staticmethod
    def from_dict(data: dict[str, Sequence[float]]) -> HeldOut:
        return HeldOut(tuple(data["em"]), tuple(data["well_formed"]), tuple(data["tool_calls"]))

    @staticmethod
    def merge(parts: Sequence[HeldOut | None]) -> HeldOut:
        """Concatenate the per-process parts of one evaluation, in rank order."""
        got = [p for p in parts if p is not None]
        return HeldOut(*(tuple(x for p in got for x in getattr(p, f)) for f in ("em", "well_formed", "tool_calls")))


def heldout_from_batch(batch: RolloutBatch) -> HeldOut:
    """One value per prompt from a batch of one chain per prompt."""
    trees = {(t.prompt_index, t.tree_index): t for t in batch.trees}
    em, good, calls = [], [], []
    for r in sorted(batch.rollouts, key=lambda r: r.prompt_index):
        tree = trees[(r.prompt_index, r.tree_index)]
        turns = [tree.nodes[i].turn for i in r.node_path]
        turns = [t for t in turns if t is not None]
        em.append(success(r.info))
        good.append(sum(not t.invalid for t in turns) / len(turns) if turns else 0.0)
        calls.append(float(sum(t.tool_calls for t in turns)))
    return HeldOut(tuple(em), tuple(good), tuple(calls))


def evaluate_policy(policy: Policy, env: Any, prompts: Sequence[Any], cfg: TrainConfig, mode: str,
                    temperature: float, progress: bool = False) -> HeldOut | None:
    """``policy`` on ``prompts``: one chain each, with the trainer's turn budget and context
    (the caller holds no_grad and autocast); None when there are no prompts. ``progress`` shows
    a bar of agent turns (at most prompts x max_turns)."""
    from treegym.agents.rollout.samplers import sample_chains

    if not prompts:
        return None
    s = cfg.sampler
    params = rt.sampling_params(cfg, temperature=temperature, top_p=1.0)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(prompts) * s.max_turns, desc=f"held-out eval ({len(prompts)} prompts)", unit="turn", leave=False)
    try:
        batch = sample_chains(policy, env, list(prompts), 1, params, max_turns=s.max_turns, mode=mode,  # type: ignore[arg-type]
                              max_context_tokens=s.max_context_tokens, progress=bar)
    finally:
        if bar is not None:
            bar.close()
    return heldout_from_batch(batch)


def paired_difference(after: HeldOut, before: HeldOut, field: str = "em") -> Interval:
    """Mean of after - before over the shared prompts, with its 95% bootstrap interval."""
    a, b = getattr(after, field), getattr(before, field)
    if len(a) != len(b):
        raise ValueError(f"paired difference needs the same prompts: {len(a)} vs {len(b)}")
    return bootstrap_interval([x - y for x, y in zip(a, b)])
