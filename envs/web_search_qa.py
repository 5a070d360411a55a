"""WebSearchQA-v0: question answering by searching and browsing over HTTP, forkable per turn."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

from treegym.envs.core import ToolCall
from treegym.envs.qa_env import QAEnv, QAState
from treegym.envs.react import ParsedAction
from treegym.envs.registry import Family, register_family
from treegym.envs.web.backends import SearchBackend, SearchResult, make_backend
from treegym.envs.web.cache import ResponseCache, shared_cache
from treegym.envs.web.guard import AddressGuard
from treegym.envs.web.http import HttpConfig
from treegym.envs.web.pages import paginate, split_page_ref
from treegym.envs.web.tools import BrowseTool, FetchedPage, WebSearchTool, shared_fetcher
from treegym.errors import ConfigError
from treegym.retrieval_index.qa import load_qa
from treegym.retrieval_index.types import QAItem

WEB_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first "
    "every time you get new information. After reasoning, if you find you lack some knowledge, "
    "you can call a search engine by <search> query </search>, and it will return the top "
    "results (title, URL and snippet) between <information> and </information>. To read a page, "
    "use <browse> URL </browse>; a long page comes in parts, and <browse> URL#page=2 </browse> "
    "(or <browse> next </browse>) gives the next part. You can search and browse as many times "
    "as you want. If you find no further external knowledge needed, you can directly provide "
    "the answer inside <answer> and </answer>, without detailed illustrations. For example, "
    "<answer> Beijing </answer>. Question: {question}\n"
)

INVALID_WEB_ACTION = (
    "\nMy previous action is invalid. If I want to search, I should put the query between "
    "<search> and </search>. If I want to read a page, I should put its URL between <browse> "
    "and </browse>. If I want to give the final answer, I should put the answer between "
    "<answer> and </answer>. Let me try again.\n"
)

TAGS = ("search", "browse", "answer")
MAX_LINKS_SHOWN = 10
MAX_TITLE_CHARS, MAX_SNIPPET_CHARS, MAX_URL_CHARS = 200, 1000, 500  # a backend's text can be any length


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class WebState(QAState):
    """A QA episode plus its queries and page state. Immutable."""

    queries: tuple[str, ...] = ()
    visited: tuple[tuple[str, int], ...] = ()  # (url, part) in the order read


_TOOLS: dict[tuple, dict[str, Any]] = {}
_TOOLS_LOCK = threading.Lock()


def cached_tools(key: tuple, build: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """One set of tools per configuration per process: envs built alike share them, so an
    EnvPool batches all their requests (it batches calls per tool object)."""
    with _TOOLS_LOCK:
        if key not in _TOOLS:
            _TOOLS[key] = build()
        return _TOOLS[key]


def format_results(query: str, results: Sequence[SearchResult]) -> str:
    """Search results in Search-R1's block, each with the URL to browse."""
    if not results:
        return f'\n\n<information>No results for "{query}".</information>\n\n'
    lines = []
    for i, r in enumerate(results, 1):
        line = f"Doc {i}(Title: {_clip(r.title, MAX_TITLE_CHARS)}) {_clip(r.snippet, MAX_SNIPPET_CHARS)}"
        lines.append(f"{line}\nURL: {_clip(r.url, MAX_URL_CHARS)}" if r.url else line)
    return "\n\n<information>" + "\n".join(lines) + "</information>\n\n"


def format_page(page: FetchedPage, part: int, parts: Sequence[str]) -> str:
    """One part of a page, with its links and how to get the next part."""
    text = parts[part - 1]
    head = f"Page: {_clip(page.title or page.url, MAX_TITLE_CHARS)}\nURL: {_clip(page.url, MAX_URL_CHARS)}\nPart {part} of {len(parts)}"
    if page.truncated:
        head += " (the page was cut at the size limit)"
    links = [link for link in page.links if link.text in text][:MAX_LINKS_SHOWN]
    tail = ""
    if links:
        tail += "\nLinks: " + "; ".join(f"{_clip(link.text, 100)} <{_clip(link.url, MAX_URL_CHARS)}>" for link in links)
    if part < len(parts):
        tail += f"\n[Next part: <browse>{page.url}#page={part + 1}</browse>]"
    return f"\n\n<information>{head}\n\n{text}{tail}</information>\n\n"


