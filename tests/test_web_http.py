"""The HTTP fetcher against a real loopback server that injects faults."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
from web_servers import DripServer, FaultServer

from treegym.envs.core import ToolError
from treegym.envs.web.http import Fetcher, FetchError, HttpConfig, parse_retry_after
from treegym.envs.web.tools import BrowseTool

FAST = HttpConfig(connect_timeout_s=1.0, read_timeout_s=0.3, retries=2, backoff_base_s=0.01, backoff_max_s=0.05,
                  max_retry_after_s=5.0, per_host=4, max_bytes=200_000)
# A deadline is a time bound, so these tests time the failed call, with a generous margin.
ONE_SECOND = replace(FAST, read_timeout_s=1.0)
MARGIN_S = 1.0
DRIPS = ("/status", "/headers", "/length", "/chunked", "/stall")


@pytest.fixture(scope="module")
def server():
    srv = FaultServer()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def drip():
    srv = DripServer(gap=0.1)  # a piece every 0.1 s: no socket read ever waits long
    yield srv
    srv.stop()


class SleepLog:
    """Records the waits the fetcher asks for, without waiting."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def fetcher(config: HttpConfig = FAST) -> tuple[Fetcher, SleepLog]:
    log = SleepLog()
    return Fetcher(config, sleep=log, seed=0), log


def test_slow_response_past_the_read_timeout_fails_with_timed_out(server):
    f, log = fetcher()
    with pytest.raises(FetchError, match=r"timed out after 0.3 s"):
        f.get(f"{server.url}/slow?s=1.5&key=a")
    assert log.waits == []  # a slow server is not retried: that would multiply the wait


def test_a_body_dripping_in_slower_than_the_deadline_times_out(server):
    f, _ = fetcher()
    with pytest.raises(FetchError, match=r"timed out after 0.3 s"):
        f.get(f"{server.url}/drip?n=10&gap=0.1&key=drip")


@pytest.mark.parametrize("path", DRIPS)
def test_a_server_that_drips_or_stalls_any_part_of_its_answer_fails_the_call_at_the_deadline(drip, path):
    # The status line, header lines, a Content-Length body, one-byte chunks, or nothing after
    # the headers: each piece comes in time, the answer never does.
    f, log = fetcher(ONE_SECOND)
    before = drip.connections
    start = time.monotonic()
    with pytest.raises(FetchError, match=r"timed out after 1 s$"):
        f.get(f"{drip.url}{path}")
    assert time.monotonic() - start < ONE_SECOND.read_timeout_s + MARGIN_S
    assert log.waits == [] and drip.connections == before + 1  # not retried


def test_a_browse_batch_against_dripping_servers_returns_tool_errors_at_the_deadline(drip):
    # One host slot per call: calls over the per-host cap queue, each then with its own deadline.
    tool = BrowseTool(Fetcher(replace(FAST, read_timeout_s=1.5, per_host=len(DRIPS))), cache=None)
    start = time.monotonic()
    out = tool.call_batch([f"{drip.url}{path}" for path in DRIPS])
    assert time.monotonic() - start < 1.5 + MARGIN_S  # the batch's calls run side by side
    assert out == [ToolError("Browse failed: timed out after 1.5 s")] * len(DRIPS)


def test_a_server_that_sends_over_100_headers_is_refused_at_once_not_retried():
    srv = DripServer(gap=0.001)
    try:
        f, log = fetcher(replace(FAST, read_timeout_s=5.0))
        with pytest.raises(FetchError, match=r"malformed answer from .*\(got more than 100 headers\)"):
            f.get(f"{srv.url}/headers")
        assert log.waits == [] and srv.connections == 1
    finally:
        srv.stop()


def test_a_kept_alive_connection_outlives_the_deadline_of_the_request_that_opened_it(server):
    f, _ = fetcher()
    assert "all good" in f.get(f"{server.url}/flaky?fail=0&key=alive1").text
    time.sleep(FAST.read_timeout_s + 0.2)  # the first request's deadline passes while its connection idles
    assert "all good" in f.get(f"{server.url}/flaky?fail=0&key=alive2").text


