"""The env contract as executable checks, in the spirit of gymnasium's ``env_checker``.

``check_fork_contract(make_env, actions)`` plays ``actions`` through an env several ways and
raises ``ForkContractError`` naming the first broken promise. It is a chain of small checks,
each usable alone on a ``Case`` (the env, the actions and the reference episode):

- ``check_determinism``: a seeded reset, and the episode after it, are deterministic;
- ``check_fork_independence``: ``fork()``, ``copy.deepcopy`` and ``treegym.envs.fork`` through
  wrappers behave exactly like the original, and stepping one never changes the other;
- ``check_snapshot_round_trip``: a restored snapshot (also a pickled one) replays identically;
- ``check_no_tool_calls_on_fork``: snapshot, restore and fork make no tool call;
- ``check_two_phase``: ``plan`` leaves the state alone, a fork between the phases is harmless,
  and ``resolve`` refuses a plan made in another state;
- ``check_invalid_action``: a garbage action is an observation with ``info["invalid_action"]``;
- ``check_terminal_keys``: the terminal step's info holds ``success`` and the episode's
  ``tool_calls`` (and ``em`` where the env reports ``answers``), and a step after the end is
  refused with ``TreegymError``.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from treegym.envs.core import ForkableEnv, Plan, Tool
from treegym.errors import TreegymError


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


def _step_tuple(result: tuple, ignore_info: Sequence[str]) -> tuple:
    obs, reward, terminated, truncated, info = result
    kept = {k: v for k, v in info.items() if k not in ignore_info}
    return (obs, float(reward), bool(terminated), bool(truncated), repr(sorted(kept.items())))


def _trace(env: gym.Env, actions: Sequence[str], ignore_info: Sequence[str]) -> list[tuple]:
    out = []
    for action in actions:
        out.append(_step_tuple(env.step(action), ignore_info))
        if out[-1][2] or out[-1][3]:
            break
    return out


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ForkContractError(message)


@dataclass
class Case:
    """One env under check: how to make it, the episode prefix to play, the reference trace."""

    make_env: Callable[[], gym.Env]
    actions: Sequence[str]
    alt: Sequence[str]
    seed: int
    reset_options: dict[str, Any] | None
    ignore_info: Sequence[str]
    expected: list[tuple] | None = None  # the trace of actions[1:] after actions[0]

    def reset(self, env: gym.Env) -> None:
        env.reset(seed=self.seed, options=self.reset_options)

    def trace(self, env: gym.Env, actions: Sequence[str]) -> list[tuple]:
        return _trace(env, actions, self.ignore_info)


def _counted(base: ForkableEnv) -> Callable[[], int]:
    """Wrap ``base``'s tools in counters (forks share them); a function that reads the count."""
    counters = {name: _CountingTool(tool) for name, tool in base.tools.items()}
    base.tools = counters
    return lambda: sum(c.calls for c in counters.values())


def _prefixed(case: Case) -> tuple[gym.Env, ForkableEnv]:
    env = case.make_env()
    base = env.unwrapped
    _require(isinstance(base, ForkableEnv), f"{type(base).__name__} is not a ForkableEnv")
    case.reset(env)
    case.trace(env, case.actions[:1])
    return env, base


def check_determinism(case: Case) -> None:
    env = case.make_env()
    obs_a, _ = env.reset(seed=case.seed, options=case.reset_options)
    trace_a = case.trace(env, case.actions)
    obs_b, _ = env.reset(seed=case.seed, options=case.reset_options)
    trace_b = case.trace(env, case.actions)
    _require(obs_a == obs_b, "reset(seed) gave two different opening observations")
    _require(trace_a == trace_b, "the same seed and actions gave two different episodes")
    case.expected = trace_a[1:]


def check_no_tool_calls_on_fork(case: Case) -> None:
    from treegym.envs import fork as fork_wrapped

    env, base = _prefixed(case)
    n_calls = _counted(base)
    snap = base.snapshot()
    base.fork()
    copy.deepcopy(base)
    fork_wrapped(env)
    base.restore(snap)
    _require(n_calls() == 0, "snapshot(), restore() or fork() made a tool call")