class WebSearchQAEnv(QAEnv[WebState]):
    """Answer a question by searching the web and reading pages (Search-R1's ReAct protocol).

    ## Observation
    Text. ``reset`` returns the whole prompt with the question. After ``<search>q</search>``:
    ``<information>Doc i(Title: t) snippet / URL: u …</information>``. After
    ``<browse>url</browse>``: the page as readable text (boilerplate stripped), one part of at
    most ``page_chars`` characters, with the links in that part and the action for the next
    part (``<browse>url#page=2</browse>``, or ``<browse>next</browse>``). After an answer, ``""``.
    A tool that fails (timeout, HTTP error, refused connection, malformed or non-text
    response) is an observation such as ``Search failed: timed out after 10 s``, with
    ``info["tool_error"]`` set; it never raises out of ``step``.

    ## Action
    The model's whole turn: ``<think>…</think>`` then one of ``<search>``, ``<browse>``,
    ``<answer>``. The first complete tag counts. Anything else is an invalid action: a clear
    message and ``info["invalid_action"] = True``.

    ## Reward
    On the answering step, SQuAD-normalised exact match against the gold aliases (``reward="f1"``
    for token F1), or Tree-GRPO's format-score table with ``format_score=True``. Otherwise 0.

    ## Episode
    Starts with a question drawn by the seeded RNG (or ``options={"task_id": id}``). Terminates
    on an answer; truncates after ``max_turns`` turns without one.

    ## Fork
    Forks share the HTTP session, the tools and the response cache (so a branch that repeats
    a query is served from the cache), and never the page state, which lives in ``state``.
    Snapshots pickle, but page URLs are absolute: with the in-process local web (the default)
    they name this process's port, so a snapshot restored in another process cannot browse
    them (the observation says why). Share one ``treegym web serve`` (``search_url=...``)
    between processes to move snapshots across them.

    ## Arguments
    dataset: ``"wiki"`` (built-in questions) or a Search-R1 parquet / FlashRAG JSONL file.
    split, question_types: which questions. items: the tasks themselves (overrides dataset).
    backend: ``"local"`` (default: the local web over the built-in corpus, started in-process,
        offline), ``"searxng:URL"``, ``"retrieve:URL"`` (Search-R1 server), ``"brave"`` or
        ``"serper"`` (keys from ``$BRAVE_API_KEY`` / ``$SERPER_API_KEY``), or a SearchBackend.
    search_url: for ``backend="local"``, a running ``treegym web serve`` to use instead.
    corpus: what the in-process local web serves: ``"wiki"``, ``"synthetic"`` (the generated
        multi-hop world of ``synthetic_passages`` passages, whose questions then become the
        tasks), or a FlashRAG JSONL file.
    topk: results per search. page_chars: characters per page part. max_turns: turn budget.
    reward, format_score: as above.
    cache: use the persistent response cache; cache_path / cache_ttl_s: where, how long.
    http: network policy (timeouts, retries, caps), an ``HttpConfig``.
    render_mode: None or ``"ansi"`` (``render()`` returns a one-line summary of the episode).
    browse_allow: what ``<browse>`` may reach besides public addresses (and the env's own local
        web): hosts, ``host:port`` or CIDR networks; ``["*"]`` allows everything. Loopback,
        private, link-local and metadata addresses are refused by default, after DNS
        resolution and on every redirect (``treegym.envs.web.guard``).
    """

    state_class = WebState
    prompt = WEB_PROMPT
    tags = TAGS
    action_stops = tuple(f"</{t}>" for t in TAGS)  # a turn ends at its closing tag
    invalid_message = INVALID_WEB_ACTION

    def __init__(
        self,
        dataset: str = "wiki",
        split: str = "train",
        question_types: Sequence[str] | None = None,
        items: Sequence[QAItem] | None = None,
        backend: str | SearchBackend = "local",
        search_url: str | None = None,
        corpus: str = "wiki",
        synthetic_passages: int = 2000,
        topk: int = 3,
        page_chars: int = 2000,
        max_turns: int = 6,
        reward: str = "em",
        format_score: bool = False,
        cache: bool = True,
        cache_path: str | None = None,
        cache_ttl_s: float = 7 * 86400.0,
        http: HttpConfig | None = None,
        max_action_chars: int = 16384,
        render_mode: str | None = None,
        browse_allow: Sequence[str] = (),
    ) -> None:
        # Bounded spaces: an observation is one page part plus its links, or topk snippets.
        super().__init__(max_turns=max_turns, reward=reward, format_score=format_score, max_action_chars=max_action_chars,
                         render_mode=render_mode, max_obs_chars=max(65536, page_chars + 16384))
        if not 1 <= topk <= 20:
            raise ConfigError(f"topk must be between 1 and 20, got {topk}")
        if page_chars < 200:
            raise ConfigError(f"page_chars must be at least 200, got {page_chars}")
        self.topk, self.page_chars = topk, page_chars
        self.http = http or HttpConfig()

        allow = tuple(browse_allow)
        if isinstance(backend, str):
            if backend == "local":
                if search_url is None:
                    from treegym.envs.web.local_web import local_web_for

                    limit = synthetic_passages if corpus == "synthetic" else None
                    search_url = local_web_for(corpus, limit).url
                backend = make_backend(f"local:{search_url}")
                allow += (urlsplit(search_url).netloc.lower(),)  # the env's own local web
            else:
                backend = make_backend(backend)
        self.backend = backend
        self.cache: ResponseCache | None = shared_cache(cache_path, cache_ttl_s) if cache else None
        # Envs with the same configuration share their tools, so an EnvPool sends all their
        # requests in one concurrent batch (it batches calls per tool object).
        self.guard = AddressGuard.of(allow)
        key = ("tools", backend.name, topk, self.http, id(self.cache), self.guard)
        self.tools = cached_tools(key, lambda: {
            "search": WebSearchTool(self.backend, shared_fetcher(self.http), self.cache, topk),
            "browse": BrowseTool(shared_fetcher(self.http), self.cache, self.guard),
        })

        if items is None and corpus == "synthetic" and dataset == "wiki":
            from treegym.retrieval_index.synthetic import synthetic_world

            items = synthetic_world(passages=synthetic_passages, seed=0).questions(split)
        if items is None:
            items = load_qa(dataset, split=split, types=question_types)
        self.set_items(items, f"no questions in dataset {dataset!r}, split {split!r}, types {question_types}")

    # ---- the QAEnv hooks ------------------------------------------------------------------

    def tool_calls(self, parsed: ParsedAction) -> tuple[list[ToolCall], Any]:
        if parsed.kind == "search":
            return [ToolCall("search", parsed.argument)], None
        ref = parsed.argument
        if ref.lower() in ("next", "next page"):
            if not self.state.visited:
                return [], replace(parsed, kind="invalid", error="<browse>next</browse> before any page was browsed")
            url, part = self.state.visited[-1]
            target = (url, part + 1)
        else:
            target = split_page_ref(ref)
        return [ToolCall("browse", target[0])], target

    def observe(self, s: WebState, parsed: ParsedAction, target: Any, result: Any) -> tuple[WebState, str, dict[str, Any]]:
        if parsed.kind == "search":
            return replace(s, queries=s.queries + (parsed.argument,)), format_results(parsed.argument, result), {}
        page: FetchedPage = result
        parts = paginate(page.text, self.page_chars)
        part = target[1]
        if part > len(parts):
            message = f"Browse failed: {page.url} has {len(parts)} part(s); there is no part {part}"
            return replace(s, tool_errors=s.tool_errors + 1), f"\n\n<information>{message}</information>\n\n", {"tool_error": message}
        # Record the requested URL (not a redirect target) so that "next" repeats it.
        return replace(s, visited=s.visited + ((target[0], part),)), format_page(page, part, parts), {}

    def episode_info(self, s: WebState) -> dict[str, Any]:
        return {"visited": [f"{u}#page={p}" for u, p in s.visited]}


# The family's record: what train, sft, eval and play read for this env (``treegym.envs.registry``).
register_family(Family(
    id="WebSearchQA-v0", entry_point="treegym.envs.web_search_qa:WebSearchQAEnv",
    max_turns=3, max_new_tokens=48,  # search, browse, answer
    expert="heuristic", score="EM", tools="web",
    training="WebSearchQA-Train-v0", training_kwargs={"format_score": True},
))
