"""What the QA envs share: per-process backends, choosing a task on reset, when a step is allowed,
and the bookkeeping of a turn that answers, runs out of budget, or ends."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from treegym.envs import core
from treegym.envs.core import StepResult
from treegym.envs.rewards import qa_reward
from treegym.errors import ConfigError
from treegym.retrieval_index.types import QAItem

_SHARED: dict[tuple, Any] = {}
_SHARED_LOCK = threading.Lock()


def shared(key: tuple, build: Callable[[], Any]) -> Any:
    """One retriever, dataset or backend per configuration per process, shared by every env and fork."""
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = build()
        return _SHARED[key]


def pick_item(
    items: Sequence[QAItem], by_id: Mapping[str, QAItem], options: Mapping[str, Any], rng: np.random.Generator
) -> QAItem:
    """The task pinned by ``options["task_id"]``, else one drawn with the env's seeded RNG."""
    task_id = options.get("task_id")
    if task_id is None:
        return items[int(rng.integers(len(items)))]
    if task_id not in by_id:
        raise ConfigError(f"unknown task_id {task_id!r}; this env has {len(items)} tasks")
    return by_id[task_id]


def require_running(state: Any) -> None:
    """A clear error for stepping before a reset or after the episode ended."""
    core.require_running(state, state is not None and state.done)


def answer_turn(env: Any, state: Any, answer: str) -> tuple[Any, float, dict[str, Any]]:
    """The state, reward and info of a turn that answers: the episode ends and is scored."""
    state = replace(state, answer=answer, done=True)
    reward, em, f1 = qa_reward(answer, state.item.answers, state.format_valid, env.reward_kind, env.format_score)
    return state, reward, {"em": em, "f1": f1}


def end_turn(
    env: Any, state: Any, obs: str, reward: float, terminated: bool, invalid: bool, extra: dict[str, Any]
) -> StepResult:
    """Close a QA turn: past the turn budget the episode is truncated and still gets its
    format reward (never an answer's); then the env takes the new state and reports it."""
    truncated = not terminated and state.turn >= env.max_turns
    if truncated:
        state = replace(state, done=True)
        reward = qa_reward(None, state.item.answers, state.format_valid, env.reward_kind, env.format_score)[0]
    env.state = state
    info = env._info(state, invalid=invalid)
    info.update(extra)
    return obs, reward, terminated, truncated, info
