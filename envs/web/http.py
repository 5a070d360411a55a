"""An HTTP fetcher that survives a real network.

One ``Fetcher`` (a ``requests.Session`` plus policy) is shared by every env and fork of a
process. Per request it enforces:

- a connect timeout and a total deadline on the status line, headers and body
  (``requests``' own read timeout is per socket read, so a server that drips one byte a
  second would never trip it; see ``deadline.py``);
- retries with exponential backoff and jitter on connection errors, broken bodies, 429 and
  5xx, honouring ``Retry-After`` up to a limit;
- a cap on concurrent requests per host, so a pool of 64 envs cannot flood one site;
- a cap on response size, read by streaming (a page is cut, an API answer is refused);
- checks on content type and character encoding.

Every failure is a ``FetchError`` whose ``reason`` is short enough to show an agent
("timed out after 10 s").
"""

from __future__ import annotations

import codecs
import email.utils
import http.client
import random
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit

import requests
import urllib3

from treegym.envs.web.deadline import Deadline, DeadlineAdapter
from treegym.envs.web.pinning import PinTarget, pinned
from treegym.errors import TreegymError

RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
MAX_REDIRECTS = 10
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_\-:.]+)""", re.IGNORECASE)
# Vets a URL (AddressGuard.check): returns where it may connect, or raises a FetchError.
CheckUrl = Callable[[str], PinTarget]
TEXT_TYPES = ("text/html", "application/xhtml+xml", "text/plain", "text/markdown", "application/xml", "text/xml")


class FetchError(TreegymError):
    """A request that failed for good (after any retries). ``reason`` is agent-readable."""

    def __init__(self, url: str, reason: str, *, status: int | None = None, retryable: bool = False,
                 retry_after: float | None = None) -> None:
        super().__init__(f"{url}: {reason}")
        self.url = url
        self.reason = reason
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after  # seconds the server asked us to wait (429/503)


@dataclass(frozen=True)
class HttpConfig:
    """Network policy. Defaults suit a public site; tests shrink the timeouts and backoff."""

    connect_timeout_s: float = 5.0
    read_timeout_s: float = 10.0  # total time for status line, headers and body, not per socket read
    retries: int = 3  # extra attempts after the first
    backoff_base_s: float = 0.5  # attempt i waits base * 2**i, times a jitter in [0.5, 1]
    backoff_max_s: float = 8.0
    max_retry_after_s: float = 30.0  # a longer Retry-After fails now instead of stalling a batch
    per_host: int = 16  # concurrent requests per host
    max_bytes: int = 2_000_000
    user_agent: str = "treegym/0.1 (+https://github.com/treegym; research agent)"
    chunk_bytes: int = 65536


@dataclass(frozen=True)
class Response:
    """A fetched body, decoded. ``truncated`` says the size cap cut it."""

    url: str
    status: int
    content_type: str
    text: str
    truncated: bool = False
    attempts: int = 1
    headers: Mapping[str, str] = field(default_factory=dict, compare=False)


def _fmt_s(seconds: float) -> str:
    return f"{seconds:g} s"


def _fmt_bytes(n: int) -> str:
    return f"{n / 1e6:g} MB" if n >= 1_000_000 else f"{n / 1e3:g} kB"


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def backoff_delay(attempt: int, config: HttpConfig, rng: random.Random) -> float:
    """Exponential backoff with jitter: base * 2**attempt, capped, scaled by U(0.5, 1)."""
    return min(config.backoff_max_s, config.backoff_base_s * (2**attempt)) * rng.uniform(0.5, 1.0)


def decode_body(body: bytes, content_type: str) -> str:
    """Decode with the header's charset, else a <meta charset>, else UTF-8 (bad bytes replaced)."""
    charset = None
    m = re.search(r"charset\s*=\s*\"?([^\s;\"]+)", content_type, re.IGNORECASE)
    if m:
        charset = m.group(1)
    elif "html" in content_type or not content_type:
        meta = _META_CHARSET.search(body[:4096])
        if meta:
            charset = meta.group(1).decode("ascii", "replace")
    try:
        codec = codecs.lookup(charset).name if charset else "utf-8"
    except LookupError:
        codec = "utf-8"  # an unknown charset name: UTF-8 is the best guess on today's web
    return body.decode(codec, errors="replace")


