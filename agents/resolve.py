"""Turning an agent spec from the command line into an agent, per env.

Specs:

- ``heuristic``, ``oracle`` (any name in ``treegym.agents.experts``): the scripted expert of that
  name registered for the env's class (e.g. ``HeuristicQAAgent`` on the QA envs, the household
  heuristic on TextHousehold).
- ``smollm2`` or a local HF model folder: an ``HFPolicy`` (a token-level policy).
- ``openai:URL`` or ``openai:URL#model``: an OpenAI-compatible chat agent.
- ``rank:smollm2`` or ``rank:MODEL_FOLDER``: ``ActionRanker``, which plays the listed command
  the model finds most likely (envs whose observations list their commands).
- ``module:callable``: an attribute of an importable module. A class is instantiated with no
  arguments; any other object is used as it is (an agent, a callable, or a Policy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from treegym.agents.base import Agent
from treegym.agents.experts import expert_names, make_expert
from treegym.agents.policy import Policy, SamplingParams
from treegym.envs.registry import family
from treegym.errors import ConfigError
from treegym.specs import load_object


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
    if spec in expert_names():
        return ResolvedAgent(spec, make_expert(env_id, spec))
    if spec.startswith("openai:"):
        stops = family(env_id).action_stops or ()  # the env's own turn ends, from its family record
        return ResolvedAgent(spec, openai_agent(spec[len("openai:") :], params=params, model=model, stop=stops))
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


def openai_agent(target: str, *, params: SamplingParams | None = None, model: str | None = None,
                 stop: Sequence[str] = ()) -> Any:
    """``URL`` or ``URL#model`` -> an ``OpenAIChatAgent`` sampling with ``params`` (default: its own)
    and ending a turn at ``stop``; ``#model`` wins over ``model``."""
    url, _, named = target.partition("#")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"openai agent needs an http(s) URL, e.g. openai:http://127.0.0.1:8000/v1#model; got {url!r}")
    try:
        from treegym.agents.openai_agent import OpenAIChatAgent
    except ImportError as exc:
        raise ConfigError(f"the OpenAI-compatible agent is not available: {exc}") from exc
    sampling = {} if params is None else {"temperature": params.temperature, "max_tokens": params.max_new_tokens}
    return OpenAIChatAgent(url, model=named or model or None, stop=stop, **sampling)


def import_agent(spec: str) -> Any:
    """``module:attr`` -> the attribute (a class is instantiated with no arguments)."""
    module_name, _, attr = spec.partition(":")
    try:
        obj = load_object(spec)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r} for agent {spec!r}: {exc}") from exc
    except AttributeError:
        raise ConfigError(f"{module_name!r} has no attribute {attr!r} (agent {spec!r})") from None
    if isinstance(obj, type):
        try:
            obj = obj()
        except TypeError as exc:
            raise ConfigError(f"agent class {spec} must be constructible with no arguments: {exc}") from exc
    if not (callable(obj) or isinstance(obj, (Agent, Policy))):
        raise ConfigError(f"{spec} is neither an agent, a callable nor a Policy")
    return obj
