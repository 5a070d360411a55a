"""The Search-R1-compatible HTTP server on 127.0.0.1 and its client, over a real index."""

from __future__ import annotations

import http.client
import json
import socket
import struct
import time
from typing import Any
from urllib.parse import urlparse

import pytest
import requests

from treegym.errors import TreegymError
from treegym.retrieval_index import open_retriever
from treegym.retrieval_index.client import RemoteRetriever
from treegym.retrieval_index.server import ServerLimits, serve_in_background

LIMIT = 300
LIMITS = ServerLimits(default_topk=3, max_topk=20, max_queries=8, max_body_bytes=4096)
QUERIES = ["inventor of the telephone", "Ibsen play about Nora leaving her husband", ""]


@pytest.fixture(scope="module")
def local():
    return open_retriever(index="hybrid", limit=LIMIT, progress=False)


@pytest.fixture(scope="module")
def server(local):
    with serve_in_background(local, limits=LIMITS) as running:
        yield running


def _post(url: str, payload) -> requests.Response:
    return requests.post(f"{url}/retrieve", json=payload, timeout=30)


def _raw(url: str, method: str, path: str, body: bytes = b"", headers: dict | None = None) -> tuple[int, dict]:
    parsed = urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    try:
        conn.putrequest(method, path)
        for key, value in (headers or {}).items():
            conn.putheader(key, value)
        conn.endheaders(body or None)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_server_binds_loopback_by_default(server):
    assert server.url.startswith("http://127.0.0.1:")


def test_retrieve_answers_in_search_r1_shape_with_scores(server, local):
    response = _post(server.url, {"queries": QUERIES[:2], "topk": 3, "return_scores": True})
    assert response.status_code == 200
    result = response.json()["result"]
    assert len(result) == 2 and all(len(hits) == 3 for hits in result)
    first = result[0][0]
    assert set(first) == {"document", "score"} and set(first["document"]) == {"id", "contents"}
    assert first["document"]["contents"].startswith('"Alexander Graham Bell"\n')


def test_without_return_scores_the_lists_hold_documents_only(server):
    result = _post(server.url, {"queries": QUERIES[:1]}).json()["result"]
    assert len(result[0]) == LIMITS.default_topk
    assert set(result[0][0]) == {"id", "contents"}


def test_round_trip_through_the_server_equals_in_process_search(server, local):
    remote = RemoteRetriever(server.url)
    assert remote.search(QUERIES, 5) == local.search(QUERIES, 5)


def test_client_splits_large_batches_under_the_server_limit(server, local):
    queries = [f"question number {i} about music" for i in range(LIMITS.max_queries + 3)]
    remote = RemoteRetriever(server.url, max_batch=LIMITS.max_queries)
    assert [[h.doc_id for h in hits] for hits in remote.search(queries, 2)] == [
        [h.doc_id for h in hits] for hits in local.search(queries, 2)
    ]


def test_health_reports_the_index(server):
    health = requests.get(f"{server.url}/health", timeout=10).json()
    assert health["status"] == "ok" and health["count"] == LIMIT and health["index"] == "hybrid"


@pytest.mark.parametrize(
    ("payload", "status", "needle"),
    [
        ({"topk": 3}, 400, "queries"),
        ({"queries": "one string"}, 400, "queries"),
        ({"queries": [1, 2]}, 400, "queries"),
        ({"queries": ["x"], "topk": 0}, 400, "topk"),
        ({"queries": ["x"], "topk": 10_000}, 400, "topk"),
        ({"queries": ["x"], "topk": "3"}, 400, "topk"),
        ({"queries": ["x"], "topk": True}, 400, "topk"),
        ({"queries": ["x"], "return_scores": "yes"}, 400, "return_scores"),
        ({"queries": ["x"] * 9}, 413, "limit is 8"),
        (["not", "an", "object"], 400, "JSON object"),
    ],
)
def test_bad_requests_get_a_4xx_with_a_message(server, payload, status, needle):
    response = _post(server.url, payload)
    assert response.status_code == status
    assert needle in response.json()["error"]


def test_a_body_that_is_not_json_is_a_400(server):
    status, body = _raw(server.url, "POST", "/retrieve", b"{queries: nope", {"Content-Length": "14"})
    assert status == 400 and "JSON" in body["error"]


