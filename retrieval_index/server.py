"""An HTTP retrieval service that speaks Search-R1's API, so many trainers can share one index.

``POST /retrieve`` with ``{"queries": [...], "topk": 3, "return_scores": true}`` answers
``{"result": [[{"document": {"id", "contents"}, "score": s}, ...], ...]}``, one list per query;
without ``return_scores`` each list holds the documents alone, as Search-R1's server does.
``GET /health`` reports the corpus size and limits. Every bad request gets a 4xx with
``{"error": message}``; only a fault of the server itself is a 500.

Built on the standard library's ``ThreadingHTTPServer``, with a listen backlog of 256 (the
stdlib's 5 resets connections when many trainers connect at once) and a cap on live
connections (past it, a 503 with ``Retry-After``), and on those of any one client address, so
one client cannot take every slot. A request must arrive whole within ``request_deadline_s``
(waiting for it, its headers and its body together, not each read), so a client that drips a
byte at a time cannot keep its slot either. It binds 127.0.0.1 unless told otherwise, because
it has no authentication, and warns when told to bind every interface.

A client that leaves before its answer is out (a reset, or its end closed mid-request) is no
fault of the server's: the request log (``verbose``) has one "client disconnected" line for it,
never a 500 or a status that was not delivered. An answer is logged once it has been sent.

Memory: a heavy request (512 queries at topk 100 answers about 30 MB of JSON, built from
embeddings, hits and dicts) leaves its freed buffers in glibc's per-thread arenas, where they stay
in the resident set. When the last request in flight ends and one of them answered at least
``TRIM_AFTER_BYTES``, the server calls glibc's ``malloc_trim(0)``, which hands that memory back to
the system (a no-op where the C library has no such call). See ``benchmarks/bench_server_memory.py``.
"""

from __future__ import annotations

import ctypes
import io
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from treegym.errors import ConfigError
from treegym.hosts import check_port, warn_if_exposed
from treegym.retrieval_index.types import Hit, Retriever

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
# An oversize body up to this size is read and dropped before the 413, so the client sees the
# answer (closing on unread data resets the connection); beyond it we just close.
DISCARD_LIMIT = 16 << 20
# How a socket says that its client has gone (a reset, or writes to a closed connection).
DISCONNECTS = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)
TRIM_AFTER_BYTES = 1 << 20  # an answer this large makes the server give its free memory back when idle


def _malloc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)``, or None where the C library has none (musl, macOS)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


