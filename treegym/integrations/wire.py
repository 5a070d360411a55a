"""What a server lets through its door, as ASGI middleware: request bodies up to a cap (a 413
past it), only WebSocket messages it can answer, and a refusal for capacity that every client sees.

openenv-core's ``/ws`` handler reads ``message.get("type")`` outside its own error handling,
so a message that is valid JSON but not an object (``[]``, ``1``) ends the session; here such a
message gets an error reply and the session goes on. With MCP off (treegym envs serve no MCP
tools), ``mcp`` messages get the same reply, so they cannot open extra sessions either.
"""

from __future__ import annotations

import json
from typing import Any

Scope = dict[str, Any]


class WireLimits:
    """ASGI middleware: ``max_body_bytes`` per HTTP request; WebSocket messages that are JSON
    objects (and not ``mcp`` ones unless ``mcp``); anything else is answered, never passed on."""

    def __init__(self, app: Any, *, max_body_bytes: int, mcp: bool = False) -> None:
        self.app, self.max_body_bytes, self.mcp = app, max_body_bytes, mcp

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope.get("type") == "http":
            await self._http(scope, receive, send)
        elif scope.get("type") == "websocket":
            await self.app(scope, self._checked_messages(receive, send), send)
        else:
            await self.app(scope, receive, send)

    async def _http(self, scope: Scope, receive: Any, send: Any) -> None:
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._too_large(send)
            return
        # Read the body here, up to the cap, so that no route ever holds more than that.
        messages, size = [], 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.max_body_bytes:
                await self._too_large(send)
                return
            if not message.get("more_body"):
                break

        async def replay() -> dict[str, Any]:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Any) -> None:
        body = json.dumps({"detail": f"request body over the {self.max_body_bytes} byte cap "
                                     "(serve-env --max-body-bytes)"}).encode()  # fmt: skip
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    def _checked_messages(self, receive: Any, send: Any) -> Any:
        async def checked() -> dict[str, Any]:
            while True:
                message = await receive()
                if message["type"] != "websocket.receive":
                    return message
                problem = self._problem(message)
                if problem is None:
                    return message
                reply = {"type": "error", "data": {"message": problem, "code": "INVALID_MESSAGE"}}
                await send({"type": "websocket.send", "text": json.dumps(reply)})
        return checked

    def _problem(self, message: dict[str, Any]) -> str | None:
        text = message.get("text")
        if text is None:
            text = (message.get("bytes") or b"").decode("utf-8", "replace")
        if len(text) > self.max_body_bytes:
            return f"message over the {self.max_body_bytes} byte cap (serve-env --max-body-bytes)"
        try:
            data = json.loads(text)
        except ValueError:
            return None  # openenv answers malformed JSON itself, and the session goes on
        if not isinstance(data, dict):
            return f"a message must be a JSON object with a 'type', got {type(data).__name__}"
        if data.get("type") == "mcp" and not self.mcp:
            return "this server serves no MCP (start serve-env with --mcp to turn it on)"
        return None


CLOSE_TRY_AGAIN_LATER = 1013  # RFC 6455's "try again later": the server is full, not broken


class CapacityReply:
    """ASGI middleware: a WebSocket client refused for capacity learns why, whatever it does.

    openenv-core sends its capacity error and closes with 1000 (a normal close) at once, so a
    client that sends its first message meanwhile sees only a clean close. Here the error gets
    a retry hint (``retry_after_s``), and the close says the same in its frame: code 1013 and
    the message as its reason, which every client reads even after its send failed.
    """

    def __init__(self, app: Any, *, retry_after_s: float, idle_timeout_s: float) -> None:
        self.app, self.retry_after_s, self.idle_timeout_s = app, retry_after_s, idle_timeout_s

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope.get("type") != "websocket":
            await self.app(scope, receive, send)
            return
        refusal: str | None = None

        async def checked_send(message: dict[str, Any]) -> None:
            nonlocal refusal
            if message["type"] == "websocket.send" and refusal is None:
                message, refusal = self._with_hint(message)
            elif message["type"] == "websocket.close" and refusal is not None:
                message = {**message, "code": CLOSE_TRY_AGAIN_LATER, "reason": _clip(refusal, 123)}
            await send(message)

        await self.app(scope, receive, checked_send)

    def _with_hint(self, message: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        text = message.get("text") or ""
        if '"CAPACITY_REACHED"' not in text:
            return message, None
        try:
            reply = json.loads(text)
            data = reply["data"]
            limit = data["max_sessions"]
        except (ValueError, KeyError, TypeError):
            return message, None
        hint = (f"server at capacity: {data.get('active_sessions', limit)} of {limit} sessions (--max-episodes); "
                f"retry in {self.retry_after_s:g} s (a session frees its slot when it closes, or after "
                f"{self.idle_timeout_s:g} s idle)")
        data.update({"message": hint, "retry_after_s": self.retry_after_s})
        short = f"server at capacity: {limit} sessions (--max-episodes); retry in {self.retry_after_s:g} s"
        return {**message, "text": json.dumps(reply)}, short


def _clip(text: str, max_bytes: int) -> str:
    """``text`` cut to ``max_bytes`` of UTF-8 (a close frame's reason holds at most 123)."""
    return text.encode("utf-8")[:max_bytes].decode("utf-8", "ignore")
