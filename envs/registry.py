"""The one way treegym makes an env: the ``Family`` record type and the registry of families, their
ids and variants, splits, and the factory that train, eval, play and SFT all call.

An env family declares its settings once, in a ``Family`` record that its own module registers
(``register_family``, at the bottom of ``tree_search_qa.py``, ``web_search_qa.py``,
``household/env.py``, ``probes.py``): the policy's turn budget and turn length, the name of the
scripted expert a warm start imitates (the experts are registered beside their agents,
``treegym.agents.experts``), the training variant, and the name of its score. Its splits, held-out
split and action stops are the env class's own (``splits``, ``eval_split``, ``action_stops``), and
the record reads them from there. ``treegym train``, ``sft``, ``eval`` and ``play`` read the
record; nothing above this layer keeps a per-env table. A new family is its own files plus one
``register_family`` call in them.

A per-use default is a registered variant with its kwargs, as Gymnasium does it (``FrozenLake8x8``
is ``FrozenLake`` with ``map_name="8x8"``): ``TreeSearchQA-Train-v0`` is ``TreeSearchQA-v0`` on BM25
scored with Tree-GRPO's format-aware table, and each family's record says what its own variant
changes. The trainer asks ``training_id(env_id)`` for the variant to train on; evaluation reads
``info["em"]``/``info["success"]``, so the shaping never reaches a reported score.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import gymnasium as gym

from treegym.errors import ConfigError, TreegymError
from treegym.specs import load_object


@dataclass(frozen=True)
class Family:
    """One env family's settings, declared once and read by every command.

    ``None`` in a training default means "the trainer's own default". ``expert`` is a name
    (``heuristic``) that ``treegym.agents.experts`` resolves for the env's class: a family names
    its expert and never imports it. ``splits``, ``eval_split`` and ``action_stops`` are left None
    here and filled from the env class by ``family()``.
    """

    id: str  # the base id, e.g. "TextHousehold-v0"
    entry_point: str  # "module:Class"
    max_turns: int | None = None  # the policy's turn budget (train's sampler.max_turns)
    max_new_tokens: int | None = None  # tokens per turn
    max_context_tokens: int | None = None
    warm_start_episodes: int | None = None
    steps: int | None = None  # RL steps of `treegym train` on defaults (what the family's step time affords)
    micro_batch_size: int | None = None  # rollouts (and SFT episodes) per forward, when long ones need fewer
    sft_micro_batch_size: int | None = None  # SFT episodes per forward, where it differs from micro_batch_size
    sft_epochs: int | None = None  # the warm start's passes over its episodes (train's sft.epochs)
    sft_batch_size: int | None = None  # the warm start's episodes per optimiser step (train's sft.batch_size)
    also_eval_split: str | None = None  # a second held-out split that train scores and reports too
    eval_n: int | None = None  # train's run.eval_n: held-out prompts scored before and after, where the run affords more
    distinct_actions: bool | None = None  # train's sampler.distinct_actions: siblings at a fork make different moves
    algo: str | None = None  # train's algorithm on defaults: the one that learns on this family, measured
    temperature: float | None = None  # train's sampler.temperature: where the warm start's rollouts still succeed and differ
    lr: Mapping[str, float] = field(default_factory=dict)  # algorithm -> train's optim.lr, tuned on seeds no report uses
    expert: str | None = None  # the name of the expert a warm start imitates (``treegym.agents.experts``)
    training: str | None = None  # the id of the variant the family trains on
    training_kwargs: Mapping[str, Any] = field(default_factory=dict)
    score: str = "success"  # what its held-out score is called ("EM" on QA envs)
    tools: str | None = None  # its tool set in adapters (TRL: ``treegym.integrations.trl.TOOL_SETS``); None: one step tool
    splits: tuple[str, ...] | None = None
    eval_split: str | None = None
    action_stops: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "training_kwargs", MappingProxyType(dict(self.training_kwargs)))
        object.__setattr__(self, "lr", MappingProxyType(dict(self.lr)))
        if self.sft_micro_batch_size is None:  # SFT takes the rollouts' micro-batch unless the family says
            object.__setattr__(self, "sft_micro_batch_size", self.micro_batch_size)


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




def register_envs() -> None:
    """Register treegym's env families with gymnasium (idempotent): each family's module registers
    its own record (``register_family``) when it is imported."""
    # The product families first (the order every listing shows), then the probes.
    from treegym.envs import tree_search_qa, web_search_qa  # noqa: F401
    from treegym.envs.household import env  # noqa: F401

    # isort: split
    from treegym.envs import probes  # noqa: F401


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
            found = load_object(spec)
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
    return load_object(ep) if isinstance(ep, str) else ep


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
