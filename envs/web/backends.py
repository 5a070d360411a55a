"""Search backends: one small class per protocol, all behind ``SearchBackend.search``.

- ``RetrieveBackend``: a Search-R1 ``POST /retrieve`` server (ours, or Search-R1's own).
- ``SearxngBackend``: SearxNG's JSON API (``GET /search?format=json``); the local web speaks it too.
- ``BraveBackend`` and ``SerperBackend``: keyed commercial APIs, the key read from an
  environment variable (``BRAVE_API_KEY``, ``SERPER_API_KEY``). Tests replay recorded
  responses of their real protocol from a loopback server; they never call the paid API.

A backend turns a query into ``SearchResult``s through a shared ``Fetcher`` and raises
``FetchError`` (with an agent-readable reason) on any failure, malformed answers included.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from treegym.envs.react import clean_text
from treegym.envs.web.http import Fetcher, FetchError, Response
from treegym.errors import ConfigError
from treegym.retrieval_index.corpus import split_contents


@dataclass(frozen=True)
class SearchResult:
    """One ranked hit: what the agent sees, and the URL it can browse."""

    title: str
    url: str
    snippet: str

    def to_json(self) -> dict[str, str]:
        return {"title": self.title, "url": self.url, "snippet": self.snippet}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SearchResult:
        return cls(str(d.get("title", "")), str(d.get("url", "")), str(d.get("snippet", "")))


@runtime_checkable
class SearchBackend(Protocol):
    """``name`` identifies the backend in the cache key (protocol + endpoint)."""

    name: str

    def search(self, fetcher: Fetcher, query: str, k: int) -> list[SearchResult]: ...


def parse_json(resp: Response, backend: str) -> Any:
    try:
        return json.loads(resp.text)
    except json.JSONDecodeError as exc:
        raise FetchError(resp.url, f"malformed JSON from {backend} ({exc.msg} at char {exc.pos})") from None
    except (ValueError, RecursionError) as exc:  # a huge integer, or nesting past the recursion limit
        raise FetchError(resp.url, f"malformed JSON from {backend} ({type(exc).__name__})") from None


def field_text(value: Any) -> str:
    """A backend's text field as the agent may read it: a string (or number), cleaned of lone
    surrogates and NULs that JSON escapes can carry; anything else (null, a list, an object) is
    no text at all, never its Python repr."""
    if isinstance(value, bool) or value is None:
        return ""
    if isinstance(value, (int, float)):
        return str(value)
    return clean_text(value) if isinstance(value, str) else ""


def make_result(title: Any, url: Any, snippet: Any) -> SearchResult | None:
    """A SearchResult from untrusted fields; None when there is no URL string to browse."""
    link = field_text(url) if isinstance(url, str) else ""
    if not link:
        return None
    return SearchResult(field_text(title), link, field_text(snippet))


def _shape_error(resp: Response, backend: str, what: str) -> FetchError:
    return FetchError(resp.url, f"unexpected answer from {backend}: {what}")


class RetrieveBackend:
    """Search-R1's retrieval API: ``{"queries", "topk", "return_scores"}`` -> ``{"result": [[...]]}``.

    Passages carry no URL; ``page_url`` (e.g. ``"http://127.0.0.1:8765/doc/{id}"``) makes one
    from the passage id, so the agent can browse it on a local web.
    """

    def __init__(self, url: str, *, page_url: str = "") -> None:
        self.url = url.rstrip("/")
        self.endpoint = self.url if self.url.endswith("/retrieve") else self.url + "/retrieve"
        self.page_url = page_url
        self.name = f"retrieve:{self.endpoint}"

    def search(self, fetcher: Fetcher, query: str, k: int) -> list[SearchResult]:
        return self.search_many(fetcher, [query], k)[0]

    def search_many(self, fetcher: Fetcher, queries: Sequence[str], k: int) -> list[list[SearchResult]]:
        """All queries in one request, as the protocol allows."""
        resp = fetcher.post_json(self.endpoint, {"queries": list(queries), "topk": k, "return_scores": True})
        data = parse_json(resp, "the retrieval server")
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, list) or len(result) != len(queries):
            raise _shape_error(resp, "the retrieval server", f"want {{\"result\": [...]}} with {len(queries)} lists")
        out = []
        for hits in result:
            row = []
            for hit in hits if isinstance(hits, list) else []:
                doc = hit.get("document", hit) if isinstance(hit, dict) else None
                if not isinstance(doc, dict) or "contents" not in doc:
                    raise _shape_error(resp, "the retrieval server", "a hit without 'contents'")
                title, text = split_contents(field_text(doc["contents"]))
                doc_id = field_text(doc.get("id"))
                url = self.page_url.format(id=doc_id) if self.page_url and doc_id else ""
                row.append(SearchResult(title, url, text))
            out.append(row[:k])
        return out


class SearxngBackend:
    """SearxNG's JSON API (the instance must enable ``json`` under ``search.formats``)."""

    def __init__(self, url: str, *, engines: str = "", language: str = "en") -> None:
        self.url = url.rstrip("/")
        self.endpoint = self.url if self.url.endswith("/search") else self.url + "/search"
        self.engines = engines
        self.language = language
        self.name = f"searxng:{self.endpoint}:{engines}:{language}"

    def search(self, fetcher: Fetcher, query: str, k: int) -> list[SearchResult]:
        params = {"q": query, "format": "json", "language": self.language}
        if self.engines:
            params["engines"] = self.engines
        resp = fetcher.get(self.endpoint, params=params, expect="json", oversize="error")
        data = parse_json(resp, "SearxNG")
        results = data.get("results") if isinstance(data, dict) else None
        if not isinstance(results, list):
            raise _shape_error(resp, "SearxNG", "no 'results' list")
        return _rows([make_result(r.get("title"), r.get("url"), r.get("content")) for r in results
                      if isinstance(r, dict)], k)


