"""Export a generated task as a PDDL problem for ALFWorld's own domain, and as a TextWorld game.

ALFWorld plays a game from a JSON record holding its PDDL domain (``alfred.pddl``), its text
grammar (``alfred.twl2``, with the task sentence in place of ``UNKNOWN GOAL``) and a PDDL
problem. ``pddl_problem(task)`` writes that problem; ``game_record(task)`` the whole record,
using the domain and grammar files that ship in the ``alfworld`` wheel.

Entity ids are chosen so that ALFWorld's demangler (which names each entity after the part of
its id before ``_bar_`` and numbers entities of one name in reverse sorted order) gives every
receptacle and object the same name it has here: ``cabinet 3`` of 5 gets ``cabinet_bar_002``.
"""

from __future__ import annotations

from pathlib import Path

from treegym.envs.household.catalogue import CAN_CONTAIN, pddl_type
from treegym.envs.household.tasks import Task
from treegym.envs.household.world import World
from treegym.errors import MissingPackageError

# ALFWorld's goal formulas (alfworld/gen/goal_library.py), with {obj}/{recep} as type constants.
GOALS = {
    "pick_and_place_simple": "(exists (?r - receptacle) (exists (?o - object) (and (inReceptacle ?o ?r) "
    "(objectType ?o {obj}) (receptacleType ?r {recep}))))",
    "pick_clean_then_place_in_recep": "(exists (?r - receptacle) (exists (?o - object) (and (cleanable ?o) "
    "(objectType ?o {obj}) (receptacleType ?r {recep}) (isClean ?o) (inReceptacle ?o ?r))))",
    "pick_heat_then_place_in_recep": "(exists (?r - receptacle) (exists (?o - object) (and (heatable ?o) "
    "(objectType ?o {obj}) (receptacleType ?r {recep}) (isHot ?o) (inReceptacle ?o ?r))))",
    "pick_cool_then_place_in_recep": "(exists (?r - receptacle) (exists (?o - object) (and (coolable ?o) "
    "(objectType ?o {obj}) (receptacleType ?r {recep}) (isCool ?o) (inReceptacle ?o ?r))))",
    "pick_two_obj_and_place": "(exists (?r - receptacle) (exists (?o1 - object) (and (objectType ?o1 {obj}) "
    "(receptacleType ?r {recep}) (inReceptacle ?o1 ?r) (exists (?o2 - object) (and (not (= ?o1 ?o2)) "
    "(objectType ?o2 {obj}) (receptacleType ?r {recep}) (inReceptacle ?o2 ?r))))))",
    "look_at_obj_in_light": "(and (exists (?ot - object ?r - receptacle ?a - agent ?l - location) (and "
    "(objectType ?ot {recep}) (toggleable ?ot) (isToggled ?ot) (receptacleAtLocation ?r ?l) "
    "(atLocation ?a ?l) (inReceptacle ?ot ?r))) (exists (?o - object ?a - agent) (and "
    "(objectType ?o {obj}) (holds ?a ?o))))",
}


def _ids(names: list[tuple[str, str]]) -> list[str]:
    """PDDL ids for (kind, name) pairs that ALFWorld's demangler maps back to ``name``."""
    totals: dict[str, int] = {}
    for kind, _ in names:
        totals[kind] = totals.get(kind, 0) + 1
    out = []
    for kind, name in names:
        number = int(name.rsplit(" ", 1)[1])
        rank = f"{totals[kind] - number:03d}"  # sorted first -> highest number
        if kind.endswith("basin"):  # the demangler appends 'basin' to any id that contains it
            out.append(f"{kind[: -len('basin')]}_bar_{rank}_bar_basin")
        else:
            out.append(f"{kind}_bar_{rank}")
    return out


def entity_ids(world: World) -> tuple[list[str], list[str]]:
    """(receptacle ids, item ids), index-aligned with ``world.receptacles`` and ``world.items``."""
    return (_ids([(r.kind, r.name) for r in world.receptacles]), _ids([(i.kind, i.name) for i in world.items]))


