"""treegym environments: registration, and fork/snapshot for envs made by ``gym.make``."""

from __future__ import annotations

import copy

import gymnasium as gym

from treegym.envs.core import ForkableEnv, Snapshot, Tool, ToolCall, ToolError, UnicodeText
from treegym.envs.pool import EnvPool

ENV_IDS = ("TreeSearchQA-v0", "WebSearchQA-v0", "TextHousehold-v0")


def register_envs() -> None:
    """Register treegym's ids with gymnasium (idempotent)."""
    entries = {
        "TreeSearchQA-v0": "treegym.envs.tree_search_qa:TreeSearchQAEnv",
        "WebSearchQA-v0": "treegym.envs.web_search_qa:WebSearchQAEnv",
        "TextHousehold-v0": "treegym.envs.household.env:TextHouseholdEnv",
    }
    from treegym.envs.probes import PROBE_IDS

    for env_id, entry_point in {**entries, **PROBE_IDS}.items():
        if env_id not in gym.registry:
            # The env owns its turn budget (max_turns), so no TimeLimit wrapper.
            gym.register(id=env_id, entry_point=entry_point, disable_env_checker=False)


def _base(env: gym.Env) -> ForkableEnv:
    base = env.unwrapped
    if not isinstance(base, ForkableEnv):
        raise TypeError(f"{type(base).__name__} is not a treegym env: it cannot be forked or snapshotted")
    return base


def fork(env: gym.Env) -> gym.Env:
    """An independent copy of ``env`` in the same state, wrappers included.

    The wrapped env forks in O(state) (see ``ForkableEnv.fork``); each wrapper is copied
    around it, so per-wrapper bookkeeping (e.g. OrderEnforcing's has-reset flag) carries over.
    """
    _base(env)
    return copy.deepcopy(env)


def snapshot(env: gym.Env) -> Snapshot:
    """``env.unwrapped.snapshot()``, for an env made by ``gym.make``."""
    return _base(env).snapshot()


def restore(env: gym.Env, snap: Snapshot) -> None:
    """``env.unwrapped.restore(snap)``, for an env made by ``gym.make``."""
    _base(env).restore(snap)


__all__ = [
    "ENV_IDS",
    "EnvPool",
    "ForkableEnv",
    "Snapshot",
    "Tool",
    "ToolCall",
    "ToolError",
    "UnicodeText",
    "fork",
    "register_envs",
    "restore",
    "snapshot",
]


