"""The expert: a full-knowledge planner that solves any generated task (the oracle agent that
plays it is in ``treegym.agents.household``).

``next_command`` looks at a state and returns the command that makes progress (fetch the goal
object, treat it at the appliance, bring it to the target, or to the lit lamp); ``walkthrough``
chains it from the task's opening state. Every command it returns is admissible there.
"""

from __future__ import annotations

from treegym.envs.household.tasks import APPLIANCE, Task
from treegym.envs.household.world import MIDDLE, State, World, actions, apply, goal_met

__all__ = ["next_command", "walkthrough"]

TREATMENT_VERB = {
    "pick_clean_then_place_in_recep": "clean",
    "pick_heat_then_place_in_recep": "heat",
    "pick_cool_then_place_in_recep": "cool",
}


def _first(world: World, kind: str) -> int:
    return next(r for r, rec in enumerate(world.receptacles) if rec.kind == kind)


def _reach(world: World, state: State, r: int) -> str | None:
    """The command that brings the agent to an open receptacle ``r``, or None if already there."""
    rec = world.receptacles[r]
    if state.loc != r:
        return f"go to {rec.name}"
    if rec.openable and r not in state.opened:
        return f"open {rec.name}"
    return None


def _treated(world: World, state: State, i: int) -> bool:
    t = world.goal.task_type
    flags = {"clean": state.clean, "heat": state.hot, "cool": state.cool}
    return t not in TREATMENT_VERB or i in flags[TREATMENT_VERB[t]]


def next_command(world: World, state: State) -> str | None:
    """The expert's next command in ``state``, or None once the goal holds."""
    if goal_met(world, state):
        return None
    g, items, recs = world.goal, world.items, world.receptacles
    held = state.held
    if g.task_type == "look_at_obj_in_light":
        lamp = next(i for i, it in enumerate(items) if it.kind == g.target)
        host = state.where[lamp]
        if held >= 0 and items[held].kind == g.obj:
            if state.loc != host:
                return f"go to {recs[host].name}"
            return f"use {items[lamp].name}"
        target = -1
    else:
        targets = [r for r, rec in enumerate(recs) if rec.kind == g.target]
        # Two-object tasks: keep filling the receptacle that already holds a finished object.
        done_in = [state.where[i] for i, it in enumerate(items)
                   if it.kind == g.obj and state.where[i] in targets and _treated(world, state, i)]
        target = done_in[0] if done_in else targets[0]
        if held >= 0 and items[held].kind == g.obj:
            if not _treated(world, state, held):
                app = _first(world, APPLIANCE[g.task_type][0])
                if state.loc != app:
                    return f"go to {recs[app].name}"
                return f"{TREATMENT_VERB[g.task_type]} {items[held].name} with {recs[app].name}"
            return _reach(world, state, target) or f"move {items[held].name} to {recs[target].name}"
    if held >= 0:
        # Holding something useless: put it down where it fits, here if possible.
        if state.loc != MIDDLE and state.loc in world.fits[held] and (
            not recs[state.loc].openable or state.loc in state.opened
        ):
            return f"move {items[held].name} to {recs[state.loc].name}"
        home = min(world.fits[held])
        return _reach(world, state, home) or f"move {items[held].name} to {recs[home].name}"
    wanted = [i for i, it in enumerate(items) if it.kind == g.obj and state.where[i] >= 0
              and not (state.where[i] == target and _treated(world, state, i))]
    i = wanted[0]
    r = state.where[i]
    return _reach(world, state, r) or f"take {items[i].name} from {recs[r].name}"


def walkthrough(task: Task, max_len: int = 100) -> list[str]:
    """The expert's commands from the task's opening state to the goal."""
    world, state = task.world, task.initial
    out: list[str] = []
    while len(out) < max_len:
        cmd = next_command(world, state)
        if cmd is None:
            return out
        state, _ = apply(world, state, actions(world, state)[cmd])
        out.append(cmd)
    raise RuntimeError(f"the expert did not finish task {task.task_id} in {max_len} commands")
