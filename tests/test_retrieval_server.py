"""The Search-R1-compatible HTTP server on 127.0.0.1 and its client, over a real index."""

from __future__ import annotations

import http.client
import json
import socket
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


def test_client_retries_a_5xx_and_then_succeeds():
    bm25 = open_retriever(index="bm25", limit=LIMIT, progress=False)
    flaky = FlakyRetriever(bm25)
    with serve_in_background(flaky) as running:
        hits = RemoteRetriever(running.url, backoff=0.01).search(["telephone inventor"], 2)
    assert flaky.calls == 2 and hits == bm25.search(["telephone inventor"], 2)


def test_client_reports_a_4xx_at_once_with_the_servers_message(server):
    with pytest.raises(TreegymError, match="topk"):
        RemoteRetriever(server.url).search(["x"], 10_000)


def test_open_retriever_with_a_url_returns_the_remote_client(server):
    remote = open_retriever(url=server.url)
    assert isinstance(remote, RemoteRetriever) and remote.search(["acne"], 1)[0][0].title == "Acne"
