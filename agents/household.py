"""The household env's scripted agents: the oracle (the expert planner on the task it is told)
and a heuristic baseline that plays from the text alone.

The heuristic reads the task, searches the room, acts.
Unlike the oracle it knows nothing of the world beyond what the chat shows. Each turn it
rebuilds what it knows (where it is, what it holds, what it has seen where) from the messages,
so one agent can drive any number of forks. It searches only receptacles that can hold the goal
object (the catalogue's common sense: a potato may be in a fridge, never in a drawer), goes back
to one where it saw a goal object it has not yet placed, opens what is closed, takes the first
goal object it sees, treats it at the first appliance of the right kind, and carries it to the
first target receptacle (or to each lamp host until a desk lamp turns on). It plays the same way
from the same text, so it is an expert a model can imitate: the oracle's moves depend on where
objects are hidden, which the text does not show.
"""

from __future__ import annotations

import re
from typing import Any

from treegym.agents.experts import expert
from treegym.envs.household.catalogue import CAN_CONTAIN, LAMP_HOSTS, OPENABLE
from treegym.envs.household.env import TextHouseholdEnv
from treegym.envs.household.listing import split_observation
from treegym.envs.household.planner import next_command
from treegym.envs.household.tasks import TEMPLATES, Task, make_task
from treegym.envs.household.text import extract_command
from treegym.envs.household.world import actions, apply

TREAT = {"pick_clean_then_place_in_recep": ("clean", "sinkbasin"),
         "pick_heat_then_place_in_recep": ("heat", "microwave"),
         "pick_cool_then_place_in_recep": ("cool", "fridge")}
_GOALS = [
    (task_type, re.compile("^" + re.escape(t).replace(r"\{obj\}", r"(?P<obj>\w+)").replace(
        r"\{recep\}", r"(?P<recep>\w+)").replace(r"\{toggle\}", r"(?P<recep>\w+)") + "$"))
    for task_type, pair in TEMPLATES.items() for t in pair
]
_SEE = re.compile(r"you see (.*?)\.(?=\s|$)")


def parse_goal(prompt: str) -> tuple[str, str, str] | None:
    """(task type, object kind, target kind) from the 'Your task is to: ...' sentence."""
    m = re.search(r"Your task is to: (.*?)\.?\s*$", prompt.strip())
    if not m:
        return None
    for task_type, pattern in _GOALS:
        g = pattern.match(m.group(1))
        if g:
            return task_type, g.group("obj"), g.group("recep")
    return None


def _names(listing: str) -> list[str]:
    return [e.strip()[2:] for e in listing.replace(", and ", ", ").split(", ") if e.strip().startswith("a ")]


def _kind(name: str) -> str:
    """The kind of ``cabinet 3`` or ``potato 1``: the name without its instance number."""
    return name.rsplit(" ", 1)[0]


def _number(name: str) -> int:
    """The instance number of ``cabinet 3`` (0 for a name without one)."""
    tail = name.rsplit(" ", 1)[-1]
    return int(tail) if tail.isdigit() else 0