def test_a_body_that_is_not_utf8_is_a_400(server):
    status, body = _raw(server.url, "POST", "/retrieve", b"\xff\xfe\x00", {"Content-Length": "3"})
    assert status == 400 and "UTF-8" in body["error"]


def test_an_oversize_body_is_a_413(server):
    body = json.dumps({"queries": ["x" * 5000]}).encode()
    status, answer = _raw(server.url, "POST", "/retrieve", body, {"Content-Length": str(len(body))})
    assert status == 413 and "limit is 4096" in answer["error"]


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 411), ({"Content-Length": "abc"}, 400), ({"Content-Length": "-5"}, 400), ({"Transfer-Encoding": "chunked"}, 411)],
)
def test_a_missing_or_bad_content_length_is_a_4xx(server, headers, status):
    code, body = _raw(server.url, "POST", "/retrieve", b"", headers)
    assert code == status and body["error"]


def test_unknown_paths_and_methods_are_4xx(server):
    assert _raw(server.url, "GET", "/nope")[0] == 404
    assert _raw(server.url, "POST", "/search", b"{}", {"Content-Length": "2"})[0] == 404
    assert _raw(server.url, "DELETE", "/retrieve")[0] == 405


def test_the_server_keeps_serving_after_bad_requests(server):
    _post(server.url, {"queries": ["x"], "topk": -1})
    assert _post(server.url, {"queries": ["acne"], "topk": 1}).status_code == 200


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_client_gives_a_clear_error_when_the_server_is_down():
    url = f"http://127.0.0.1:{_free_port()}"
    client = RemoteRetriever(url, timeout=(0.5, 1), retries=2, backoff=0.01)
    with pytest.raises(TreegymError, match=r"did not answer after 3 attempts") as excinfo:
        client.search(["anything"], 3)
    assert url in str(excinfo.value) and "ConnectionError" in str(excinfo.value)


class FlakyRetriever:
    """A real index behind a server whose first search fails, as an overloaded backend would."""

    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, 0

    def search(self, queries, k):
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("backend busy")
        return self.inner.search(queries, k)


def test_client_does_not_retry_a_500_that_would_repeat():
    bm25 = open_retriever(index="bm25", limit=LIMIT, progress=False)
    flaky = FlakyRetriever(bm25)
    with serve_in_background(flaky) as running:
        with pytest.raises(TreegymError, match="failed: HTTP 500: retrieval failed: RuntimeError: backend busy"):
            RemoteRetriever(running.url, backoff=0.01).search(["telephone inventor"], 2)
        assert flaky.calls == 1  # not retried: a retry would only add load
        assert RemoteRetriever(running.url).search(["telephone inventor"], 2) == bm25.search(["telephone inventor"], 2)


def test_client_reports_a_4xx_at_once_with_the_servers_message(server):
    with pytest.raises(TreegymError, match="topk"):
        RemoteRetriever(server.url).search(["x"], 10_000)


def test_open_retriever_with_a_url_returns_the_remote_client(server):
    remote = open_retriever(url=server.url)
    assert isinstance(remote, RemoteRetriever) and remote.search(["acne"], 1)[0][0].title == "Acne"


# ---- hardened against bad input and load -----------------------------------------------------------


@pytest.fixture(scope="module")
def roomy(local):
    """The same index behind the default limits (a 1 MB body), for bodies the small one refuses."""
    with serve_in_background(local) as running:
        yield running


