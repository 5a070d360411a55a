"""What the QA envs share about their tasks: choosing one on reset, and when a step is allowed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from treegym.errors import ConfigError, TreegymError
from treegym.retrieval_index.types import QAItem


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
    if state is None:
        raise TreegymError("step() before reset(): call env.reset() first")
    if state.done:
        raise TreegymError("step() after the episode ended: call env.reset()")
