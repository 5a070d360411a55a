"""The fork contract as executable checks, in the spirit of gymnasium's ``env_checker``.

``check_fork_contract(make_env, actions)`` plays ``actions`` through an env several ways
and raises ``ForkContractError`` naming the first broken promise:

- a seeded reset is deterministic;
- ``fork()`` (and ``copy.deepcopy``, and ``treegym.envs.fork`` through wrappers) makes an
  env that behaves exactly like the original, and stepping one never changes the other;
- a snapshot, restored, yields identical later behaviour, also after a pickle round trip;
- snapshot, restore and fork make no tool call.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

from treegym.envs.core import ForkableEnv, Tool


class ForkContractError(AssertionError):
    """An env broke the snapshot/fork contract."""


class _CountingTool:
    """Wraps a tool and counts the payloads it is asked to serve."""

    def __init__(self, tool: Tool) -> None:
        self.tool = tool
        self.calls = 0

    def call_batch(self, payloads: Sequence[Any]) -> list[Any]:
        self.calls += len(payloads)
        return self.tool.call_batch(payloads)


def _trace(env: gym.Env, actions: Sequence[str], ignore_info: Sequence[str]) -> list[tuple]:
    out = []
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        kept = {k: v for k, v in info.items() if k not in ignore_info}
        out.append((obs, float(reward), bool(terminated), bool(truncated), repr(sorted(kept.items()))))
        if terminated or truncated:
            break
    return out


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ForkContractError(message)


def check_fork_contract(
    make_env: Callable[[], gym.Env],
    actions: Sequence[str],
    *,
    alt_actions: Sequence[str] = (),
    seed: int = 0,
    reset_options: dict[str, Any] | None = None,
    ignore_info: Sequence[str] = (),
) -> None:
    """Check the fork/snapshot contract of the env that ``make_env`` builds.

    Args:
        make_env: builds a fresh env (``gym.make`` result or a bare treegym env).
        actions: a valid episode prefix; ``actions[0]`` is played before forking, the rest after.
            Use at least three actions, so that behaviour after the fork is tested.
        alt_actions: a different continuation played on the fork, to show the original does
            not see it. Defaults to ``actions[1:]`` reversed.
        seed: the reset seed.
        reset_options: passed to ``reset``.
        ignore_info: info keys that may differ between runs (timings).
    """
    if len(actions) < 2:
        raise ValueError("check_fork_contract needs at least two actions")
    alt = list(alt_actions) or list(reversed(actions[1:]))
    env = make_env()
    base = env.unwrapped
    _require(isinstance(base, ForkableEnv), f"{type(base).__name__} is not a ForkableEnv")

    # Seeded reset is deterministic, and so is the episode that follows it.
    obs_a, _ = env.reset(seed=seed, options=reset_options)
    trace_a = _trace(env, actions, ignore_info)
    obs_b, _ = env.reset(seed=seed, options=reset_options)
    trace_b = _trace(env, actions, ignore_info)
    _require(obs_a == obs_b, "reset(seed) gave two different opening observations")
    _require(trace_a == trace_b, "the same seed and actions gave two different episodes")

    # From here on, count tool calls.
    counters = {name: _CountingTool(tool) for name, tool in base.tools.items()}
    base.tools = counters

    def n_calls() -> int:
        return sum(c.calls for c in counters.values())

    env.reset(seed=seed, options=reset_options)
    _trace(env, actions[:1], ignore_info)
    before = n_calls()
    snap = base.snapshot()
    forks = [base.fork(), copy.deepcopy(base)]
    from treegym.envs import fork as fork_wrapped

    wrapped_fork = fork_wrapped(env)
    _require(n_calls() == before, "snapshot() or fork() made a tool call")
    _require(pickle.loads(pickle.dumps(snap)) == snap, "a snapshot is not equal to itself after pickling")

    expected = trace_a[1:]
    for i, child in enumerate(forks):
        _require(_trace(child, actions[1:], ignore_info) == expected, f"fork #{i} behaved differently from the original")
    _require(_trace(wrapped_fork, actions[1:], ignore_info) == expected, "treegym.envs.fork(env) through wrappers behaved differently")

    # Stepping a fork down another path leaves the original untouched.
    other = base.fork()
    _trace(other, alt, ignore_info)
    _require(base.snapshot() == snap, "stepping a fork changed the original's state")
    _require(_trace(env, actions[1:], ignore_info) == expected, "the original behaved differently after its fork was stepped")

    # Restoring a snapshot (also a pickled one) replays identically.
    for label, s in (("snapshot", snap), ("pickled snapshot", pickle.loads(pickle.dumps(snap)))):
        calls = n_calls()
        base.restore(s)
        _require(n_calls() == calls, "restore() made a tool call")
        _require(_trace(env, actions[1:], ignore_info) == expected, f"a restored {label} behaved differently")