class HouseholdHeuristic:
    """Search-and-act baseline for TextHousehold (and ALFWorld's text): ``act(messages) -> str``."""

    def act(self, messages: list[dict[str, str]]) -> str:
        prefs = self.preferences(messages)
        listed = split_observation(messages[-1].get("content", ""))[1] if len(messages) % 2 == 1 else None
        if listed is not None:  # choose from what the observation lists, as the model must
            shown = set(listed)
            return next((c for c in prefs if c in shown), prefs[0])
        return prefs[0]

    def preferences(self, messages: list[dict[str, str]]) -> list[str]:
        """The commands the heuristic would play now, best first (the first is its choice when
        the observation lists no commands; the first one listed when it does)."""
        if not messages:
            return ["look"]
        prompt = split_observation(messages[0].get("content", ""))[0]
        goal = parse_goal(prompt)
        intro = _SEE.search(prompt)
        recs = _names(intro.group(1)) if intro else []
        if goal is None or not recs:
            return ["look"]
        task_type, obj, target = goal
        loc, held, treated = "", "", False
        seen: dict[str, list[str]] = {}
        visited: list[str] = []
        since_pickup: list[str] = []
        placed: set[str] = set()
        for k in range(1, len(messages) - 1, 2):
            cmd = extract_command(messages[k].get("content", ""))
            obs = split_observation(messages[k + 1].get("content", ""))[0]
            if obs.startswith("You arrive at "):
                loc = cmd[len("go to "):]
                visited.append(loc)
                since_pickup.append(loc)
            if obs.startswith("You pick up the "):
                held, treated = obs[len("You pick up the "):].split(" from the ")[0], False
                since_pickup = []
            elif obs.startswith("You move the "):
                placed.add(held)
                held = ""
            elif re.match(r"You (heat|cool|clean) the ", obs):
                treated = True
            found = _SEE.search(obs)
            if found and loc:
                seen[loc] = _names(found.group(1))
        last = split_observation(messages[-1].get("content", ""))[0] if len(messages) % 2 == 1 else ""
        here = seen.get(loc, [])

        def go_or(r: str, then: str) -> list[str]:
            if loc != r:
                return [f"go to {r}"]
            if f"The {r} is closed." in last:
                return [f"open {r}"]
            return [then]

        if held and _kind(held) == obj:
            if task_type == "look_at_obj_in_light":
                lamps = [n for n in here if n.startswith("desklamp ")]
                if lamps:
                    return [f"use {lamps[0]}"]
                hosts = [r for r in recs if _kind(r) in LAMP_HOSTS]
                # Not the host it stands at: going there is not admissible (it picked up here).
                todo = [r for r in hosts if r not in since_pickup and r != loc] or hosts
                return [f"go to {r}" for r in todo]
            if task_type in TREAT and not treated:
                verb, kind = TREAT[task_type]
                app = next(r for r in recs if _kind(r) == kind)
                return go_or(app, f"{verb} {held} with {app}")
            dest = next(r for r in recs if _kind(r) == target)
            return go_or(dest, f"move {held} to {dest}")
        if held:  # wrong object: put it back where it is
            return [f"move {held} to {loc}"]
        if f"The {loc} is closed." in last:
            return [f"open {loc}"]
        wanted = [n for n in here if _kind(n) == obj and n not in placed]
        if wanted and _kind(loc) != target:
            return [f"take {wanted[0]} from {loc}"]
        spotted = [r for r, names in seen.items() if r != loc and _kind(r) != target
                   and any(_kind(n) == obj and n not in placed for n in names)]
        if spotted:
            return [f"go to {r}" for r in spotted]
        unvisited = [r for r in recs if r not in visited and _kind(r) != target]
        # Number 1 of every kind first (it always exists), then the 2s, ...; open kinds before
        # closed ones (opening costs a turn). Objects are spread evenly over the receptacles that
        # can hold them, so this order finds them as fast as any, and it is easy to imitate.
        todo = sorted((r for r in unvisited if obj in CAN_CONTAIN.get(_kind(r), ())),
                      key=lambda r: (_number(r), _kind(r) in OPENABLE))
        return [f"go to {r}" for r in (todo or unvisited or recs)]


class HouseholdOracle:
    """An agent that plays the expert on the task named in ``info['task_id']``.

    It rebuilds the state from its own past actions in ``messages`` each turn, so one oracle
    can drive any number of forks of the same episode.
    """

    def __init__(self) -> None:
        self._task: Task | None = None

    def begin(self, info: dict[str, Any]) -> None:
        self._task = make_task(info["task_id"])

    def act(self, messages: list[dict[str, str]]) -> str:
        if self._task is None:
            return "look"
        world, state = self._task.world, self._task.initial
        for m in messages:
            if m.get("role") == "assistant":
                action = actions(world, state).get(extract_command(m.get("content", "")))
                if action is not None:
                    state, _ = apply(world, state, action)
        return next_command(world, state) or "look"


# ---- the household env's experts (``treegym.agents.experts``): each plays to the episode's end ----


@expert("heuristic", TextHouseholdEnv)
def heuristic_expert(max_turns: int | None) -> HouseholdHeuristic:
    return HouseholdHeuristic()


@expert("oracle", TextHouseholdEnv)
def oracle_expert(max_turns: int | None) -> HouseholdOracle:
    return HouseholdOracle()