def _api_key(env_var: str, service: str, key: str | None) -> str:
    key = key or os.environ.get(env_var, "")
    if not key:
        raise ConfigError(f"{service} needs an API key: set ${env_var} (or pass api_key=...)")
    return key


class BraveBackend:
    """Brave Search API: ``GET /res/v1/web/search?q&count`` with ``X-Subscription-Token``."""

    DEFAULT_URL = "https://api.search.brave.com/res/v1/web/search"

    def __init__(self, url: str = DEFAULT_URL, *, api_key: str | None = None, env_var: str = "BRAVE_API_KEY") -> None:
        self.endpoint = url
        self._key = _api_key(env_var, "Brave Search", api_key)
        self.name = f"brave:{url}"

    def search(self, fetcher: Fetcher, query: str, k: int) -> list[SearchResult]:
        headers = {"X-Subscription-Token": self._key, "Accept": "application/json"}
        resp = fetcher.get(self.endpoint, params={"q": query, "count": min(max(k, 1), 20)}, headers=headers,
                           expect="json", oversize="error")
        data = parse_json(resp, "Brave Search")
        web = data.get("web", {}) if isinstance(data, dict) else None
        results = web.get("results", []) if isinstance(web, dict) else None
        if not isinstance(results, list):
            raise _shape_error(resp, "Brave Search", "no 'web.results' list")
        return _rows([make_result(r.get("title"), r.get("url"), _strip_tags(field_text(r.get("description"))))
                      for r in results if isinstance(r, dict)], k)


class SerperBackend:
    """Serper (Google results): ``POST /search {"q", "num"}`` with ``X-API-KEY``."""

    DEFAULT_URL = "https://google.serper.dev/search"

    def __init__(self, url: str = DEFAULT_URL, *, api_key: str | None = None, env_var: str = "SERPER_API_KEY") -> None:
        self.endpoint = url
        self._key = _api_key(env_var, "Serper", api_key)
        self.name = f"serper:{url}"

    def search(self, fetcher: Fetcher, query: str, k: int) -> list[SearchResult]:
        resp = fetcher.post_json(self.endpoint, {"q": query, "num": max(k, 1)}, headers={"X-API-KEY": self._key})
        data = parse_json(resp, "Serper")
        organic = data.get("organic") if isinstance(data, dict) else None
        if not isinstance(organic, list):
            raise _shape_error(resp, "Serper", "no 'organic' list")
        return _rows([make_result(r.get("title"), r.get("link"), r.get("snippet")) for r in organic
                      if isinstance(r, dict)], k)


def _rows(results: list[SearchResult | None], k: int) -> list[SearchResult]:
    return [r for r in results if r is not None][:k]


def _strip_tags(text: str) -> str:
    # Brave marks query terms with <strong>; the agent wants plain text.
    return re.sub(r"</?\w+[^>]*>", "", text)


def make_backend(spec: str) -> SearchBackend:
    """A backend from a spec: ``searxng:URL``, ``retrieve:URL``, ``brave[:URL]``, ``serper[:URL]``.

    ``local:URL`` is a treegym local web (it speaks SearxNG's JSON API).
    """
    kind, _, url = spec.partition(":")
    kind = kind.lower()
    if kind in ("searxng", "local") and url:
        return SearxngBackend(url)
    if kind == "retrieve" and url:
        return RetrieveBackend(url)
    if kind == "brave":
        return BraveBackend(url or BraveBackend.DEFAULT_URL)
    if kind == "serper":
        return SerperBackend(url or SerperBackend.DEFAULT_URL)
    raise ConfigError(f"unknown search backend {spec!r}: use local, searxng:URL, retrieve:URL, brave[:URL] or serper[:URL]")