def pddl_problem(task: Task) -> str:
    """The task's opening state and goal as a PDDL problem for ALFWorld's ``alfred`` domain."""
    world, state = task.world, task.initial
    rids, iids = entity_ids(world)
    locs = [f"loc_bar_{r:03d}" for r in range(len(rids))]
    start = "loc_bar_start"
    rkinds = sorted({r.kind for r in world.receptacles})
    ikinds = sorted({i.kind for i in world.items} | {world.goal.obj})
    init = [f"(atLocation agent1 {start})"]
    for r, rec in enumerate(world.receptacles):
        init += [f"(receptacleAtLocation {rids[r]} {locs[r]})", f"(receptacleType {rids[r]} {pddl_type(rec.kind)})"]
        if rec.openable:
            init.append(f"(openable {rids[r]})")
            if r in state.opened:
                init.append(f"(opened {rids[r]})")
    for i, it in enumerate(world.items):
        r = state.where[i]
        init += [f"(objectType {iids[i]} {pddl_type(it.kind)})", f"(inReceptacle {iids[i]} {rids[r]})",
                 f"(objectAtLocation {iids[i]} {locs[r]})"]
        for flag, pred in (("pickupable", "pickupable"), ("cleanable", "cleanable"), ("heatable", "heatable"),
                           ("coolable", "coolable"), ("toggleable", "toggleable"), ("sliceable", "sliceable"),
                           ("receptacle_object", "isReceptacleObject")):
            if getattr(it, flag):
                init.append(f"({pred} {iids[i]})")
    for rk in rkinds:
        init += [f"(canContain {pddl_type(rk)} {pddl_type(ik)})" for ik in ikinds if ik in CAN_CONTAIN[rk]]
    goal = GOALS[world.goal.task_type].format(obj=pddl_type(world.goal.obj), recep=pddl_type(world.goal.target))
    # The domain's preconditions name these type constants, so they must exist even if unused.
    rtypes = sorted({pddl_type(k) for k in rkinds} | {"SinkBasinType", "MicrowaveType", "FridgeType"}
                    | ({pddl_type(world.goal.target)} if world.goal.task_type != "look_at_obj_in_light" else set()))
    otypes = sorted({pddl_type(k) for k in ikinds} | {"KnifeType", "ButterKnifeType", "DeskLampType"})
    objects = (
        ["agent1 - agent", *(f"{loc} - location" for loc in [start, *locs])]
        + [f"{t} - rtype" for t in rtypes] + [f"{t} - otype" for t in otypes]
        + [f"{x} - receptacle" for x in rids] + [f"{x} - object" for x in iids]
    )
    name = "household_" + task.task_id.replace("-", "_")
    return (
        f"(define (problem {name})\n(:domain alfred)\n(:objects\n  " + "\n  ".join(objects) + "\n)\n"
        "(:init\n  " + "\n  ".join(init) + "\n)\n(:goal " + goal + ")\n)\n"
    )


def alfworld_data_dir() -> Path:
    """The folder of ALFWorld's domain and grammar files inside the installed wheel."""
    try:
        import alfworld  # noqa: PLC0415 - optional dependency
    except ImportError:
        raise MissingPackageError("alfworld", "exporting tasks to ALFWorld", 'pip install "treegym[household]"') from None
    return Path(alfworld.__file__).resolve().parent / "data"


def game_record(task: Task) -> dict[str, str]:
    """The JSON record TextWorld's ``PddlEnv`` loads: ALFWorld's domain and grammar, and this task's problem."""
    data = alfworld_data_dir()
    grammar = (data / "alfred.twl2").read_text().replace("UNKNOWN GOAL", task.description)
    return {"pddl_domain": (data / "alfred.pddl").read_text(), "grammar": grammar, "pddl_problem": pddl_problem(task)}
