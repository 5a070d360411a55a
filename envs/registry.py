"""The one way treegym makes an env: each family's record, its registered ids and variants, splits,
and the factory that train, eval, play and SFT all call.

An env family declares its settings once, in a ``Family`` record registered with it
(``register_family``): the policy's turn budget and turn length, the scripted experts and the one a
warm start imitates, the training variant, and the name of its score. Its splits, held-out split
and action stops are the env class's own (``splits``, ``eval_split``, ``action_stops``), and the
record reads them from there. ``treegym train``, ``sft``, ``eval`` and ``play`` read the record;
nothing above this layer keeps a per-env table. A new family is its own files plus one
``register_family`` call.

A per-use default is a registered variant with its kwargs, as Gymnasium does it (``FrozenLake8x8``
is ``FrozenLake`` with ``map_name="8x8"``): ``TreeSearchQA-Train-v0`` is ``TreeSearchQA-v0`` on BM25
(builds in seconds, no embedder forward per query: what a 2-core run can afford) scored with
Tree-GRPO's format-aware table, ``WebSearchQA-Train-v0`` is ``WebSearchQA-v0`` with that table, and
``TextHousehold-Train-v0`` takes 0.1 off each inadmissible command (verl-agent's ALFWorld penalty)
and lists the admissible commands in every observation (verl-agent's ALFWorld layout, capped).
The trainer asks ``training_id(env_id)`` for the variant to train on; evaluation reads
``info["em"]``/``info["success"]``, so the shaping never reaches a reported score.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import gymnasium as gym

from treegym.errors import ConfigError, TreegymError


@dataclass(frozen=True)
class Family:
    """One env family's settings, declared once and read by every command.

    ``None`` in a training default means "the trainer's own default". ``experts`` maps a name
    (``heuristic``, ``oracle``) to the ``module:attr`` of a scripted agent, loaded by
    ``treegym.agents.resolve`` the way ``entry_point`` is. ``splits``, ``eval_split`` and
    ``action_stops`` are left None here and filled from the env class by ``family()``.
    """

    id: str  # the base id, e.g. "TextHousehold-v0"
    entry_point: str  # "module:Class"
    max_turns: int | None = None  # the policy's turn budget (train's sampler.max_turns)
    max_new_tokens: int | None = None  # tokens per turn
    max_context_tokens: int | None = None
    warm_start_episodes: int | None = None
    micro_batch_size: int | None = None  # rollouts (and SFT episodes) per forward, when long ones need fewer
    also_eval_split: str | None = None  # a second held-out split that train scores and reports too
    experts: Mapping[str, str] = field(default_factory=dict)
    expert: str | None = None  # the expert a warm start imitates (a key of ``experts``)
    training: str | None = None  # the id of the variant the family trains on
    training_kwargs: Mapping[str, Any] = field(default_factory=dict)
    score: str = "success"  # what its held-out score is called ("EM" on QA envs)
    splits: tuple[str, ...] | None = None
    eval_split: str | None = None
    action_stops: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "experts", MappingProxyType(dict(self.experts)))
        object.__setattr__(self, "training_kwargs", MappingProxyType(dict(self.training_kwargs)))
        if self.expert is not None and self.expert not in self.experts:
            raise ValueError(f"family {self.id}: its expert {self.expert!r} is not one of its experts {list(self.experts)}")


FAMILIES: dict[str, Family] = {}
# id -> (base id, kwargs): the variants the families register for one use (filled by register_family).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {}
_resolved: dict[str, Family] = {}  # family() results, with what the env class says filled in


def register_family(fam: Family) -> Family:
    """Record ``fam`` and register its id (and training variant) with gymnasium (idempotent)."""
    FAMILIES[fam.id] = fam
    if fam.training is not None:
        VARIANTS[fam.training] = (fam.id, dict(fam.training_kwargs))
    for env_id, kwargs in ((fam.id, {}), *(((fam.training, dict(fam.training_kwargs)),) if fam.training else ())):
        if env_id not in gym.registry:
            # The env owns its turn budget (max_turns), so no TimeLimit wrapper.
            gym.register(id=env_id, entry_point=fam.entry_point, kwargs=kwargs, disable_env_checker=False)
    _resolved.pop(fam.id, None)
    return fam


_QA_EXPERTS = {"heuristic": "treegym.agents.scripted:HeuristicQAAgent", "oracle": "treegym.agents.scripted:OracleQAAgent"}

register_family(Family(
    id="TreeSearchQA-v0", entry_point="treegym.envs.tree_search_qa:TreeSearchQAEnv",
    max_turns=2, max_new_tokens=48, max_context_tokens=2048, warm_start_episodes=24,
    experts=_QA_EXPERTS, expert="heuristic", score="EM",
    training="TreeSearchQA-Train-v0", training_kwargs={"index": "bm25", "format_score": True},
))
register_family(Family(
    id="WebSearchQA-v0", entry_point="treegym.envs.web_search_qa:WebSearchQAEnv",
    max_turns=3, max_new_tokens=48,  # search, browse, answer
    experts=_QA_EXPERTS, expert="heuristic", score="EM",
    training="WebSearchQA-Train-v0", training_kwargs={"format_score": True},
))
register_family(Family(
    # 128 heuristic episodes (about 90 solved in 10 turns and kept), chosen on 32 tuning tasks that
    # the run does not report (benchmarks/tune_warm_start.py): 64 / 128 / 192 episodes gave success
    # 0.0% / 3.1% / 0.0% and well-formed actions 83% / 67% / 68%, in 180 / 323 / 485 s of SFT. That
    # was on ALFWorld's plain text; with the listed commands an episode is 2.8x longer (median 1,498
    # SmolLM2 tokens over 10 turns, against 536), hence the 2,048-token context, and the episode
    # count was not re-tuned (docs/household.md).
    id="TextHousehold-v0", entry_point="treegym.envs.household.env:TextHouseholdEnv",
    max_turns=10, max_new_tokens=16, max_context_tokens=2048, warm_start_episodes=128,
    # One rollout per forward: with the listed commands an episode is ~1,500 tokens, and a padded
    # micro-batch takes SDPA's masked path on the CPU, which keeps every layer's attention (11.5 GB
    # at 4 x 1,500 tokens); the loss is the same.
    micro_batch_size=1, also_eval_split="unseen",
    experts={"heuristic": "treegym.agents.household:HouseholdHeuristic",
             "oracle": "treegym.agents.household:HouseholdOracle"},
    expert="heuristic", score="success",
    # The listing's cap is spelt out so that it is part of every warm start's cache key.
    training="TextHousehold-Train-v0",
    training_kwargs={"invalid_penalty": 0.1, "list_admissible": True, "list_top_n": 10, "list_max_tokens": 96},
))  # fmt: skip

ENV_IDS = tuple(FAMILIES)


def register_envs() -> None:
    """Register treegym's probe envs with gymnasium (idempotent; the families register themselves
    with ``register_family``)."""
    from treegym.envs.probes import PROBE_IDS

    for env_id, entry_point in PROBE_IDS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, disable_env_checker=False)


def base_id(env_id: str) -> str:
    """The id a registered variant is a variant of (``TextHousehold-Train-v0`` ->
    ``TextHousehold-v0``); any other id is its own base."""
    return VARIANTS[env_id][0] if env_id in VARIANTS else env_id


def family(env_id: str) -> Family:
    """The family record of ``env_id`` (a family's id, its training variant, or any other env:
    ``module:Class`` or an id registered elsewhere gets a record with no training defaults and no
    expert), with its splits, held-out split and action stops read from the env class."""
    base = base_id(env_id)
    if base in _resolved:
        return _resolved[base]
    cls = env_class(base)
    fam = FAMILIES.get(base) or Family(id=base, entry_point=base, score=_default_score(cls))
    splits = getattr(cls, "splits", None)
    fam = dataclasses.replace(
        fam, splits=tuple(splits) if splits is not None else None, eval_split=getattr(cls, "eval_split", "dev"),
        action_stops=tuple(getattr(cls, "action_stops", ())),
    )
    if base in FAMILIES:  # a module:Class may change between calls (tests); a registered family does not
        _resolved[base] = fam
    return fam


def _default_score(cls: Any) -> str:
    from treegym.envs.qa_env import QAEnv

    return "EM" if isinstance(cls, type) and issubclass(cls, QAEnv) else "success"


def training_id(env_id: str) -> str:
    """The variant an env trains on (its family's ``training``), else ``env_id`` itself."""
    fam = FAMILIES.get(env_id)
    return fam.training if fam is not None and fam.training else env_id


def env_kwargs(env_id: str) -> dict[str, Any]:
    """The kwargs a registered id adds to its entry point (a variant's; {} for a base id)."""
    return dict(VARIANTS[env_id][1]) if env_id in VARIANTS else {}


def env_class(spec: str) -> Any:
    """The class behind a registered id or a ``module:Class`` spec; a ConfigError naming the ids."""
    if ":" in spec:
        module, _, name = spec.partition(":")
        if not module or not name:
            raise ConfigError(f"env {spec!r}: expected a registered id or module:Class")
        try:
            found = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"env {spec!r}: cannot import {name} from {module} ({exc})") from None
        except Exception as exc:  # noqa: BLE001  (a module that fails on import is the user's, not ours)
            raise ConfigError(f"env {spec!r}: importing {module} failed ({type(exc).__name__}: {exc})") from None
        if not (isinstance(found, type) and issubclass(found, gym.Env)):
            raise ConfigError(f"env {spec!r}: {name} is not a gymnasium Env class (a {type(found).__name__})")
        return found
    register_envs()
    if spec not in gym.registry:
        ours = ", ".join((*FAMILIES, *VARIANTS))
        raise ConfigError(f"env {spec!r} is not registered (treegym envs: {ours}); or pass module:Class")
    ep = gym.registry[spec].entry_point
    if isinstance(ep, str):
        module, _, name = ep.partition(":")
        return getattr(importlib.import_module(module), name)
    return ep


