"""A Retriever that asks a Search-R1-compatible ``/retrieve`` server (``treegym index serve``).

Connection errors, timeouts and 5xx answers are retried with exponential backoff; a 4xx is the
caller's mistake and fails at once with the server's message. After the last retry the error
names the URL and what went wrong, so a dead server is obvious.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import requests

from treegym.errors import TreegymError
from treegym.retrieval_index.corpus import split_contents
from treegym.retrieval_index.retrievers import check_k
from treegym.retrieval_index.types import Hit


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
    ) -> None:
        self.url = url.rstrip("/")
        self.endpoint = self.url if self.url.endswith("/retrieve") else f"{self.url}/retrieve"
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_batch = max_batch  # stay under the server's per-request query limit
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
        last_error = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                response = self._session().post(self.endpoint, json=payload, timeout=self.timeout)
            except requests.RequestException as exc:
                last_error = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code >= 500:
                last_error = f"HTTP {response.status_code}: {_error_message(response)}"
                continue
            if response.status_code != 200:
                raise TreegymError(f"retrieval server {self.url} refused the request: HTTP {response.status_code}: {_error_message(response)}")
            return _parse_results(response, self.url, len(queries))
        raise TreegymError(
            f"retrieval server {self.url} did not answer after {self.retries + 1} attempts "
            f"(last error: {last_error}); is `treegym index serve` running there?"
        )

    def __deepcopy__(self, memo: dict) -> RemoteRetriever:
        return self  # forks share the client and its connection pools

    def __reduce__(self) -> tuple:
        return (RemoteRetriever, (self.url, self.timeout, self.retries, self.backoff, self.max_batch))


def _error_message(response: requests.Response) -> str:
    try:
        return str(response.json().get("error", response.text[:200]))
    except ValueError:
        return response.text[:200]


def _parse_results(response: requests.Response, url: str, expected: int) -> list[list[Hit]]:
    try:
        result: Any = response.json()["result"]
        if not isinstance(result, list) or len(result) != expected:
            raise ValueError(f"want {expected} result lists")
        return [[_to_hit(item) for item in hits] for hits in result]
    except (ValueError, KeyError, TypeError) as exc:
        raise TreegymError(f"retrieval server {url} sent a malformed answer ({exc}): {response.text[:200]}") from exc


def _to_hit(item: dict[str, Any]) -> Hit:
    document, score = (item["document"], item.get("score", 0.0)) if "document" in item else (item, 0.0)
    title, text = split_contents(document["contents"])
    return Hit(doc_id=str(document["id"]), title=title, text=text, score=float(score))
