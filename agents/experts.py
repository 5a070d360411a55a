"""Scripted experts, registered by name for the env classes they can play (as branching rules are).

An expert is registered with a decorator next to the agent it builds::

    @expert("heuristic", QAEnv)
    def heuristic_qa(max_turns: int | None) -> HeuristicQAAgent:
        ...

and is found by ``make_expert(env_id, name, max_turns)``: eval's ``--agent heuristic``, the SFT
data and the warm start all ask here. An env family's record names the expert its warm start
imitates (``Family.expert``), never where it lives: the edge from an expert to its env is a real
import, downward (agents -> envs), that every reader and the layer test see. A subclass of a
registered env class plays that class's experts unless it registers its own under the name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from treegym.envs.registry import env_class, family
from treegym.errors import ConfigError

# max_turns (the policy's turn budget; None: the expert's own) -> a new agent
ExpertFactory = Callable[[int | None], Any]
F = TypeVar("F", bound=ExpertFactory)

EXPERTS: dict[tuple[type, str], ExpertFactory] = {}


class ExpertError(ConfigError):
    """The expert is unknown, or the env has none."""


def expert(name: str, *envs: type) -> Callable[[F], F]:
    """Register ``factory`` as the ``name`` expert of each env class in ``envs`` (and subclasses)."""

    def register(factory: F) -> F:
        for env in envs:
            EXPERTS[(env, name)] = factory
        return factory

    return register


def _builtin() -> None:
    # The built-in experts register themselves when their modules are imported.
    from treegym.agents import household, scripted  # noqa: F401


def expert_names() -> tuple[str, ...]:
    """Every registered expert name, for any env (what ``--agent`` accepts as an expert)."""
    _builtin()
    return tuple(dict.fromkeys(name for _, name in EXPERTS))


def experts_of(env_id: str) -> dict[str, ExpertFactory]:
    """The experts that can play ``env_id`` (a family id, its variant, or a ``module:Class``), by
    name; the most specific env class's registration wins."""
    _builtin()
    cls = env_class(family(env_id).entry_point)
    found: dict[str, ExpertFactory] = {}
    for klass in getattr(cls, "__mro__", ()):
        for (env, name), factory in EXPERTS.items():
            if env is klass:
                found.setdefault(name, factory)
    return found


def make_expert(env_id: str, name: str, max_turns: int | None = None) -> Any:
    """A new scripted ``name`` expert for ``env_id``, fitted to a budget of ``max_turns`` turns
    (None: the expert's own budget)."""
    found = experts_of(env_id)
    if not found:
        raise ExpertError(f"env {env_id!r} has no {name} expert (none is registered for it); "
                          "pass --traces from `treegym eval --out`")
    if name not in found:
        raise ExpertError(f"unknown expert {name!r} for {env_id}; choose one of: {', '.join(found)}")
    return found[name](max_turns)


def warm_start_expert(env_id: str) -> str | None:
    """The expert ``env_id``'s family imitates in a warm start (``Family.expert``), when it is registered."""
    name = family(env_id).expert
    return name if name is not None and name in experts_of(env_id) else None
