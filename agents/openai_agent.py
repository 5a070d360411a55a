"""An agent backed by any OpenAI-compatible chat endpoint: hosted APIs, ``vllm serve``,
``treegym serve-model``.

Each ``act(messages)`` is one ``POST {base_url}/chat/completions``. Connection failures,
timeouts, 429 and 5xx answers and unreadable bodies are retried with exponential backoff;
after the last try the agent raises ``EndpointError`` naming the endpoint and the last
problem. Other 4xx answers (a wrong model name, a bad key) are not retried.

The model is the one named (``model=``, ``--model`` or ``URL#model``), else the one that
``GET /models`` lists when it lists exactly one; a server without ``/models`` gets requests
without a model name, which single-model servers answer with their model. A server that
answers with Server-Sent Events (``text/event-stream``) is read chunk by chunk; ``stream=True``
asks for that, and a server that refuses a request without ``stream`` is asked again with it.

OpenAI-style servers drop the stop string from the returned text. A ReAct action needs its
closing tag, so when a turn ended on a stop string of the form ``</tag>`` whose opening tag is
still open, the agent puts the closing tag back.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from typing import Any

import requests

from treegym.agents.base import Message
from treegym.errors import ConfigError, TreegymError


class EndpointError(TreegymError):
    """An OpenAI-compatible endpoint is down, refuses the request, or answers garbage."""


def normalise_base_url(url: str) -> str:
    """``http://host:port`` or ``.../v1`` -> ``.../v1`` without a trailing slash."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"endpoint URL must start with http:// or https://, got {url!r}")
    return url if url.endswith("/v1") else url + "/v1"


def restore_stop(text: str, stops: Sequence[str]) -> str:
    """Re-append the closing tag that the server cut, if its opening tag is still open."""
    best, best_at = None, -1
    for stop in stops:
        if not (stop.startswith("</") and stop.endswith(">")):
            continue
        opening = "<" + stop[2:]
        at = text.rfind(opening)
        if at > text.rfind(stop) and at > best_at:
            best, best_at = stop, at
    return text + best if best else text


class OpenAIChatAgent:
    """``act(messages) -> str`` over an OpenAI-compatible ``/chat/completions`` endpoint.

    Args:
        base_url: the endpoint, e.g. ``http://127.0.0.1:8001/v1`` (``/v1`` is added if missing).
        model: model id; ``None`` asks ``GET /models`` and takes its only model (or sends none
            when the server has no ``/models``).
        api_key_env: environment variable holding the API key (optional for local servers).
        timeout: seconds per request.
        retries: attempts per turn, including the first.
        backoff: seconds before the first retry, doubled after each.
        temperature, max_tokens, stop: sampling settings sent with every request.
        stream: ask for Server-Sent Events (an SSE answer is read either way).
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        *,
        api_key_env: str = "OPENAI_API_KEY",
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.5,
        temperature: float = 0.0,
        max_tokens: int = 512,
        stop: Sequence[str] = (),
        stream: bool = False,
    ) -> None:
        if retries < 1:
            raise ConfigError("retries must be at least 1")
        self.base_url = normalise_base_url(base_url)
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.stop = tuple(stop)
        self.stream = stream
        self.session = requests.Session()
        key = os.environ.get(api_key_env)
        if key:
            self.session.headers["Authorization"] = f"Bearer {key}"
        self._model = model
        self._model_known = model is not None

    @property
    def model(self) -> str | None:
        """The model id sent with each request; None when the server lists no models (then the
        requests name none, and a single-model server answers with its own)."""
        if not self._model_known:
            self._model = self._listed_model()
            self._model_known = True
        return self._model

    def _listed_model(self) -> str | None:
        try:
            listing = self._request("GET", "/models", None)
        except EndpointRefused:
            return None  # no /models route: a single-model server (llama.cpp's, a proxy)
        try:
            ids = [str(m["id"]) for m in listing["data"]]
        except (KeyError, TypeError) as exc:
            raise EndpointError(f"{self.base_url}/models answers no model list; pass --model (or URL#model)") from exc
        if len(ids) != 1:
            listed = ", ".join(ids[:10]) or "none"
            raise EndpointError(f"{self.base_url}/models lists {len(ids)} models ({listed}): pass --model (or URL#model)")
        return ids[0]

    def act(self, messages: list[Message]) -> str:
        body: dict[str, Any] = {
            "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        if self.model is not None:
            body["model"] = self.model
        if self.stop:
            body["stop"] = list(self.stop)[:4]  # OpenAI accepts at most four
        try:
            text, finish = self._chat(body)
        except EndpointRefused as exc:
            if self.stream or "stream" not in str(exc).lower():
                raise
            self.stream = True  # a streaming-only server: ask it the way it answers, from now on
            text, finish = self._chat(body)
        return restore_stop(text, self.stop) if finish == "stop" else text

    def _chat(self, body: dict[str, Any]) -> tuple[str, str]:
        if self.stream:
            body = {**body, "stream": True}
        return self._request("POST", "/chat/completions", body, check=_chat_text)

    def _request(self, method: str, path: str, body: dict[str, Any] | None, check: Any = None) -> Any:
        """One call with retries; ``check(payload)`` raising means the answer is garbage."""
        url = self.base_url + path
        problem = ""
        for attempt in range(self.retries):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                resp = self.session.request(method, url, json=body, timeout=self.timeout)
                raw = resp.text
            except requests.RequestException as exc:
                problem = f"{type(exc).__name__}: {exc}"
                continue
            if resp.status_code == 429 or resp.status_code >= 500:
                problem = f"HTTP {resp.status_code}: {raw[:200]}"
                continue
            if resp.status_code >= 400:
                raise EndpointRefused(f"{method} {url} was refused: HTTP {resp.status_code}: {_error_text(resp)}")
            try:
                sse = resp.headers.get("Content-Type", "").startswith("text/event-stream")
                payload = sse_chat_text(raw) if sse else resp.json()
                if check is not None:
                    payload = check(payload)
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                problem = f"unreadable answer ({type(exc).__name__}: {exc}): {raw[:200]!r}"
                continue
            return payload
        raise EndpointError(f"{method} {url} failed after {self.retries} attempt(s): {problem}")


class EndpointRefused(EndpointError):
    """The endpoint answered a 4xx other than 429: the request itself is wrong (not retried)."""


def sse_chat_text(raw: str) -> tuple[str, str]:
    """(text, finish reason) of a streamed chat completion: the ``data:`` events' deltas joined,
    up to ``data: [DONE]``."""
    parts, finish, events = [], "", 0
    for line in raw.splitlines():
        if not line.startswith("data:"):
            continue  # comments, event names, ids, blank separators
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            break
        choice = json.loads(data)["choices"][0]
        events += 1
        delta = choice.get("delta") or {}
        content = delta.get("content")
        if content is not None and not isinstance(content, str):
            raise TypeError("delta.content is not a string")
        parts.append(content or "")
        finish = str(choice.get("finish_reason") or finish)
    if not events:
        raise ValueError("the event stream holds no chat completion chunk")
    return "".join(parts), finish


def _chat_text(payload: Any) -> tuple[str, str]:
    if isinstance(payload, tuple):  # already read from an event stream
        return payload
    choice = payload["choices"][0]
    content = choice["message"]["content"]
    if not isinstance(content, str):
        raise TypeError("message.content is not a string")
    return content, str(choice.get("finish_reason") or "")


def _error_text(resp: requests.Response) -> str:
    try:
        return str(resp.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return resp.text[:200]
