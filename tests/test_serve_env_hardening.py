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

from websockets.exceptions import ConnectionClosed  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from treegym.errors import TreegymError  # noqa: E402
from treegym.integrations.openenv import SESSION_HEADER as SESSION  # noqa: E402
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
        token = env.session_token()
    assert len(ids) == 3 and all(len(i) >= 24 for i in ids)
    refused = requests.post(f"{server.url}/fork", json={"episode_id": "alice"}, headers={SESSION: token}, timeout=10)
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
            bob.reset(attach=child, session=alice.session_token())  # alice's token: the right to drive it
            assert _live(server) == 3
        assert _live(server) == 0  # alice's session ended: her episode and both forks with it
        with pytest.raises(RuntimeError, match="no live episode"):
            bob.step("A")


def _refusal(response: requests.Response, episode_id: str) -> str:
    """A refusal's text with the id it names taken out, to compare refusals of different ids."""
    assert response.status_code == 404, response.text
    return response.json()["detail"].replace(repr(episode_id), "ID")


def test_no_route_lets_another_session_touch_an_episode_nor_says_whether_it_exists(server_factory):
    server = server_factory()
    with TreegymEnvClient(server.url).sync() as bob, TreegymEnvClient(server.url).sync() as mallory:
        bob.reset(seed=0)
        bob.step("A")
        bobs, snap, child = bob.state().episode_id, bob.snapshot(), bob.fork()
        mallory.reset(seed=0)
        as_mallory = {SESSION: mallory.session_token()}
        made_up = "x" * len(bobs)
        for eid in (bobs, child):
            for path, body in (("/fork", {"episode_id": eid}), ("/snapshot", {"episode_id": eid}),
                               ("/restore", {"episode_id": eid, "snapshot_id": snap})):
                url = f"{server.url}{path}"
                theirs = _refusal(requests.post(url, json=body, headers=as_mallory, timeout=10), eid)
                none = _refusal(requests.post(url, json={**body, "episode_id": made_up}, headers=as_mallory,
                                              timeout=10), made_up)
                assert theirs == none, path  # word for word: the refusal tells nothing
                anonymous = requests.post(url, json=body, headers={SESSION: "guess"}, timeout=10)
                assert _refusal(anonymous, eid) == theirs
                assert requests.post(url, json=body, timeout=10).status_code == 401  # no session named
            theirs = _refusal(requests.delete(f"{server.url}/episodes/{eid}", headers=as_mallory, timeout=10), eid)
            assert theirs == _refusal(requests.delete(f"{server.url}/episodes/{made_up}", headers=as_mallory,
                                                      timeout=10), made_up)
        # The WebSocket form: attaching to bob's fork needs bob's token, and refuses as for no fork at all.
        refusals = []
        for eid, token in ((child, None), (child, "guess"), (child, mallory.session_token()), (made_up, None)):
            with pytest.raises(RuntimeError) as refused:
                mallory.reset(attach=eid, session=token)
            refusals.append(str(refused.value).replace(repr(eid), "ID"))
        assert len(set(refusals)) == 1 and "no live episode ID of this session" in refusals[0]
        # Nothing of bob's was touched: his episode steps on, his fork and snapshot still work.
        assert bob.state().step_count == 1 and bob.step("A").observation.episode_id == bobs
        assert bob.restore(snap).observation.episode_id == bobs
        assert requests.get(f"{server.url}/episodes", timeout=10).json()["live_episodes"] == 3
        assert requests.delete(f"{server.url}/episodes/{child}", headers={SESSION: bob.session_token()},
                               timeout=10).status_code == 200


# ---- no client can starve the server ----------------------------------------------------------


def test_one_session_cannot_take_every_snapshot(server_factory):
    server = server_factory(max_snapshots=5, max_session_snapshots=2)
    with TreegymEnvClient(server.url).sync() as greedy, TreegymEnvClient(server.url).sync() as other:
        greedy.reset(seed=0)
        greedy.snapshot()
        greedy.snapshot()
        with pytest.raises(TreegymError, match="this session holds 2 snapshots, its limit .--max-session-snapshots"):
            greedy.snapshot()
        other.reset(seed=0)
        assert other.restore(other.snapshot()).observation.text  # another session still gets its own
        assert requests.get(f"{server.url}/episodes", timeout=10).json()["snapshots"] == 3


def test_a_websocket_client_past_max_episodes_gets_the_capacity_error_before_the_close(server_factory):
    server = server_factory(max_episodes=2)
    url = server.url.replace("http://", "ws://") + "/ws"
    with TreegymEnvClient(server.url).sync() as a, TreegymEnvClient(server.url).sync() as b:
        a.reset(seed=0)
        b.reset(seed=0)
        for _ in range(4):  # a client that reads first: the error with its limit and a retry hint, then a 1013
            with connect(url) as ws:
                reply = json.loads(ws.recv(timeout=10))
                assert reply["type"] == "error" and reply["data"]["code"] == "CAPACITY_REACHED"
                assert reply["data"]["max_sessions"] == 2 and reply["data"]["retry_after_s"] > 0
                assert "retry in" in reply["data"]["message"]
                with pytest.raises(ConnectionClosed) as closed:
                    ws.recv(timeout=10)
                assert closed.value.rcvd.code == 1013 and "retry in" in closed.value.rcvd.reason
        for _ in range(4):  # a client that sends at once: its send may fail, the reason still reaches it
            late = TreegymEnvClient(server.url).sync()
            with pytest.raises((TreegymError, RuntimeError), match="at capacity: 2 .*retry in"):
                late.reset(seed=0)
            late.close()
        assert a.step("A").observation.text  # the sessions inside the limit go on


def test_forks_count_against_their_creator_so_resets_never_starve_and_delete_frees_one(server_factory):
    server = server_factory(max_episodes=2, max_forks=2)
    with TreegymEnvClient(server.url).sync() as greedy, TreegymEnvClient(server.url).sync() as other:
        greedy.reset(seed=0)
        forks = [greedy.fork(), greedy.fork()]
        with pytest.raises(TreegymError, match="this session holds 2 forks, its limit"):
            greedy.fork()
        other.reset(seed=0)  # 2 forks held, yet a reset of another session goes through
        mine = {SESSION: greedy.session_token()}
        gone = requests.delete(f"{server.url}/episodes/{forks[0]}", headers=mine, timeout=10)
        assert gone.status_code == 200 and gone.json() == {"deleted": forks[0]}
        assert requests.delete(f"{server.url}/episodes/{forks[0]}", headers=mine, timeout=10).status_code == 404
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
