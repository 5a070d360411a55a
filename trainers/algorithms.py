"""Each algorithm is a small record: which sampler, which advantage function, which loss.

The loop (``treegym.trainers.loop``) is shared; swapping the record swaps the algorithm.

- ``grpo``: G independent chains per prompt; group-normalised outcome reward; PPO clip.
- ``tree-grpo``: m trees per prompt grown by forking envs at agent turns (n nodes per round,
  l rounds, k leaves kept per tree); inter-tree + intra-tree normalised leaf reward; PPO clip.
- ``treeopsd``: the same trees; backed-up turn credit V(child) - V(parent); a bounded
  teacher-student divergence (see ``treegym.trainers.losses.treeopsd_loss``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from treegym.errors import ConfigError
from treegym.trainers.config import TrainConfig


@dataclass(frozen=True)
class Algorithm:
    name: str
    sampler: str  # "chains" or "trees"
    advantage: str  # a name in treegym.trainers.advantages.ADVANTAGES
    loss: str  # a name in treegym.trainers.losses.POLICY_LOSSES


ALGORITHMS: dict[str, Algorithm] = {
    "grpo": Algorithm("grpo", sampler="chains", advantage="grpo", loss="ppo-clip"),
    "tree-grpo": Algorithm("tree-grpo", sampler="trees", advantage="tree-grpo", loss="ppo-clip"),
    "treeopsd": Algorithm("treeopsd", sampler="trees", advantage="treeopsd", loss="treeopsd"),
}


def get_algorithm(name: str) -> Algorithm:
    if name not in ALGORITHMS:
        raise ConfigError(f"algorithm {name!r} is not one of: {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]


def advantage_kwargs(algo: Algorithm, cfg: TrainConfig) -> dict[str, Any]:
    """The advantage function's options, read from the config."""
    a = cfg.advantage
    return {
        "grpo": {"use_std": a.use_std},
        "tree-grpo": {"mode": a.tree_mode, "prefix_credit": a.prefix_credit},
        "treeopsd": {"normalize_std": a.normalize_std, "root": a.opsd_root, "fallback": a.opsd_fallback},
    }.get(algo.advantage, {})


def loss_kwargs(algo: Algorithm, cfg: TrainConfig) -> dict[str, Any]:
    """The policy loss's options, read from the config."""
    lc = cfg.loss
    common = {"agg": lc.agg, "constant": lc.constant_normalizer}
    if algo.loss == "ppo-clip":
        return {**common, "clip": lc.clip, "dual_clip": lc.dual_clip or None}
    return {**common, "beta": lc.beta, "eps": lc.eps}


def leaves_per_prompt(algo: Algorithm, cfg: TrainConfig) -> int:
    """Trajectories each prompt contributes to a batch."""
    s = cfg.sampler
    return s.group_size if algo.sampler == "chains" else s.trees * s.leaves
