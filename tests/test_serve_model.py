"""The OpenAI-compatible model server (real SmolLM2 over loopback HTTP) and the OpenAI agent."""

from __future__ import annotations

import copy
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from treegym.agents.base import as_agent
from treegym.agents.hf_policy import HFPolicy
from treegym.agents.openai_agent import EndpointError, OpenAIChatAgent, normalise_base_url, restore_stop
from treegym.agents.serve_model import ModelServer, ModelService, parse_messages
from treegym.agents.tool_calls import TemplateSupport, parse_tool_calls, template_messages, template_support
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


# ---- OpenAI-compatible servers of other kinds: one model and no /models, streaming only -------


@pytest.fixture
def openai_like():
    """Start a real loopback server that answers chat completions the way ``kind`` says:
    ``models`` is what GET /v1/models lists (None: no such route), ``sse_only`` refuses a request
    without ``stream: true`` and answers in Server-Sent Events. It records every request body."""
    started = []

    def start(models: list[str] | None = None, sse_only: bool = False, reply: str = "look"):
        bodies: list[dict] = []

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, status: int, data: bytes, kind: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path.rstrip("/") == "/v1/models" and models is not None:
                    self._send(200, json.dumps({"object": "list", "data": [{"id": m} for m in models]}).encode())
                else:
                    self._send(404, json.dumps({"error": {"message": "no such route"}}).encode())

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                bodies.append(body)
                if sse_only and not body.get("stream"):
                    self._send(400, json.dumps({"error": {"message": "this server only streams: set stream to true"}}).encode())
                elif sse_only:
                    words = [reply[:2], reply[2:]]
                    events = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
                    events += [{"choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}]} for w in words]
                    events += [{"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]
                    data = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
                    self._send(200, (": keep-alive\n\n" + data).encode(), "text/event-stream")
                else:
                    choice = {"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}
                    self._send(200, json.dumps({"choices": [choice]}).encode())

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        started.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}", bodies

    yield start
    for httpd in started:
        httpd.shutdown()
        httpd.server_close()


HI = [{"role": "user", "content": "hi"}]


def test_eval_sends_max_new_tokens_temperature_and_model_to_an_openai_agent(openai_like, tmp_path, capsys):
    from treegym.cli import main

    url, bodies = openai_like(models=["a", "b"])
    argv = ["eval", "--agent", f"openai:{url}", "--env", "TextHousehold-v0", "--n", "1", "--max-turns", "2",
            "--max-new-tokens", "77", "--temperature", "0.5", "--model", "b", "--no-progress", "--out", str(tmp_path)]
    assert main(argv) == 0, capsys.readouterr().err
    assert len(bodies) == 2
    assert all((b["max_tokens"], b["temperature"], b["model"]) == (77, 0.5, "b") for b in bodies)
    assert all(b["stop"] == ["</action>", "\n", ","] for b in bodies)  # the env's own stops, from its family
    url, bodies = openai_like(models=["a", "b"])
    assert main([*argv[:2], f"openai:{url}#a", *argv[3:]]) == 0  # URL#model wins over --model
    assert {b["model"] for b in bodies} == {"a"}


def test_the_agent_falls_back_to_the_servers_single_model(openai_like):
    url, bodies = openai_like(models=["only-one"])
    agent = OpenAIChatAgent(url, retries=1)
    assert agent.act(HI) == "look" and agent.model == "only-one" and bodies[-1]["model"] == "only-one"
    url, bodies = openai_like(models=None)  # no /v1/models at all: a single-model server
    agent = OpenAIChatAgent(url, retries=1)
    assert agent.act(HI) == "look" and agent.model is None and "model" not in bodies[-1]
    url, _ = openai_like(models=["a", "b"])
    with pytest.raises(EndpointError, match=r"lists 2 models \(a, b\): pass --model"):
        OpenAIChatAgent(url, retries=1).act(HI)


def test_the_agent_reads_a_streaming_only_server(openai_like):
    url, bodies = openai_like(models=None, sse_only=True, reply="<answer>Paris</answer>")
    agent = OpenAIChatAgent(url, retries=1, stop=("</answer>",))
    assert agent.act(HI) == "<answer>Paris</answer>"
    assert [b.get("stream", False) for b in bodies] == [False, True]
    assert agent.act(HI) == "<answer>Paris</answer>" and bodies[-1]["stream"] is True  # asked with stream from then on


# ---- serve-model stops generating for a client that has gone ---------------------------------


def test_serve_model_stops_generating_when_the_client_disconnects():
    import socket
    import time

    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from treegym.agents.models import smollm2_folder

    tok = AutoTokenizer.from_pretrained(smollm2_folder())
    torch.manual_seed(0)
    # A random model says EOS about once in 49k tokens, so a request runs to its max_tokens.
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=8300,
                                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)).eval()
    policy = HFPolicy(model, tok)
    srv = ModelServer(ModelService(policy, "tiny"), "127.0.0.1", 0).start()
    try:
        body = json.dumps({"prompt": "once upon a time", "max_tokens": 8192, "temperature": 1.0}).encode()
        client = socket.create_connection(srv.httpd.server_address[:2])
        client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        deadline = time.monotonic() + 60
        while policy.stats.generated_tokens < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        client.close()  # the client gives up (a timeout, Ctrl-C)
        # Generation stops within a few tokens: wait until the count holds still for a second
        # (on a busy machine a token can take a while), which never happens if it runs on.
        counts = [policy.stats.generated_tokens]
        while time.monotonic() < deadline + 60 and (len(counts) < 2 or counts[-1] != counts[-2]):
            time.sleep(1.0)
            counts.append(policy.stats.generated_tokens)
        assert counts[-1] == counts[-2] < 8192, counts
        # The policy is free again: the next request is answered.
        answer = requests.post(srv.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 4}, timeout=60).json()
        assert answer["usage"]["completion_tokens"] == 4
    finally:
        srv.close()


# ---- OpenAI tool calling: tool results in, tool calls out --------------------------------------

STEP_TOOL = {"type": "function", "function": {"name": "step", "description": "Take one turn in the game",
                                              "parameters": {"type": "object", "properties": {"action": {"type": "string"}}}}}


def step_call(i: int, action: str) -> dict:
    return {"id": f"c{i}", "type": "function", "function": {"name": "step", "arguments": json.dumps({"action": action})}}


def played(actions: list[str]) -> list[dict]:
    """A chat as ldp's SimpleAgent sends it: the task, then per turn an assistant message with a
    ``step`` call and null content, and the env's observation as a ``tool`` message."""
    msgs = [{"role": "user", "content": "Explore the house."}]
    for i, action in enumerate(actions):
        msgs += [{"role": "assistant", "content": None, "function_call": None, "tool_calls": [step_call(i, action)]},
                 {"role": "tool", "tool_call_id": f"c{i}", "name": "step", "content": "You see a room."}]
    return msgs


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from transformers import AutoTokenizer

    from treegym.agents.models import smollm2_folder

    return AutoTokenizer.from_pretrained(smollm2_folder())


def test_a_model_that_has_called_tools_before_gets_its_next_call_back_in_openais_shape(server):
    # Greedy SmolLM2 continues the pattern of its earlier calls (rendered as <tool_call> blocks,
    # since its template has no tool_calls field), and the server parses the reply into one.
    body = {"messages": played(["look", "go north", "look"]), "tools": [STEP_TOOL], "tool_choice": "required",
            "max_tokens": 30, "temperature": 0}
    resp = requests.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_") and call["function"]["name"] == "step"
    assert isinstance(json.loads(call["function"]["arguments"])["action"], str)  # a JSON string, as OpenAI sends
    assert choice["message"]["content"] is None


def test_tool_results_and_calls_with_null_content_are_answered_as_text_without_tools(server):
    body = {"messages": played(["look"]), "max_tokens": 3, "temperature": 0}
    resp = requests.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    message = resp.json()["choices"][0]["message"]
    assert isinstance(message["content"], str) and "tool_calls" not in message  # no tools offered: never a call


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"messages": [{"role": "tool", "content": "x"}]}, "needs the tool_call_id"),
        ({"messages": [{"role": "tool", "tool_call_id": 7, "content": "x"}]}, "needs the tool_call_id"),
        ({"messages": [{"role": "tool", "tool_call_id": "c0", "content": None}]}, r"messages\[0\].content must be"),
        ({"messages": [{"role": "assistant", "content": None}]}, r"messages\[0\].content must be a string"),
        ({"messages": [{"role": "assistant", "tool_calls": {"id": "c0"}}]}, "tool_calls must be a list"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c0"}]}]}, r"tool_calls\[0\] needs a function"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "step", "arguments": 3}}]}]},
         "arguments must be a JSON string or an object"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, r"tools\[0\] needs"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [STEP_TOOL],
          "tool_choice": {"type": "function", "function": {"name": "fly"}}}, "tool_choice must be"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [STEP_TOOL], "tool_choice": {"function": "step"}},
         "tool_choice must be"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": {"step": STEP_TOOL}}, "tools must be a list"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "role of system, user, assistant or tool"),
    ],
)
def test_malformed_tool_messages_get_a_400_that_names_the_problem(server, body, says):
    resp = requests.post(server.url + "/v1/chat/completions", json=body, timeout=30)
    assert resp.status_code == 400
    assert re.search(says, resp.json()["error"]["message"])


