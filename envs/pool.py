"""EnvPool: step many envs at once, with one batched backend call per shared tool.

Each env plans its action (phase one, a ``Plan`` value); the pool groups every planned call by
the tool that serves it, so forks and siblings that share one index make one FAISS search for
all their queries, and one HTTP tool fans all its requests out concurrently; then each env
resolves its own plan with its results (phase two). The pool keeps no env state: which envs it
steps is an argument of each ``step``; it keeps only counters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import gymnasium as gym

from treegym.envs.core import StepResult, base_env, run_grouped


@dataclass
class PoolStats:
    """Counters a trainer reports as budget: steps taken, tool calls made, batches issued."""

    steps: int = 0
    tool_calls: int = 0
    batches: int = 0
    tool_rounds: int = 0  # steps with at least one tool call: what a latency model charges
    calls_by_tool: dict[str, int] = field(default_factory=dict)


class EnvPool:
    """Steps treegym envs together: ``pool.step(envs, actions)``, one action per env."""

    def __init__(self) -> None:
        self.stats = PoolStats()

    def step(self, envs: Sequence[gym.Env], actions: Sequence[str]) -> list[StepResult]:
        """Step ``envs[i]`` with ``actions[i]``, batching their tool calls; the results in order."""
        if len(actions) != len(envs):
            raise ValueError(f"got {len(actions)} actions for {len(envs)} envs")
        bases = [base_env(e) for e in envs]
        plans = [env.plan(a) for env, a in zip(bases, actions)]
        results, batches = run_grouped([(env.tools, plan.calls) for env, plan in zip(bases, plans)])
        self.stats.tool_rounds += bool(batches)
        for name, n in batches:
            self.stats.batches += 1
            self.stats.tool_calls += n
            self.stats.calls_by_tool[name] = self.stats.calls_by_tool.get(name, 0) + n
        out = [env.resolve(plan, res) for env, plan, res in zip(bases, plans, results)]
        self.stats.steps += len(out)
        return out