def test_server_errors_are_retried_with_growing_backoff_until_success(server):
    f, log = fetcher()
    resp = f.get(f"{server.url}/flaky?fail=2&status=500&key=b")
    assert resp.status == 200 and "all good" in resp.text and resp.attempts == 3
    assert len(log.waits) == 2 and all(0 < w <= FAST.backoff_max_s for w in log.waits)


def test_persistent_500_gives_up_and_says_so(server):
    f, _ = fetcher()
    with pytest.raises(FetchError, match=r"HTTP 500 \(server error\) \(gave up after 3 attempts\)"):
        f.get(f"{server.url}/flaky?fail=99&status=500&key=c")
    assert server.hits["/flaky:c"] == 3


def test_client_errors_are_not_retried(server):
    f, log = fetcher()
    with pytest.raises(FetchError, match="HTTP 404"):
        f.get(f"{server.url}/flaky?fail=99&status=404&key=d")
    assert log.waits == [] and server.hits["/flaky:d"] == 1


def test_429_waits_as_long_as_retry_after_says(server):
    f, log = fetcher()
    resp = f.get(f"{server.url}/ratelimit?after=2&key=e")
    assert resp.status == 200 and log.waits == [2.0]


def test_retry_after_over_the_limit_fails_at_once_instead_of_stalling(server):
    f, log = fetcher()
    with pytest.raises(FetchError, match=r"rate limited.*Retry-After 120 s is over the 5 s limit"):
        f.get(f"{server.url}/ratelimit?after=120&key=f")
    assert log.waits == []


def test_retry_after_accepts_an_http_date():
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == pytest.approx(10.0)
    assert parse_retry_after("soon") is None and parse_retry_after("3") == 3.0


def test_truncated_body_is_retried_then_reported(server):
    f, _ = fetcher()
    assert "all good" in f.get(f"{server.url}/truncated-once?key=g").text
    with pytest.raises(FetchError, match=r"connection broke mid-response .*gave up after 3 attempts"):
        f.get(f"{server.url}/truncated?key=h")


def test_ten_megabyte_page_is_cut_at_the_size_cap(server):
    f, _ = fetcher()
    resp = f.get(f"{server.url}/huge?mb=10&key=i")
    assert resp.truncated and len(resp.text.encode()) <= FAST.max_bytes and "lorem ipsum" in resp.text


def test_oversized_api_answer_is_refused_not_cut(server):
    f, _ = fetcher()
    with pytest.raises(FetchError, match=r"10 MB is over the 200 kB cap"):
        f.get(f"{server.url}/huge?mb=10&type=application/json&key=j", expect="json", oversize="error")


def test_non_text_content_is_refused_by_type_and_by_sniffing(server):
    f, _ = fetcher()
    with pytest.raises(FetchError, match=r"not a text page \(application/pdf\)"):
        f.get(f"{server.url}/pdf")
    with pytest.raises(FetchError, match="binary content"):
        f.get(f"{server.url}/binary")
    with pytest.raises(FetchError, match="expected JSON, got text/html"):
        f.get(f"{server.url}/flaky?fail=0&key=k", expect="json")


def test_bodies_are_decoded_with_the_declared_or_meta_charset(server):
    f, _ = fetcher()
    assert "Café crème à Orléans" in f.get(f"{server.url}/latin1").text
    assert "naïve “quotes”" in f.get(f"{server.url}/meta-charset").text


def test_concurrent_requests_to_one_host_are_capped(server):
    f, _ = fetcher()
    with ThreadPoolExecutor(12) as pool:
        list(pool.map(lambda i: f.get(f"{server.url}/busy?s=0.05&key={i}"), range(12)))
    assert 1 < server.max_inflight <= FAST.per_host


def test_refused_connection_is_retried_then_reported():
    f, log = fetcher()
    with pytest.raises(FetchError, match=r"cannot connect to 127.0.0.1:9 \(connection refused\)"):
        f.get("http://127.0.0.1:9/")
    assert len(log.waits) == FAST.retries


def test_non_http_urls_are_refused_without_a_request():
    f, _ = fetcher()
    with pytest.raises(FetchError, match="not an http"):
        f.get("file:///etc/passwd")
    assert f.requests_sent == 0
