"""A local web over a passage corpus: HTML articles with links, and a search endpoint.

``treegym web serve`` (or ``LocalWeb(docs).start()``) serves, on 127.0.0.1:

- ``/wiki/<Title>``: an article page. Each title of another article that the passage
  mentions becomes a link to it, and the page carries the usual boilerplate (nav, header,
  footer, a script) that the browse tool must strip;
- ``/doc/<id>``: a redirect to the article of a passage id (for Search-R1 style results);
- ``/search?q=...&format=json``: BM25 search (bm25s) in SearxNG's JSON format, so the
  SearxNG backend drives it; without ``format=json`` an HTML results page;
- ``POST /retrieve``: Search-R1's retrieval API over the same index;
- ``/health``.

The default corpus is the built-in Wikipedia one; any FlashRAG JSONL corpus works (e.g. the
synthetic world written by ``treegym data synth``). This is WebSearchQA-v0's offline default
backend and the real server its tests run against.
"""

from __future__ import annotations

import contextlib
import html
import json
import threading
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from treegym.envs.web.site import Site, load_docs, slug, snippet
from treegym.retrieval_index.corpus import Document, wiki_documents


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # a pool of 64 envs connects at once; the default backlog is 5
    allow_reuse_address = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.open_connections: set[Any] = set()
        self._conn_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conn_lock:
            self.open_connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._conn_lock:
            self.open_connections.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> None:
        """Close kept-alive connections too, so that a stopped server is really gone."""
        import socket

        with self._conn_lock:
            conns, self.open_connections = list(self.open_connections), set()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)
        # else: the client gave up (its timeout); nothing to report


