"""`treegym serve-env`: a treegym env behind OpenEnv's real server (openenv 0.10, or openenv-core 0.3), driven by its real client.

Every server here is a real uvicorn server on 127.0.0.1 with a free port; every client is
openenv-core's own (``EnvClient`` subclassed as ``TreegymEnvClient``, and ``GenericEnvClient``).
The probe env ProbeKeys-v0 is the cheap env: dense reward, "ok"/"no" after each turn.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gymnasium as gym
import pytest
import requests

from treegym.cli import main
from treegym.envs import fork

openenv = pytest.importorskip("openenv", reason="needs pip install 'treegym[openenv]'")

from openenv.core.generic_client import GenericEnvClient  # noqa: E402

from treegym.errors import TreegymError  # noqa: E402
from treegym.integrations.openenv import TreegymEnvClient  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ENV = "ProbeKeys-v0"


def _openenv_version() -> tuple[int, ...]:
    """The OpenEnv release under test: the ``openenv`` distribution (0.10+), else ``openenv-core`` (0.3)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        text = version("openenv")
    except PackageNotFoundError:
        text = version("openenv-core")
    return tuple(int(p) for p in text.split(".")[:2])


OPENENV_VERSION = _openenv_version()


@pytest.fixture()
def server(server_factory):
    return server_factory(max_episodes=8)


def local_moves(env_id: str = ENV):
    """A right and a wrong move for turn 2 after move 'A', found on a local env by forking."""
    env = gym.make(env_id)
    env.reset(seed=0)
    env.step("A")
    rewards = {}
    for move in ("A", "B", "C", "D"):
        branch = fork(env)
        rewards[move] = branch.step(move)
    right = next(m for m, r in rewards.items() if r[1] > 0)
    wrong = next(m for m, r in rewards.items() if r[1] == 0)
    return rewards[right], rewards[wrong], right, wrong


def test_fork_is_a_new_episode_in_the_parents_state_and_independent(server):
    (right_obs, right_reward, *_), (wrong_obs, wrong_reward, *_), right, wrong = local_moves()
    with TreegymEnvClient(server.url).sync() as parent:
        start = parent.reset(seed=0)
        assert start.observation.text and not start.done
        after_a = parent.step("A")
        snap = parent.snapshot()
        child_id = parent.fork()
        parent_id = parent.state().episode_id
        assert child_id != parent_id

        with GenericEnvClient(server.url).sync() as child:  # openenv's generic client drives the fork
            attached = child.reset(attach=child_id, session=parent.session_token())
            assert attached.observation["text"] == after_a.observation.text  # starts in the parent's state
            assert attached.observation["episode_id"] == child_id
            state = child.state()
            assert state["step_count"] == 1 and state["parent_id"] == parent_id

            # Step both episodes differently: each sees only its own move.
            p = parent.step(right)
            c = child.step({"text": wrong})
            assert (p.observation.text, p.reward) == (right_obs, right_reward)
            assert (c.observation["text"], c.reward) == (wrong_obs, wrong_reward)
            assert p.reward != c.reward
            assert parent.state().step_count == 2 and child.state()["step_count"] == 2

        # Restore the parent to its snapshot (taken after 'A'), then replay the fork's move.
        restored = parent.restore(snap)
        assert restored.observation.text == after_a.observation.text
        assert restored.observation.episode_id == parent_id
        assert parent.state().step_count == 1
        again = parent.step(wrong)
        assert (again.observation.text, again.reward) == (wrong_obs, wrong_reward)


def test_concurrent_sessions_never_mix_their_episodes(server):
    plays = ["AAAA", "BBBB", "ABCD", "DCBA"]

    def served(moves: str) -> list[tuple[str, float]]:
        with TreegymEnvClient(server.url).sync() as env:
            env.reset(seed=0)
            return [(r.observation.text, r.reward) for r in (env.step(m) for m in moves)]

    def local(moves: str) -> list[tuple[str, float]]:
        env = gym.make(ENV)
        env.reset(seed=0)
        return [tuple(env.step(m)[:2]) for m in moves]

    with ThreadPoolExecutor(len(plays)) as pool:
        results = list(pool.map(served, plays))
    assert results == [local(m) for m in plays]


