"""Turning an agent spec from the command line into an agent, per env.

Specs:

- ``heuristic`` or ``oracle``: the scripted agent of that name that the env's family record lists
  (``treegym.envs.registry.Family.experts``: e.g. ``HeuristicQAAgent`` on the QA envs, the
  household heuristic on TextHousehold).
- ``smollm2`` or a local HF model folder: an ``HFPolicy`` (a token-level policy).
- ``openai:URL`` or ``openai:URL#model``: an OpenAI-compatible chat agent.
- ``rank:smollm2`` or ``rank:MODEL_FOLDER``: ``ActionRanker``, which plays the listed command
  the model finds most likely (envs whose observations list their commands).
- ``module:callable``: an attribute of an importable module. A class is instantiated with no
  arguments; any other object is used as it is (an agent, a callable, or a Policy).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from treegym.agents.base import Agent
from treegym.agents.policy import Policy, SamplingParams
from treegym.errors import ConfigError

SCRIPTED = ("heuristic", "oracle")


@dataclass(frozen=True)
class ResolvedAgent:
    """An agent and what kind it is: a text agent (``act``) or a token-level ``Policy``."""

    name: str
    obj: Any

    @property
    def is_policy(self) -> bool:
        return isinstance(self.obj, Policy) and not isinstance(self.obj, Agent)


def resolve_agent(spec: str, env_id: str, *, params: SamplingParams | None = None,
                  model: str | None = None) -> ResolvedAgent:
    """The agent that ``spec`` names, for ``env_id`` (see the module docstring). An ``openai:``
    agent samples with ``params`` (temperature, max_new_tokens) and asks for ``model`` unless
    the URL names one (``#model``)."""
    spec = spec.strip()
    if not spec:
        raise ConfigError("empty agent spec; use heuristic, oracle, smollm2, a model folder, openai:URL, rank:MODEL "
                          "or module:callable")
    if spec in SCRIPTED:
        return ResolvedAgent(spec, scripted_agent(spec, env_id))
    if spec.startswith("openai:"):
        return ResolvedAgent(spec, openai_agent(spec[len("openai:") :], params=params, model=model))
    if spec.startswith("rank:"):
        from treegym.agents.ranking import ActionRanker

        return ResolvedAgent(spec, ActionRanker(spec[len("rank:") :] or "smollm2"))
    if spec.lower() == "smollm2" or Path(spec).expanduser().is_dir():
        from treegym.agents.hf_policy import HFPolicy

        name = "smollm2" if spec.lower() == "smollm2" else Path(spec).name
        return ResolvedAgent(name, HFPolicy.from_pretrained(spec))
    if ":" in spec:
        return ResolvedAgent(spec, import_agent(spec))
    raise ConfigError(
        f"unknown agent {spec!r}: use heuristic, oracle, smollm2, a local model folder, "
        "openai:URL[#model] or module:callable"
    )


def scripted_agent(name: str, env_id: str) -> Any:
    """A new scripted agent ``name`` of ``env_id``'s family (its record's ``experts``)."""
    from treegym.envs.registry import family

    experts = family(env_id).experts
    if name not in experts:
        raise ConfigError(f"no scripted {name} agent for {env_id} (its family lists: {', '.join(experts) or 'none'})")
    return import_agent(experts[name])


def openai_agent(target: str, *, params: SamplingParams | None = None, model: str | None = None) -> Any:
    """``URL`` or ``URL#model`` -> an ``OpenAIChatAgent`` sampling with ``params`` (default: its own);
    ``#model`` wins over ``model``."""
    url, _, named = target.partition("#")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"openai agent needs an http(s) URL, e.g. openai:http://127.0.0.1:8000/v1#model; got {url!r}")
    try:
        from treegym.agents.openai_agent import OpenAIChatAgent
    except ImportError as exc:
        raise ConfigError(f"the OpenAI-compatible agent is not available: {exc}") from exc
    sampling = {} if params is None else {"temperature": params.temperature, "max_tokens": params.max_new_tokens}
    return OpenAIChatAgent(url, model=named or model or None, **sampling)


def import_agent(spec: str) -> Any:
    """``module:attr`` -> the attribute (a class is instantiated with no arguments)."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r} for agent {spec!r}: {exc}") from exc
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{module_name!r} has no attribute {attr!r} (agent {spec!r})")
        obj = getattr(obj, part)
    if isinstance(obj, type):
        try:
            obj = obj()
        except TypeError as exc:
            raise ConfigError(f"agent class {spec} must be constructible with no arguments: {exc}") from exc
    if not (callable(obj) or isinstance(obj, (Agent, Policy))):
        raise ConfigError(f"{spec} is neither an agent, a callable nor a Policy")
    return obj
