"""`treegym serve-env` under a hostile client: no labels on the wire, no access to another
session's episodes, no starving the server, and bad input answered with a 4xx.

Real servers (openenv-core's app under uvicorn on 127.0.0.1), real clients (openenv-core's
``EnvClient``, ``requests``, ``websockets``).
"""

from __future__ import annotations

import json

import pytest
import requests

openenv = pytest.importorskip("openenv", reason="needs pip install 'treegym[openenv]'")

from websockets.sync.client import connect  # noqa: E402

from treegym.errors import TreegymError  # noqa: E402
from treegym.integrations.openenv import TreegymEnvClient  # noqa: E402

LABELS = ("answers", "supporting_ids", "supporting_titles")


def _live(server) -> int:
    return requests.get(f"{server.url}/episodes", timeout=10).json()["live_episodes"]


# ---- labels stay on the server ----------------------------------------------------------------


def test_no_label_reaches_a_client_from_reset_to_the_last_step(server_factory):
    server = server_factory("TreeSearchQA-v0", env_kwargs={"index": "bm25"})
    with TreegymEnvClient(server.url).sync() as env:
        first = env.reset(seed=0)
        last = env.step("<think>x</think><answer>nobody</answer>")
    assert not set(LABELS) & set(first.observation.info) and "task_id" in first.observation.info
    assert last.done and last.observation.info["success"] == 0.0 and "em" in last.observation.info
    assert not set(LABELS) & set(last.observation.info)
    raw = requests.post(f"{server.url}/reset", json={"seed": 0}, timeout=30).text
    assert not any(label in raw for label in LABELS)


def test_the_trl_adapter_shows_no_label_but_its_env_still_has_them():
    pytest.importorskip("trl")
    from treegym.integrations.trl import environment_factory

    env = environment_factory("TreeSearchQA-v0", index="bm25")()
    env.reset(seed=0)
    assert not set(LABELS) & set(env.info)
    env.answer("nobody")  # the QA family's own tool (the adapter has no generic step for it)
    assert env.ended and "success" in env.info and not set(LABELS) & set(env.info)
    assert env.env.unwrapped.state.item.answers  # a trainer that needs a label asks the env


# ---- episodes and snapshots belong to their session -------------------------------------------


def test_an_episode_id_is_the_servers_unguessable_choice(server_factory):
    server = server_factory()
    with TreegymEnvClient(server.url).sync() as env:
        with pytest.raises(RuntimeError, match="the server picks episode ids"):
            env.reset(seed=0, episode_id="alice")
        ids = {env.reset(seed=0).observation.episode_id for _ in range(3)}
    assert len(ids) == 3 and all(len(i) >= 24 for i in ids)
    refused = requests.post(f"{server.url}/fork", json={"episode_id": "alice"}, timeout=10)
    assert refused.status_code == 404


def test_a_snapshot_restores_only_into_an_episode_of_its_own_session(server_factory):
    server = server_factory()
    with TreegymEnvClient(server.url).sync() as alice, TreegymEnvClient(server.url).sync() as bob:
        alice.reset(seed=0)
        alice.step("A")
        snap = alice.snapshot()
        bob.reset(seed=0)
        with pytest.raises(TreegymError, match="no snapshot .* of this session"):
            bob.restore(snap)
        assert bob.state().step_count == 0
        assert alice.restore(snap).observation.text  # its own session may


def test_forks_belong_to_their_creator_and_are_freed_with_it(server_factory):
    server = server_factory()
    with TreegymEnvClient(server.url).sync() as bob:
        with TreegymEnvClient(server.url).sync() as alice:
            alice.reset(seed=0)
            child = alice.fork()
            alice.fork()
            bob.reset(attach=child)  # the id is the right to drive it
            assert _live(server) == 3
        assert _live(server) == 0  # alice's session ended: her episode and both forks with it
        with pytest.raises(RuntimeError, match="no live episode"):
            bob.step("A")


# ---- no client can starve the server ----------------------------------------------------------


def test_forks_count_against_their_creator_so_resets_never_starve_and_delete_frees_one(server_factory):
    server = server_factory(max_episodes=2, max_forks=2)
    with TreegymEnvClient(server.url).sync() as greedy, TreegymEnvClient(server.url).sync() as other:
        greedy.reset(seed=0)
        forks = [greedy.fork(), greedy.fork()]
        with pytest.raises(TreegymError, match="this session holds 2 forks, its limit"):
            greedy.fork()
        other.reset(seed=0)  # 2 forks held, yet a reset of another session goes through
        gone = requests.delete(f"{server.url}/episodes/{forks[0]}", timeout=10)
        assert gone.status_code == 200 and gone.json() == {"deleted": forks[0]}
        assert requests.delete(f"{server.url}/episodes/{forks[0]}", timeout=10).status_code == 404
        greedy.fork()  # room again


def test_mcp_is_off_unless_asked_for(server_factory):
    off, on = server_factory(), server_factory(mcp=True)
    rpc = {"jsonrpc": "2.0", "method": "openenv/session/create", "id": 1, "params": {}}
    assert requests.post(f"{off.url}/mcp", json=rpc, timeout=10).status_code == 404
    assert requests.post(f"{on.url}/mcp", json=rpc, timeout=10).status_code == 200
    with connect(off.url.replace("http://", "ws://") + "/ws") as ws:
        for _ in range(3):
            ws.send(json.dumps({"type": "mcp", "data": rpc}))
            reply = json.loads(ws.recv())
            assert reply["type"] == "error" and "serves no MCP" in reply["data"]["message"]
        ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
        assert json.loads(ws.recv())["type"] == "observation"


def test_a_request_body_over_the_cap_is_a_413_before_it_is_read(server_factory):
    server = server_factory(max_body_bytes=64 << 10)
    big = b'{"action": {"text": "' + b"x" * (1 << 20) + b'"}}'
    too_big = requests.post(f"{server.url}/step", data=big, headers={"Content-Type": "application/json"}, timeout=30)
    assert too_big.status_code == 413 and "byte cap" in too_big.json()["detail"]
    chunked = requests.post(f"{server.url}/step", data=iter([big[:50_000], big[50_000:]]), timeout=30)
    assert chunked.status_code == 413  # no Content-Length: counted as it arrives
    small = requests.post(f"{server.url}/reset", json={"seed": 0}, timeout=10)
    assert small.status_code == 200


# ---- bad input is a 4xx or an error message, and the session lives on ---------------------------


def test_a_nan_seed_and_an_unknown_task_id_are_4xx_not_500(server_factory):
    keys, household = server_factory(), server_factory("TextHousehold-v0")
    nan = requests.post(f"{keys.url}/reset", data='{"seed": NaN}', headers={"Content-Type": "application/json"},
                        timeout=10)
    assert nan.status_code == 422
    unknown = requests.post(f"{household.url}/reset", json={"task_id": "nope"}, timeout=10)
    assert unknown.status_code == 400 and "bad task id 'nope'" in unknown.json()["detail"]


def test_a_websocket_message_that_is_json_but_not_an_object_does_not_end_the_session(server_factory):
    server = server_factory()
    with connect(server.url.replace("http://", "ws://") + "/ws") as ws:
        ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
        assert json.loads(ws.recv())["type"] == "observation"
        for junk in ("[]", "1", '"step"', "null"):
            ws.send(junk)
            reply = json.loads(ws.recv())
            assert reply["type"] == "error" and "JSON object" in reply["data"]["message"], junk
        ws.send(json.dumps({"type": "step", "data": {"text": "A"}}))
        assert json.loads(ws.recv())["type"] == "observation"