def check_fork_independence(case: Case) -> None:
    from treegym.envs import fork as fork_wrapped

    env, base = _prefixed(case)
    snap = base.snapshot()
    for label, child in (("fork()", base.fork()), ("copy.deepcopy", copy.deepcopy(base)),
                         ("treegym.envs.fork(env) through wrappers", fork_wrapped(env))):
        _require(case.trace(child, case.actions[1:]) == case.expected, f"{label} behaved differently from the original")
    other = base.fork()
    case.trace(other, case.alt)
    _require(base.snapshot() == snap, "stepping a fork changed the original's state")
    _require(case.trace(env, case.actions[1:]) == case.expected, "the original behaved differently after its fork was stepped")


def check_snapshot_round_trip(case: Case) -> None:
    env, base = _prefixed(case)
    snap = base.snapshot()
    _require(pickle.loads(pickle.dumps(snap)) == snap, "a snapshot is not equal to itself after pickling")
    case.trace(env, case.alt)
    for label, s in (("snapshot", snap), ("pickled snapshot", pickle.loads(pickle.dumps(snap)))):
        base.restore(s)
        _require(case.trace(env, case.actions[1:]) == case.expected, f"a restored {label} behaved differently")


def check_two_phase(case: Case) -> None:
    from treegym.envs.core import execute_calls

    env, base = _prefixed(case)
    before = base.snapshot()
    plan = base.plan(case.actions[1])
    _require(isinstance(plan, Plan), f"plan() returned {type(plan).__name__}, not a Plan")
    _require(base.snapshot() == before, "plan() changed the env's state")
    child = base.fork()  # between the phases: harmless
    results = execute_calls(base.tools, plan.calls)
    got = _step_tuple(child.resolve(plan, results), case.ignore_info)
    _require(got == case.expected[0], "resolving a plan on a fork made between the phases differed from a step")
    _require(base.snapshot() == before, "resolving on a fork changed the original")
    got = _step_tuple(base.resolve(plan, results), case.ignore_info)
    _require(got == case.expected[0], "plan() then resolve() differed from step()")
    try:
        base.resolve(plan, results)
    except TreegymError:
        pass
    else:
        raise ForkContractError("resolve() accepted a plan made in an earlier state")


def check_invalid_action(case: Case, action: str = "%%% <not an action> %%%") -> None:
    env = case.make_env()
    case.reset(env)
    obs, _, _, _, info = env.step(action)
    _require(isinstance(obs, str), "an invalid action did not yield a text observation")
    _require(info.get("invalid_action") is True, "an invalid action did not set info['invalid_action']")


def check_terminal_keys(case: Case, action: str = "%%% <not an action> %%%", max_steps: int = 500) -> None:
    env = case.make_env()
    case.reset(env)
    for _ in range(max_steps):
        _, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
    else:
        raise ForkContractError(f"{max_steps} invalid actions did not end the episode: the env has no turn budget")
    _require("success" in info, "the terminal step's info has no 'success'")
    _require(isinstance(info.get("tool_calls"), int), "the info has no 'tool_calls' count (0 for an env without tools)")
    _require(float(info["success"]) in (0.0, 1.0), f"info['success'] must be 0.0 or 1.0, got {info['success']!r}")
    if "answers" in info:
        _require("em" in info, "a QA env's terminal info has 'answers' but no 'em'")
    try:
        env.step(action)
    except TreegymError:
        pass
    else:
        raise ForkContractError("a step after the episode ended was not refused with TreegymError")


CHECKS = (check_determinism, check_no_tool_calls_on_fork, check_fork_independence, check_snapshot_round_trip,
          check_two_phase, check_invalid_action, check_terminal_keys)


def check_fork_contract(
    make_env: Callable[[], gym.Env],
    actions: Sequence[str],
    *,
    alt_actions: Sequence[str] = (),
    seed: int = 0,
    reset_options: dict[str, Any] | None = None,
    ignore_info: Sequence[str] = (),
) -> None:
    """Run every check in ``CHECKS`` on the env that ``make_env`` builds.

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
    case = Case(make_env, list(actions), list(alt_actions) or list(reversed(actions[1:])), seed, reset_options,
                tuple(ignore_info))
    for check in CHECKS:
        check(case)