def test_observations_are_typed_with_text_reward_done_and_info(server):
    with TreegymEnvClient(server.url).sync() as env:
        result = env.reset(seed=0)
        assert len(result.observation.episode_id) >= 24 and result.reward is None
        for _ in range(4):  # ProbeKeys-v0's horizon
            result = env.step("A")
            assert isinstance(result.observation.text, str) and isinstance(result.reward, float)
        obs = result.observation
        assert result.done and obs.done and obs.terminated and not obs.truncated
        assert obs.info["success"] in (0.0, 1.0) and obs.info["turn"] == 4
        assert env.state().done
        with pytest.raises(RuntimeError, match="after the episode ended"):
            env.step("A")
        with pytest.raises(RuntimeError, match="unknown options"):
            env.reset(sed=1)


def test_http_routes_speak_openenv_and_errors_are_json(server):
    reset = requests.post(f"{server.url}/reset", json={"seed": 0}, timeout=10).json()
    assert reset["observation"]["text"] and reset["done"] is False
    schema = requests.get(f"{server.url}/schema", timeout=10).json()
    assert "text" in schema["action"]["properties"] and "info" in schema["observation"]["properties"]
    step = requests.post(f"{server.url}/step", json={"action": {"text": "A"}}, timeout=10)
    assert step.status_code == 400 and "reset()" in step.json()["detail"]
    anonymous = requests.post(f"{server.url}/fork", json={"episode_id": "nope"}, timeout=10)
    assert anonymous.status_code == 401 and "X-Treegym-Session" in anonymous.json()["detail"]
    missing = requests.post(f"{server.url}/fork", json={"episode_id": "nope"},
                            headers={"X-Treegym-Session": "nope"}, timeout=10)
    assert missing.status_code == 404 and "no live episode" in missing.json()["detail"]
    assert requests.get(f"{server.url}/tasks", timeout=10).json() == {"env_id": ENV, "task_ids": None}


def test_reset_pins_a_task_listed_by_tasks(server_factory):
    server = server_factory("TextHousehold-v0")
    task_ids = requests.get(f"{server.url}/tasks", timeout=10).json()["task_ids"]
    assert len(task_ids) > 1
    with TreegymEnvClient(server.url).sync() as env:
        first = env.reset(task_id=task_ids[1])
        assert env.state().task_id == task_ids[1]
        assert env.reset(task_id=task_ids[1]).observation.text == first.observation.text


def test_live_episodes_are_bounded_with_a_clear_error(server_factory):
    server = server_factory(max_episodes=2, max_forks=1)
    with TreegymEnvClient(server.url).sync() as env, TreegymEnvClient(server.url).sync() as other:
        env.reset(seed=0)
        env.fork()  # 1 of its 1 fork
        with pytest.raises(TreegymError, match="this session holds 1 forks, its limit"):
            env.fork()
        episode_id = env.state().episode_id
        full = requests.post(f"{server.url}/fork", json={"episode_id": episode_id},
                             headers={"X-Treegym-Session": env.session_token()}, timeout=10)
        assert full.status_code == 503 and "--max-forks" in full.json()["detail"]
        other.reset(seed=0)  # forks never take the episodes that resets need: 2 of 2
        assert requests.get(f"{server.url}/episodes", timeout=10).json()["live_episodes"] == 3
        env.reset(seed=1)  # a session may always start over: its old episode makes room
        assert requests.get(f"{server.url}/episodes", timeout=10).json()["live_episodes"] == 3


def test_idle_episodes_and_snapshots_expire(server_factory):
    # 1.5 s, not less: on a loaded 2-core machine reset, fork and snapshot alone have taken 0.5 s.
    server = server_factory(idle_timeout_s=1.5)
    with TreegymEnvClient(server.url).sync() as env:
        env.reset(seed=0)
        child = env.fork()
        snap = env.snapshot()
        token = env.session_token()
        time.sleep(2.5)
        with pytest.raises(RuntimeError, match="idle for more than 1.5 s"):
            env.step("A")
        gone = requests.post(f"{server.url}/restore", json={"episode_id": child, "snapshot_id": snap},
                             headers={"X-Treegym-Session": token}, timeout=10)
        assert gone.status_code == 404
        assert requests.get(f"{server.url}/episodes", timeout=10).json()["live_episodes"] == 0
        env.reset(seed=0)  # and the session can start again


def test_binds_loopback_unless_told_otherwise(server):
    assert server.socket.getsockname()[0] == "127.0.0.1"
    assert server.url.startswith("http://127.0.0.1:")


