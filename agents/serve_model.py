"""A local OpenAI-compatible server that answers with a real model through ``HFPolicy``.

Speaks the subset of the OpenAI protocol that agents use: ``POST /v1/chat/completions``
(chat template applied; tool messages and tool calls in OpenAI's shape, see ``tool_calls``),
``POST /v1/completions`` (raw prompt) and ``GET /v1/models``.
It honours ``max_tokens``, ``temperature``, ``top_p``, ``stop`` and ``seed``; like OpenAI and
vLLM, the returned text does not include the stop string that ended it. Bad requests get a
4xx JSON error body. Requests are served by threads; the policy generates one at a time, and
stops a request's generation when its client disconnects (a client timeout, Ctrl-C).
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from jinja2 import TemplateError

from treegym.agents.chat import chat_prompt_ids, text_ids
from treegym.agents.hf_policy import GenerationCancelled, HFPolicy
from treegym.agents.policy import Generation, SamplingParams
from treegym.agents.tool_calls import TemplateSupport, parse_tool_calls, template_messages, template_support
from treegym.errors import TreegymError

MAX_BODY_BYTES = 4 << 20
MAX_TOKENS_LIMIT = 8192
Cancel = Callable[[], bool]


class RequestError(Exception):
    """A client error, answered with ``status`` and an OpenAI-style error body."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


def parse_sampling(body: dict[str, Any]) -> SamplingParams:
    """Sampling parameters of an OpenAI request, validated."""
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens", 256))
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
        raise RequestError(400, f"max_tokens must be an integer in [1, {MAX_TOKENS_LIMIT}]")
    temperature = body.get("temperature", 1.0)
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not 0 <= temperature <= 2:
        raise RequestError(400, "temperature must be a number in [0, 2]")
    top_p = body.get("top_p", 1.0)
    if not isinstance(top_p, (int, float)) or isinstance(top_p, bool) or not 0 < top_p <= 1:
        raise RequestError(400, "top_p must be a number in (0, 1]")
    stop = body.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError(400, "stop must be a non-empty string or a list of them")
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise RequestError(400, "seed must be an integer")
    if body.get("n", 1) != 1:
        raise RequestError(400, "only n=1 is supported")
    return SamplingParams(
        temperature=float(temperature), top_p=float(top_p), max_new_tokens=max_tokens, stop=tuple(stop), seed=seed
    )


def _text(content: Any, where: str) -> str:
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not isinstance(content, str):
        raise RequestError(400, f"{where}.content must be a string")
    return content