def task_ids(env: gym.Env) -> list[Any] | None:
    """The task ids of ``env`` (wrapped or not): ``ForkableEnv.task_ids``, or None for an env that
    draws its tasks from the seed (or does not say)."""
    listed = getattr(env.unwrapped, "task_ids", None)
    return listed() if callable(listed) else None


def score_name(env_id: str) -> str:
    """What an env's held-out score is called: its family's ``score`` (``EM`` for QA envs)."""
    return family(env_id).score


def resolve_split(env_id: str, split: str) -> str:
    """``auto`` -> the env family's held-out split; an unknown split is a ConfigError naming the valid ones."""
    fam = family(env_id)
    if split == "auto":
        return fam.eval_split or "dev"
    aliases = getattr(env_class(fam.entry_point), "split_aliases", ())
    if fam.splits is not None and split not in fam.splits and split not in aliases:
        raise ConfigError(f"env {env_id!r} has no split {split!r}; its splits: {', '.join(fam.splits)}")
    return split


def make(env_id: str, split: str | None = None, /, *, max_turns: int | None = None, **kwargs: Any) -> gym.Env:
    """Make ``env_id`` (a registered id or ``module:Class``) on ``split`` (``auto``: its held-out
    split; None: its default). ``max_turns`` reaches envs that take it unless ``kwargs`` set it.
    A ``split`` in ``kwargs`` (``--env-kwargs '{"split": ...}'``) is the split, checked the same
    way. Bad ids, splits and kwargs are ConfigErrors."""
    if "split" in kwargs:
        given = kwargs.pop("split")
        if split not in (None, "auto") and given != split:
            raise ConfigError(f"two splits for {env_id}: {split!r} and env kwargs' {given!r}; give one")
        if not isinstance(given, str):
            raise ConfigError(f"env kwargs' split must be a string, got {given!r}")
        split = given
    cls = env_class(env_id)
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        params = {}
    if split is not None:
        split = resolve_split(env_id, split)
        if "split" in params:
            kwargs["split"] = split
    if max_turns is not None and "max_turns" in params and "max_turns" not in kwargs:
        kwargs["max_turns"] = max_turns
    try:
        return cls(**kwargs) if ":" in env_id else gym.make(env_id, **kwargs)
    except TreegymError:
        raise
    except TypeError as exc:
        raise ConfigError(f"env {env_id!r} rejected its arguments {kwargs}: {exc}") from None
    except (ValueError, gym.error.Error) as exc:  # an env's own check of its arguments
        raise ConfigError(f"env {env_id!r}: {exc}") from None
