"""Differential test: our household engine against ALFWorld's real TextWorld engine.

Tasks of every type are exported as PDDL problems for ALFWorld's own domain and played on
both engines: the expert walkthrough, with probes (look, inventory, examine, a command that is
not admissible, close/open) in between. At every step the admissible commands, the won flag and
the observation's facts must agree. Needs the ``household`` extra (alfworld).
"""

from __future__ import annotations

import os
import random

import pytest

pytest.importorskip("alfworld")
pytest.importorskip("textworld.envs.pddl")

from treegym.envs.household.env import TextHouseholdEnv  # noqa: E402
from treegym.envs.household.planner import walkthrough  # noqa: E402
from treegym.envs.household.reference import RealEngine, observation_facts  # noqa: E402
from treegym.envs.household.tasks import TASK_TYPES, make_task, task_ids  # noqa: E402

# One task per type by default, from unseen, train and seen in turn; TREEGYM_HOUSEHOLD_DIFF_PER_TYPE=N
# plays N per type. Fast Downward's translation grows with the room, so the default picks the
# smallest of a few candidate tasks (a few seconds each); larger samples draw at random.
PER_TYPE = int(os.environ.get("TREEGYM_HOUSEHOLD_DIFF_PER_TYPE", "1"))
SPLIT_CYCLE = ("unseen", "train", "seen")


def _size(task_id: str) -> int:
    world = make_task(task_id).world
    return len(world.receptacles) * (len(world.receptacles) + len(world.items))


def _pick(k: int, task_type: str, j: int) -> str:
    rng = random.Random(f"{task_type}:{j}")
    ids = task_ids(SPLIT_CYCLE[(k + j) % 3], (task_type,))
    return min(rng.sample(ids, 12), key=_size) if PER_TYPE == 1 else rng.choice(ids)


SAMPLE = sorted({_pick(k, t, j) for k, t in enumerate(TASK_TYPES) for j in range(PER_TYPE)})


def _probes(cmd: str, admissible: list[str]) -> list[str]:
    """Extra commands to try after ``cmd``: ones that read the state, and one that is not admissible."""
    probes = ["look", "inventory", "take nothing 9 from nowhere 9"]
    probes += [c for c in admissible if c.startswith("examine ")][-1:]
    closable = [c for c in admissible if c.startswith("close ")]
    if closable:  # close and reopen: exercises the closed-receptacle text
        probes += [closable[0], "open " + closable[0][len("close "):]]
    return probes


def _compare(where: str, ours: tuple[str, list[str], bool], real) -> None:
    obs, admissible, won = ours
    assert sorted(real.admissible) == admissible, (
        f"{where}: admissible differ\n only ours: {sorted(set(admissible) - set(real.admissible))}"
        f"\n only real: {sorted(set(real.admissible) - set(admissible))}")
    assert real.won == won, f"{where}: won ours={won} real={real.won}"
    assert observation_facts(obs) == observation_facts(real.observation), f"{where}:\n ours: {obs!r}\n real: {real.observation!r}"


@pytest.mark.parametrize("task_id", SAMPLE)
def test_expert_episode_matches_the_real_alfworld_engine_step_by_step(task_id):
    task = make_task(task_id)
    real = RealEngine(task)
    env = TextHouseholdEnv(split=task.split, max_steps=500)
    obs, info = env.reset(options={"task_id": task_id})
    intro = obs[obs.index("-= Welcome"):]
    _compare("reset", (intro, info["admissible_commands"], False), real.reset())
    plan = walkthrough(task)
    for n, cmd in enumerate(plan):
        # Probe at a receptacle, and right after the state-changing steps whose text matters.
        after_change = n > 0 and plan[n - 1].split()[0] in ("take", "heat", "cool", "clean", "use")
        for probe in _probes(cmd, info["admissible_commands"]) if n == 1 or after_change else []:
            o, _, _, _, pinfo = env.step(probe)
            _compare(f"{task_id} probe {probe!r}", (o, pinfo["admissible_commands"], pinfo["won"]), real.step(probe))
        obs, _, _, _, info = env.step(cmd)
        _compare(f"{task_id} step {n} {cmd!r}", (obs, info["admissible_commands"], info["won"]), real.step(cmd))
    assert info["won"]