def _tool_call(call: Any, where: str) -> dict[str, Any]:
    """One OpenAI tool call, checked: a function with a name and arguments (a JSON string or an object)."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise RequestError(400, f"{where} needs a function with a non-empty name")
    arguments = function.get("arguments", "{}")
    if not isinstance(arguments, (str, dict)):
        raise RequestError(400, f"{where}.function.arguments must be a JSON string or an object")
    if not isinstance(call.get("id", ""), str):
        raise RequestError(400, f"{where}.id must be a string")
    return {"id": call.get("id", ""), "type": "function", "function": {"name": function["name"], "arguments": arguments}}


def parse_message(m: Any, i: int) -> dict[str, Any]:
    """One OpenAI chat message, checked: system, user, assistant (content may be null when it
    carries ``tool_calls``) or tool (with the ``tool_call_id`` it answers)."""
    where = f"messages[{i}]"
    if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
        raise RequestError(400, f"{where} needs a role of system, user, assistant or tool")
    role = m["role"]
    if role == "assistant" and m.get("tool_calls") is not None:
        calls = m["tool_calls"]
        if not isinstance(calls, list):
            raise RequestError(400, f"{where}.tool_calls must be a list")
        checked = [_tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
        content = _text(m.get("content") or "", where)
        return {"role": role, "content": content, "tool_calls": checked} if checked else {"role": role, "content": content}
    if role == "tool":
        if not isinstance(m.get("tool_call_id"), str) or not m["tool_call_id"]:
            raise RequestError(400, f"{where} (a tool result) needs the tool_call_id it answers, a string")
        if m.get("name") is not None and not isinstance(m["name"], str):
            raise RequestError(400, f"{where}.name must be a string")
        out = {"role": role, "content": _text(m.get("content"), where), "tool_call_id": m["tool_call_id"]}
        return {**out, "name": m["name"]} if m.get("name") else out
    return {"role": role, "content": _text(m.get("content"), where)}


def parse_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "'messages' must be a non-empty list")
    return [parse_message(m, i) for i, m in enumerate(messages)]


def parse_tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    """The request's function tools (for the chat template) and the names a reply may call:
    none when ``tool_choice`` is "none", the one it names when it names one."""
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise RequestError(400, "tools must be a list")
    for j, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise RequestError(400, f"tools[{j}] needs a function with a non-empty name")
    names = tuple(t["function"]["name"] for t in tools)
    choice = body.get("tool_choice", "auto" if tools else "none")
    if choice in ("none", None):
        return tools, ()
    if choice in ("auto", "required"):
        return tools, names
    function = choice.get("function") if isinstance(choice, dict) else None
    chosen = function.get("name") if isinstance(function, dict) else None
    if not isinstance(chosen, str) or chosen not in names:
        raise RequestError(400, "tool_choice must be none, auto, required or a function among tools")
    return tools, (chosen,)


class ModelService:
    """The model side of the server: prompt -> completion, independent of HTTP."""

    def __init__(self, policy: HFPolicy, model_name: str) -> None:
        self.policy = policy
        self.model_name = model_name
        self._support: TemplateSupport | None = None  # found on the first chat request

    def complete(self, prompt_ids: list[int], params: SamplingParams, cancel: Cancel | None = None) -> Completion:
        gen: Generation = self.policy.generate([prompt_ids], params, cancel=cancel)[0]
        text = gen.text
        if gen.finish_reason == "stop":
            for stop in params.stop:
                if text.endswith(stop):
                    text = text[: -len(stop)]
                    break
        return Completion(text, gen.finish_reason, len(prompt_ids), len(gen.token_ids))

    def chat(self, body: dict[str, Any], cancel: Cancel | None = None) -> dict[str, Any]:
        messages = parse_messages(body)
        tools, callable_names = parse_tools(body)
        params = parse_sampling(body)
        done = self.complete(self.chat_ids(messages, tools), params, cancel)
        message: dict[str, Any] = {"role": "assistant", "content": done.text}
        finish_reason = done.finish_reason
        if callable_names:
            content, calls = parse_tool_calls(done.text, callable_names)
            if calls:
                message, finish_reason = {"role": "assistant", "content": content, "tool_calls": calls}, "tool_calls"
        choice = {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}
        return self._envelope("chat.completion", "chatcmpl", choice, done)

    def chat_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[int]:
        """The prompt of a chat through the model's template; a template that refuses the
        messages (a role order it does not allow) is the client's error, not the server's."""
        if self._support is None:
            self._support = template_support(self.policy.tokenizer)
        rendered = template_messages(messages, self._support)
        try:
            return chat_prompt_ids(self.policy.tokenizer, rendered, tools=tools or None)
        except (TemplateError, TypeError) as exc:
            raise RequestError(400, f"the model's chat template refused these messages: {exc}") from None

    def text(self, body: dict[str, Any], cancel: Cancel | None = None) -> dict[str, Any]:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise RequestError(400, "'prompt' must be a non-empty string")
        params = parse_sampling(body)
        done = self.complete(text_ids(self.policy.tokenizer, prompt), params, cancel)
        choice = {"index": 0, "text": done.text, "finish_reason": done.finish_reason, "logprobs": None}
        return self._envelope("text_completion", "cmpl", choice, done)

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "treegym"}]}

    def _envelope(self, kind: str, prefix: str, choice: dict[str, Any], done: Completion) -> dict[str, Any]:
        return {
            "id": f"{prefix}-{uuid.uuid4().hex[:24]}",
            "object": kind,
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            "usage": {
                "prompt_tokens": done.prompt_tokens,
                "completion_tokens": done.completion_tokens,
                "total_tokens": done.prompt_tokens + done.completion_tokens,
            },
        }


def client_gone(sock: socket.socket) -> bool:
    """Whether the peer of ``sock`` has closed it (or reset it). A client that sends more (a
    pipelined request) is still there."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def _handler_for(service: ModelService) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet by default
            pass

        def do_GET(self) -> None:
            path = self.path.split("?")[0].rstrip("/")
            if path in ("/v1/models", "/models"):
                self._reply(200, service.models())
            elif path in ("", "/health"):
                self._reply(200, {"status": "ok"})
            else:
                self._error(RequestError(404, f"no route GET {self.path}", "not_found_error"))

        def do_POST(self) -> None:
            path = self.path.split("?")[0].rstrip("/")
            routes = {"/v1/chat/completions": service.chat, "/v1/completions": service.text}
            try:
                if path not in routes:
                    raise RequestError(404, f"no route POST {self.path}", "not_found_error")
                payload = routes[path](self._body(), cancel=self._client_gone)
            except GenerationCancelled:
                self.close_connection = True  # nobody is left to answer
                return
            except RequestError as exc:
                self._error(exc)
            except Exception as exc:  # a bug or a model failure must still answer the client
                self._error(RequestError(500, f"{type(exc).__name__}: {exc}", "server_error"))
            else:
                self._reply(200, payload)

        def _client_gone(self) -> bool:
            """Whether the client closed its connection: readable, and a peek reads end of stream."""
            return client_gone(self.connection)

        def _body(self) -> dict[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                raise RequestError(413, f"request body over {MAX_BODY_BYTES} bytes")
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw or b"null")
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise RequestError(400, f"request body is not valid JSON: {exc}") from exc
            if not isinstance(body, dict):
                raise RequestError(400, "request body must be a JSON object")
            return body

        def _error(self, exc: RequestError) -> None:
            self._reply(exc.status, {"error": {"message": str(exc), "type": exc.kind, "code": exc.status}})

        def _reply(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


class ModelServer:
    """The HTTP server. ``start()`` serves from a background thread; ``serve_forever()`` blocks."""

    def __init__(self, service: ModelService, host: str = "127.0.0.1", port: int = 8001) -> None:
        self.service = service
        try:
            self.httpd = ThreadingHTTPServer((host, port), _handler_for(service))
        except (OSError, UnicodeError, TypeError, ValueError, OverflowError) as exc:  # a host that cannot even be encoded
            raise TreegymError(f"cannot listen on {host[:60]}:{port}: {exc}") from None
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> ModelServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
