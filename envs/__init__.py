"""treegym environments: the factory (``make``), registration, and fork/snapshot for envs made by ``gym.make``."""

from __future__ import annotations

import copy

import gymnasium as gym

from treegym.envs.core import ForkableEnv, Snapshot, Tool, ToolCall, ToolError, UnicodeText
from treegym.envs.pool import EnvPool
from treegym.envs.registry import ENV_IDS, VARIANTS, make, register_envs, training_id


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
    "VARIANTS",
    "fork",
    "make",
    "register_envs",
    "restore",
    "snapshot",
    "training_id",
]


