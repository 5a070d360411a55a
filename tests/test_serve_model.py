"""The OpenAI-compatible model server (real SmolLM2 over loopback HTTP) and the OpenAI agent."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from treegym.agents.base import as_agent
from treegym.agents.hf_policy import HFPolicy
from treegym.agents.openai_agent import EndpointError, OpenAIChatAgent, normalise_base_url, restore_stop
from treegym.agents.serve_model import ModelServer, ModelService
from treegym.cli import build_parser
from treegym.errors import ConfigError

pytest_plugins = ["model_fixtures"]  # the session-scoped `smollm2` fixture


@pytest.fixture(scope="module")
def server(smollm2):
    srv = ModelServer(ModelService(HFPolicy(*smollm2), "smollm2"), "127.0.0.1", 0).start()
    yield srv
    srv.close()


@pytest.fixture
def garbage_server():
    """A real loopback server whose every answer is 200 with a body that is not JSON."""

    class Garbage(BaseHTTPRequestHandler):
        hits = 0

        def log_message(self, *args):
            pass

        def do_POST(self):
            Garbage.hits += 1
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            data = b"<html>definitely { not json"
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Garbage)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", Garbage
    httpd.shutdown()
    httpd.server_close()


def test_openai_agent_gets_a_real_model_answer_from_the_local_server(server):
    agent = OpenAIChatAgent(server.url, max_tokens=8, timeout=120)
    assert agent.model == "smollm2"  # discovered through GET /v1/models
    reply = as_agent(agent).act([{"role": "user", "content": "What is the capital of France?"}])
    assert isinstance(reply, str) and reply.strip()


def test_chat_completion_reports_usage_and_honours_max_tokens(server):
    body = {"messages": [{"role": "user", "content": "Count: one, two,"}], "max_tokens": 3, "temperature": 0}
    resp = requests.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200
    payload = resp.json()
    assert payload["object"] == "chat.completion"
    assert payload["usage"]["completion_tokens"] <= 3
    assert payload["choices"][0]["finish_reason"] in ("stop", "length")


def test_text_completion_drops_the_stop_string_like_openai(server):
    body = {"prompt": "1, 2, 3, 4,", "max_tokens": 6, "temperature": 0, "stop": [","]}
    payload = requests.post(server.url + "/v1/completions", json=body, timeout=120).json()
    choice = payload["choices"][0]
    assert choice["finish_reason"] == "stop" and "," not in choice["text"]


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/chat/completions", b"{not json", 400),
        ("/v1/chat/completions", json.dumps({"messages": []}).encode(), 400),
        ("/v1/chat/completions", json.dumps({"messages": [{"role": "robot", "content": "x"}]}).encode(), 400),
        ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": 0}).encode(), 400),
        ("/v1/completions", json.dumps({"prompt": "x", "temperature": "hot"}).encode(), 400),
        ("/v1/nothing", b"{}", 404),
    ],
)
def test_bad_requests_get_a_json_error_without_generating(server, path, body, status):
    resp = requests.post(server.url + path, data=body, timeout=30)
    assert resp.status_code == status
    assert resp.json()["error"]["message"]


def test_agent_on_a_down_endpoint_raises_after_its_retries():
    agent = OpenAIChatAgent("http://127.0.0.1:9", model="m", retries=2, backoff=0.01, timeout=2)
    with pytest.raises(EndpointError, match="after 2 attempt"):
        agent.act([{"role": "user", "content": "hi"}])


def test_agent_on_a_garbage_answer_raises_after_its_retries(garbage_server):
    url, handler = garbage_server
    agent = OpenAIChatAgent(url, model="m", retries=3, backoff=0.01, timeout=5)
    with pytest.raises(EndpointError, match="unreadable answer"):
        agent.act([{"role": "user", "content": "hi"}])
    assert handler.hits == 3


def test_agent_is_not_retried_on_a_client_error(server):
    agent = OpenAIChatAgent(server.url, model="smollm2", retries=3, backoff=0.01, max_tokens=0)
    with pytest.raises(EndpointError, match="HTTP 400"):
        agent.act([{"role": "user", "content": "hi"}])


def test_closing_tag_cut_by_the_server_is_put_back():
    stops = ("</search>", "</answer>")
    assert restore_stop("<think>x</think><search>paris", stops) == "<think>x</think><search>paris</search>"
    assert restore_stop("<answer>a</answer> done", stops) == "<answer>a</answer> done"


def test_base_url_gets_v1_and_rejects_non_http():
    assert normalise_base_url("http://h:1/") == "http://h:1/v1"
    assert normalise_base_url("http://h:1/v1") == "http://h:1/v1"
    with pytest.raises(ConfigError):
        normalise_base_url("h:1")


def test_serve_model_command_is_registered_with_help():
    args = build_parser().parse_args(["serve-model", "--port", "8123"])
    assert args.port == 8123 and args.model == "smollm2" and callable(args.func)