def test_smollm2s_template_renders_the_tool_role_and_gets_calls_as_tool_call_text(smollm2_tokenizer):
    support = template_support(smollm2_tokenizer)
    assert support == TemplateSupport(tool_calls=False, tool_role=True)
    text = smollm2_tokenizer.apply_chat_template(template_messages(parse_messages({"messages": played(["look"])}),
                                                                   support), tokenize=False)
    assert '<|im_start|>assistant\n<tool_call>{"name": "step", "arguments": {"action": "look"}}</tool_call>' in text
    assert "<|im_start|>tool\nYou see a room.<|im_end|>" in text


def with_template(tokenizer, template):
    """A copy of ``tokenizer`` rendering with ``template``, and what that template supports."""
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = template
    return tokenizer, template_support(tokenizer)


def test_a_template_without_a_tool_role_gets_results_as_one_labelled_user_turn(smollm2_tokenizer):
    tokenizer, support = with_template(smollm2_tokenizer, ALTERNATING_TEMPLATE)
    assert support == TemplateSupport(tool_calls=False, tool_role=False)
    msgs = played(["look"])
    msgs[1]["tool_calls"].append(step_call(1, "go north"))
    msgs.append({"role": "tool", "tool_call_id": "c1", "content": "A hall."})  # no name: found from its call
    text = tokenizer.apply_chat_template(template_messages(parse_messages({"messages": msgs}), support), tokenize=False)
    assert text.count("[user]") == 2  # the two results merged into one turn: roles still alternate
    assert "[Result of tool call step (c0)]\nYou see a room.\n\n[Result of tool call step (c1)]\nA hall." in text