class Fetcher:
    """A shared, thread-safe HTTP client with the policy of ``HttpConfig``.

    Args:
        config: timeouts, retries, caps.
        sleep: how to wait between retries (tests pass a recorder).
        seed: seeds the jitter, for reproducible backoff in tests.
    """

    def __init__(self, config: HttpConfig | None = None, *, sleep: Callable[[float], None] = time.sleep, seed: int | None = None) -> None:
        self.config = config or HttpConfig()
        self.sleep = sleep
        self.session = requests.Session()
        # One pooled connection per allowed concurrent request, so no request opens and
        # drops a spare connection (urllib3 warns "pool is full" otherwise).
        adapter = DeadlineAdapter(pool_connections=32, pool_maxsize=max(1, self.config.per_host), max_retries=0)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        self.session.headers["User-Agent"] = self.config.user_agent
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self._hosts: dict[str, threading.BoundedSemaphore] = {}
        self._hosts_lock = threading.Lock()
        self.requests_sent = 0  # attempts that reached the wire, for stats and benchmarks

    def _host_slot(self, url: str) -> threading.BoundedSemaphore:
        host = urlsplit(url).netloc.lower()
        with self._hosts_lock:
            sem = self._hosts.get(host)
            if sem is None:
                sem = self._hosts[host] = threading.BoundedSemaphore(max(1, self.config.per_host))
            return sem

    def get(self, url: str, *, params: Mapping[str, Any] | None = None, headers: Mapping[str, str] | None = None,
            expect: str = "text", oversize: str = "truncate", check_url: CheckUrl | None = None) -> Response:
        """GET ``url``. ``expect`` is "text" (a page) or "json"; ``oversize`` is "truncate" or "error".
        ``check_url`` (e.g. ``AddressGuard.check``) vets the URL and every redirect target."""
        return self.request("GET", url, params=params, headers=headers, expect=expect, oversize=oversize,
                            check_url=check_url)

    def post_json(self, url: str, body: Any, *, headers: Mapping[str, str] | None = None) -> Response:
        """POST a JSON body and expect a JSON answer (refused, not cut, when over the size cap)."""
        return self.request("POST", url, json_body=body, headers=headers, expect="json", oversize="error")

    def request(self, method: str, url: str, *, params: Mapping[str, Any] | None = None, json_body: Any = None,
                headers: Mapping[str, str] | None = None, expect: str = "text", oversize: str = "truncate",
                check_url: CheckUrl | None = None) -> Response:
        """One logical request: attempts with backoff until success or a final ``FetchError``."""
        scheme = urlsplit(url).scheme
        if scheme not in ("http", "https"):
            raise FetchError(url, f"not an http(s) URL (scheme {scheme or 'missing'!r})")
        cfg = self.config
        last: FetchError | None = None
        for attempt in range(cfg.retries + 1):
            try:
                with self._host_slot(url):
                    resp = self._attempt(method, url, params, json_body, headers, expect, oversize, check_url)
                return Response(resp.url, resp.status, resp.content_type, resp.text, resp.truncated, attempt + 1, resp.headers)
            except FetchError as err:
                last = err
                if not err.retryable or attempt == cfg.retries:
                    break
                with self._rng_lock:
                    wait = backoff_delay(attempt, cfg, self._rng)
                hinted = err.retry_after
                if hinted is not None:
                    if hinted > cfg.max_retry_after_s:
                        raise FetchError(url, f"{err.reason}; Retry-After {_fmt_s(round(hinted, 1))} is over the "
                                         f"{_fmt_s(cfg.max_retry_after_s)} limit", status=err.status) from None
                    wait = max(wait, hinted)
                self.sleep(wait)
        assert last is not None
        if last.retryable and cfg.retries:
            raise FetchError(url, f"{last.reason} (gave up after {cfg.retries + 1} attempts)", status=last.status)
        raise last

    def _attempt(self, method: str, url: str, params: Mapping[str, Any] | None, json_body: Any,
                 headers: Mapping[str, str] | None, expect: str, oversize: str,
                 check_url: CheckUrl | None = None) -> Response:
        cfg = self.config
        with self._hosts_lock:
            self.requests_sent += 1
        # One deadline for the status line, headers and body together: requests' read timeout
        # is per socket read. A connect may take its own connect_timeout_s.
        with Deadline(cfg.read_timeout_s) as deadline:
            try:
                return self._exchange(method, url, params, json_body, headers, expect, oversize, check_url, deadline)
            except Exception:
                if deadline.expired:  # whatever broke once the socket was shut down
                    raise self._timed_out(url) from None
                raise

    def _timed_out(self, url: str) -> FetchError:
        # A slow server: retrying would multiply the wait, so this fails at once.
        return FetchError(url, f"timed out after {_fmt_s(self.config.read_timeout_s)}")

    def _exchange(self, method: str, url: str, params: Mapping[str, Any] | None, json_body: Any,
                  headers: Mapping[str, str] | None, expect: str, oversize: str,
                  check_url: CheckUrl | None, deadline: Deadline) -> Response:
        cfg = self.config
        host = urlsplit(url).netloc
        try:
            r = self._open(method, url, params, json_body, headers, check_url)
        except requests.exceptions.ConnectTimeout:
            raise FetchError(url, f"could not connect to {host} within {_fmt_s(cfg.connect_timeout_s)}", retryable=True) from None
        except requests.exceptions.ReadTimeout:
            raise self._timed_out(url) from None
        except requests.exceptions.ConnectionError as exc:
            if deadline.expired:
                raise self._timed_out(url) from None
            if (bad := _malformed_answer(exc)) is not None:  # it would say the same again
                raise FetchError(url, f"malformed answer from {host} ({bad})") from None
            raise FetchError(url, f"cannot connect to {host} ({_short(exc)})", retryable=True) from None
        except requests.exceptions.RequestException as exc:
            raise FetchError(url, f"bad request ({_short(exc)})") from None
        try:
            status = r.status_code
            ctype = r.headers.get("Content-Type", "").lower()
            if status in RETRY_STATUS or 500 <= status < 600:
                raise FetchError(url, f"HTTP {status}" + (" (rate limited)" if status == 429 else " (server error)"),
                                 status=status, retryable=status in RETRY_STATUS,
                                 retry_after=parse_retry_after(r.headers.get("Retry-After")))
            if status >= 400:
                raise FetchError(url, f"HTTP {status}" + (f": {_snippet(r)}" if "json" in ctype or "text" in ctype else ""), status=status)
            _check_type(url, ctype, expect)
            body, truncated = self._read_body(r, url, oversize, deadline)
            if deadline.expired:  # a body read to the end of a connection that the deadline shut
                raise self._timed_out(url)
        finally:
            deadline.stop()  # before the connection can go back to the pool
            r.close()
        if expect == "text" and b"\x00" in body[:2048]:
            raise FetchError(url, f"binary content (declared {ctype or 'no content type'}), not a text page", status=status)
        return Response(r.url, status, ctype, decode_body(body, ctype), truncated, headers=dict(r.headers))

    def _open(self, method: str, url: str, params: Mapping[str, Any] | None, json_body: Any,
              headers: Mapping[str, str] | None, check_url: CheckUrl | None) -> requests.Response:
        """Send the request; with ``check_url``, send exactly the URL it checked, connect only to
        the addresses it checked, and follow redirects here so that each hop is checked too."""
        cfg = self.config
        common: dict[str, Any] = {"headers": dict(headers or {}), "stream": True,
                                  "timeout": (cfg.connect_timeout_s, cfg.read_timeout_s)}  # fmt: skip
        if check_url is None:
            return self.session.request(method, url, params=params, json=json_body, allow_redirects=True, **common)
        target = check_url(url)
        with pinned(target):
            r = self.session.request(method, target.url, params=params, json=json_body, allow_redirects=False, **common)
        for _ in range(MAX_REDIRECTS):
            if not r.is_redirect:
                return r
            hop = urljoin(r.url, r.headers["Location"])
            r.close()
            target = check_url(hop)
            with pinned(target):
                r = self.session.request("GET", target.url, allow_redirects=False, **common)
        r.close()
        raise FetchError(url, f"more than {MAX_REDIRECTS} redirects")

    def _read_body(self, r: requests.Response, url: str, oversize: str, deadline: Deadline) -> tuple[bytes, bool]:
        cfg = self.config
        declared = r.headers.get("Content-Length")
        if oversize == "error" and declared and declared.isdigit() and int(declared) > cfg.max_bytes:
            raise FetchError(url, f"response of {_fmt_bytes(int(declared))} is over the {_fmt_bytes(cfg.max_bytes)} cap")
        chunks: list[bytes] = []
        size = 0
        try:
            for chunk in r.iter_content(cfg.chunk_bytes):
                chunks.append(chunk)
                size += len(chunk)
                if size > cfg.max_bytes:
                    if oversize == "error":
                        raise FetchError(url, f"response is over the {_fmt_bytes(cfg.max_bytes)} cap")
                    return b"".join(chunks)[: cfg.max_bytes], True
        except (requests.exceptions.ChunkedEncodingError, requests.exceptions.ConnectionError) as exc:
            if deadline.expired or _is_read_timeout(exc):
                raise self._timed_out(url) from None
            raise FetchError(url, f"connection broke mid-response after {size} bytes ({_short(exc)})", retryable=True) from None
        except requests.exceptions.ReadTimeout:
            raise self._timed_out(url) from None
        return b"".join(chunks), False

    def close(self) -> None:
        self.session.close()


