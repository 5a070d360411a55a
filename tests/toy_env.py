"""A minimal forkable env used to test the contract machinery itself (not a product env)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from treegym.agents.experts import expert
from treegym.envs.core import ForkableEnv, Plan, StepResult, ToolCall, require_running


class SquareTool:
    """A backend that squares numbers and counts its batches."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def call_batch(self, payloads: Sequence[Any]) -> list[Any]:
        self.batches.append(len(payloads))
        return [int(p) ** 2 for p in payloads]


@dataclass(frozen=True)
class ToyState:
    target: int
    total: int = 0
    turn: int = 0
    tool_calls: int = 0


class ToyEnv(ForkableEnv[ToyState]):
    """Action: an integer; the env adds its square. Reward 1 when the total hits the target."""

    def __init__(self, tool: SquareTool | None = None, max_turns: int = 6) -> None:
        super().__init__(max_obs_chars=200, max_action_chars=200)
        self.tools = {"square": tool or SquareTool()}
        self.max_turns = max_turns

    def _reset_state(self, options: dict[str, Any]) -> tuple[ToyState, str, dict[str, Any]]:
        target = int(options.get("target", self.np_random.integers(5, 50)))
        return ToyState(target=target), f"reach {target}", {}

    def plan(self, action: str) -> Plan:
        s = self.state
        require_running(s, s is not None and (s.total == s.target or s.turn >= self.max_turns))
        try:
            return self.make_plan([ToolCall("square", int(action))])
        except ValueError:
            return self.make_plan([], parsed="invalid")

    def resolve(self, plan: Plan, results: Sequence[Any]) -> StepResult:
        self.check_plan(plan)
        parsed, s = plan.parsed, self.state
        add = results[0] if results else 0
        self.state = s = replace(s, total=s.total + add, turn=s.turn + 1, tool_calls=s.tool_calls + len(plan.calls))
        won = s.total == s.target
        obs = "invalid" if parsed == "invalid" else f"total {s.total}"
        trunc = s.turn >= self.max_turns and not won
        info: dict[str, Any] = {"turn": s.turn, "invalid_action": parsed == "invalid", "tool_calls": s.tool_calls}
        if won or trunc:
            info["success"] = float(won)
        return obs, float(won), won, trunc, info


class LeakyToyEnv(ToyEnv):
    """Breaks the contract on purpose: keeps a mutable list shared between forks."""

    def _reset_state(self, options: dict[str, Any]) -> tuple[ToyState, str, dict[str, Any]]:
        self.log: list[int] = []
        return super()._reset_state(options)

    def resolve(self, plan: Plan, results: Sequence[Any]) -> StepResult:
        obs, r, term, trunc, info = super().resolve(plan, results)
        self.log.append(self.state.total)
        return f"{obs} after {len(self.log)} steps", r, term, trunc, info


class ToyExpert:
    """The toy family's scripted expert: the largest square that still fits, read from the chat."""

    def act(self, messages: Sequence[dict[str, str]]) -> str:
        target = int(messages[0]["content"].split()[-1])
        last = messages[-1]["content"] if len(messages) > 1 else "total 0"
        left = target - int(last.split()[-1])
        return str(max(k for k in range(1, 8) if k * k <= left)) if left > 0 else "1"


@expert("heuristic", ToyEnv)
def toy_expert(max_turns: int | None) -> ToyExpert:
    return ToyExpert()


def toy_family() -> Any:
    """ToyEnv as an env family: its record is all a new family adds outside its own files."""
    from treegym.envs.registry import Family

    return Family(id="ToySquares-v0", entry_point="toy_env:ToyEnv", max_turns=6, max_new_tokens=4,
                  max_context_tokens=512, warm_start_episodes=4, expert="heuristic", training="ToySquares-Train-v0", training_kwargs={"max_turns": 6},
                  score="success")
