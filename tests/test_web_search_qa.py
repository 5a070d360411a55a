"""WebSearchQA-v0 end to end, against a real local web on 127.0.0.1, with faults injected."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path

import gymnasium as gym
import pytest
import requests
from gymnasium.utils.env_checker import check_env
from web_servers import FaultServer, small_corpus

import treegym  # noqa: F401 (registers the ids)
from treegym.envs import EnvPool
from treegym.envs.checker import check_fork_contract
from treegym.envs.web.http import HttpConfig
from treegym.envs.web.local_web import LocalWeb
from treegym.envs.web_search_qa import WebSearchQAEnv
from treegym.errors import ConfigError

QA = str(Path(__file__).parent / "web_fixtures" / "qa.jsonl")
NET = HttpConfig(connect_timeout_s=2.0, read_timeout_s=5.0, retries=1, backoff_base_s=0.01, backoff_max_s=0.02)
IMPATIENT = HttpConfig(connect_timeout_s=1.0, read_timeout_s=0.3, retries=1, backoff_base_s=0.01, backoff_max_s=0.02)


@pytest.fixture(scope="module")
def docs():
    return small_corpus()


@pytest.fixture(scope="module")
def web(docs):
    with LocalWeb(docs) as w:
        yield w


@pytest.fixture(scope="module")
def faults():
    srv = FaultServer()
    yield srv
    srv.stop()


@pytest.fixture()
def make(web, tmp_path):
    def build(**kw):
        kw.setdefault("dataset", QA)
        kw.setdefault("search_url", web.url)
        kw.setdefault("cache_path", str(tmp_path / "cache.sqlite"))
        kw.setdefault("http", NET)
        kw.setdefault("browse_allow", ("127.0.0.1",))  # the fault server is on loopback too
        return WebSearchQAEnv(**kw)

    return build


def first_url(obs: str) -> str:
    return re.search(r"URL: (\S+)", obs).group(1)


def test_an_episode_searches_browses_part_by_part_and_answers(make, web):
    env = make(page_chars=300)
    obs, info = env.reset(options={"task_id": "web-1"})
    assert "Who wrote the tragedy Hamlet?" in obs and "<browse>" in obs
    obs, *_ = env.step("<think>find the play</think><search>Hamlet tragedy</search>")
    assert obs.count("Doc ") >= 1 and "(Title: Hamlet)" in obs
    url = first_url(obs)
    obs, reward, term, trunc, info = env.step(f"<think>read it</think><browse>{url}</browse>")
    assert "Part 1 of " in obs and "William Shakespeare" in obs and f"<browse>{url}#page=2</browse>" in obs
    assert "treegym local web" not in obs.split("Part 1")[1]  # header/nav/footer are stripped
    obs, *_ = env.step("<think>more</think><browse>next</browse>")
    assert "Part 2 of " in obs
    obs, reward, term, trunc, info = env.step("<think>done</think><answer>Shakespeare</answer>")
    assert (reward, term, trunc) == (1.0, True, False) and info["em"] == 1.0
    assert info["visited"] == [f"{url}#page=1", f"{url}#page=2"]


def test_the_registered_id_builds_the_env(web, tmp_path):
    env = gym.make("WebSearchQA-v0", dataset=QA, search_url=web.url, cache_path=str(tmp_path / "c.sqlite"))
    obs, _ = env.reset(seed=1)
    assert "Question:" in obs


def test_gymnasium_check_env_passes_without_warnings(make):
    env = make()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env, skip_render_check=True)


def test_fork_contract_holds(make):
    check_fork_contract(
        lambda: make(page_chars=300),
        ["<search>Hamlet</search>", "<browse>next</browse>", "<search>William Shakespeare</search>",
         "<answer>Shakespeare</answer>"],
        alt_actions=["<search>Paris</search>", "<answer>Paris</answer>"],
        reset_options={"task_id": "web-1"},
    )


def test_a_fork_that_repeats_a_query_is_served_from_the_cache(make, web):
    env = make()
    env.reset(options={"task_id": "web-2"})
    env.step("<search>sixteenth president Lincoln</search>")
    before = web.requests
    child = env.fork()
    obs, *_ = child.step("<search>sixteenth president Lincoln</search>")
    assert "Abraham Lincoln" in obs and web.requests == before
    assert env.cache.stats.hits >= 1
    assert child.tools is env.tools and child.cache is env.cache


def test_forks_never_share_page_state(make, web):
    env = make(page_chars=300)
    env.reset(options={"task_id": "web-1"})
    env.step(f"<browse>{web.url}/wiki/Hamlet</browse>")
    child = env.fork()
    child.step(f"<browse>{web.url}/wiki/Abraham_Lincoln</browse>")
    assert "URL: " + web.url + "/wiki/Hamlet" in env.step("<browse>next</browse>")[0]
    assert "URL: " + web.url + "/wiki/Abraham_Lincoln" in child.step("<browse>next</browse>")[0]


def test_a_search_past_the_timeout_is_an_observation(docs, make, tmp_path):
    with LocalWeb(docs[:20], latency_s=1.0) as slow:
        env = make(search_url=slow.url, http=IMPATIENT)
        env.reset(seed=0)
        obs, reward, term, trunc, info = env.step("<search>anything</search>")
    assert "Search failed: timed out after 0.3 s" in obs and info["tool_error"] == "Search failed: timed out after 0.3 s"
    assert (reward, term) == (0.0, False)


@pytest.mark.parametrize(("target", "message"), [
    ("/down", "Browse failed: HTTP 503 (server error) (gave up after 2 attempts)"),
    ("/pdf", "Browse failed: not a text page (application/pdf)"),
    ("/truncated", "Browse failed: connection broke mid-response"),
    ("/ratelimit?after=600", "Browse failed: HTTP 429 (rate limited); Retry-After 600 s is over the 30 s limit"),
])
def test_a_failing_page_is_an_observation(make, faults, target, message):
    env = make()
    env.reset(seed=0)
    obs, _, _, _, info = env.step(f"<browse>{faults.url}{target}</browse>")
    assert message in obs and info["tool_error"].startswith(message)


def test_a_ten_megabyte_page_is_read_up_to_the_cap(make, faults):
    env = make(http=HttpConfig(max_bytes=100_000, retries=0))
    env.reset(seed=0)
    obs, _, _, _, info = env.step(f"<browse>{faults.url}/huge?mb=10</browse>")
    assert "cut at the size limit" in obs and "lorem ipsum" in obs and "tool_error" not in info


def test_malformed_json_and_server_errors_from_search_are_observations(make, faults):
    env = make(backend=f"searxng:{faults.url}/malformed-json")
    env.reset(seed=0)
    assert "Search failed: malformed JSON from SearxNG" in env.step("<search>x</search>")[0]
    env = make(backend=f"searxng:{faults.url}/down")
    env.reset(seed=0)
    assert "Search failed: HTTP 503" in env.step("<search>x</search>")[0]


def test_a_server_that_goes_down_mid_episode_costs_nothing_but_observations(docs, make):
    web = LocalWeb(docs[:30]).start()
    env = make(search_url=web.url)
    env.reset(options={"task_id": "web-2"})
    first, *_ = env.step("<search>Abraham Lincoln</search>")
    web.stop()
    obs, _, _, _, info = env.step("<search>a new query</search>")
    assert "Search failed: cannot connect" in obs and "connection refused" in info["tool_error"]
    again, _, _, _, info = env.step("<search>Abraham Lincoln</search>")
    assert again == first and "tool_error" not in info  # served from the cache
    obs, _, _, _, info = env.step(f"<browse>{first_url(first)}</browse>")
    assert "Browse failed: cannot connect" in obs
    assert env.step("<answer>Abraham Lincoln</answer>")[1] == 1.0


def test_a_pool_of_envs_sends_its_requests_concurrently_in_one_batch(docs, make):
    with LocalWeb(docs, latency_s=0.05) as web:
        envs = [make(search_url=web.url) for _ in range(12)]
        for e in envs:
            e.reset(seed=0)
        pool = EnvPool()
        titles = [d.title for d in docs if d.title[:1].isalpha()][:11]
        actions = [f"<search>{t}</search>" for t in titles] + ["<browse>http://127.0.0.1:9/</browse>"]
        out = pool.step(envs, actions)
    assert pool.stats.calls_by_tool == {"search": 11, "browse": 1} and pool.stats.batches == 2
    assert web.max_inflight > 1
    assert all("<information>Doc 1(Title:" in out[i][0] for i in range(11))
    assert "Browse failed: cannot connect" in out[11][0] and "tool_error" in out[11][4]


def test_bad_actions_are_observations_not_exceptions(make):
    env = make(max_turns=3)
    env.reset(seed=0)
    obs, _, _, _, info = env.step("I think I will look it up")
    assert "My previous action is invalid" in obs and info["invalid_action"]
    obs, _, _, _, info = env.step("<browse>next</browse>")
    assert info["invalid_action"] and "before any page" in info["error"]
    obs, reward, term, trunc, info = env.step("<browse>ftp://example.org/file</browse>")
    assert "Browse failed: not an http(s) URL" in obs and trunc and not term and reward == 0.0


def test_wrong_arguments_are_config_errors(make):
    with pytest.raises(ConfigError, match="reward"):
        make(reward="bleu")
    with pytest.raises(ConfigError, match="unknown task_id"):
        make().reset(options={"task_id": "nope"})


def test_web_serve_binds_loopback_and_prints_its_url():
    proc = subprocess.Popen([sys.executable, "-m", "treegym.cli", "web", "serve", "--port", "0", "--limit", "40"],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+", line).group(0)
        health = requests.get(f"{url}/health", timeout=5).json()
        assert health["status"] == "ok" and health["documents"] == 40
        hits = requests.get(f"{url}/search", params={"q": "number", "format": "json"}, timeout=5).json()["results"]
        assert hits and hits[0]["url"].startswith(url + "/wiki/")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_synthetic_world_is_served_as_a_linked_web(tmp_path):
    env = WebSearchQAEnv(corpus="synthetic", synthetic_passages=200, cache_path=str(tmp_path / "c.sqlite"), http=NET)
    obs, info = env.reset(seed=0)
    assert info["task_id"].startswith("synq-")
    obs, *_ = env.step(f"<search>{env.state.item.question}</search>")
    url = first_url(obs)
    page, _, _, _, info = env.step(f"<browse>{url}</browse>")
    assert "tool_error" not in info and "Part 1 of" in page
    title = re.search(r"Page: (.+?) - treegym local web", page).group(1)
    passages = [d for d in env_site_docs(env) if d.title == title]
    assert all(p.text[:40] in page for p in passages)  # an entity's article holds all its passages


def env_site_docs(env):
    from treegym.envs.web.local_web import local_web_for

    return local_web_for("synthetic", 200).site.docs


def test_render_mode_ansi_is_accepted_and_passes_the_render_check(web, tmp_path):
    env = gym.make("WebSearchQA-v0", render_mode="ansi", dataset=QA, search_url=web.url,
                   cache_path=str(tmp_path / "cache.sqlite"), http=NET)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
    env.reset(seed=0)
    assert isinstance(env.render(), str)


def test_a_page_number_past_the_int_digit_limit_is_an_observation_not_an_exception(make, web):
    env = make()
    env.reset(seed=0)
    obs, _, _, _, info = env.step(f"<think>x</think><browse>{web.url}/wiki/Hamlet#page={'9' * 5000}</browse>")
    assert "there is no part" in obs and info["tool_error"]


# ---- browsing cannot reach private addresses (SSRF) -------------------------------------------------


def _browse(env, url: str) -> tuple[str, dict]:
    env.reset(seed=0)
    obs, _, _, _, info = env.step(f"<think>x</think><browse>{url}</browse>")
    return obs, info


def test_browsing_refuses_private_addresses_but_not_the_envs_own_local_web(make, web, faults):
    env = make(browse_allow=())
    obs, info = _browse(env, f"{web.url}/wiki/Hamlet")
    assert "William Shakespeare" in obs and "tool_error" not in info
    port = faults.url.rsplit(":", 1)[1]
    for url in (f"{faults.url}/slow?s=0&key=ssrf", f"http://localhost:{port}/slow?s=0&key=ssrf",
                f"http://[::1]:{port}/", f"http://[::ffff:127.0.0.1]:{port}/", "http://10.1.2.3/",
                "http://169.254.169.254/latest/meta-data/", f"http://0.0.0.0:{port}/", "http://192.168.0.1/"):
        obs, info = _browse(env, url)
        assert "refused" in info["tool_error"] and "non-public address" in obs, url
    assert faults.hits["/slow:ssrf"] == 0  # refused before any request was sent


def test_a_redirect_to_a_private_address_is_refused(make, faults):
    port = faults.url.rsplit(":", 1)[1]
    env = make(browse_allow=(f"127.0.0.1:{port}",))
    obs, info = _browse(env, f"{faults.url}/redirect?to=http://localhost:{port}/slow%3Fs%3D0%26key%3Dhop")
    assert "refused: localhost is a non-public address" in info["tool_error"]
    assert faults.hits["/slow:hop"] == 0


def _reached(server: FaultServer, key: str) -> int:
    """Requests ``server`` got with ``key=KEY`` on any path."""
    return sum(n for k, n in server.hits.items() if k.endswith(f":{key}"))


def test_a_backslash_or_user_info_cannot_smuggle_a_loopback_host_past_the_guard(make, faults):
    port = faults.url.rsplit(":", 1)[1]
    env = make(browse_allow=("allowed.example",))
    for url in (f"http://127.0.0.1:{port}\\@allowed.example/slow?s=0&key=smuggled",
                f"http://127.0.0.1:{port}\\@nonexistent.invalid/slow?s=0&key=smuggled",
                f"http://127.0.0.1:{port}@allowed.example/slow?s=0&key=smuggled",
                f"{faults.url}/redirect?to=http://127.0.0.1:{port}%5C@allowed.example/slow%3Fkey%3Dsmuggled"):
        obs, info = _browse(make(browse_allow=("allowed.example", f"127.0.0.1:{port}")) if "redirect" in url else env, url)
        assert "refused" in info["tool_error"], url
    assert _reached(faults, "smuggled") == 0


def test_a_host_that_does_not_resolve_is_refused_not_fetched(make):
    obs, info = _browse(make(browse_allow=()), "http://nonexistent.invalid/page")
    assert "refused: nonexistent.invalid does not resolve" in info["tool_error"]


def test_the_connection_goes_to_the_address_the_guard_checked_not_to_a_later_resolution(make, faults, monkeypatch):
    import socket

    port = int(faults.url.rsplit(":", 1)[1])
    other = FaultServer("127.0.0.2", port)  # where the name points once the check has passed
    real, asked = socket.getaddrinfo, []

    def rebinding(host, *args, **kwargs):  # a DNS answer with a zero TTL that changes (rebinding)
        if host != "rebind.test":
            return real(host, *args, **kwargs)
        asked.append(host)
        return real("127.0.0.1" if len(asked) == 1 else "127.0.0.2", *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    try:
        obs, info = _browse(make(browse_allow=("127.0.0.1/32",)), f"http://rebind.test:{port}/slow?s=0&key=rebind")
    finally:
        other.stop()
    assert "all good" in obs and "tool_error" not in info
    assert (_reached(faults, "rebind"), _reached(other, "rebind")) == (1, 0)


def test_the_allow_list_names_hosts_ports_or_networks(make, faults):
    for allow in (["127.0.0.0/8"], [f"127.0.0.1:{faults.url.rsplit(':', 1)[1]}"], ["*"]):
        obs, info = _browse(make(browse_allow=allow), f"{faults.url}/slow?s=0&key=allowed")
        assert "all good" in obs and "tool_error" not in info, allow


def test_a_page_cached_by_a_permissive_env_is_still_refused_to_a_guarded_one(make, faults, tmp_path):
    url = f"{faults.url}/slow?s=0&key=cached"
    cache = str(tmp_path / "shared.sqlite")
    assert "all good" in _browse(make(browse_allow=["*"], cache_path=cache), url)[0]
    obs, info = _browse(make(browse_allow=(), cache_path=cache), url)
    assert "refused" in info["tool_error"]


def test_a_snapshot_from_another_process_local_web_fails_with_a_clear_message(docs, tmp_path):
    import pickle

    with LocalWeb(docs) as old_web:
        env = WebSearchQAEnv(dataset=QA, search_url=old_web.url, cache=False, http=NET)
        env.reset(seed=0)
        env.step(f"<think>x</think><browse>{old_web.url}/wiki/Hamlet</browse>")
        snap = pickle.dumps(env.snapshot())
    with LocalWeb(docs) as new_web:  # another process: its local web on another port
        env = WebSearchQAEnv(dataset=QA, search_url=new_web.url, cache=False, http=NET)
        env.restore(pickle.loads(snap))
        obs, _, _, _, info = env.step("<think>x</think><browse>next</browse>")
    assert "another process" in info["tool_error"] and "treegym web serve" in obs
