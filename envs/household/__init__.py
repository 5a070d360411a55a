"""TextHousehold-v0: ALFWorld's household tasks, grammar and text in a pure-Python, forkable engine.

Modules, by concern: ``catalogue`` (object and receptacle kinds, what holds what), ``world``
(the static room template and the immutable episode state, with the rules of every command),
``tasks`` (procedural task generation in train/seen/unseen splits), ``text`` (parsing an
agent's turn into a command), ``planner`` (the expert walkthrough and the oracle agent),
``heuristic`` (a text-only baseline agent), ``pddl`` (export of a task as a PDDL problem for
ALFWorld's own domain), ``reference`` (the real ALFWorld engine on an exported task) and ``env``.
"""

from __future__ import annotations

from treegym.envs.household.tasks import SPLITS, TASK_TYPES, Task, make_task, task_ids

__all__ = ["SPLITS", "TASK_TYPES", "Task", "make_task", "task_ids"]