def _taken_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


@pytest.mark.parametrize("argv,message", [
    (["serve-env", "NoSuchEnv-v0", "--port", "0"], "is not registered"),
    (["serve-env", ENV, "--port", "70000"], "--port must be from 0 to 65535"),
    (["serve-env", ENV, "--port", "-1"], "--port must be from 0 to 65535"),
    (["serve-env", ENV, "--port", "TAKEN"], "cannot bind 127.0.0.1:"),
    (["serve-env", ENV, "--port", "0", "--env-kwargs", "{oops"], "--env-kwargs is not valid JSON"),
    (["serve-env", ENV, "--port", "0", "--max-episodes", "0"], "--max-episodes"),
])
def test_bad_input_is_a_one_line_error(argv, message, capsys):
    taken = _taken_port()
    try:
        argv = [str(taken.getsockname()[1]) if a == "TAKEN" else a for a in argv]
        assert main(argv) == 2
    finally:
        taken.close()
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("treegym serve-env: error:") and message in err


def test_without_openenv_the_module_and_the_command_say_how_to_install(monkeypatch, capsys):
    for name in [m for m in sys.modules if m == "openenv" or m.startswith("openenv.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "openenv", None)  # makes `import openenv...` fail
    monkeypatch.delitem(sys.modules, "treegym.integrations.openenv")
    with pytest.raises(ImportError, match=r"pip install 'treegym\[openenv\]'"):
        import treegym.integrations.openenv  # noqa: F401
    assert main(["serve-env", ENV, "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs the package 'openenv'" in err


def test_the_command_serves_until_stopped():
    proc = subprocess.Popen([sys.executable, "-m", "treegym.cli", "serve-env", ENV, "--port", "0"],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        assert "serving ProbeKeys-v0 over OpenEnv at http://127.0.0.1:" in line, line
        url = line.split(" at ")[1].split()[0]
        with TreegymEnvClient(url).sync() as env:
            assert env.reset(seed=0).observation.text
            assert env.step("A").observation.info["turn"] == 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_accepted_connections_set_tcp_nodelay(server):
    # Without it every small answer on a keep-alive connection waits ~40 ms for the client's delayed ACK.
    assert server.socket.proto == socket.IPPROTO_TCP
    with requests.Session() as http:
        assert http.get(f"{server.url}/health", timeout=10).status_code == 200
        connections = list(server.server.server_state.connections)
        assert connections
        for conn in connections:
            sock = conn.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_reset_takes_gymnasium_options(server_factory):
    server = server_factory("TextHousehold-v0")
    task_ids = requests.get(f"{server.url}/tasks", timeout=10).json()["task_ids"]
    local = gym.make("TextHousehold-v0").reset(options={"task_id": task_ids[2]})[0]
    with TreegymEnvClient(server.url).sync() as env:
        assert env.reset(options={"task_id": task_ids[2]}).observation.text == local
        assert env.state().task_id == task_ids[2]
        drawn = env.reset(seed=3, options={"task_types": ["pick_and_place_simple"]})
        assert env.state().task_id.startswith("train") and "put" in drawn.observation.text.lower()
    over_http = requests.post(f"{server.url}/reset", json={"options": {"task_id": task_ids[2]}}, timeout=10).json()
    assert over_http["observation"]["text"] == local


def test_the_async_with_form_of_openenvs_readme_drives_the_server(server):
    import asyncio

    async def play() -> list[float]:
        async with GenericEnvClient(base_url=server.url) as client:  # OpenEnv README's first example
            result = await client.reset(seed=0)
            assert result.observation["text"] == "go"
            return [(await client.step({"text": move})).reward for move in "AB"]

    env = gym.make(ENV)
    env.reset(seed=0)
    assert asyncio.run(play()) == [env.step(m)[1] for m in "AB"]
    if OPENENV_VERSION < (0, 10):
        # openenv-core 0.3 refuses the plain `with GenericEnvClient(...)` of its docstrings itself;
        # docs/integrations.md shows `with GenericEnvClient(...).sync() as env` instead.
        with pytest.raises(TypeError, match=r"\.sync\(\)"):
            GenericEnvClient(base_url=server.url).__enter__()
    else:  # openenv 0.10 takes it
        with GenericEnvClient(base_url=server.url) as client:
            assert client.reset(seed=0).observation["text"] == "go"
