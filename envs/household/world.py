"""The household world: a static room template, the immutable episode state, and the rules.

A ``World`` is built once per task and shared read-only by every fork: receptacles (each at its
own location, as in ALFWorld), objects and their properties, and the goal. A ``State`` is a
small frozen value (where each object is, what is open, clean, hot, ...); every command makes a
new one, so a fork or snapshot is the state reference itself.

The rules mirror the actions of ALFWorld's PDDL domain (``alfred.pddl``) and the feedback mirrors
its grammar (``alfred.twl2``): ``actions`` lists exactly what that domain admits in a state, and
``apply`` performs one of them and says what the agent sees.
"""

from __future__ import annotations

from dataclasses import dataclass

from treegym.envs.household.catalogue import SHARP

MIDDLE = -1  # the agent's start: the middle of the room, at no receptacle
HELD = -2  # object location code: in the agent's hands


@dataclass(frozen=True)
class Receptacle:
    name: str  # "cabinet 3"
    kind: str  # "cabinet"
    openable: bool


@dataclass(frozen=True)
class Item:
    """An object (ALFWorld's word); called Item here to avoid shadowing Python's ``object``."""

    name: str
    kind: str
    pickupable: bool
    cleanable: bool
    heatable: bool
    coolable: bool
    toggleable: bool
    sliceable: bool
    receptacle_object: bool


@dataclass(frozen=True)
class Goal:
    """What the task asks: a task type, the object kind, and the target receptacle or light kind."""

    task_type: str
    obj: str
    target: str  # receptacle kind, or the light kind for look_at_obj_in_light


@dataclass(frozen=True)
class World:
    """The static part of a task, shared by all forks."""

    room: str
    receptacles: tuple[Receptacle, ...]
    items: tuple[Item, ...]
    fits: tuple[frozenset[int], ...]  # item index -> receptacle indices that can hold it
    goal: Goal

    def __post_init__(self) -> None:
        # Derived, read-only lookups that keep a step cheap.
        object.__setattr__(self, "goto", tuple(f"go to {r.name}" for r in self.receptacles))
        object.__setattr__(self, "goal_items", tuple(i for i, it in enumerate(self.items) if it.kind == self.goal.obj))
        object.__setattr__(self, "goal_recs", frozenset(r for r, rec in enumerate(self.receptacles) if rec.kind == self.goal.target))
        object.__setattr__(self, "lamps", tuple(i for i, it in enumerate(self.items) if it.kind == self.goal.target))


@dataclass(frozen=True, slots=True)
class State:
    """One moment of an episode. Never mutated: each command builds a new one."""

    loc: int  # receptacle index the agent stands at, or MIDDLE
    where: tuple[int, ...]  # item index -> receptacle index, or HELD
    opened: frozenset[int] = frozenset()
    clean: frozenset[int] = frozenset()
    hot: frozenset[int] = frozenset()
    cool: frozenset[int] = frozenset()
    toggled: frozenset[int] = frozenset()
    sliced: frozenset[int] = frozenset()

    @property
    def held(self) -> int:
        """Index of the item in the agent's hands, or -1."""
        try:
            return self.where.index(HELD)
        except ValueError:
            return -1


def game_problem(world: World, state: State) -> str | None:
    """What makes ``state`` impossible in ``world`` (an index out of range, two things held); None if nothing."""
    recs, items = range(len(world.receptacles)), range(len(world.items))
    if state.loc != MIDDLE and state.loc not in recs:
        return f"state.game.loc is {state.loc}, not a receptacle of this task"
    if len(state.where) != len(world.items):
        return f"state.game.where places {len(state.where)} objects, not this task's {len(world.items)}"
    if any(w != HELD and w not in recs for w in state.where) or state.where.count(HELD) > 1:
        return "state.game.where puts an object in no receptacle of this task (or two in the hands)"
    for name, valid in (("opened", recs), ("clean", items), ("hot", items), ("cool", items), ("toggled", items),
                        ("sliced", items)):
        if not all(i in valid for i in getattr(state, name)):
            return f"state.game.{name} names an index this task does not have"
    return None


def _with(state: State, **changes: object) -> State:
    """A copy of ``state`` with some fields changed (faster than ``dataclasses.replace``)."""
    fields = {name: getattr(state, name) for name in State.__slots__}
    fields.update(changes)
    return State(**fields)  # type: ignore[arg-type]


# An action: (verb, item index or -1, receptacle or second item index or -1).
Action = tuple[str, int, int]

