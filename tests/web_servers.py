"""Loopback servers for the web tests: one that injects faults on demand (and replays recorded
responses of keyed search APIs, Brave, Serper and SearxNG, with their auth), and a raw-socket
one that answers slower than any deadline."""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

FIXTURES = Path(__file__).parent / "web_fixtures"
BRAVE_KEY = "test-brave-key"
SERPER_KEY = "test-serper-key"
ODD_SEARXNG = (b'{"results": [{"title": null, "url": "http://a.example/1", "content": ["x"]}, '
               b'{"title": "T\\udcff", "url": "http://a.example/2", "content": "ok \\ud800 text"}, '
               b'{"title": "no url"}, {"title": "bad url", "url": 42}, {"title": {"a": 1}, "url": "http://a.example/3", '
               b'"content": 7}]}')
PAGE = b"<html><head><title>ok</title></head><body><p>all good</p></body></html>"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients here hang up on purpose (timeouts, size caps); only real errors are printed.
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class FaultServer:
    """A real HTTP server on 127.0.0.1 whose routes misbehave on purpose.

    Routes (``key=`` names an independent counter, so tests do not interfere):
    ``/slow?s=`` sleeps first; ``/flaky?fail=N&status=S`` fails N times then serves a page;
    ``/ratelimit?after=A`` answers 429 with ``Retry-After: A`` once; ``/truncated`` (and
    ``/truncated-once``) promise more bytes than they send; ``/malformed-json``; ``/pdf``;
    ``/binary`` (no content type); ``/huge?mb=`` streams megabytes of HTML; ``/latin1`` and
    ``/meta-charset`` test decoding; ``/busy`` records how many requests overlap; and
    ``/brave/...``, ``/serper/search``, ``/searxng/search`` replay recorded API answers;
    ``/searxng-odd`` answers with wrong field types and lone surrogates; ``/redirect?to=U``.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.hits: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.inflight = 0
        self.max_inflight = 0
        self.seen_headers: list[dict[str, str]] = []
        self._httpd = _Server((host, port), _handler(self))
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self._httpd.server_address[1]}"

    def count(self, key: str) -> int:
        with self.lock:
            self.hits[key] += 1
            return self.hits[key]

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _handler(srv: FaultServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in separate writes; with Nagle on, each response would
        # stall ~40 ms on the client's delayed ACK.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

        def send(self, status: int, ctype: str, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            if ctype:
                self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            # The client may have given up first (a timeout test).
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if urlsplit(self.path).path == "/serper/search":
                srv.seen_headers.append(dict(self.headers))
                if self.headers.get("X-API-KEY") != SERPER_KEY:
                    return self.send(403, "application/json; charset=utf-8", (FIXTURES / "serper_unauthorized.json").read_bytes())
                data = json.loads((FIXTURES / "serper_search.json").read_text())
                data["searchParameters"].update(q=body.get("q"), num=body.get("num"))
                return self.send(200, "application/json; charset=utf-8", json.dumps(data).encode())
            self.send(404, "application/json", b'{"error": "no such route"}')

        def do_GET(self) -> None:  # noqa: N802, C901
            parts = urlsplit(self.path)
            q = {k: v[0] for k, v in parse_qs(parts.query).items()}
            # The first path segment picks the route, so a backend that appends "/search" to
            # its base URL still reaches it; the query text doubles as the counter key.
            path = "/" + parts.path.strip("/").split("/")[0]
            key = q.get("key", q.get("q", ""))
            n = srv.count(f"{path}:{key}")
            if path == "/slow":
                time.sleep(float(q.get("s", "1")))
                return self.send(200, "text/html", PAGE)
            if path == "/drip":  # every byte arrives in time, the whole body does not
                pieces, gap = int(q.get("n", "10")), float(q.get("gap", "0.1"))
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(pieces * 8))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    for _ in range(pieces):
                        self.wfile.write(b"<p>x</p>")
                        time.sleep(gap)
                return None
            if path == "/searxng-odd":  # wrong field types, and lone-surrogate escapes in the text
                return self.send(200, "application/json", ODD_SEARXNG)
            if path == "/redirect":  # a 302 to wherever ?to= says
                return self.send(302, "text/plain", b"moved", {"Location": q.get("to", "/")})
            if path == "/flaky":
                if n <= int(q.get("fail", "1")):
                    return self.send(int(q.get("status", "500")), "text/plain", b"internal error")
                return self.send(200, "text/html", PAGE)
            if path == "/ratelimit":
                if n == 1:
                    return self.send(429, "text/plain", b"slow down", {"Retry-After": q.get("after", "1")})
                return self.send(200, "text/html", PAGE)
            if path in ("/truncated", "/truncated-once"):
                if path == "/truncated-once" and n > 1:
                    return self.send(200, "text/html", PAGE)
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", "5000")
                self.end_headers()
                self.wfile.write(b"<html><body><p>the start of a page that never ")
                self.close_connection = True
                return None
            if path == "/malformed-json":
                return self.send(200, "application/json", b'{"results": [{"url": "http://x", "title": ')
            if path == "/json-page":
                return self.send(200, "application/json", b'{"ok": true}')
            if path == "/pdf":
                return self.send(200, "application/pdf", b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj")
            if path == "/binary":
                return self.send(200, "", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" * 10)
            if path == "/huge":
                size = int(float(q.get("mb", "10")) * 1_000_000)
                self.send_response(200)
                self.send_header("Content-Type", q.get("type", "text/html; charset=utf-8"))
                self.send_header("Content-Length", str(size))
                self.end_headers()
                chunk = b"<p>" + b"lorem ipsum dolor sit amet " * 37 + b"</p>\n"
                sent = 0
                try:
                    while sent < size:
                        piece = chunk[: size - sent]
                        self.wfile.write(piece)
                        sent += len(piece)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client stopped reading at its cap, as it should
                self.close_connection = True
                return None
            if path == "/latin1":
                return self.send(200, "text/html; charset=iso-8859-1", "<p>Café crème à Orléans</p>".encode("latin-1"))
            if path == "/meta-charset":
                body = '<html><head><meta charset="windows-1252"></head><body><p>naïve “quotes”</p></body></html>'
                return self.send(200, "text/html", body.encode("cp1252"))
            if path == "/busy":
                with srv.lock:
                    srv.inflight += 1
                    srv.max_inflight = max(srv.max_inflight, srv.inflight)
                time.sleep(float(q.get("s", "0.1")))
                with srv.lock:
                    srv.inflight -= 1
                return self.send(200, "text/html", PAGE)
            if path == "/down":
                return self.send(503, "text/html", b"<html><body>Service Unavailable</body></html>")
            if path == "/brave":
                srv.seen_headers.append(dict(self.headers))
                if self.headers.get("X-Subscription-Token") != BRAVE_KEY:
                    return self.send(422, "application/json", (FIXTURES / "brave_invalid_token.json").read_bytes())
                data = json.loads((FIXTURES / "brave_web_search.json").read_text())
                data["query"]["original"] = q.get("q", "")
                data["web"]["results"] = data["web"]["results"][: int(q.get("count", "20"))]
                return self.send(200, "application/json", json.dumps(data).encode())
            if path == "/searxng":
                if q.get("format") != "json":
                    return self.send(403, "text/html", b"<html><body>403 Forbidden</body></html>")
                return self.send(200, "application/json", (FIXTURES / "searxng_search.json").read_bytes())
            return self.send(404, "text/html", b"<html><body>not found</body></html>")

    return Handler


DRIP_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"


class DripServer:
    """A raw-socket HTTP server on 127.0.0.1 that never finishes an answer.

    After what the path sends at once, one piece goes out every ``gap`` seconds (well inside
    any per-read timeout) until the client hangs up or ``limit_s`` passes. Paths:
    ``/status`` drips the status line itself; ``/headers`` sends the status line, then one
    header line per piece; ``/length`` promises a Content-Length body and drips it a byte at
    a time; ``/chunked`` sends one one-byte chunk per piece; ``/stall`` sends whole headers
    and then nothing. ``connections`` counts the connections accepted.
    """

    SCRIPTS: dict[str, tuple[bytes, bytes]] = {  # path: (sent at once, each piece)
        "/status": (b"", b"HTTP/1.1 200 O" + b"K" * 4000),
        "/headers": (DRIP_HEAD, b"X-Drip: 1\r\n"),
        "/length": (DRIP_HEAD + b"Content-Length: 100000\r\n\r\n", b"x"),
        "/chunked": (DRIP_HEAD + b"Transfer-Encoding: chunked\r\n\r\n", b"1\r\nx\r\n"),
        "/stall": (DRIP_HEAD + b"Content-Length: 100\r\n\r\n", b""),
    }

    def __init__(self, gap: float = 0.1, limit_s: float = 30.0) -> None:
        self.gap, self.limit_s = gap, limit_s
        self.connections = 0
        self._stop = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0), backlog=64)
        self._sock.settimeout(0.05)
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        end = time.monotonic() + self.limit_s
        with conn, contextlib.suppress(OSError):
            conn.settimeout(self.gap)
            head = b""
            while b"\r\n\r\n" not in head and time.monotonic() < end:
                with contextlib.suppress(TimeoutError):
                    data = conn.recv(4096)
                    if not data:
                        return
                    head += data
            path = head.split(b" ", 2)[1].decode("ascii", "replace").split("?")[0] if head.count(b" ") >= 2 else ""
            at_once, piece = self.SCRIPTS.get(path, (b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", b""))
            conn.sendall(at_once)
            # A status line drips byte by byte; a header line, a body byte or a chunk goes out whole.
            units = [piece[i : i + 1] for i in range(len(piece))] if path == "/status" else [piece]
            sent = 0
            while not self._stop.is_set() and time.monotonic() < end:
                if units[sent % len(units)]:
                    conn.sendall(units[sent % len(units)])
                sent += 1
                try:
                    if conn.recv(1) == b"":
                        return  # the client hung up
                except TimeoutError:
                    pass  # the wait between pieces

    def stop(self) -> None:
        self._stop.set()
        self._sock.close()
        self._thread.join(timeout=2)


KEY_TITLES = ("Hamlet", "William Shakespeare", "Abraham Lincoln", "Paris", "France", "England", "United States",
              "Denmark", "London")


def small_corpus(extra: int = 150) -> list:
    """The built-in passages about the test questions' answers, plus the first ``extra`` others."""
    from treegym.retrieval_index.corpus import wiki_documents

    docs = wiki_documents()
    keep = [d for d in docs if d.title in KEY_TITLES]
    return keep + [d for d in docs[:extra] if d.title not in KEY_TITLES]
