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
    FAMILIES,
    VARIANTS,
    Family,
    family,
    make,
    register_envs,
    register_family,
    training_id,
)
from treegym.errors import SnapshotError


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


def _wrapper_chain(env: gym.Env) -> list[gym.Wrapper]:
    chain = []
    while isinstance(env, gym.Wrapper):
        chain.append(env)
        env = env.env
    return chain


def _wrapper_problem(wrapper: gym.Wrapper, attrs: object) -> str | None:
    """What is wrong with ``attrs`` as the state of ``wrapper``: only attributes that
    ``_wrapper_state`` saves, each of the type it has now (or None where it is None)."""
    if not isinstance(attrs, tuple) or not all(isinstance(a, tuple) and len(a) == 2 for a in attrs):
        return "is not (attribute, value) pairs"
    own = dict(_wrapper_state(wrapper)) if type(wrapper) not in _BOOKKEEPING else {}
    for key, value in attrs:
        if not isinstance(key, str) or key not in own:
            return f"names {str(key)[:40]!r}, which it does not save"
        now = own[key]
        if value is not None and now is not None and type(value) is not type(now):
            return f"has {key} of type {type(value).__name__}, not {type(now).__name__}"
    return None


def _wrapper_state(wrapper: gym.Wrapper) -> tuple[tuple[str, object], ...]:
    # What fork copies (see _copy_wrapper), as a value: the wrapper's own attributes, mutable
    # ones deep-copied so that later steps do not reach into the snapshot. A bookkeeping
    # wrapper's flags record checks done once per wrapper (PassiveEnvChecker), not the episode.
    if type(wrapper) in _BOOKKEEPING:
        return ()
    return tuple(sorted(
        (key, value if type(value) in _ATOMIC else copy.deepcopy(value))
        for key, value in wrapper.__dict__.items()
        if key not in _SHARED_KEYS and not isinstance(value, _SHARED)
    ))


def snapshot(env: gym.Env) -> Snapshot:
    """The state of ``env`` (made by ``gym.make``, or any wrappers over a treegym env): the treegym
    env's ``snapshot()`` plus each wrapper's own state, as ``fork`` carries it."""
    snap = base_env(env).snapshot()
    chain = _wrapper_chain(env)
    if not chain:
        return snap
    wrappers = tuple((type(w).__qualname__, _wrapper_state(w)) for w in chain)
    return Snapshot(snap.env_class, snap.state, wrappers)


def restore(env: gym.Env, snap: Snapshot) -> None:
    """Put ``env`` and its wrappers back into ``snap``'s state (``snapshot(env)``'s). A snapshot
    without wrapper state (an env's own ``snapshot()``) restores the treegym env alone."""
    inner = base_env(env)
    chain = _wrapper_chain(env)
    if snap.wrappers and [name for name, _ in snap.wrappers] != [type(w).__qualname__ for w in chain]:
        raise ValueError(f"snapshot of an env wrapped in {[name for name, _ in snap.wrappers]} cannot restore one "
                         f"wrapped in {[type(w).__qualname__ for w in chain]}")
    for wrapper, (name, attrs) in zip(chain, snap.wrappers):
        problem = _wrapper_problem(wrapper, attrs)
        if problem:
            raise SnapshotError(f"snapshot refused: its state of wrapper {name} {problem}; restore only what "
                                "snapshot(env) returned")
    inner.restore(snap)
    for wrapper, (_, attrs) in zip(chain, snap.wrappers):
        for key, value in attrs:
            setattr(wrapper, key, value if type(value) in _ATOMIC else copy.deepcopy(value))


__all__ = [
    "FAMILIES",
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