HELP_TEXT = (
    "\nAvailable commands:\n"
    "  look:                             look around your current location\n"
    "  inventory:                        check your current inventory\n"
    "  go to (receptacle):               move to a receptacle\n"
    "  open (receptacle):                open a receptacle\n"
    "  close (receptacle):               close a receptacle\n"
    "  take (object) from (receptacle):  take an object from a receptacle\n"
    "  move (object) to (receptacle):  place an object in or on a receptacle\n"
    "  examine (something):              examine a receptacle or an object\n"
    "  use (object):                     use an object\n"
    "  heat (object) with (receptacle):  heat an object using a receptacle\n"
    "  clean (object) with (receptacle): clean an object using a receptacle\n"
    "  cool (object) with (receptacle):  cool an object using a receptacle\n"
    "  slice (object) with (object):     slice an object using a sharp object\n"
)


def _accessible(world: World, state: State, r: int) -> bool:
    return not world.receptacles[r].openable or r in state.opened


def contents(state: State, r: int) -> list[int]:
    """Items in receptacle ``r``, in catalogue order."""
    return [i for i, w in enumerate(state.where) if w == r]


def list_text(names: list[str]) -> str:
    """TextWorld's list rendering: 'nothing', 'a x', 'a x, and a y', 'a x, a y, and a z'."""
    if not names:
        return "nothing"
    items = [f"a {n}" for n in names]
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + ", and " + items[-1]


def describe_receptacle(world: World, state: State, r: int) -> str:
    rec = world.receptacles[r]
    if rec.openable and r not in state.opened:
        return f"The {rec.name} is closed."
    seen = list_text([world.items[i].name for i in contents(state, r)])
    if rec.openable:
        return f"The {rec.name} is open. In it, you see {seen}."
    return f"On the {rec.name}, you see {seen}."


def describe_item(world: World, state: State, i: int) -> str:
    it = world.items[i]
    name = it.name
    if it.receptacle_object:
        return f"This is a normal {name}. In it, you see nothing."
    clean, hot, cool, sliced = i in state.clean, i in state.hot, i in state.cool, i in state.sliced
    if sliced:
        if clean and hot:
            return f"This is a hot and clean sliced {name}."
        if clean and cool:
            return f"This is a cool and clean sliced {name}."
        if clean:
            return f"This is a clean sliced {name}."
        if hot:
            return f"This is a hot sliced {name}."
        if cool:
            return f"This is a cool sliced {name}."
    if clean and hot:
        return f"This is a hot and clean {name}."
    if clean and cool:
        return f"This is a cool and clean {name}."
    if hot:
        return f"This is a hot {name}."
    if clean:
        return f"This is a clean {name}."
    if cool:
        return f"This is a cold {name}."
    if it.toggleable:
        return f"This {name} is {'on' if i in state.toggled else 'off'}."
    if sliced:
        return f"This is a sliced {name}."
    return f"There's nothing special about {name}."


def look_text(world: World, state: State, intro: bool = False) -> str:
    """What ``look`` says. In the middle of the room ALFWorld lists every receptacle in the intro
    but nothing on a later ``look`` (its grammar then binds the location to the agent's, which
    holds no receptacle); both are kept."""
    if state.loc == MIDDLE:
        seen = list_text([r.name for r in world.receptacles]) if intro else "nothing"
        return f"You are in the middle of a room. Looking quickly around you, you see {seen}."
    return f"You are facing the {world.receptacles[state.loc].name}. Next to it, you see nothing."


