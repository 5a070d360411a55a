"""TRL adapter: a treegym env id as a ``GRPOTrainer`` ``environment_factory``, its tasks as rows.

TRL 1.16's ``GRPOTrainer(environment_factory=...)`` calls the factory once per concurrent
rollout, calls ``reset(**row)`` on the instance with each dataset row (the returned text is
appended to the row's last user message), exposes the instance's public methods as tools the
model calls through its chat template, and scores each rollout with ``get_reward()``. This
module maps a treegym episode onto that:

- ``reset(**row)``: ``env.reset(seed=row["seed"], options={"task_id": row["task_id"]})``;
  returns the env's opening prompt.
- one tool, ``step(action)``: one env turn; the action is the text of the turn in the env's
  own protocol (``<search>q</search>``, ``<answer>a</answer>``, a probe's move), and the tool
  returns the env's observation. A step after the episode ended returns a note, never raises.
- ``get_reward()``: the episode's return (the sum of the env's rewards).

Why this path and not ``rollout_func``: TRL's tool loop (``GRPOTrainer._tool_call_loop``)
generates with plain transformers ``generate`` unless ``use_vllm`` is set, so the
environment path runs on a CPU without vLLM. TRL then owns generation and training; treegym
owns the episode. (Forked tree rollouts are treegym's own trainers' job: TRL's GRPO samples
independent chains.)

The model's chat template must render tool calls and TRL must be able to parse them (TRL
knows the Qwen, Llama 3.1+, GLM, GPT-OSS, LFM, Gemma 4 templates; see
``trl.chat_template_utils.add_response_schema``). SmolLM2's own template renders no tools.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

from treegym.envs import base_env, fork, make, public_info
from treegym.errors import ConfigError, MissingPackageError

try:
    import trl  # noqa: F401  (fail here, in one line, not deep inside a trainer)
    from datasets import Dataset
except ImportError:
    raise MissingPackageError("trl", "treegym's TRL adapter", "pip install 'treegym[trl]'") from None

ENDED = "The episode has ended. Reply without calling a tool."


class TRLEnv:
    """One treegym env as a TRL environment: ``reset(**row)``, the ``step`` tool, ``get_reward()``.

    Public methods other than ``reset`` and ``get_reward`` become tools for TRL, so the class
    has exactly one (``step``); what a reward function may read is on properties.
    """

    def __init__(self, env: gym.Env) -> None:
        self._env = env
        self._return = 0.0
        self._turns = 0
        self._ended = True
        self._info: dict[str, Any] = {}

    def reset(self, task_id: str | None = None, seed: int | None = None, **row: Any) -> str:
        """Start an episode on the row's task (``task_id``) or seed; return the opening prompt."""
        options = None if task_id is None else {"task_id": task_id}
        obs, info = self._env.reset(seed=None if seed is None else int(seed), options=options)
        self._return, self._turns, self._ended, self._info = 0.0, 0, False, public_info(self._env, info)
        return obs

    def step(self, action: str) -> str:
        """Take one turn in the environment and return what it shows next.

        Args:
            action: your whole turn, written as the task's instructions ask, e.g. a search or an answer in their tags.
        """
        if self._ended:
            return ENDED
        obs, reward, terminated, truncated, info = self._env.step(action)
        self._return += float(reward)
        self._turns += 1
        self._info = public_info(self._env, info)
        self._ended = bool(terminated or truncated)
        return f"{obs}\n{ENDED}" if self._ended else obs

    def get_reward(self) -> float:
        """The episode's return: the sum of the env's rewards so far."""
        return self._return

    @property
    def env(self) -> gym.Env:
        """The treegym env (fork or snapshot it with ``treegym.envs``)."""
        return self._env

    @property
    def turns(self) -> int:
        """Steps taken in this episode."""
        return self._turns

    @property
    def ended(self) -> bool:
        """Whether the episode terminated or was truncated."""
        return self._ended

    @property
    def info(self) -> dict[str, Any]:
        """The last step's info (at the end: ``success``, and ``em`` for QA envs), without the
        task's labels (``treegym.envs.public_info``); the env itself (``.env``) has them."""
        return self._info


def environment_factory(env_id: str, split: str | None = None, **env_kwargs: Any) -> Callable[[], TRLEnv]:
    """A ``GRPOTrainer(environment_factory=...)`` for ``env_id``: each call returns a ``TRLEnv``.

    The env is made once (``treegym.envs.make(env_id, split, **env_kwargs)``); every instance
    is a fork of it, so all of them share its backends (index, HTTP cache, world templates).
    """
    template = make(env_id, split, **env_kwargs)
    base_env(template)  # a NotForkableError here, not at the first rollout, for an env treegym cannot fork
    return lambda: TRLEnv(fork(template))


def task_dataset(env_id: str, split: str | None = None, *, n: int | None = None, first_seed: int = 0,
                 **env_kwargs: Any) -> Dataset:
    """The env's tasks as ``GRPOTrainer`` rows, for ``environment_factory(env_id, **env_kwargs)``.

    Each row has a ``prompt`` (an empty user message, which ``reset`` fills) and either a
    ``task_id`` (one row per task of ``env.unwrapped.task_ids()``, the first ``n`` if given)
    or, when the env draws its tasks from the seed, a ``seed`` (``n`` rows, seeds from
    ``first_seed``). ``split`` and ``env_kwargs`` are ``environment_factory``'s.
    """
    if n is not None and n < 1:
        raise ConfigError(f"task_dataset: n must be at least 1, got {n}")
    env = make(env_id, split, **env_kwargs)
    ids = base_env(env).task_ids()
    env.close()
    prompt = [{"role": "user", "content": ""}]
    if ids is not None:
        ids = list(ids)[:n]
        return Dataset.from_dict({"prompt": [prompt] * len(ids), "task_id": ids})
    if n is None:
        raise ConfigError(f"{env_id} draws its tasks from the seed: pass n, the number of rows (seeds) to make")
    seeds = list(range(first_seed, first_seed + n))
    return Dataset.from_dict({"prompt": [prompt] * n, "seed": seeds})


__all__ = ["ENDED", "TRLEnv", "environment_factory", "task_dataset"]