class LocalWeb:
    """The local web server. ``start()`` runs it in a background thread; ``url`` is its root.

    Args:
        docs: the corpus (default: the built-in Wikipedia passages).
        host, port: where to bind (port 0 picks a free one).
        latency_s: a delay added to every response, to stand in for a real network.
    """

    def __init__(self, docs: Iterable[Document] | None = None, *, host: str = "127.0.0.1", port: int = 0,
                 latency_s: float = 0.0) -> None:
        self.site = Site(tuple(docs) if docs is not None else wiki_documents())
        self.latency_s = latency_s
        self.requests = 0
        self.inflight = 0
        self.max_inflight = 0  # most requests served at once (shows that clients overlap)
        self._count_lock = threading.Lock()
        self._httpd = _Server((host, port), _make_handler(self))
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> LocalWeb:
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="treegym-local-web", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._httpd.serve_forever(poll_interval=0.2)

    def stop(self) -> None:
        """Stop serving and close the socket (later requests are refused)."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._httpd.server_close()
        self._httpd.drop_connections()

    def __enter__(self) -> LocalWeb:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ---- routes -----------------------------------------------------------------------------

    def handle(self, method: str, path: str, query: dict[str, list[str]], body: bytes) -> tuple[int, str, bytes, dict[str, str]]:
        """(status, content type, body, extra headers) for one request."""
        site = self.site
        if method == "POST":
            if path.rstrip("/") == "/retrieve":
                return self._retrieve(body)
            return _json(404, {"error": f"no POST route {path}"})
        if path in ("/", ""):
            items = "".join(f'<li><a href="/wiki/{slug(d.title)}">{html.escape(d.title)}</a></li>' for d in site.docs[:100])
            return _html(200, f"<html><head><title>treegym local web</title></head><body><h1>treegym local web</h1>"
                              f"<p>{len(site.docs)} articles.</p><ul>{items}</ul></body></html>")
        if path == "/health":
            return _json(200, {"status": "ok", "documents": len(site.docs), "requests": self.requests})
        if path.startswith("/wiki/"):
            title = unquote(path[len("/wiki/"):]).replace("_", " ")
            if title not in site.by_title:
                return _html(404, f"<html><body><h1>Not found</h1><p>No article titled {html.escape(title)}.</p></body></html>")
            return _html(200, site.article(title))
        if path.startswith("/doc/"):
            doc = site.by_id.get(unquote(path[len("/doc/"):]))
            if doc is None:
                return _html(404, "<html><body><h1>Not found</h1></body></html>")
            return 302, "text/plain", b"", {"Location": f"/wiki/{slug(doc.title or doc.id)}"}
        if path == "/search":
            q = (query.get("q") or [""])[0]
            try:
                k = max(1, min(int((query.get("k") or query.get("count") or ["10"])[0]), 100))
            except ValueError:
                return _json(400, {"error": "k must be an integer"})
            hits = site.search(q, k, per_article=True) if q.strip() else []
            results = [{"url": f"{self.url}/wiki/{slug(d.title or d.id)}", "title": d.title, "content": snippet(d.text),
                        "engine": "treegym-local", "engines": ["treegym-local"], "score": round(s, 4),
                        "category": "general", "positions": [r + 1]} for r, (d, s) in enumerate(hits)]
            if (query.get("format") or [""])[0] == "json":
                return _json(200, {"query": q, "number_of_results": len(results), "results": results, "answers": [],
                                   "corrections": [], "infoboxes": [], "suggestions": [], "unresponsive_engines": []})
            items = "".join(f'<li><a href="{r["url"]}">{html.escape(r["title"])}</a><p>{html.escape(r["content"])}</p></li>'
                            for r in results)
            return _html(200, f"<html><head><title>{html.escape(q)} - search</title></head><body><ol>{items}</ol></body></html>")
        return _html(404, "<html><body><h1>Not found</h1></body></html>")

    def _retrieve(self, body: bytes) -> tuple[int, str, bytes, dict[str, str]]:
        try:
            req = json.loads(body or b"{}")
        except json.JSONDecodeError as exc:
            return _json(400, {"error": f"body is not JSON: {exc.msg}"})
        queries = req.get("queries") if isinstance(req, dict) else None
        if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries) or not 0 < len(queries) <= 512:
            return _json(400, {"error": "'queries' must be a list of 1 to 512 strings"})
        topk = req.get("topk", 3)
        if not isinstance(topk, int) or not 1 <= topk <= 100:
            return _json(400, {"error": "'topk' must be an integer in 1..100"})
        scores = bool(req.get("return_scores", False))
        result = []
        for q in queries:
            hits = self.site.search(q, topk)
            if scores:
                result.append([{"document": d.to_record(), "score": s} for d, s in hits])
            else:
                result.append([d.to_record() for d, _ in hits])
        return _json(200, {"result": result})


def _json(status: int, obj: Any) -> tuple[int, str, bytes, dict[str, str]]:
    return status, "application/json", json.dumps(obj, ensure_ascii=False).encode("utf-8"), {}


def _html(status: int, text: str) -> tuple[int, str, bytes, dict[str, str]]:
    return status, "text/html; charset=utf-8", text.encode("utf-8"), {}


def _make_handler(web: LocalWeb) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: a pool reuses its connections
        # Headers and body go out in separate writes; with Nagle on, each response would
        # stall ~40 ms on the client's delayed ACK.
        disable_nagle_algorithm = True

        def _serve(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(min(length, 4_000_000)) if length else b""
            if length > 4_000_000:
                status, ctype, data, extra = _json(413, {"error": "body over 4 MB"})
            else:
                parts = urlsplit(self.path)
                try:
                    status, ctype, data, extra = web.handle(method, parts.path, parse_qs(parts.query), body)
                except Exception as exc:  # a bug must not kill the server thread silently
                    status, ctype, data, extra = _json(500, {"error": f"{type(exc).__name__}: {exc}"})
            with web._count_lock:
                web.requests += 1
                web.inflight += 1
                web.max_inflight = max(web.max_inflight, web.inflight)
            try:
                if web.latency_s:
                    time.sleep(web.latency_s)
            finally:
                with web._count_lock:
                    web.inflight -= 1
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            for k, v in extra.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            self._serve("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._serve("POST")

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    return Handler


_RUNNING: dict[tuple[str, int | None], LocalWeb] = {}
_RUNNING_LOCK = threading.Lock()


def local_web_for(corpus: str = "wiki", limit: int | None = None) -> LocalWeb:
    """The process's in-process local web over ``corpus`` (see ``load_docs``), started on first use."""
    with _RUNNING_LOCK:
        key = (corpus, limit)
        if key not in _RUNNING:
            _RUNNING[key] = LocalWeb(load_docs(corpus, limit)).start()
        return _RUNNING[key]


def default_local_web() -> LocalWeb:
    """The in-process local web over the built-in corpus."""
    return local_web_for("wiki")
