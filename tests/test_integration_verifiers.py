"""treegym envs under verifiers 0.4 (``verifiers.v1``): its own env, agent and rollout machinery.

``TreegymEnv.run_episode`` is verifiers' episode loop: it opens the player's interaction, whose
harness (verifiers' ``null`` chat harness, a real program in the ``subprocess`` runtime) calls
the model through verifiers' interception server, which forwards to the model endpoint. The
endpoint here is a stub OpenAI-compatible server on 127.0.0.1 (a real HTTP server, streaming
Server-Sent Events as verifiers asks) that answers from a script.

verifiers runs its harness program with ``uv`` (``uv sync --script`` the program's own
dependencies on first use). Nothing here leaves 127.0.0.1: uv installs those dependencies from
the wheels ``.ci/install-integrations`` fetched into the venv (``uv-wheels``), never from PyPI.
The tests skip without those wheels, or without ``uv`` on PATH (verifiers would download uv).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from openai_stub import ScriptedModel

import treegym  # noqa: F401  (registers the ids)

vf = pytest.importorskip("verifiers.v1", reason="needs pip install 'treegym[verifiers]'")
if shutil.which("uv") is None:
    pytest.skip("verifiers runs its harness with uv: put uv on PATH (pip install uv)", allow_module_level=True)

from verifiers.v1.harnesses.null.harness import NullHarnessConfig  # noqa: E402
from verifiers.v1.runtimes.subprocess import SubprocessConfig  # noqa: E402

from treegym.integrations.verifiers import (  # noqa: E402
    TASKSET_ID,
    TreegymEnv,
    TreegymEnvConfig,
    TreegymTasksetConfig,
    offline_uv_env,
)

KEYS = {"horizon": 3, "choices": 2}
WHEELS = Path(sys.prefix) / "uv-wheels"
if not WHEELS.is_dir():
    pytest.skip(f"verifiers' harness installs its packages from {WHEELS}: run .ci/install-integrations",
                allow_module_level=True)


@pytest.fixture(autouse=True, scope="module")
def uv_from_local_wheels():
    """uv installs the harness from the prefetched wheels, so an episode downloads nothing."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in offline_uv_env(WHEELS, Path(sys.executable)).items():
            patch.setenv(name, value)
        yield


def run_episode(replies: list[str], seed_tasks: int = 1):
    model = ScriptedModel(replies)
    os.environ.setdefault("TREEGYM_STUB_KEY", "loopback")
    config = TreegymEnvConfig(
        taskset=TreegymTasksetConfig(id=TASKSET_ID, env_id="ProbeKeys-v0", env_kwargs=KEYS, n=seed_tasks),
        player=vf.AgentConfig(harness=NullHarnessConfig(id="null"), runtime=SubprocessConfig()))
    env = TreegymEnv(config)
    task = next(iter(env.taskset))
    ctx = vf.ModelContext(model="stub", client=vf.EvalClientConfig(base_url=model.url, api_key_var="TREEGYM_STUB_KEY"))

    async def play():
        async with env.serving():
            return await env.run_episode(task, ctx)

    try:
        return asyncio.run(play()), model.requests, task
    finally:
        model.stop()


def test_verifiers_rollout_loop_plays_a_treegym_episode_against_a_loopback_model() -> None:
    keys = list(gym.make("ProbeKeys-v0", **KEYS).unwrapped.fixed_keys)
    episode, requests, task = run_episode(keys)

    assert episode.ok and not episode.errors
    (trace,) = episode.traces
    assert trace.rewards["treegym_return"].score == 1.0 and trace.metrics["success"] == 1.0
    # The env played the user: its opening prompt, then its observation after each reply.
    first, last = requests[0]["messages"], requests[-1]["messages"]
    assert first == [{"role": "user", "content": task.data.prompt}] and task.data.prompt == "go"
    assert [m["content"] for m in last if m["role"] == "user"] == ["go", "ok", "ok"]
    assert len(requests) == 3  # one model call per env turn, none after the episode ended


def test_a_wrong_reply_is_scored_by_the_env_not_by_verifiers() -> None:
    keys = list(gym.make("ProbeKeys-v0", **KEYS).unwrapped.fixed_keys)
    wrong = "B" if keys[0] == "A" else "A"
    episode, requests, _ = run_episode([wrong, *keys[1:]])
    (trace,) = episode.traces
    assert trace.rewards["treegym_return"].score == pytest.approx(2 / 3) and trace.metrics["success"] == 0.0
    assert [m["content"] for m in requests[-1]["messages"] if m["role"] == "user"] == ["go", "no", "ok"]


def test_the_taskset_yields_the_envs_tasks_by_id_with_its_opening_prompt() -> None:
    from treegym.integrations.verifiers import TreegymTaskset

    taskset = TreegymTaskset(TreegymTasksetConfig(id=TASKSET_ID, env_id="TextHousehold-v0", split="unseen", n=2))
    tasks = list(taskset)
    ids = gym.make("TextHousehold-v0", split="unseen").unwrapped.task_ids()[:2]
    assert [t.data.info["task_id"] for t in tasks] == ids
    own = gym.make("TextHousehold-v0", split="unseen").reset(options={"task_id": ids[1]})[0]
    assert tasks[1].data.prompt == own
    with pytest.raises(ValueError, match="draws its tasks from the seed"):
        list(TreegymTaskset(TreegymTasksetConfig(id=TASKSET_ID, env_id="ProbeKeys-v0")))