def _raw_bytes(url: str, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``data`` as it is on a fresh connection; the status, headers and body of the answer."""
    parsed = urlparse(url)
    with socket.create_connection((parsed.hostname, parsed.port), timeout=30) as sock:
        sock.sendall(data)
        response = http.client.HTTPResponse(sock, method="HEAD" if data.startswith(b"HEAD") else None)
        response.begin()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()


def test_a_lone_surrogate_query_is_a_400_not_a_500(server):
    body = b'{"queries": ["\\udcff"], "topk": 2}'
    status, answer = _raw(server.url, "POST", "/retrieve", body, {"Content-Length": str(len(body))})
    assert status == 400 and "lone surrogate" in answer["error"]
    assert _post(server.url, {"queries": ["acne"], "topk": 1}).status_code == 200


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b'{"queries": ["x"], "topk": 1' + b"0" * 5000 + b"}", "number too large"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, "nested too deeply"),
    ],
    ids=["5000-digit-int", "100k-arrays", "50k-objects"],
)
def test_huge_numbers_and_deep_nesting_get_a_json_400(roomy, body, needle):
    status, answer = _raw(roomy.url, "POST", "/retrieve", body, {"Content-Length": str(len(body))})
    assert status == 400 and needle in answer["error"]


def test_two_content_lengths_are_refused(server):
    smuggled = b'{}POST /retrieve HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}'
    request = (b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: " +
               str(len(smuggled)).encode() + b"\r\n\r\n" + smuggled)
    status, headers, body = _raw_bytes(server.url, request)
    assert status == 400 and "2 Content-Length headers" in json.loads(body)["error"]
    assert headers["connection"] == "close"


@pytest.mark.parametrize("method", ["HEAD", "OPTIONS", "BREW", "PUT"])
def test_other_methods_get_a_json_405(server, method):
    status, headers, body = _raw_bytes(server.url, f"{method} /retrieve HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert status == 405 and headers["content-type"].startswith("application/json")
    if method != "HEAD":  # a HEAD answer carries the headers of the body, not the body
        assert "is not supported" in json.loads(body)["error"]


def test_two_hundred_concurrent_clients_all_get_an_answer(server):
    import threading

    assert server.server.request_queue_size >= 256  # the stdlib's backlog of 5 resets a burst
    barrier, answers, errors = threading.Barrier(200), [], []

    def client() -> None:
        barrier.wait()
        try:
            answers.append(requests.get(f"{server.url}/health", timeout=60).status_code)
        except requests.RequestException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client) for _ in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and answers == [200] * 200


def test_live_connections_are_capped_with_a_503(local):
    limits = ServerLimits(max_connections=2)
    with serve_in_background(local, limits=limits) as running:
        parsed = urlparse(running.url)
        idle = [socket.create_connection((parsed.hostname, parsed.port), timeout=30) for _ in range(2)]
        status, headers, body = _raw_bytes(running.url, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 503 and headers["retry-after"] == "1" and "limit of 2 connections" in json.loads(body)["error"]
        for sock in idle:
            sock.close()
        # The slots come back once the server sees the stalled clients go (poll: not a timing test).
        for _ in range(200):
            if requests.get(f"{running.url}/health", timeout=30).status_code == 200:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the connection slots never came back")


@pytest.mark.parametrize("argv", [["index", "serve", "--port", "99999"], ["index", "serve", "--port", "-1"],
                                  ["web", "serve", "--port", "99999"], ["serve-model", "--port", "70000"],
                                  ["serve-env", "ProbeKeys-v0", "--port", "-5"]])  # fmt: skip
def test_a_port_out_of_range_is_a_one_line_error(argv, capsys):
    from treegym.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--port must be from 0 to 65535" in err and "Traceback" not in err


def test_a_port_in_use_is_a_one_line_error(capsys):
    from treegym.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["index", "serve", "--type", "bm25", "--limit", str(LIMIT), "--port", str(port), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"cannot bind 127.0.0.1:{port}" in err and "Traceback" not in err


# ---- the client against other servers' answers (a scripted server on 127.0.0.1) ----------------------


class ScriptedServer:
    """A real HTTP server that answers each POST /retrieve with the next (status, headers, body)
    of its script (the last one repeats), as Search-R1's server or a proxy in front of it would."""

    def __init__(self, script: list[tuple[int, dict[str, str], Any]]) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.script, self.requests = list(script), 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                status, headers, body = outer.script[min(outer.requests, len(outer.script) - 1)]
                outer.requests += 1
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                for key, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def __enter__(self) -> ScriptedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


BM25_DOCS = [{"title": "Acne", "text": "Acne is a skin condition.", "contents": '"Acne"\nAcne is a skin condition.'},
             {"title": "Ibsen", "text": "Henrik Ibsen wrote plays.", "contents": '"Ibsen"\nHenrik Ibsen wrote plays.'}]  # fmt: skip


@pytest.mark.parametrize("with_scores", [True, False])
def test_client_accepts_documents_without_an_id(with_scores):
    items = [{"document": d, "score": 2.0 - i} for i, d in enumerate(BM25_DOCS)] if with_scores else BM25_DOCS
    with ScriptedServer([(200, {}, {"result": [items]})]) as srv:
        first = RemoteRetriever(srv.url).search(["acne"], 2)[0]
        again = RemoteRetriever(srv.url).search(["acne"], 2)[0]
    assert [h.title for h in first] == ["Acne", "Ibsen"] and first[0].text == "Acne is a skin condition."
    assert [h.doc_id for h in first] == [h.doc_id for h in again]  # derived from the contents: stable
    assert len({h.doc_id for h in first}) == 2 and all(h.doc_id.startswith("sha1:") for h in first)


def test_client_drops_faiss_padding_hits():
    real = {"document": {"id": "7", "contents": '"Acne"\nskin'}, "score": 0.61}
    pad = {"document": {"id": "7", "contents": '"Acne"\nskin'}, "score": -3.4028234663852886e38}
    with ScriptedServer([(200, {}, {"result": [[real, pad, pad]]})]) as srv:
        hits = RemoteRetriever(srv.url).search(["acne"], 3)[0]
    assert [(h.doc_id, h.score) for h in hits] == [("7", 0.61)]


OK_ANSWER = {"result": [[{"document": {"id": "1", "contents": '"A"\na'}, "score": 1.0}]]}


@pytest.mark.parametrize("status", [429, 502, 503, 504])
def test_client_retries_what_can_succeed_honouring_retry_after(status):
    # A backoff of 1e6 s: only the server's Retry-After: 0 can make the retry happen now.
    with ScriptedServer([(status, {"Retry-After": "0"}, {"error": "busy"}), (200, {}, OK_ANSWER)]) as srv:
        hits = RemoteRetriever(srv.url, backoff=1e6, max_retry_s=60).search(["a"], 1)[0]
        assert srv.requests == 2 and hits[0].doc_id == "1"


@pytest.mark.parametrize("status", [500, 501, 400, 404])
def test_client_does_not_retry_what_would_fail_again(status):
    with ScriptedServer([(status, {}, {"error": "no"}), (200, {}, OK_ANSWER)]) as srv:
        with pytest.raises(TreegymError, match=f"HTTP {status}: no"):
            RemoteRetriever(srv.url, backoff=0.0).search(["a"], 1)
        assert srv.requests == 1


def test_client_caps_the_total_time_spent_retrying():
    with ScriptedServer([(503, {}, {"error": "busy"})]) as srv:
        with pytest.raises(TreegymError, match="stopped retrying after max_retry_s=0.01"):
            RemoteRetriever(srv.url, retries=10, backoff=1e6, max_retry_s=0.01).search(["a"], 1)
        assert srv.requests == 1


@pytest.mark.parametrize(
    ("status", "body"),
    [(400, ["a", "list"]), (400, b"[" * 100_000 + b"]" * 100_000), (200, b"[" * 100_000 + b"]" * 100_000),
     (200, {"result": [[{"document": {"id": 1}}]]})],
    ids=["4xx-list", "4xx-deep", "200-deep", "200-no-contents"],
)  # fmt: skip
def test_index_query_url_reports_odd_answers_in_one_line(status, body, capsys):
    from treegym.cli import main

    with ScriptedServer([(status, {}, body)]) as srv:
        assert main(["index", "query", "acne", "--url", srv.url]) == 2
    err = capsys.readouterr().err
    assert f"retrieval server {srv.url}" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


# ---- slow clients cannot starve the server (issue 39) ---------------------------------------------


def _connect_from(source_ip: str, url: str) -> socket.socket:
    """A connection to the server from ``source_ip`` (any 127.x address is this machine)."""
    parsed = urlparse(url)
    sock = socket.socket()
    sock.bind((source_ip, 0))
    sock.connect((parsed.hostname, parsed.port))
    return sock


def test_a_client_that_drips_its_request_loses_its_slot_at_the_deadline(local):
    with serve_in_background(local, limits=ServerLimits(request_deadline_s=1.5)) as running:
        sock = _connect_from("127.0.0.1", running.url)
        sock.settimeout(10)
        request = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n\r\n" + b'{"queries": ["a"]}'
        t0, closed_at = time.monotonic(), None
        try:
            for byte in request:  # one byte every 0.3 s: every read is quick, the request never ends
                sock.sendall(bytes([byte]))
                time.sleep(0.3)
        except OSError:
            closed_at = time.monotonic() - t0
        if closed_at is None:  # all sent (it cannot be, at 0.3 s a byte): read what the server said
            closed_at = time.monotonic() - t0
        answer = sock.recv(4096)
        sock.close()
        assert closed_at < 6.0  # the whole request had 1.5 s, however the bytes were spread
        assert answer == b"" or b" 408 " in answer.split(b"\r\n")[0]
        assert _post(running.url, {"queries": ["Ibsen"], "topk": 1}).status_code == 200


def test_one_client_cannot_take_every_connection(local):
    limits = ServerLimits(max_connections=6, max_client_connections=3, request_deadline_s=30)
    with serve_in_background(local, limits=limits) as running:
        greedy = [_connect_from("127.0.0.1", running.url) for _ in range(3)]  # stalled: they send nothing
        time.sleep(0.3)
        extra = _connect_from("127.0.0.1", running.url)
        extra.settimeout(10)
        refused = extra.recv(4096)
        assert refused.startswith(b"HTTP/1.1 503") and b"holds 3 connections, the limit of one client" in refused
        other = _connect_from("127.0.0.2", running.url)  # another client still gets in, and an answer
        body = json.dumps({"queries": ["Ibsen"], "topk": 1}).encode()
        other.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                      % (len(body), body))
        other.settimeout(30)
        assert other.recv(4096).startswith(b"HTTP/1.1 200")
        for sock in (*greedy, extra, other):
            sock.close()


