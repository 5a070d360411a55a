"""SkyRL-gym adapter: any treegym env as a ``skyrl_gym`` ``BaseTextEnv``, registered under its own id.

SkyRL's generator makes one env per sample with ``skyrl_gym.make(env_class, env_config=...,
extras=row)``, calls ``init(prompt)`` once with the row's chat messages, then ``step(action)``
with each model turn until ``done``. This module maps a treegym episode onto that:

- ``make``: the env is a fork of one template per (id, split, kwargs), so every sample shares
  its backends (index, HTTP cache, world templates) and the first make pays for them.
- ``init(prompt)``: resets the env on the row's task (``extras["task_id"]``, or ``seed``; also
  read from ``extras["extra_info"]``, where SkyRL's data scripts put per-sample fields) and
  returns the row's non-empty messages followed by the env's opening prompt as a user message.
- ``step(action)``: one env turn; ``observations`` is the env's text as one user message (none
  once done), ``reward`` the env's, ``done`` is terminated or truncated, and ``metadata`` the
  env's info without its labels (``treegym.envs.public_info``).
- ``fork()`` (and ``copy.deepcopy``): an independent env in the same state, which SkyRL itself
  never asks for; a tree-search generator on top of SkyRL can.

``register_envs()`` registers every treegym family and probe id with ``skyrl_gym``. Needs
``pip install 'treegym[skyrl]'``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym

from treegym.envs import base_env, family, fork, make, public_info
from treegym.envs import register_envs as register_treegym_envs
from treegym.errors import ConfigError, MissingPackageError

try:
    import skyrl_gym
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
except ImportError:
    raise MissingPackageError("skyrl-gym", "treegym's SkyRL-gym adapter", "pip install 'treegym[skyrl]'") from None

Messages = list[dict[str, str]]

_templates: dict[str, gym.Env] = {}  # one made env per (id, split, kwargs); samples get forks of it


def template(env_id: str, split: str | None = None, **env_kwargs: Any) -> gym.Env:
    """The env every sample of (``env_id``, ``split``, ``env_kwargs``) forks: made once per process."""
    key = json.dumps([env_id, split, env_kwargs], sort_keys=True, default=repr)
    if key not in _templates:
        env = make(env_id, split, **env_kwargs)
        base_env(env)  # a NotForkableError at the first make, not mid-rollout
        _templates[key] = env
    return _templates[key]


def _task(extras: Mapping[str, Any]) -> tuple[str | None, int | None]:
    """The row's task id and seed: top-level keys first, then ``extra_info``'s."""
    inner = extras.get("extra_info") or {}
    task_id = extras.get("task_id", inner.get("task_id"))
    seed = extras.get("seed", inner.get("seed"))
    return (None if task_id is None else str(task_id)), (None if seed is None else int(seed))


def turn_budget(env: gym.Env, env_id: str) -> int:
    """The env's own turn budget (``max_turns``, household's ``max_steps``, a probe's ``horizon``),
    else its family's. The env ends episodes itself; SkyRL reads ``max_turns`` only to report it."""
    inner = base_env(env)
    for name in ("max_turns", "max_steps", "horizon"):
        if isinstance(getattr(inner, name, None), int):
            return getattr(inner, name)
    return family(env_id).max_turns or 1


class TreegymTextEnv(BaseTextEnv):
    """One treegym episode behind SkyRL-gym's ``init``/``step``.

    ``env_config`` (SkyRL's ``environment.skyrl_gym.<id>`` section) may hold ``split`` and
    ``env_kwargs``; ``extras`` is the dataset row (``task_id`` or ``seed``).
    """

    def __init__(self, env_id: str, env_config: Mapping[str, Any] | None = None,
                 extras: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        config = dict(env_config or {})
        self.env_id = env_id
        self.env = fork(template(env_id, config.get("split"), **dict(config.get("env_kwargs") or {})))
        self.task_id, self.seed = _task(extras or {})
        self.max_turns = turn_budget(self.env, env_id)
        self.episode_return = 0.0
        self.done = False
        self.last_info: dict[str, Any] = {}

    def init(self, prompt: Sequence[Mapping[str, str]] | None = None) -> tuple[Messages, dict[str, Any]]:
        """Reset on the row's task; the row's non-empty messages, then the env's opening prompt."""
        options = None if self.task_id is None else {"task_id": self.task_id}
        obs, info = self.env.reset(seed=self.seed, options=options)
        self.turns, self.episode_return, self.done = 0, 0.0, False
        self.last_info = public_info(self.env, info)
        kept = [dict(m) for m in (prompt or ()) if m.get("content")]
        return [*kept, {"role": "user", "content": obs}], dict(self.last_info)

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """One env turn. After the episode ended, a step changes nothing and says so."""
        if self.done:
            return BaseTextEnvStepOutput(observations=[], reward=0.0, done=True, metadata=dict(self.last_info),
                                         postprocessed_action=action)
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.turns += 1
        self.episode_return += float(reward)
        self.done = bool(terminated or truncated)
        self.last_info = public_info(self.env, info)
        observations = [] if self.done else [{"role": "user", "content": obs}]
        return BaseTextEnvStepOutput(observations=observations, reward=float(reward), done=self.done,
                                     metadata=dict(self.last_info), postprocessed_action=action)

    def get_metrics(self) -> dict[str, Any]:
        """The episode's turns and return, and the terminal contract keys (``success``, ``em``)."""
        scores = {k: float(self.last_info[k]) for k in ("success", "em", "f1") if k in self.last_info}
        return {"turns": self.turns, "return": self.episode_return, **scores}

    def fork(self) -> TreegymTextEnv:
        """An independent env in this one's state (``treegym.envs.fork``); its steps never reach this one."""
        new = object.__new__(type(self))
        new.__dict__ = {**self.__dict__, "env": fork(self.env), "last_info": dict(self.last_info),
                        "tool_groups": list(self.tool_groups), "tool_to_toolgroup": dict(self.tool_to_toolgroup)}
        return new

    def __deepcopy__(self, memo: dict[int, Any]) -> TreegymTextEnv:
        return self.fork()

    def close(self) -> None:
        self.env.close()


def register_envs(env_ids: Sequence[str] | None = None) -> list[str]:
    """Register ``env_ids`` (default: every treegym family and probe id) with ``skyrl_gym``
    under the same ids; idempotent. Returns the ids."""
    from treegym.envs.probes import PROBE_IDS
    from treegym.envs.registry import FAMILIES

    register_treegym_envs()  # every family's record, whichever module registers it
    ids = list(env_ids) if env_ids is not None else list(dict.fromkeys([*FAMILIES, *PROBE_IDS]))
    for env_id in ids:
        if env_id in skyrl_gym.registry:
            spec = skyrl_gym.registry[env_id]
            if spec.entry_point is not TreegymTextEnv:
                raise ConfigError(f"skyrl_gym already has an env {env_id!r} ({spec.entry_point}); not treegym's")
            continue
        skyrl_gym.register(id=env_id, entry_point=TreegymTextEnv, kwargs={"env_id": env_id})
    return ids


__all__ = ["TreegymTextEnv", "register_envs", "template", "turn_budget"]
