"""verifiers adapter: any treegym env as a verifiers (0.4, ``verifiers.v1``) taskset and env.

verifiers 0.4 dropped ``GymEnv``. Its equivalent for a reset/step env is the pattern of its own
TextArena and OpenEnv tasksets: a ``Taskset`` yields one task per env task, and the ``Env``'s
``run(task, agents)`` plays the user. It opens ``agents.player.interaction(task)``, takes the
model's reply to the opening prompt (``turn()``), steps the env with it, and sends each
observation back as the next user turn, until the episode ends. The env's return is the trace's
``treegym_return`` reward, and the terminal ``success`` (and QA's ``em``) are recorded as
metrics.

- ``TreegymTasksetConfig``: ``env_id``, ``split``, ``env_kwargs``, and ``n`` (the first ``n``
  task ids, or ``n`` seeds for an env that draws its tasks from the seed).
- Every episode is a fork of one template env per taskset, so episodes share its backends.

verifiers finds a taskset by a plugin id that names a top-level module, never a dotted path;
this module registers itself as ``treegym_verifiers`` in ``sys.modules`` on import, so
``TasksetConfig(id=TASKSET_ID)`` resolves in any process that imported it. Needs
``pip install 'treegym[verifiers]'``.

verifiers' chat harness is a PEP 723 script that it installs with ``uv sync --script`` on first
use, from PyPI. ``harness_requirements()`` lists that script's dependencies, so an install step
can fetch them ahead of time (``.ci/install-integrations``) and ``offline_uv_env`` points uv at
them, leaving nothing to download while episodes run.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import tomllib
from pydantic import Field

from treegym.envs import base_env, fork, make, public_info
from treegym.errors import MissingPackageError

try:
    import verifiers.v1 as vf
except ImportError:
    raise MissingPackageError("verifiers", "treegym's verifiers adapter", "pip install 'treegym[verifiers]'") from None

TASKSET_ID = "treegym_verifiers"


class TreegymTasksetConfig(vf.TasksetConfig):
    env_id: str = "ProbeKeys-v0"
    """The treegym env id (or ``module:Class``)."""
    split: str | None = None
    """The env's task split (None: its default)."""
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    """``treegym.envs.make`` keyword arguments, e.g. ``{"index": "bm25"}``."""
    n: int | None = None
    """The first ``n`` tasks; required for an env that draws its tasks from the seed (``n`` seeds)."""


class TreegymData(vf.TaskData):
    info: dict[str, Any]
    """The treegym task: ``env_id`` and ``task_id`` or ``seed``."""


class TreegymTask(vf.Task[TreegymData]):
    pass


class TreegymEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class TreegymTaskset(vf.Taskset[TreegymTask, TreegymTasksetConfig]):
    """The env's tasks, each with the env's opening prompt as its prompt."""

    _template: gym.Env | None = None

    @property
    def template(self) -> gym.Env:
        """The env every episode forks (made on first use)."""
        if self._template is None:
            config = self.config
            self._template = make(config.env_id, config.split, **config.env_kwargs)
            base_env(self._template)  # a NotForkableError now, not mid-eval
        return self._template

    def load(self) -> Iterator[TreegymTask]:
        config = self.config
        ids = base_env(self.template).task_ids()
        if ids is None and config.n is None:
            raise ValueError(f"{config.env_id} draws its tasks from the seed: set n, the number of seeds")
        keys = [{"task_id": str(t)} for t in list(ids)[:config.n]] if ids is not None else [
            {"seed": s} for s in range(config.n)]
        for key in keys:
            env = fork(self.template)
            opening, _ = reset(env, key)
            yield TreegymTask(TreegymData(name=f"{config.env_id}#{next(iter(key.values()))}", prompt=opening,
                                          info={"env_id": config.env_id, **key}), config.task)


def reset(env: gym.Env, key: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Reset ``env`` on a task key (``task_id`` or ``seed``)."""
    options = {"task_id": key["task_id"]} if "task_id" in key else None
    return env.reset(seed=key.get("seed"), options=options)


class TreegymEnv(vf.Env[TreegymEnvConfig]):
    """One treegym episode per task: the env plays the user, the model plays the agent."""

    async def run(self, task: TreegymTask, agents: vf.Agents) -> None:
        env = fork(self.taskset.template)
        reset(env, task.data.info)
        total, info = 0.0, {}
        # The task's prompt is the env's opening, so the model speaks first (a bare turn()).
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                obs, reward, terminated, truncated, step_info = env.step(segment.last_reply)
                total += float(reward)
                info = public_info(env, step_info)
                if terminated or truncated:
                    break  # the episode is over: end the exchange
                segment = await interaction.turn(obs)
        trace = interaction.trace
        trace.record_reward("treegym_return", total)
        for key in ("success", "em", "f1"):
            if key in info:
                trace.record_metric(key, float(info[key]))


def harness_requirements() -> list[str]:
    """The dependencies that verifiers' chat harness (``null`` and ``bash``) declares in its PEP 723 block."""
    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE

    lines = CHAT_PROGRAM_SOURCE.splitlines()
    start = lines.index("# /// script") + 1
    block = lines[start:lines.index("# ///", start)]
    return list(tomllib.loads("\n".join(line.removeprefix("#").removeprefix(" ") for line in block))
                .get("dependencies", []))


def offline_uv_env(wheels: Path, python: Path) -> dict[str, str]:
    """Environment variables under which verifiers' ``uv sync --script`` installs from ``wheels`` alone.

    verifiers sets ``UV_OFFLINE=false`` for that step, so offline mode cannot be forced; instead
    the default index is an empty local folder (no server to ask) and ``wheels`` is uv's only
    source (``find-links``). ``python`` fixes the interpreter the wheels were fetched for.
    """
    no_index = wheels / "no-index"
    no_index.mkdir(parents=True, exist_ok=True)
    return {"UV_DEFAULT_INDEX": str(no_index), "UV_FIND_LINKS": str(wheels), "UV_PYTHON": str(python),
            "UV_PYTHON_DOWNLOADS": "never"}


sys.modules.setdefault(TASKSET_ID, sys.modules[__name__])

__all__ = ["TASKSET_ID", "TreegymData", "TreegymEnv", "TreegymEnvConfig", "TreegymTask", "TreegymTaskset",
           "TreegymTasksetConfig", "harness_requirements", "offline_uv_env"]