@dataclass(frozen=True)
class ServerLimits:
    """Bounds on one request; anything beyond them is refused with a 4xx."""

    default_topk: int = 3
    max_topk: int = 100
    max_queries: int = 512
    max_body_bytes: int = 1 << 20
    max_connections: int = 512  # live connections, each one thread; more get a 503 at once
    max_client_connections: int = 256  # live connections of one client address; more get a 503
    request_deadline_s: float = 60.0  # to wait for a request and read all of it, its body included

    def __post_init__(self) -> None:
        if (not 1 <= self.default_topk <= self.max_topk or self.max_queries < 1 or self.max_body_bytes < 64
                or self.max_connections < 1 or self.max_client_connections < 1
                or not 0 < self.request_deadline_s < float("inf")):
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
    except ValueError as exc:  # an integer past Python's digit limit
        raise BadRequest(400, f"body holds a number too large to read: {str(exc)[:120]}") from exc
    except RecursionError:
        raise BadRequest(400, "body is nested too deeply") from None
    if not isinstance(payload, dict):
        raise BadRequest(400, 'body must be a JSON object like {"queries": ["..."], "topk": 3}')
    queries = payload.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise BadRequest(400, '"queries" must be a list of strings')
    for i, q in enumerate(queries):
        try:
            q.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (a "\udcff" escape) is valid JSON, not text
            raise BadRequest(400, f"query {i} is not valid Unicode text (a lone surrogate escape)") from None
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
    request_queue_size = 256  # the listen backlog: a burst of clients waits instead of being reset

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
        self._slots = threading.BoundedSemaphore(limits.max_connections)
        self._per_client: dict[str, int] = {}  # live connections by client address
        self._count_lock = threading.Lock()
        self._in_flight = 0  # requests being answered
        self._heavy_since_trim = False  # one of them answered TRIM_AFTER_BYTES or more
        self._trim = _malloc_trim()
        self.trims = 0  # how often memory was given back, and the seconds it took
        self.trim_seconds = 0.0
        super().__init__(address, _Endpoints)

    def request_began(self) -> None:
        with self._count_lock:
            self._in_flight += 1

    def request_ended(self, answer_bytes: int) -> None:
        """Give freed memory back once no request is in flight, if a heavy one ran since last time:
        trimming while others run would only hand back what they are about to take again."""
        with self._count_lock:
            self._in_flight -= 1
            self._heavy_since_trim |= answer_bytes >= TRIM_AFTER_BYTES
            due = self._in_flight == 0 and self._heavy_since_trim and self._trim is not None
            if due:
                self._heavy_since_trim = False
        if due:
            t0 = time.perf_counter()
            self._trim()  # type: ignore[misc]
            with self._count_lock:
                self.trims += 1
                self.trim_seconds += time.perf_counter() - t0

    def process_request(self, request: Any, client_address: Any) -> None:
        client = str(client_address[0]) if isinstance(client_address, tuple) else str(client_address)
        with self._count_lock:
            held = self._per_client.get(client, 0)
            mine = held < self.limits.max_client_connections
            if mine:
                self._per_client[client] = held + 1
        if not mine:
            _refuse_busy(request, f"this client ({client}) holds {held} connections, the limit of one client")
            self.shutdown_request(request)
            return
        if not self._slots.acquire(blocking=False):
            self._leave(client)
            _refuse_busy(request, f"the server holds its limit of {self.limits.max_connections} connections")
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            self._leave(client)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()
            self._leave(str(client_address[0]) if isinstance(client_address, tuple) else str(client_address))

    def _leave(self, client: str) -> None:
        with self._count_lock:
            left = self._per_client.get(client, 1) - 1
            if left > 0:
                self._per_client[client] = left
            else:
                self._per_client.pop(client, None)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-answer is not a server fault worth a traceback.
        exc = sys.exc_info()[1]
        if isinstance(exc, DISCONNECTS):
            if self.verbose:
                sys.stderr.write(f"{client_address[0]} - client disconnected ({type(exc).__name__})\n")
        elif not isinstance(exc, TimeoutError):
            super().handle_error(request, client_address)


class _DeadlineReader(io.RawIOBase):
    """The connection's reads, each given only what is left of the request's deadline (the
    handler sets ``deadline`` as it starts waiting for a request): a client that sends a byte
    every few seconds runs out of time all the same."""

    def __init__(self, sock: socket.socket, write_timeout_s: float) -> None:
        self.sock, self.write_timeout_s = sock, write_timeout_s
        self.deadline = time.monotonic()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive whole within its deadline")
        self.sock.settimeout(left)
        try:
            return self.sock.recv_into(buffer)
        finally:
            self.sock.settimeout(self.write_timeout_s)  # the answer's writes get the usual timeout


def _refuse_busy(sock: Any, why: str) -> None:
    body = json.dumps({"error": f"{why}; retry shortly"}).encode()
    head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n").encode()
    try:
        sock.settimeout(1.0)
        sock.sendall(head + body)
    except OSError:
        pass


