"""Procedural task generation in ALFWorld's six task types and three splits.

A task id is ``"<split>-<index>"``; the index fixes the task type (``index % 6``) and seeds
everything else, so a task is a pure function of its id. Splits:

- ``train`` and ``seen`` (ALFWorld's valid_seen) draw from the same room layouts and the same
  (room, task type, object, receptacle) combinations, with different seeds;
- ``unseen`` (valid_unseen) draws from layouts and combinations that never occur in train.

A layout is a room kind with a count of each receptacle kind; its identity is that multiset,
and the unseen layouts are chosen so that no train layout has the same one.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from functools import cache, lru_cache

from treegym.envs.household.catalogue import (
    CAN_CONTAIN,
    CLEANABLE,
    COOLABLE,
    HEATABLE,
    LAMP_HOSTS,
    OPENABLE,
    RECEPTACLE_OBJECTS,
    ROOM_KINDS,
    SLICEABLE,
)
from treegym.envs.household.world import Goal, Item, Receptacle, State, World
from treegym.errors import ConfigError

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
# Split name -> number of tasks (ALFWorld's sizes: 3553 train, 140 valid_seen, 134 valid_unseen).
SPLITS = {"train": 3553, "seen": 140, "unseen": 134}
SPLIT_ALIASES = {"valid_seen": "seen", "valid_unseen": "unseen", "eval_in_distribution": "seen",
                 "eval_out_of_distribution": "unseen"}

# ALFWorld's goal templates (alfworld/gen/goal_library.py): two phrasings per task type.
TEMPLATES = {
    "pick_and_place_simple": ("put a {obj} in {recep}", "put some {obj} on {recep}"),
    "look_at_obj_in_light": ("look at {obj} under the {toggle}", "examine the {obj} with the {toggle}"),
    "pick_clean_then_place_in_recep": ("put a clean {obj} in {recep}", "clean some {obj} and put it in {recep}"),
    "pick_heat_then_place_in_recep": ("put a hot {obj} in {recep}", "heat some {obj} and put it in {recep}"),
    "pick_cool_then_place_in_recep": ("put a cool {obj} in {recep}", "cool some {obj} and put it in {recep}"),
    "pick_two_obj_and_place": ("put two {obj} in {recep}", "find two {obj} and put them in {recep}"),
}
# Appliance a state-change task needs, and the object set it acts on.
APPLIANCE = {
    "pick_clean_then_place_in_recep": ("sinkbasin", CLEANABLE),
    "pick_heat_then_place_in_recep": ("microwave", HEATABLE),
    "pick_cool_then_place_in_recep": ("fridge", COOLABLE),
}
LAYOUTS_PER_ROOM = 48
UNSEEN_LAYOUT_IDS = range(36, 48)  # candidates; those equal to a train layout are dropped
UNSEEN_COMBO_MODULUS = 6  # about one combination in six is kept out of train


@dataclass(frozen=True)
class Task:
    """A generated task: its id, the static world and the opening state."""

    task_id: str
    split: str
    description: str  # "put a clean apple in fridge"
    world: World
    initial: State

    @property
    def task_type(self) -> str:
        return self.world.goal.task_type


Layout = tuple[str, tuple[tuple[str, int], ...]]  # (room, ((receptacle kind, count), ...))
Combo = tuple[str, str, str, str]  # (room, task type, object kind, target kind)


def normalize_split(split: str) -> str:
    s = SPLIT_ALIASES.get(split, split)
    if s not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use one of {sorted(SPLITS)} (or valid_seen/valid_unseen)")
    return s


def _layout(room: str, layout_id: int) -> Layout:
    rng = random.Random(f"layout:{room}:{layout_id}")
    counts = tuple((kind, rng.randint(lo, hi)) for kind, lo, hi in ROOM_KINDS[room].receptacles)
    return room, tuple((k, n) for k, n in counts if n > 0)


@cache
def layouts(split: str) -> tuple[Layout, ...]:
    """The layouts a split draws from; unseen ones share none with train."""
    train_ids = [i for i in range(LAYOUTS_PER_ROOM) if i not in UNSEEN_LAYOUT_IDS]
    train = {_layout(room, i) for room in ROOM_KINDS for i in train_ids}
    if normalize_split(split) != "unseen":
        return tuple(sorted(train))
    return tuple(sorted({_layout(room, i) for room in ROOM_KINDS for i in UNSEEN_LAYOUT_IDS} - train))


def _all_combos() -> list[Combo]:
    out: list[Combo] = []
    for room, kind in ROOM_KINDS.items():
        recs = {k for k, _, _ in kind.receptacles}
        for obj in sorted(kind.objects):
            targets = sorted(r for r in recs if obj in CAN_CONTAIN[r])
            for t in targets:
                out.append((room, "pick_and_place_simple", obj, t))
                out.append((room, "pick_two_obj_and_place", obj, t))
                for task_type, (appliance, able) in APPLIANCE.items():
                    if obj in able and appliance in recs and t != appliance:
                        out.append((room, task_type, obj, t))
            if targets and recs & set(LAMP_HOSTS):
                out.append((room, "look_at_obj_in_light", obj, "desklamp"))
    return out


@cache
def combos(split: str) -> dict[str, tuple[Combo, ...]]:
    """Task type -> the (room, type, object, target) combinations a split draws from."""
    unseen = normalize_split(split) == "unseen"
    keep = [c for c in _all_combos() if (zlib.crc32(repr(c).encode()) % UNSEEN_COMBO_MODULUS == 0) == unseen]
    return {t: tuple(c for c in keep if c[1] == t) for t in TASK_TYPES}


def task_ids(split: str, task_types: tuple[str, ...] | None = None) -> list[str]:
    """All task ids of a split, optionally only those of some task types."""
    s = normalize_split(split)
    wanted = set(task_types or TASK_TYPES)
    return [f"{s}-{i}" for i in range(SPLITS[s]) if TASK_TYPES[i % len(TASK_TYPES)] in wanted]


def parse_task_id(task_id: str) -> tuple[str, int]:
    split, _, idx = str(task_id).rpartition("-")
    try:
        s, i = normalize_split(split), int(idx)
    except ValueError:
        raise ConfigError(f"bad task id {task_id!r}: expected '<split>-<index>', e.g. 'train-12'") from None
    if not 0 <= i < SPLITS[s]:
        raise ConfigError(f"task id {task_id!r} out of range: split {s} has {SPLITS[s]} tasks")
    return s, i


def _needed(combo: Combo) -> set[str]:
    _, task_type, _, target = combo
    need = set() if target == "desklamp" else {target}
    if task_type in APPLIANCE:
        need.add(APPLIANCE[task_type][0])
    return need


@lru_cache(maxsize=4096)
def make_task(task_id: str) -> Task:
    """Build the task with this id (deterministic; cached)."""
    split, index = parse_task_id(task_id)
    rng = random.Random(f"task:{split}:{index}")
    task_type = TASK_TYPES[index % len(TASK_TYPES)]
    pool = combos(split)[task_type]
    for _ in range(1000):
        combo = rng.choice(pool)
        need = _needed(combo)
        fitting = [lay for lay in layouts(split) if lay[0] == combo[0] and need <= {k for k, _ in lay[1]}]
        # The goal object needs a home other than the target, so that the task is not solved at the start.
        fitting = [lay for lay in fitting if any(k != combo[3] and combo[2] in CAN_CONTAIN[k] for k, _ in lay[1])]
        if task_type == "look_at_obj_in_light":
            fitting = [lay for lay in fitting if {k for k, _ in lay[1]} & set(LAMP_HOSTS)]
        if fitting:
            break
    else:  # pragma: no cover - the catalogue guarantees a fit
        raise RuntimeError(f"no layout fits task {task_id}")
    layout = rng.choice(fitting)
    world, initial = _populate(rng, layout, Goal(task_type, combo[2], combo[3]))
    template = rng.choice(TEMPLATES[task_type])
    description = template.format(obj=combo[2], recep=combo[3], toggle=combo[3])
    return Task(f"{split}-{index}", split, description, world, initial)


def _item(name: str, kind: str) -> Item:
    return Item(
        name=name, kind=kind, pickupable=kind != "desklamp", cleanable=kind in CLEANABLE,
        heatable=kind in HEATABLE, coolable=kind in COOLABLE, toggleable=kind == "desklamp",
        sliceable=kind in SLICEABLE, receptacle_object=kind in RECEPTACLE_OBJECTS,
    )


def _populate(rng: random.Random, layout: Layout, goal: Goal) -> tuple[World, State]:
    room, counts = layout
    recs = tuple(
        Receptacle(f"{kind} {n}", kind, kind in OPENABLE) for kind, count in counts for n in range(1, count + 1)
    )
    kinds: list[str] = []  # object kinds, in creation order
    if goal.task_type == "pick_two_obj_and_place":
        kinds += [goal.obj] * rng.randint(2, 3)
    else:
        kinds += [goal.obj] * rng.randint(1, 2)
    if goal.task_type == "look_at_obj_in_light":
        kinds.append("desklamp")
    pool = sorted(ROOM_KINDS[room].objects)
    kinds += [rng.choice(pool) for _ in range(rng.randint(8, 16))]
    # Keep the goal unsatisfied at the start: no object of the goal kind in a target receptacle.
    placed: list[tuple[str, int]] = []
    for kind in kinds:
        if kind == "desklamp":
            options = [r for r, rec in enumerate(recs) if rec.kind in LAMP_HOSTS]
        else:
            options = [r for r, rec in enumerate(recs) if kind in CAN_CONTAIN[rec.kind]]
            if kind == goal.obj:
                options = [r for r in options if recs[r].kind != goal.target]
        if options:
            placed.append((kind, rng.choice(options)))
    seen: dict[str, int] = {}
    items: list[Item] = []
    where: list[int] = []
    for kind, r in placed:
        seen[kind] = seen.get(kind, 0) + 1
        items.append(_item(f"{kind} {seen[kind]}", kind))
        where.append(r)
    fits = tuple(
        frozenset(r for r, rec in enumerate(recs) if it.kind in CAN_CONTAIN[rec.kind]) for it in items
    )
    world = World(room, recs, tuple(items), fits, goal)
    return world, State(loc=-1, where=tuple(where))
