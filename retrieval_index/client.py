"""A Retriever that asks a Search-R1-compatible ``/retrieve`` server (``treegym index serve``).

Only what can succeed on a second try is retried: a failed connection, and HTTP 429, 502, 503
and 504. Waits back off exponentially with full jitter (so many clients do not retry in
lock-step), honour ``Retry-After``, and all retries of one search stop after ``max_retry_s``.
A timeout once connected, a 500 or a 4xx fails at once with the server's message: repeating
it would only add load. The error names the URL and what went wrong, so a dead server is
obvious.

Answers in both of Search-R1's shapes are read: ``{"document": {...}, "score": s}`` items or
bare documents, with or without an ``"id"`` (Search-R1's BM25 path sends ``title``, ``text``
and ``contents`` only: the id is then derived from the contents, stably). Hits scored below
-1e30 are FAISS's padding when topk exceeds the corpus, and are dropped.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import requests

from treegym.errors import ConfigError, TreegymError
from treegym.retrieval_index.corpus import split_contents
from treegym.retrieval_index.retrievers import check_k
from treegym.retrieval_index.types import Hit, clean_text

RETRY_STATUS = frozenset({429, 502, 503, 504})
PADDING_SCORE = -1e30  # FAISS pads a short result list with -3.4e38 (-FLT_MAX)


class RemoteRetriever:
    """Batched search over HTTP. One session (connection pool) per thread; safe to share."""

    kind = "remote"

    def __init__(
        self,
        url: str,
        timeout: tuple[float, float] = (3, 30),
        retries: int = 3,
        backoff: float = 0.25,
        max_batch: int = 256,
        max_retry_s: float = 30.0,
    ) -> None:
        parts = urlsplit(str(url))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"a retriever URL is http(s)://HOST[:PORT][/retrieve] (a `treegym index serve` "
                              f"server), got {str(url)[:80]!r}")
        self.url = url.rstrip("/")
        self.endpoint = self.url if self.url.endswith("/retrieve") else f"{self.url}/retrieve"
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_batch = max_batch  # stay under the server's per-request query limit
        self.max_retry_s = max_retry_s  # all the waiting one search may do before it gives up
        self._local = threading.local()

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        return session

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        k = check_k(k)
        results: list[list[Hit]] = []
        for start in range(0, len(queries), self.max_batch):
            results.extend(self._post(list(queries[start : start + self.max_batch]), k))
        return results

    def _post(self, queries: list[str], k: int) -> list[list[Hit]]:
        payload = {"queries": queries, "topk": k, "return_scores": True}
        deadline = time.monotonic() + self.max_retry_s
        last_error, attempts = "", 0
        for attempt in range(self.retries + 1):
            attempts = attempt + 1
            try:
                response = self._session().post(self.endpoint, json=payload, timeout=self.timeout)
            except requests.ConnectionError as exc:
                last_error, wait = f"{type(exc).__name__}: {exc}", None
            except requests.RequestException as exc:  # e.g. a read timeout: the server is slow, not gone
                raise TreegymError(f"retrieval server {self.url} failed: {type(exc).__name__}: {exc}") from None
            else:
                if response.status_code == 200:
                    return _parse_results(response, self.url, len(queries))
                message = f"HTTP {response.status_code}: {_error_message(response)}"
                if response.status_code not in RETRY_STATUS:
                    verb = "refused the request" if response.status_code < 500 else "failed"
                    raise TreegymError(f"retrieval server {self.url} {verb}: {message}")
                last_error, wait = message, _retry_after(response)
            if attempt == self.retries:
                break
            if wait is None:
                wait = random.uniform(0, self.backoff * 2**attempt)  # full jitter
            if time.monotonic() + wait > deadline:
                last_error += f"; stopped retrying after max_retry_s={self.max_retry_s:g}"
                break
            time.sleep(wait)
        raise TreegymError(
            f"retrieval server {self.url} did not answer after {attempts} attempt{'s' if attempts > 1 else ''} "
            f"(last error: {last_error}); is `treegym index serve` running there?"
        )

    def __deepcopy__(self, memo: dict) -> RemoteRetriever:
        return self  # forks share the client and its connection pools

    def __reduce__(self) -> tuple:
        return (RemoteRetriever, (self.url, self.timeout, self.retries, self.backoff, self.max_batch, self.max_retry_s))


def _retry_after(response: requests.Response) -> float | None:
    """Seconds from a ``Retry-After: N`` header (the HTTP-date form is rare here: ignored)."""
    value = response.headers.get("Retry-After", "").strip()
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if 0 <= seconds < 3600 else None


def _error_message(response: requests.Response) -> str:
    try:
        body = response.json()
    except (ValueError, RecursionError):
        return response.text[:200]
    if isinstance(body, dict) and "error" in body:
        return str(body["error"])[:500]
    return response.text[:200]


def _parse_results(response: requests.Response, url: str, expected: int) -> list[list[Hit]]:
    try:
        result: Any = response.json()["result"]
        if not isinstance(result, list) or len(result) != expected:
            raise ValueError(f"want {expected} result lists")
        return [[hit for hit in map(_to_hit, hits) if hit.score > PADDING_SCORE] for hits in result]
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise TreegymError(f"retrieval server {url} sent a malformed answer ({type(exc).__name__}: {exc}): "
                           f"{response.text[:200]}") from None


def _to_hit(item: dict[str, Any]) -> Hit:
    document, score = (item["document"], item.get("score", 0.0)) if "document" in item else (item, 0.0)
    contents = document.get("contents")
    if contents is None and "text" in document:
        contents = f'"{document.get("title", "")}"\n{document["text"]}'
    if not isinstance(contents, str):
        raise ValueError("a document without text 'contents'")
    contents = clean_text(contents)  # a remote server's lone surrogates must not reach a tokenizer
    title, text = split_contents(contents)
    doc_id = document.get("id")
    if doc_id is None:
        doc_id = "sha1:" + hashlib.sha1(contents.encode("utf-8")).hexdigest()[:16]
    return Hit(doc_id=clean_text(str(doc_id)), title=title, text=text, score=float(score))
