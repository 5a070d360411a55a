"""A scripted OpenAI-compatible chat server on 127.0.0.1, for the adapters whose frameworks call a model
(verifiers, ldp): a real HTTP server that answers from a script, in JSON or in Server-Sent Events."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ScriptedModel:
    """An OpenAI-compatible chat endpoint on 127.0.0.1: the k-th assistant turn of a conversation
    gets ``replies[k]``; every request is kept."""

    def __init__(self, replies: list[str]) -> None:
        self.replies, self.requests = replies, []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/v1"

    def reply(self, messages: list[dict]) -> str:
        return self.replies[sum(m["role"] == "assistant" for m in messages)]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        model = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                model.requests.append(request)
                text = model.reply(request["messages"])
                head = {"id": "stub", "created": 0, "model": "stub"}
                if not request.get("stream"):
                    self.send(json.dumps({**head, "object": "chat.completion", "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}),
                        "application/json")
                    return
                chunk = {**head, "object": "chat.completion.chunk"}
                events = [
                    {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text},
                                           "finish_reason": None}]},
                    {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                    {**chunk, "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}},
                ]
                self.send("".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n",
                          "text/event-stream")

            def send(self, body: str, ctype: str) -> None:
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