def _leave_mid_request(url: str, body_bytes: int, reset: bool) -> None:
    """Send the head of a POST and ``body_bytes`` of its 200-byte body, then hang up (FIN, or RST)."""
    sock = _connect_from("127.0.0.1", url)
    if reset:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 200\r\n\r\n" + b"x" * body_bytes)
    time.sleep(0.1)
    sock.close()


def test_a_client_that_leaves_mid_request_is_logged_as_a_disconnect_not_a_status(local, capsys):
    with serve_in_background(local, limits=LIMITS, verbose=True) as running:
        for body_bytes, reset in [(0, False), (50, False), (0, True), (50, True)]:
            _leave_mid_request(running.url, body_bytes, reset)
        assert _post(running.url, {"queries": ["Ibsen"], "topk": 1}).status_code == 200
        deadline = time.monotonic() + 10
        log = ""
        while time.monotonic() < deadline and (log.count("client disconnected") < 4 or '" 200 ' not in log):
            time.sleep(0.1)
            log += capsys.readouterr().err
    lines = log.strip().splitlines()
    assert sum("client disconnected" in line for line in lines) == 4, log  # one line each, at the request log's level
    assert not any(f'" {code} ' in log for code in (400, 500)) and "Traceback" not in log, log
    assert '"POST /retrieve HTTP/1.1" 200 ' in log  # an answer that went out is still logged


def test_the_server_gives_memory_back_after_a_heavy_answer_when_idle(local):
    from treegym.retrieval_index.server import TRIM_AFTER_BYTES, _malloc_trim

    if _malloc_trim() is None:
        pytest.skip("no malloc_trim in this C library")
    with serve_in_background(local, limits=ServerLimits(max_topk=100, max_queries=64)) as running:
        assert _post(running.url, {"queries": ["Ibsen"], "topk": 1}).status_code == 200
        assert running.server.trims == 0  # a light answer costs no trim
        heavy = _post(running.url, {"queries": [f"Ibsen {i}" for i in range(64)], "topk": 100, "return_scores": True})
        assert heavy.status_code == 200 and len(heavy.content) >= TRIM_AFTER_BYTES
        deadline = time.monotonic() + 5
        while running.server.trims == 0 and time.monotonic() < deadline:  # it runs after the answer is out
            time.sleep(0.05)
        assert running.server.trims == 1
