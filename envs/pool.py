"""EnvPool: step many envs at once, with one batched backend call per shared tool.

Each env plans its action (phase one); the pool groups every pending call by the tool object
that serves it, so forks and siblings that share one index make one FAISS search for all
their queries, and one HTTP tool fans all its requests out concurrently; then each env
resolves its own results (phase two).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from treegym.envs.core import ForkableEnv, StepResult, Tool, ToolCall


@dataclass
class PoolStats:
    """Counters a trainer reports as budget: steps taken, tool calls made, batches issued."""

    steps: int = 0
    tool_calls: int = 0
    batches: int = 0
    calls_by_tool: dict[str, int] = field(default_factory=dict)


class EnvPool:
    """A list of forkable envs stepped together. Envs may come and go between steps."""

    def __init__(self, envs: Sequence[gym.Env] = ()) -> None:
        self.envs: list[ForkableEnv] = [_unwrap(e) for e in envs]
        self.stats = PoolStats()

    def __len__(self) -> int:
        return len(self.envs)

    def add(self, env: gym.Env) -> int:
        self.envs.append(_unwrap(env))
        return len(self.envs) - 1

    def step(self, actions: dict[int, str] | Sequence[str]) -> dict[int, StepResult]:
        """Step the envs named by ``actions`` (index -> action, or one action per env)."""
        if not isinstance(actions, dict):
            if len(actions) != len(self.envs):
                raise ValueError(f"got {len(actions)} actions for {len(self.envs)} envs")
            actions = dict(enumerate(actions))
        plans: dict[int, list[ToolCall]] = {i: self.envs[i].plan(a) for i, a in actions.items()}
        results = run_grouped(
            [(self.envs[i].tools, plans[i]) for i in plans],
            self.stats,
        )
        out = {i: self.envs[i].resolve(res) for i, res in zip(plans, results)}
        self.stats.steps += len(out)
        return out


def run_grouped(requests: Sequence[tuple[dict[str, Tool], Sequence[ToolCall]]], stats: PoolStats | None = None) -> list[list[Any]]:
    """Execute each (tools, calls) request, batching calls that go to the same tool object."""
    groups: dict[int, tuple[str, Tool, list[tuple[int, int]]]] = {}
    for r, (tools, calls) in enumerate(requests):
        for c, call in enumerate(calls):
            if call.tool not in tools:
                raise KeyError(f"env has no tool {call.tool!r} (has {sorted(tools)})")
            tool = tools[call.tool]
            groups.setdefault(batch_key(tool), (call.tool, tool, []))[2].append((r, c))
    results: list[list[Any]] = [[None] * len(calls) for _, calls in requests]
    for name, tool, slots in groups.values():
        out = tool.call_batch([requests[r][1][c].payload for r, c in slots])
        if len(out) != len(slots):
            raise RuntimeError(f"tool {name!r} returned {len(out)} results for {len(slots)} calls")
        for (r, c), value in zip(slots, out):
            results[r][c] = value
        if stats is not None:
            stats.batches += 1
            stats.tool_calls += len(slots)
            stats.calls_by_tool[name] = stats.calls_by_tool.get(name, 0) + len(slots)
    return results


def batch_key(tool: Tool) -> object:
    """Tools with equal keys serve each other's calls: envs built separately over one index
    have separate tool objects but should still share one batched search."""
    key = getattr(tool, "batch_key", None)
    return ("key", key) if key is not None else ("id", id(tool))


def _unwrap(env: gym.Env) -> ForkableEnv:
    base = env.unwrapped
    if not isinstance(base, ForkableEnv):
        raise TypeError(f"EnvPool needs treegym envs (ForkableEnv), got {type(base).__name__}")
    return base