def actions(world: World, state: State) -> dict[str, Action]:
    """Every admissible command in ``state`` -> the action it performs (ALFWorld's admissible set)."""
    # ALFWorld does not admit going to the receptacle the agent is already at.
    acts: dict[str, Action] = {cmd: ("goto", -1, r) for r, cmd in enumerate(world.goto) if r != state.loc}
    acts["look"] = ("look", -1, -1)
    acts["inventory"] = ("inventory", -1, -1)
    acts["help"] = ("help", -1, -1)
    held = state.held
    items = world.items
    if held >= 0:
        acts[f"examine {items[held].name}"] = ("examine_item", held, -1)
    r = state.loc
    if r == MIDDLE:
        return acts
    rec = world.receptacles[r]
    acts[f"examine {rec.name}"] = ("examine_recep", -1, r)
    if rec.openable:
        if r in state.opened:
            acts[f"close {rec.name}"] = ("close", -1, r)
        else:
            acts[f"open {rec.name}"] = ("open", -1, r)
    open_ = _accessible(world, state, r)
    here = contents(state, r)
    held_sharp = held >= 0 and items[held].kind in SHARP
    for i in here:
        it = items[i]
        if open_ and held < 0 and it.pickupable:
            acts[f"take {it.name} from {rec.name}"] = ("take", i, r)
        if it.toggleable:
            acts[f"use {it.name}"] = ("use", i, r)
        if held_sharp and it.sliceable:
            acts[f"slice {it.name} with {items[held].name}"] = ("slice", i, held)
    if held >= 0:
        it = items[held]
        if open_ and r in world.fits[held]:
            acts[f"move {it.name} to {rec.name}"] = ("move", held, r)
        if rec.kind == "sinkbasin" and it.cleanable:
            acts[f"clean {it.name} with {rec.name}"] = ("clean", held, r)
        if rec.kind == "microwave" and it.heatable:
            acts[f"heat {it.name} with {rec.name}"] = ("heat", held, r)
        if rec.kind == "fridge" and it.coolable:
            acts[f"cool {it.name} with {rec.name}"] = ("cool", held, r)
    return acts


def apply(world: World, state: State, action: Action) -> tuple[State, str]:
    """Perform an admissible ``action``; return the next state and what the agent sees."""
    verb, i, r = action
    items, recs = world.items, world.receptacles
    if verb == "goto":
        state = State(r, state.where, state.opened, state.clean, state.hot, state.cool, state.toggled, state.sliced)
        return state, f"You arrive at {recs[r].name}. {describe_receptacle(world, state, r)}"
    if verb == "look":
        return state, look_text(world, state)
    if verb == "inventory":
        held = state.held
        if held < 0:
            return state, "You are not carrying anything."
        return state, f"You are carrying: a {items[held].name}."
    if verb == "help":
        return state, HELP_TEXT
    if verb == "examine_recep":
        return state, describe_receptacle(world, state, r)
    if verb == "examine_item":
        return state, describe_item(world, state, i)
    if verb == "open":
        state = _with(state, opened=state.opened | {r})
        return state, f"You open the {recs[r].name}. {describe_receptacle(world, state, r)}"
    if verb == "close":
        return _with(state, opened=state.opened - {r}), f"You close the {recs[r].name}."
    if verb == "take":
        where = state.where[:i] + (HELD,) + state.where[i + 1 :]
        return _with(state, where=where), f"You pick up the {items[i].name} from the {recs[r].name}."
    if verb == "move":
        where = state.where[:i] + (r,) + state.where[i + 1 :]
        return _with(state, where=where), f"You move the {items[i].name} to the {recs[r].name}."
    if verb == "use":
        return _with(state, toggled=state.toggled | {i}), f"You turn on the {items[i].name}."
    if verb == "clean":
        return _with(state, clean=state.clean | {i}), f"You clean the {items[i].name} using the {recs[r].name}."
    if verb == "heat":
        state = _with(state, hot=state.hot | {i}, cool=state.cool - {i})
        return state, f"You heat the {items[i].name} using the {recs[r].name}."
    if verb == "cool":
        state = _with(state, cool=state.cool | {i}, hot=state.hot - {i})
        return state, f"You cool the {items[i].name} using the {recs[r].name}."
    if verb == "slice":
        return _with(state, sliced=state.sliced | {i}), f"You sliced the {items[i].name} with the {items[r].name}."
    raise ValueError(f"unknown action verb {verb!r}")


def goal_met(world: World, state: State) -> bool:
    """ALFWorld's goal formula for the world's task type, evaluated on ``state``."""
    g = world.goal
    where = state.where
    if g.task_type == "look_at_obj_in_light":
        held = state.held
        if held < 0 or world.items[held].kind != g.obj or state.loc == MIDDLE:
            return False
        return any(where[i] == state.loc and i in state.toggled for i in world.lamps)
    need = {
        "pick_clean_then_place_in_recep": state.clean,
        "pick_heat_then_place_in_recep": state.hot,
        "pick_cool_then_place_in_recep": state.cool,
    }.get(g.task_type)
    count: dict[int, int] = {}
    for i in world.goal_items:
        w = where[i]
        if w in world.goal_recs and (need is None or i in need):
            count[w] = count.get(w, 0) + 1
    want = 2 if g.task_type == "pick_two_obj_and_place" else 1
    return any(c >= want for c in count.values())