def _check_type(url: str, ctype: str, expect: str) -> None:
    if not ctype:
        return  # undeclared: judge by the bytes (JSON parse, binary sniff)
    if expect == "json":
        if "json" not in ctype and not ctype.startswith("text/plain"):
            raise FetchError(url, f"expected JSON, got {ctype.split(';')[0]} (is the endpoint URL right?)")
    elif not ctype.startswith(TEXT_TYPES) and not ctype.startswith("text/"):
        raise FetchError(url, f"not a text page ({ctype.split(';')[0]})")


def _snippet(r: requests.Response) -> str:
    try:
        return " ".join(next(r.iter_content(300), b"").decode("utf-8", "replace").split())[:200]
    except requests.exceptions.RequestException:
        return ""


def _is_read_timeout(exc: BaseException) -> bool:
    # requests reports a per-read timeout in the body as a ConnectionError around urllib3's.
    return bool(exc.args) and isinstance(exc.args[0], urllib3.exceptions.ReadTimeoutError)


def _malformed_answer(exc: BaseException) -> str | None:
    """What was wrong with a status line or headers the server did send (over 100 headers, a
    line over 64 kB, not HTTP), or None. A server that hung up (``RemoteDisconnected``, which is
    also a ``ConnectionError``) is not malformed: a retry may reach a live connection."""
    cause = exc.args[0] if exc.args else None
    inner = cause.args[1] if isinstance(cause, urllib3.exceptions.ProtocolError) and len(cause.args) > 1 else None
    if isinstance(inner, http.client.HTTPException) and not isinstance(inner, ConnectionError):
        return str(inner)[:120] or type(inner).__name__
    return None


def _short(exc: BaseException) -> str:
    text = str(exc)
    for needle, short in (("Connection refused", "connection refused"), ("Name or service not known", "unknown host"),
                          ("IncompleteRead", "body ended early"), ("Connection reset", "connection reset"),
                          ("RemoteDisconnected", "server closed the connection"), ("timed out", "timed out")):
        if needle in text:
            return short
    return text[:120]
