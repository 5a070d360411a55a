"""The ``search`` and ``browse`` tools of WebSearchQA-v0.

Each tool serves a whole batch at once: duplicates in the batch are asked once, the cache
answers what it can, and the rest go out concurrently on a shared thread pool (bounded per
host by the ``Fetcher``). A failed call becomes a ``ToolError`` in its slot; the other calls
of the batch are unaffected.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from treegym.envs.core import ToolError
from treegym.envs.web.backends import SearchBackend, SearchResult
from treegym.envs.web.cache import ResponseCache, request_key
from treegym.envs.web.guard import AddressGuard, Target
from treegym.envs.web.http import Fetcher, FetchError, HttpConfig
from treegym.envs.web.pages import Link, html_to_text, plain_text


@dataclass(frozen=True)
class FetchedPage:
    """A browsed page as readable text (the whole of it; the env pages it)."""

    url: str
    title: str
    text: str
    links: tuple[Link, ...] = ()
    truncated: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "title": self.title, "text": self.text, "truncated": self.truncated,
                "links": [[link.text, link.url] for link in self.links]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FetchedPage:
        return cls(d["url"], d["title"], d["text"], tuple(Link(t, u) for t, u in d.get("links", [])), bool(d.get("truncated")))


_EXECUTOR: ThreadPoolExecutor | None = None
_EXECUTOR_LOCK = threading.Lock()
MAX_WORKERS = 64


def executor() -> ThreadPoolExecutor:
    """The process-wide pool that runs tool requests (threads wait on the network, not the CPU)."""
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = ThreadPoolExecutor(max_workers=MAX_WORKERS, thread_name_prefix="treegym-web")
        return _EXECUTOR


_FETCHERS: dict[HttpConfig, Fetcher] = {}


def shared_fetcher(config: HttpConfig) -> Fetcher:
    """One Fetcher (session, per-host caps) per configuration per process."""
    with _EXECUTOR_LOCK:
        if config not in _FETCHERS:
            _FETCHERS[config] = Fetcher(config)
        return _FETCHERS[config]


def _error_message(prefix: str, exc: BaseException) -> str:
    if isinstance(exc, FetchError):
        return f"{prefix} failed: {exc.reason}"
    return f"{prefix} failed: {type(exc).__name__}: {exc}"


def _run_batch(payloads: Sequence[str], one: Callable[[str], Any], prefix: str) -> list[Any]:
    """Run ``one`` for each distinct payload concurrently; failures become ToolErrors."""
    unique = list(dict.fromkeys(payloads))

    def guarded(p: str) -> Any:
        try:
            return one(p)
        except Exception as exc:  # one failure is a result, never an exception for the batch
            return ToolError(_error_message(prefix, exc))

    if len(unique) == 1:
        done = {unique[0]: guarded(unique[0])}
    else:
        done = dict(zip(unique, executor().map(guarded, unique)))
    return [done[p] for p in payloads]


class WebSearchTool:
    """``search``: query -> tuple of SearchResult (or ToolError)."""

    def __init__(self, backend: SearchBackend, fetcher: Fetcher, cache: ResponseCache | None, k: int) -> None:
        self.backend, self.fetcher, self.cache, self.k = backend, fetcher, cache, k

    def _search(self, query: str) -> tuple[SearchResult, ...]:
        def compute() -> list[dict[str, str]]:
            return [r.to_json() for r in self.backend.search(self.fetcher, query, self.k)]

        if self.cache is None:
            raw = compute()
        else:
            raw, _ = self.cache.get_or_compute(self.backend.name, {"q": query, "k": self.k}, compute)
        return tuple(SearchResult.from_json(r) for r in raw)

    def call_batch(self, payloads: Sequence[Any]) -> list[Any]:
        queries = [str(p) for p in payloads]
        search_many = getattr(self.backend, "search_many", None)
        if search_many is not None and len(set(queries)) > 1:
            return self._batched(queries, search_many)
        return _run_batch(queries, self._search, "Search")

    def _batched(self, queries: list[str], search_many: Callable[..., list[list[SearchResult]]]) -> list[Any]:
        # A backend that takes many queries per request (Search-R1 /retrieve) gets one request
        # for every query the cache cannot answer.
        found: dict[str, Any] = {}
        missing = []
        for q in dict.fromkeys(queries):
            hit = self.cache.get(request_key(self.backend.name, {"q": q, "k": self.k})) if self.cache else None
            if hit is None:
                missing.append(q)
            else:
                found[q] = tuple(SearchResult.from_json(r) for r in hit)
        if self.cache is not None:
            self.cache.count(hits=len(found), misses=len(missing))
        if missing:
            try:
                rows = search_many(self.fetcher, missing, self.k)
                for q, row in zip(missing, rows):
                    found[q] = tuple(row)
                    if self.cache is not None:
                        self.cache.put(request_key(self.backend.name, {"q": q, "k": self.k}), self.backend.name,
                                       [r.to_json() for r in row])
            except Exception as exc:
                for q in missing:
                    found[q] = ToolError(_error_message("Search", exc))
        return [found[q] for q in queries]


class BrowseTool:
    """``browse``: URL -> FetchedPage (or ToolError). Pages are cached whole; paging is local."""

    def __init__(self, fetcher: Fetcher, cache: ResponseCache | None, guard: AddressGuard | None = None) -> None:
        self.fetcher, self.cache, self.guard = fetcher, cache, guard

    def _browse(self, url: str) -> FetchedPage:
        check = None
        if self.guard is not None:
            guard = self.guard
            first = guard.check(url)  # before the cache too: it is shared with envs that may browse more

            def check(hop: str) -> Target:  # the URL as first resolved and checked; a redirect hop anew
                return first if hop == url else guard.check(hop)

        def compute() -> dict[str, Any]:
            resp = self.fetcher.get(url, expect="text", oversize="truncate", check_url=check)
            if "html" in resp.content_type or "xml" in resp.content_type or (
                not resp.content_type and "<html" in resp.text[:2000].lower()):
                page = html_to_text(resp.text, resp.url)
            else:
                page = plain_text(resp.text)
            return FetchedPage(resp.url, page.title, page.text, page.links, resp.truncated).to_json()

        raw = compute() if self.cache is None else self.cache.get_or_compute("browse", {"url": url}, compute)[0]
        page = FetchedPage.from_json(raw)
        if check is not None and page.url != url:
            check(page.url)  # a cached page that a redirect took elsewhere
        return page

    def call_batch(self, payloads: Sequence[Any]) -> list[Any]:
        return _run_batch([str(p) for p in payloads], self._browse, "Browse")