def test_a_template_that_renders_tool_calls_gets_them_with_object_arguments(smollm2_tokenizer):
    tokenizer, support = with_template(smollm2_tokenizer, TOOL_CALLS_TEMPLATE)
    assert support == TemplateSupport(tool_calls=True, tool_role=True)
    text = tokenizer.apply_chat_template(template_messages(parse_messages({"messages": played(["look"])}), support),
                                         tokenize=False)
    assert "[assistant] call step with look" in text and "[tool step] You see a room." in text


def test_a_chat_the_template_refuses_is_a_400_not_a_server_error(smollm2_tokenizer, tiny_chat_model):
    from transformers import AutoModelForCausalLM

    tokenizer, _ = with_template(smollm2_tokenizer, ALTERNATING_TEMPLATE)
    srv = ModelServer(ModelService(HFPolicy(AutoModelForCausalLM.from_pretrained(tiny_chat_model), tokenizer), "t"),
                      "127.0.0.1", 0).start()
    try:
        body = {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "max_tokens": 2}
        resp = requests.post(srv.url + "/v1/chat/completions", json=body, timeout=60)
        assert resp.status_code == 400
        assert "chat template refused these messages: roles must alternate" in resp.json()["error"]["message"]
        resp = requests.post(srv.url + "/v1/chat/completions", json={**body, "messages": played(["look"])}, timeout=60)
        assert resp.status_code == 200, resp.text
    finally:
        srv.close()


@pytest.mark.parametrize(
    ("reply", "content", "calls"),
    [
        ('<tool_call>{"name": "step", "arguments": {"action": "look"}}</tool_call>', None, [{"action": "look"}]),
        ('Let me look. <tool_call>[{"name": "step", "arguments": {"action": "a"}}, '
         '{"name": "step", "arguments": "{\\"action\\": \\"b\\"}"}]</tool_call>', "Let me look.",
         [{"action": "a"}, {"action": "b"}]),
        ('<tool_call>{"name": "step", "arguments": {"action": "cut"}}', None, [{"action": "cut"}]),  # stopped at the tag
        ('{"name": "step", "parameters": {"action": "llama"}}', None, [{"action": "llama"}]),
        ('<tool_call>{"name": "fly", "arguments": {}}</tool_call>', "same", []),  # a tool nobody offered
        ('<tool_call>{"name": "step", "arguments": {"action": </tool_call>', "same", []),  # not JSON
        ('{"name": "step", "arguments": "look"}', "same", []),  # arguments that are not an object
        ("go north", "same", []),
    ],
)
def test_a_reply_is_a_tool_call_only_when_every_block_is_a_json_call_to_an_offered_tool(reply, content, calls):
    got_content, got_calls = parse_tool_calls(reply, ("step",))
    assert got_content == (reply if content == "same" else content)
    assert [json.loads(c["function"]["arguments"]) for c in got_calls] == calls
    assert len({c["id"] for c in got_calls}) == len(got_calls)


ALTERNATING_TEMPLATE = (  # a Gemma-like template: user and assistant only, in turn
    "{% for m in messages %}"
    "{% if m['role'] not in ['user', 'assistant'] or (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}"
    "[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"
)
TOOL_CALLS_TEMPLATE = (  # renders tool calls with object arguments, and tool results
    "{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}"
    "[assistant] call {{ c.function.name }} with "
    "{{ c.function.arguments.action if c.function.arguments is mapping else 'a string' }}\n{% endfor %}"
    "{% elif m.role == 'tool' %}[tool {{ m.name }}] {{ m.content }}\n"
    "{% else %}[{{ m.role }}] {{ m.content }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)
