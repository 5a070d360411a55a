"""An HTTP retrieval service that speaks Search-R1's API, so many trainers can share one index.

``POST /retrieve`` with ``{"queries": [...], "topk": 3, "return_scores": true}`` answers
``{"result": [[{"document": {"id", "contents"}, "score": s}, ...], ...]}``, one list per query;
without ``return_scores`` each list holds the documents alone, as Search-R1's server does.
``GET /health`` reports the corpus size and limits. Every bad request gets a 4xx with
``{"error": message}``; only a fault of the server itself is a 500.

Built on the standard library's ``ThreadingHTTPServer``; it binds 127.0.0.1 unless told
otherwise, because it has no authentication.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from treegym.errors import ConfigError
from treegym.retrieval_index.types import Hit, Retriever

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
# An oversize body up to this size is read and dropped before the 413, so the client sees the
# answer (closing on unread data resets the connection); beyond it we just close.
DISCARD_LIMIT = 16 << 20


@dataclass(frozen=True)
class ServerLimits:
    """Bounds on one request; anything beyond them is refused with a 4xx."""

    default_topk: int = 3
    max_topk: int = 100
    max_queries: int = 512
    max_body_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if not 1 <= self.default_topk <= self.max_topk or self.max_queries < 1 or self.max_body_bytes < 64:
            raise ConfigError(f"inconsistent server limits: {self}")


@dataclass(frozen=True)
class RetrieveRequest:
    queries: tuple[str, ...]
    topk: int
    return_scores: bool


class BadRequest(Exception):
    """A client error: its status (4xx) and the message sent back as ``{"error": ...}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def parse_retrieve(body: bytes, limits: ServerLimits) -> RetrieveRequest:
    """Validate a ``/retrieve`` body; raises BadRequest with the reason."""
    try:
        payload = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(400, f"body is not valid UTF-8 JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise BadRequest(400, 'body must be a JSON object like {"queries": ["..."], "topk": 3}')
    queries = payload.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise BadRequest(400, '"queries" must be a list of strings')
    if len(queries) > limits.max_queries:
        raise BadRequest(413, f"{len(queries)} queries in one request; the limit is {limits.max_queries}")
    topk = payload.get("topk")
    if topk is None:
        topk = limits.default_topk
    if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= limits.max_topk:
        raise BadRequest(400, f'"topk" must be an integer from 1 to {limits.max_topk}, not {topk!r}')
    return_scores = payload.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise BadRequest(400, f'"return_scores" must be true or false, not {return_scores!r}')
    return RetrieveRequest(tuple(queries), topk, return_scores)


def format_results(results: Sequence[Sequence[Hit]], return_scores: bool) -> dict[str, Any]:
    """Search-R1's response shape for a batch of hit lists."""
    out: list[list[Any]] = []
    for hits in results:
        docs = [{"id": h.doc_id, "contents": h.contents} for h in hits]
        out.append([{"document": d, "score": h.score} for d, h in zip(docs, hits)] if return_scores else docs)
    return {"result": out}


class RetrievalServer(ThreadingHTTPServer):
    """A threading HTTP server that owns one shared retriever."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        retriever: Retriever,
        limits: ServerLimits = ServerLimits(),
        verbose: bool = False,
        info: dict[str, Any] | None = None,
    ) -> None:
        self.retriever = retriever
        self.limits = limits
        self.verbose = verbose
        self.info = info or {}
        super().__init__(address, _Endpoints)


class _Endpoints(BaseHTTPRequestHandler):
    """Routes /retrieve and /health; every answer is JSON with a Content-Length."""

    server: RetrievalServer
    protocol_version = "HTTP/1.1"  # keep-alive: a client's session reuses its connection
    timeout = 60  # seconds a connection may sit idle or stall mid-body before it is dropped
    # Headers and body go out as two writes; with Nagle on, a keep-alive client waits ~40 ms
    # for the delayed ACK on every request.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            sys.stderr.write(f"{self.address_string()} - {format % args}\n")

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _refuse(self, status: int, message: str, close: bool = False) -> None:
        # An unread body would be parsed as the next request; close instead of draining it.
        self.close_connection = self.close_connection or close
        self._send(status, {"error": message})

    def do_GET(self) -> None:
        if self.path.split("?")[0] == "/health":
            limits = self.server.limits
            self._send(200, {"status": "ok", **self.server.info, "max_topk": limits.max_topk, "max_queries": limits.max_queries})
        else:
            self._refuse(404, f"no such endpoint {self.path!r}; use POST /retrieve or GET /health")

    def do_POST(self) -> None:
        if self.path.split("?")[0] != "/retrieve":
            self._refuse(404, f"no such endpoint {self.path!r}; use POST /retrieve", close=True)
            return
        body = self._read_body()
        if body is None:
            return
        try:
            request = parse_retrieve(body, self.server.limits)
        except BadRequest as exc:
            self._refuse(exc.status, exc.message)
            return
        try:
            results = self.server.retriever.search(list(request.queries), request.topk) if request.queries else []
        except Exception as exc:  # a server fault, not the client's: report it, stay up
            self._refuse(500, f"retrieval failed: {type(exc).__name__}: {exc}")
            return
        self._send(200, format_results(results, request.return_scores))

    def _read_body(self) -> bytes | None:
        if self.headers.get("Transfer-Encoding", "").lower() not in ("", "identity"):
            self._refuse(411, "send the body with a Content-Length (no chunked encoding)", close=True)
            return None
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            self._refuse(411, "a Content-Length header is required", close=True)
            return None
        try:
            length = int(length_header)
            if length < 0:
                raise ValueError
        except ValueError:
            self._refuse(400, f"bad Content-Length {length_header!r}", close=True)
            return None
        if length > self.server.limits.max_body_bytes:
            if length <= DISCARD_LIMIT:
                self._discard(length)
            self._refuse(413, f"body of {length} bytes; the limit is {self.server.limits.max_body_bytes}", close=True)
            return None
        body = self.rfile.read(length)
        if len(body) < length:
            self._refuse(400, f"body ended after {len(body)} of {length} bytes", close=True)
            return None
        return body

    def _discard(self, length: int) -> None:
        while length > 0:
            chunk = self.rfile.read(min(length, 1 << 16))
            if not chunk:
                return
            length -= len(chunk)

    def _method_not_allowed(self) -> None:
        self._refuse(405, f"{self.command} is not supported; use POST /retrieve or GET /health", close=True)

    do_PUT = do_DELETE = do_PATCH = _method_not_allowed


@dataclass
class RunningServer:
    """A server on a background thread; ``stop()`` (or leaving a ``with`` block) shuts it down."""

    url: str
    server: RetrievalServer
    thread: threading.Thread

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _info(retriever: Retriever) -> dict[str, Any]:
    info: dict[str, Any] = {"index": getattr(retriever, "kind", type(retriever).__name__)}
    docs = getattr(retriever, "docs", None)
    if docs is not None:
        info["count"] = len(docs)
    return info


def serve_in_background(
    retriever: Retriever,
    host: str = DEFAULT_HOST,
    port: int = 0,
    limits: ServerLimits = ServerLimits(),
    verbose: bool = False,
) -> RunningServer:
    """Start a server on a daemon thread (port 0 picks a free port); returns its URL and handle."""
    server = RetrievalServer((host, port), retriever, limits, verbose, _info(retriever))
    thread = threading.Thread(target=server.serve_forever, name="treegym-retrieval-server", daemon=True)
    thread.start()
    bound_host, bound_port = server.server_address[:2]
    return RunningServer(f"http://{bound_host}:{bound_port}", server, thread)


def serve_forever(
    retriever: Retriever,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    limits: ServerLimits = ServerLimits(),
    verbose: bool = True,
) -> None:
    """Serve in the foreground until interrupted."""
    with RetrievalServer((host, port), retriever, limits, verbose, _info(retriever)) as server:
        print(f"serving {server.info} on http://{host}:{server.server_address[1]} (POST /retrieve, GET /health)", flush=True)
        server.serve_forever()
