"""``QAEnv``: the base of the QA envs (TreeSearchQA-v0, WebSearchQA-v0).

What they share: a question per episode drawn from the env's items (or pinned by task id), the
ReAct turn (``<think>`` then one tag), the turn budget, the reward (EM, F1 or Tree-GRPO's format
table), the terminal keys of the contract (``success``, ``em``, ``answers``) and the render line.
A subclass names its prompt, tags and invalid-action message, says which tool calls a parsed
tool tag needs (``tool_calls``), and turns a tool's result into the state and the observation
(``observe``): one hook each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, TypeVar

from treegym.envs import core
from treegym.envs.core import ForkableEnv, Plan, StepResult, ToolCall, ToolError
from treegym.envs.react import ParsedAction, parse_action
from treegym.envs.rewards import qa_reward
from treegym.errors import ConfigError
from treegym.retrieval_index.qa import SPLITS as QA_SPLITS
from treegym.retrieval_index.types import QAItem


@dataclass(frozen=True)
class QAState:
    """What every QA episode tracks. Immutable: a step builds a new one."""

    item: QAItem
    turn: int = 0
    done: bool = False
    answer: str | None = None
    invalid_actions: int = 0
    format_valid: bool = True
    tool_calls: int = 0
    tool_errors: int = 0


S = TypeVar("S", bound=QAState)


class QAEnv(ForkableEnv[S]):
    """A ReAct QA env over ``self.items``. See the subclasses for observations and tools."""

    splits: ClassVar[tuple[str, ...]] = (*QA_SPLITS, "all")  # the env owns its tasks
    eval_split: ClassVar[str] = "dev"
    state_class: ClassVar[type[QAState]] = QAState
    label_keys: ClassVar[frozenset[str]] = frozenset({"answers", "supporting_ids", "supporting_titles"})
    prompt: ClassVar[str]  # with a {question} field
    tags: ClassVar[tuple[str, ...]]  # the tool tags and "answer"
    invalid_message: ClassVar[str]

    def __init__(self, *, max_turns: int, reward: str, format_score: bool, max_action_chars: int,
                 render_mode: str | None, max_obs_chars: int = 1 << 20) -> None:
        super().__init__(max_obs_chars=max_obs_chars, max_action_chars=max_action_chars, render_mode=render_mode)
        if reward not in ("em", "f1"):
            raise ConfigError(f"reward must be 'em' or 'f1', got {reward!r}")
        if max_turns < 1:
            raise ConfigError(f"max_turns must be at least 1, got {max_turns}")
        self.max_turns, self.reward_kind, self.format_score = max_turns, reward, format_score
        self.max_action_chars = max_action_chars
        self.items: tuple[QAItem, ...] = ()
        self._by_id: dict[str, QAItem] = {}

    def set_items(self, items: Sequence[QAItem], empty_message: str) -> None:
        if not items:
            raise ConfigError(empty_message)
        self.items = tuple(items)
        self._by_id = {it.id: it for it in self.items}

    # ---- the hooks a subclass defines ----------------------------------------------------

    def tool_calls(self, parsed: ParsedAction) -> tuple[list[ToolCall], Any]:
        """The calls a parsed tool tag needs, and anything ``observe`` will want (or an
        ``invalid`` ParsedAction in place of ``parsed``, as the second value's first item)."""
        raise NotImplementedError

    def observe(self, state: S, parsed: ParsedAction, extra: Any, result: Any) -> tuple[S, str, dict[str, Any]]:
        """A tool's (non-error) result -> the new state, the observation, extra info."""
        raise NotImplementedError

    def episode_info(self, state: S) -> dict[str, Any]:
        """The subclass's own info keys."""
        return {}

    def state_problem(self, state: S) -> str | None:
        # The task must be this env's own, labels included: a snapshot cannot bring its own answers.
        if self._by_id.get(state.item.id) != state.item:
            return f"state.item (task {state.item.id[:40]!r}) is not one of this env's tasks, as it was"
        if not 0 <= state.turn <= self.max_turns:
            return f"state.turn is {state.turn}, not in 0..{self.max_turns}"
        for name in ("invalid_actions", "tool_calls", "tool_errors"):
            if not 0 <= getattr(state, name) <= state.turn:
                return f"state.{name} is {getattr(state, name)}, not in 0..turn ({state.turn})"
        if state.answer is not None and not state.done:
            return "state.answer is set in an episode that has not ended"
        return None

    # ---- the episode ------------------------------------------------------------------------

    def task_ids(self) -> list[str]:
        return [it.id for it in self.items]

    def _reset_state(self, options: dict[str, Any]) -> tuple[S, str, dict[str, Any]]:
        unknown = set(options) - {"task_id"}
        if unknown:
            raise ConfigError(f"{type(self).__name__}.reset: unknown options {sorted(unknown)}; it takes task_id")
        task_id = options.get("task_id")
        if task_id is None:
            item = self.items[int(self.np_random.integers(len(self.items)))]
        elif task_id in self._by_id:
            item = self._by_id[task_id]
        else:
            raise ConfigError(f"unknown task_id {task_id!r}; this env has {len(self.items)} tasks")
        state = self.state_class(item=item)
        return state, self.prompt.format(question=item.question), self._info(state, invalid=False)

    def plan(self, action: str) -> Plan:
        s = self.state
        core.require_running(s, s is not None and s.done)
        parsed = parse_action(action, self.tags, self.max_action_chars)
        calls: list[ToolCall] = []
        extra = None
        if parsed.kind not in ("answer", "invalid"):
            calls, extra = self.tool_calls(parsed)
            if isinstance(extra, ParsedAction):  # the subclass found the tag unusable
                parsed, extra = extra, None
        return self.make_plan(calls, (parsed, extra))

    def resolve(self, plan: Plan, results: Sequence[Any]) -> StepResult:
        self.check_plan(plan)
        parsed, extra = plan.parsed
        s = self.state
        s = replace(s, turn=s.turn + 1, format_valid=s.format_valid and parsed.well_formed)
        reward, terminated, obs, info = 0.0, False, "", {}
        if parsed.kind == "answer":
            s = replace(s, answer=parsed.argument, done=True)
            terminated = True
        elif parsed.kind == "invalid":
            s = replace(s, invalid_actions=s.invalid_actions + 1, format_valid=False)
            obs, info = self.invalid_message, {"error": parsed.error}
        else:
            s = replace(s, tool_calls=s.tool_calls + 1)
            result = results[0]
            if isinstance(result, ToolError):
                obs = f"\n\n<information>{result.message}</information>\n\n"
                info = {"tool_error": result.message, "failed_step": True}  # restart-at-failure reads it
                s = replace(s, tool_errors=s.tool_errors + 1)
                if result.unreachable:  # no action could do better: the episode ends unscored
                    info["failed_to_run"] = result.message
                    s = replace(s, done=True)
            else:
                s, obs, info = self.observe(s, parsed, extra, result)
        truncated = not terminated and (s.turn >= self.max_turns or s.done)
        if terminated or truncated:
            # Past the turn budget the episode still gets its format reward (never an answer's).
            s = replace(s, done=True)
            reward, em, f1 = qa_reward(s.answer, s.item.answers, s.format_valid, self.reward_kind, self.format_score)
            info.update({"em": em, "f1": f1, "success": em})
        self.state = s
        return obs, reward, terminated, truncated, {**self._info(s, invalid=parsed.kind == "invalid"), **info}

    def _info(self, s: S, invalid: bool) -> dict[str, Any]:
        return {
            "task_id": s.item.id,
            "answers": list(s.item.answers),
            "supporting_ids": list(s.item.supporting_ids),
            "question_type": s.item.type,
            "hops": s.item.hops,
            "turn": s.turn,
            "tool_calls": s.tool_calls,
            "answered": s.answer is not None,
            "invalid_action": invalid,
            **self.episode_info(s),
        }

    def render(self) -> str:
        s = self.state
        if s is None:
            return "(not reset)"
        return f"[{s.item.id}] turn {s.turn}/{self.max_turns} answer={s.answer!r} question={s.item.question!r}"