class _Endpoints(BaseHTTPRequestHandler):
    """Routes /retrieve and /health; every answer is JSON with a Content-Length."""

    server: RetrievalServer
    protocol_version = "HTTP/1.1"  # keep-alive: a client's session reuses its connection
    timeout = 60  # seconds a connection may sit idle or stall mid-body before it is dropped
    # Headers and body go out as two writes; with Nagle on, a keep-alive client waits ~40 ms
    # for the delayed ACK on every request.
    disable_nagle_algorithm = True

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the stdlib's reader, replaced by one that keeps the request's deadline
        self._reader = _DeadlineReader(self.connection, self.timeout)
        self.rfile = io.BufferedReader(self._reader)
        self._gone = False  # set when the client has left mid-request (``_disconnected``)

    def handle_one_request(self) -> None:
        self._reader.deadline = time.monotonic() + self.server.limits.request_deadline_s
        self._gone = False
        super().handle_one_request()

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            sys.stderr.write(f"{self.address_string()} - {format % args}\n")

    def log_request(self, code: Any = "-", size: Any = "-") -> None:
        # The stdlib logs a status as it starts the answer; this server logs it once the answer
        # is out (``_sent``), so the status of an answer its client never got is not logged.
        pass

    def _sent(self, status: int) -> None:
        if not self._gone:
            super().log_request(status)

    def _disconnected(self, why: str) -> None:
        """The client left mid-request: one line in the request log, not a status."""
        self.close_connection = True
        if not self._gone:
            self._gone = True
            self.log_message('"%s" client disconnected %s', self.requestline[:200], why)

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload, ensure_ascii=False).encode("utf-8", errors="replace")
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self._answer_bytes = len(body)
        self.wfile.write(body)
        self._sent(status)

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

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # The stdlib's own refusals (bad request line, headers too long, unknown method) in
        # this API's JSON shape; an unknown method is a 405, not the stdlib's 501.
        if code == 501:
            self._method_not_allowed()
            return
        self.close_connection = True
        self._send(code, {"error": message or explain or f"HTTP {code}"})

    def do_POST(self) -> None:
        self._answer_bytes = 0
        self.server.request_began()
        try:
            self._post()
        finally:
            self.server.request_ended(self._answer_bytes)

    def _post(self) -> None:
        try:
            self._retrieve()
        except TimeoutError:  # the body did not arrive within the request's deadline
            self._refuse(408, f"the request did not arrive whole within {self.server.limits.request_deadline_s:g} s",
                         close=True)
        except DISCONNECTS as exc:  # the client left: nothing to answer, and no fault
            self._disconnected(f"({type(exc).__name__})")
        except Exception as exc:  # never a dropped connection: a fault is a JSON 500
            self._refuse(500, f"internal error: {type(exc).__name__}: {exc}", close=True)

    def _retrieve(self) -> None:
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
        lengths = self.headers.get_all("Content-Length") or []
        if len(lengths) > 1:
            # Two lengths make the request's end ambiguous (request smuggling): refuse it.
            self._refuse(400, f"{len(lengths)} Content-Length headers; send exactly one", close=True)
            return None
        length_header = lengths[0] if lengths else None
        if length_header is None:
            self._refuse(411, "a Content-Length header is required", close=True)
            return None
        try:
            if not length_header.strip().isdigit() or len(length_header) > 18:
                raise ValueError
            length = int(length_header)
        except ValueError:
            self._refuse(400, f"bad Content-Length {length_header!r}", close=True)
            return None
        if length > self.server.limits.max_body_bytes:
            if length <= DISCARD_LIMIT:
                self._discard(length)
            self._refuse(413, f"body of {length} bytes; the limit is {self.server.limits.max_body_bytes}", close=True)
            return None
        body = self.rfile.read(length)
        if len(body) < length:  # the client closed its end: answered still, for one that only half-closed
            self._disconnected(f"after {len(body)} of its {length} body bytes")
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
        message = f"{str(self.command)[:32]} is not supported; use POST /retrieve or GET /health"
        if self.command == "HEAD":  # a HEAD answer has the headers of the JSON body, not the body
            body = json.dumps({"error": message}).encode("utf-8")
            self.close_connection = True
            self.send_response(405)
            self.send_header("Allow", "GET, POST")
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self._sent(405)
            return
        self._refuse(405, message, close=True)

    do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _method_not_allowed


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


def _bind(host: str, port: int, retriever: Retriever, limits: ServerLimits, verbose: bool) -> RetrievalServer:
    check_port(port)
    try:
        return RetrievalServer((host, port), retriever, limits, verbose, _info(retriever))
    except (OSError, UnicodeError, TypeError, ValueError) as exc:  # a host that cannot even be encoded, too
        raise ConfigError(f"cannot bind {host[:60]}:{port} ({getattr(exc, 'strerror', None) or exc}); pick another "
                          "--port or --host") from None


def serve_in_background(
    retriever: Retriever,
    host: str = DEFAULT_HOST,
    port: int = 0,
    limits: ServerLimits = ServerLimits(),
    verbose: bool = False,
) -> RunningServer:
    """Start a server on a daemon thread (port 0 picks a free port); returns its URL and handle."""
    server = _bind(host, port, retriever, limits, verbose)
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
    warn_if_exposed(host, "the retrieval API")
    with _bind(host, port, retriever, limits, verbose) as server:
        print(f"serving {server.info} on http://{host}:{server.server_address[1]} (POST /retrieve, GET /health)", flush=True)
        server.serve_forever()
