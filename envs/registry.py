"""The one way treegym makes an env: ids, their registered variants, splits, and the factory that
train, eval, play and SFT all call.

A per-use default is a registered variant with its kwargs, as Gymnasium does it (``FrozenLake8x8``
is ``FrozenLake`` with ``map_name="8x8"``): ``TreeSearchQA-Train-v0`` is ``TreeSearchQA-v0`` on BM25
(builds in seconds, no embedder forward per query: what a 2-core run can afford) scored with
Tree-GRPO's format-aware table, ``WebSearchQA-Train-v0`` is ``WebSearchQA-v0`` with that table, and
``TextHousehold-Train-v0`` takes 0.1 off each inadmissible command (verl-agent's ALFWorld penalty).
The trainer asks ``training_id(env_id)`` for the variant to train on; evaluation reads
``info["em"]``/``info["success"]``, so the shaping never reaches a reported score.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import gymnasium as gym

from treegym.errors import ConfigError, TreegymError

ENV_IDS = ("TreeSearchQA-v0", "WebSearchQA-v0", "TextHousehold-v0")

_ENTRY_POINTS = {
    "TreeSearchQA-v0": "treegym.envs.tree_search_qa:TreeSearchQAEnv",
    "WebSearchQA-v0": "treegym.envs.web_search_qa:WebSearchQAEnv",
    "TextHousehold-v0": "treegym.envs.household.env:TextHouseholdEnv",
}

# id -> (base id, kwargs): the variants an env registers for one use.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "TreeSearchQA-Train-v0": ("TreeSearchQA-v0", {"index": "bm25", "format_score": True}),
    "WebSearchQA-Train-v0": ("WebSearchQA-v0", {"format_score": True}),
    "TextHousehold-Train-v0": ("TextHousehold-v0", {"invalid_penalty": 0.1}),
}


def register_envs() -> None:
    """Register treegym's ids and variants with gymnasium (idempotent)."""
    from treegym.envs.probes import PROBE_IDS

    for env_id, entry_point in {**_ENTRY_POINTS, **PROBE_IDS}.items():
        if env_id not in gym.registry:
            # The env owns its turn budget (max_turns), so no TimeLimit wrapper.
            gym.register(id=env_id, entry_point=entry_point, disable_env_checker=False)
    for env_id, (base, kwargs) in VARIANTS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=_ENTRY_POINTS[base], kwargs=dict(kwargs), disable_env_checker=False)


def training_id(env_id: str) -> str:
    """The variant an env trains on (``X-Train-vN`` when registered), else ``env_id`` itself."""
    name, sep, version = env_id.rpartition("-")
    variant = f"{name}-Train-{version}" if sep else env_id
    return variant if variant in VARIANTS else env_id


def base_id(env_id: str) -> str:
    """The id a registered variant is a variant of (``TextHousehold-Train-v0`` ->
    ``TextHousehold-v0``); any other id is its own base."""
    return VARIANTS[env_id][0] if env_id in VARIANTS else env_id


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
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"env {spec!r}: cannot import {name} from {module} ({exc})") from None
    register_envs()
    if spec not in gym.registry:
        ours = ", ".join((*ENV_IDS, *VARIANTS))
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
    """What an env's held-out score is called: ``EM`` for QA envs (an answer string is graded),
    ``success`` for every other env."""
    from treegym.envs.qa_env import QAEnv

    cls = env_class(env_id)
    return "EM" if isinstance(cls, type) and issubclass(cls, QAEnv) else "success"


def resolve_split(cls: Any, env_id: str, split: str) -> str:
    """``auto`` -> the env's held-out split; an unknown split is a ConfigError naming the valid ones."""
    splits = getattr(cls, "splits", None)
    if split == "auto":
        return getattr(cls, "eval_split", "dev")
    if splits is not None and split not in splits and split not in getattr(cls, "split_aliases", ()):
        raise ConfigError(f"env {env_id!r} has no split {split!r}; its splits: {', '.join(splits)}")
    return split


def make(env_id: str, split: str | None = None, *, max_turns: int | None = None, **kwargs: Any) -> gym.Env:
    """Make ``env_id`` (a registered id or ``module:Class``) on ``split`` (``auto``: its held-out
    split; None: its default). ``max_turns`` reaches envs that take it unless ``kwargs`` set it.
    Bad ids, splits and kwargs are ConfigErrors."""
    cls = env_class(env_id)
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        params = {}
    if split is not None and "split" not in kwargs:
        split = resolve_split(cls, env_id, split)
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
