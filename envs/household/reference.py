"""The real ALFWorld engine on an exported task, and how to compare its text with ours.

``RealEngine(task)`` loads the task's game record (ALFWorld's domain and grammar, our PDDL
problem) into TextWorld's ``PddlEnv`` behind ALFWorld's own ``AlfredDemangler``: the same
pipeline ALFWorld's ``AlfredTWEnv`` uses, minus the game files it would download. It needs the
``household`` extra (``pip install "treegym[household]"``).

``observation_facts`` reduces an observation to what both engines must agree on: the sentence
with each "you see ..." list taken out, and the set of things in the list (TextWorld orders
lists by its fact store, we by catalogue).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from treegym.envs.household.pddl import game_record
from treegym.envs.household.tasks import Task
from treegym.errors import MissingPackageError

_LIST_RE = re.compile(r"you see (.*?)\.(?=\s|$)", re.DOTALL)


def observation_facts(text: str) -> tuple[str, tuple[frozenset[str], ...]]:
    """(the text with every 'you see' list replaced by '{}', the set of entries of each list)."""
    lists: list[frozenset[str]] = []

    def take(m: re.Match[str]) -> str:
        entries = [e.strip() for e in m.group(1).replace(", and ", ", ").split(", ")]
        lists.append(frozenset(e for e in entries if e))
        return "you see {}."

    return _LIST_RE.sub(take, text.strip()), tuple(lists)


@dataclass(frozen=True)
class RealStep:
    """What the real engine reports after a reset or a step."""

    observation: str
    admissible: tuple[str, ...]
    won: bool


class RealEngine:
    """One exported task, playing on ALFWorld's TextWorld engine (PDDL + Fast Downward)."""

    def __init__(self, task: Task) -> None:
        try:
            import textworld
            from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
            from textworld.envs.pddl import PddlEnv
        except ImportError as exc:
            raise MissingPackageError("alfworld", "the real ALFWorld engine", 'pip install "treegym[household]"') from exc
        infos = textworld.EnvInfos(admissible_commands=True, won=True)
        self.env = AlfredDemangler(PddlEnv(infos))
        self.env.load(game_record(task))

    def _report(self, state: dict) -> RealStep:
        return RealStep(str(state["feedback"]), tuple(state["admissible_commands"]), bool(state["won"]))

    def reset(self) -> RealStep:
        return self._report(self.env.reset())

    def step(self, command: str) -> RealStep:
        state, _, _ = self.env.step(command)
        return self._report(state)
