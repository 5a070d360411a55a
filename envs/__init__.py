"""treegym environments: the factory (``make``), registration, and fork/snapshot for envs made by ``gym.make``."""

from __future__ import annotations

import copy

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec

from treegym.envs.core import (
    BOOKKEEPING_WRAPPERS,
    ForkableEnv,
    NotForkableError,
    Plan,
    Snapshot,
    Tool,
    ToolCall,
    ToolError,
    UnicodeText,
    base_env,
)
from treegym.envs.pool import EnvPool
from treegym.envs.registry import (
    ENV_IDS,
    VARIANTS,
    Family,
    family,
    make,
    register_envs,
    register_family,
    training_id,
)


def fork(env: gym.Env) -> gym.Env:
    """An independent copy of ``env`` in the same state, wrappers included.

    The treegym env at the bottom forks in O(state) (``ForkableEnv.fork``). Each wrapper above it
    is copied shallowly around the fork, and only its own mutable attributes (a counter dict, a
    history list) are deep-copied, so per-wrapper bookkeeping (OrderEnforcing's has-reset flag,
    a user wrapper's episode log) carries over without copying spaces or specs.
    ``copy.deepcopy(env)`` gives the same result, at several times the cost.
    """
    chain = []
    inner = env
    while isinstance(inner, gym.Wrapper):
        chain.append(inner)
        inner = inner.env
    if not isinstance(inner, ForkableEnv):
        base_env(inner)  # raises, naming what it is
    new = inner.fork()
    for wrapper in reversed(chain):
        new = _copy_wrapper(wrapper, new)
    return new


_ATOMIC = frozenset({int, float, bool, str, bytes, type(None), frozenset})
_SHARED = (gym.Space, EnvSpec)
# gymnasium's record of a wrapper's constructor arguments (written once, only read after), and
# PassiveEnvChecker's last (obs, info), kept only to test identity.
_SHARED_KEYS = frozenset({"env", "_saved_kwargs", "_previous_data"})
_BOOKKEEPING = frozenset(BOOKKEEPING_WRAPPERS)


def _copy_wrapper(wrapper: gym.Wrapper, inner: gym.Env) -> gym.Wrapper:
    cls = type(wrapper)
    new = object.__new__(cls)
    state = wrapper.__dict__.copy()
    if cls not in _BOOKKEEPING:  # their attributes are flags and shared records only
        for key, value in state.items():
            if type(value) not in _ATOMIC and key not in _SHARED_KEYS and not isinstance(value, _SHARED):
                state[key] = copy.deepcopy(value)
    state["env"] = inner
    new.__dict__ = state
    return new


def public_info(env: gym.Env, info: dict) -> dict:
    """``info`` without the env's labels (``ForkableEnv.label_keys``): what may cross a wire.
    Scoring keys (``success``, ``em``, ``f1``) stay; a trainer that needs a label asks the env."""
    labels = base_env(env).label_keys
    return {k: v for k, v in info.items() if k not in labels}


def snapshot(env: gym.Env) -> Snapshot:
    """``env.unwrapped.snapshot()``, for an env made by ``gym.make``."""
    return base_env(env).snapshot()


def restore(env: gym.Env, snap: Snapshot) -> None:
    """``env.unwrapped.restore(snap)``, for an env made by ``gym.make``."""
    base_env(env).restore(snap)


__all__ = [
    "ENV_IDS",
    "EnvPool",
    "Family",
    "ForkableEnv",
    "NotForkableError",
    "Plan",
    "Snapshot",
    "Tool",
    "ToolCall",
    "ToolError",
    "UnicodeText",
    "VARIANTS",
    "base_env",
    "family",
    "fork",
    "make",
    "public_info",
    "register_envs",
    "register_family",
    "restore",
    "snapshot",
    "training_id",
]


