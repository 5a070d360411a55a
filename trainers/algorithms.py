"""Each algorithm is a small record of three functions: how it samples, how it credits, what it
minimises. The loop (``treegym.trainers.loop``) is shared and calls them; it never asks an
algorithm's name.

- ``grpo``: G independent chains per prompt; group-normalised outcome reward; PPO clip.
- ``tree-grpo``: m trees per prompt grown by forking envs at agent turns (n nodes per round,
  l rounds, k leaves kept per tree); inter-tree + intra-tree normalised leaf reward; PPO clip.
- ``treeopsd``: the same trees; backed-up turn credit V(child) - V(parent), blended by default
  with the outcome advantage (λ = ``advantage.opsd_lambda`` = 0.5); a bounded teacher-student
  divergence (see ``treegym.trainers.losses.treeopsd_loss``).

Each function reads its own options from the config (``advantage_options``, ``loss_options``),
so an estimator or loss gets exactly the keywords it declares.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from treegym.agents.policy import Policy, SamplingParams
from treegym.agents.rollout.samplers import sample_chains, sample_trees
from treegym.agents.rollout.types import RolloutBatch
from treegym.errors import ConfigError
from treegym.trainers import advantages, losses
from treegym.trainers.config import TrainConfig

# (policy, env, prompts, cfg, sampling params, context mode, seed) -> batch
Sampler = Callable[[Policy, Any, list, TrainConfig, SamplingParams, str, int], RolloutBatch]


def _common(cfg: TrainConfig, mode: str) -> dict[str, Any]:
    return {"max_turns": cfg.sampler.max_turns, "mode": mode, "max_context_tokens": cfg.sampler.max_context_tokens}


def chains(policy: Policy, env: Any, prompts: list, cfg: TrainConfig, params: SamplingParams, mode: str,
           seed: int) -> RolloutBatch:
    """G independent chains per prompt (``sampler.group_size``)."""
    return sample_chains(policy, env, prompts, cfg.sampler.group_size, params, **_common(cfg, mode))


def trees(policy: Policy, env: Any, prompts: list, cfg: TrainConfig, params: SamplingParams, mode: str,
          seed: int) -> RolloutBatch:
    """Tree-GRPO's agent-step trees (``sampler.trees/expand_nodes/rounds/leaves/expansion``)."""
    s = cfg.sampler
    return sample_trees(policy, env, prompts, m=s.trees, n=s.expand_nodes, l=s.rounds, k=s.leaves, params=params,
                        expansion=s.expansion, seed=seed, distinct=s.distinct, distinct_retries=s.distinct_retries,
                        distinct_exclude=s.distinct_exclude, distinct_actions=s.distinct_actions,
                        **_common(cfg, mode))


def tree_leaves(cfg: TrainConfig) -> int:
    return cfg.sampler.trees * cfg.sampler.leaves


def ppo_options(cfg: TrainConfig) -> dict[str, Any]:
    lc = cfg.loss
    return {"agg": lc.agg, "constant": lc.constant_normalizer, "clip": lc.clip, "dual_clip": lc.dual_clip or None}


def opsd_loss_options(cfg: TrainConfig) -> dict[str, Any]:
    lc = cfg.loss
    return {"agg": lc.agg, "constant": lc.constant_normalizer, "beta": lc.beta, "eps": lc.eps}


@dataclass(frozen=True)
class Algorithm:
    sample: Sampler
    leaves_per_prompt: Callable[[TrainConfig], int]  # trajectories each prompt adds to a batch
    advantage: advantages.AdvantageFn
    advantage_options: Callable[[TrainConfig], dict[str, Any]]
    loss: Callable[..., losses.LossOutput]
    loss_options: Callable[[TrainConfig], dict[str, Any]]


ALGORITHMS: dict[str, Algorithm] = {
    "grpo": Algorithm(chains, lambda c: c.sampler.group_size, advantages.grpo, lambda c: {"use_std": c.advantage.use_std},
                      losses.ppo_clip_loss, ppo_options),
    "tree-grpo": Algorithm(trees, tree_leaves, advantages.tree_grpo,
                           lambda c: {"mode": c.advantage.tree_mode, "prefix_credit": c.advantage.prefix_credit},
                           losses.ppo_clip_loss, ppo_options),
    "treeopsd": Algorithm(trees, tree_leaves, advantages.treeopsd,
                          lambda c: {"normalize_std": c.advantage.normalize_std, "root": c.advantage.opsd_root,
                                     "fallback": c.advantage.opsd_fallback, "blend": c.advantage.opsd_lambda},
                          losses.treeopsd_loss, opsd_loss_options),
}


def get_algorithm(name: str) -> Algorithm:
    if name not in ALGORITHMS:
        raise ConfigError(f"algorithm {name!r} is not one of: {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]
