"""A passage corpus as a web site: articles per title, links between them, BM25 search.

Pure content, no sockets: ``Site`` answers "what is the page of this title" and "what matches
this query"; ``local_web`` serves it over HTTP.
"""

from __future__ import annotations

import contextlib
import html
import os
import re
import shutil
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from treegym.errors import ConfigError
from treegym.paths import cache_dir, seal, seal_problem
from treegym.retrieval_index.corpus import Document, corpus_hash, read_jsonl, wiki_documents

MAX_LINKS_PER_PAGE = 40
MIN_DOCS_TO_CACHE = 2000  # smaller corpora index in well under a second
SEAL = "seal.json"  # written last in a cached index folder: its files, sizes and SHA-256
MAX_TITLE_WORDS = 6
MAX_CACHED_PAGES = 20_000
_WORD = re.compile(r"[\w][\w'’.\-]*")


def slug(title: str) -> str:
    """The path segment of an article: spaces as underscores, then percent-encoded."""
    return quote(title.replace(" ", "_"), safe="_-.,()'")


class Site:
    """The corpus as a linked site: title lookup, link finding, BM25 search."""

    def __init__(self, docs: Sequence[Document]) -> None:
        import bm25s

        if not docs:
            raise ConfigError("the local web needs at least one document")
        self.docs = list(docs)
        # An entity may span several passages (the synthetic world spreads its facts): its
        # article shows them all, in corpus order.
        self.by_title: dict[str, list[Document]] = {}
        for d in self.docs:
            self.by_title.setdefault(d.title or d.id, []).append(d)
        self.by_id = {d.id: d for d in self.docs}
        self._bm25s = bm25s
        self.index = self._load_or_build(bm25s)
        self._lock = threading.Lock()  # bm25s keeps scratch state; one search at a time
        # Pages never change, so the server renders each once (a dict: GIL-atomic get/set).
        self._pages: dict[str, str] = {}

    def _load_or_build(self, bm25s: Any) -> Any:
        # Indexing the whole built-in corpus takes seconds; the index is kept in the cache
        # folder under the corpus hash, so every later start loads it instead.
        folder = cache_dir("web", "bm25") / corpus_hash(self.docs)[:20]
        if folder.exists():
            # bm25s loads a cut or garbled array without a word, and searches give other results:
            # only a folder whose seal matches every file is used.
            problem = seal_problem(folder / SEAL)
            if problem is None:
                try:
                    return bm25s.BM25.load(str(folder))
                except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                    problem = f"bm25s cannot read it ({type(exc).__name__})"
            warnings.warn(f"rebuilding the local web's cached index {folder}: {problem}", stacklevel=2)
            shutil.rmtree(folder, ignore_errors=True)
        tokens = bm25s.tokenize([f"{d.title} {d.text}" for d in self.docs], stopwords="en", show_progress=False)
        index = bm25s.BM25()
        index.index(tokens, show_progress=False)
        if len(self.docs) >= MIN_DOCS_TO_CACHE:
            tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
            index.save(str(tmp))
            seal(tmp / SEAL, [p for p in tmp.rglob("*") if p.is_file()])  # last: the folder is whole
            with contextlib.suppress(OSError):  # another process got there first: keep theirs
                os.replace(tmp, folder)
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return index

    def search(self, query: str, k: int, *, per_article: bool = False) -> list[tuple[Document, float]]:
        """Top-k passages by BM25; ``per_article`` keeps only the best passage of each title."""
        want = max(1, min(k * (3 if per_article else 1), len(self.docs)))
        tokens = self._bm25s.tokenize([query], stopwords="en", show_progress=False)
        with self._lock:
            ids, scores = self.index.retrieve(tokens, k=want, show_progress=False)
        hits = [(self.docs[int(i)], float(s)) for i, s in zip(ids[0], scores[0]) if s > 0]
        if per_article:
            seen: set[str] = set()
            hits = [h for h in hits if not (h[0].title in seen or seen.add(h[0].title))]
        return hits[:k]

    def linked_html(self, doc: Document) -> str:
        """The passage as HTML, each mentioned title of another article linked once."""
        out: list[str] = []
        pos = 0
        linked: set[str] = set()
        words = list(_WORD.finditer(doc.text))
        i = 0
        while i < len(words):
            hit = None
            for n in range(min(MAX_TITLE_WORDS, len(words) - i), 0, -1):
                start, end = words[i].start(), words[i + n - 1].end()
                cand = doc.text[start:end].rstrip(".")
                end = start + len(cand)
                if cand == doc.title:  # the article's own name: no link, and no link to a part of it
                    hit = (start, end, "", n)
                    break
                if (cand[:1].isupper() and cand not in linked and cand in self.by_title
                        and (n > 1 or len(cand) >= 4)):
                    hit = (start, end, cand, n)
                    break
            if hit and not hit[2]:
                i += hit[3]
            elif hit and len(linked) < MAX_LINKS_PER_PAGE:
                start, end, cand, n = hit
                out.append(html.escape(doc.text[pos:start]))
                out.append(f'<a href="/wiki/{slug(cand)}">{html.escape(cand)}</a>')
                linked.add(cand)
                pos = end
                i += n
            else:
                i += 1
        out.append(html.escape(doc.text[pos:]))
        return "".join(out)

    def article(self, title: str) -> str:
        """The HTML page of one title (all its passages), with the usual site chrome around it."""
        page = self._pages.get(title)
        if page is None:
            page = self._render(title)
            if len(self._pages) < MAX_CACHED_PAGES:  # bounded: a synthetic world may have 1M titles
                self._pages[title] = page
        return page

    def _render(self, title: str) -> str:
        docs = self.by_title[title]
        doc = docs[0]
        title = html.escape(title)
        desc = f'<p class="description"><i>{html.escape(doc.description)}</i></p>' if doc.description else ""
        body = "".join(f"<p>{self.linked_html(d)}</p>" for d in docs)
        ids = ", ".join(html.escape(d.id) for d in docs)
        return (
            f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title} - treegym local web</title>"
            "<style>body{font-family:sans-serif;max-width:48em;margin:auto}</style>"
            "<script>window.analytics = {track: function () {}};</script></head><body>"
            '<header><a href="/">treegym local web</a> <form action="/search"><input name="q"></form></header>'
            '<nav><ul><li><a href="/">Main page</a></li><li><a href="/search?q=">Search</a></li></ul></nav>'
            f"<main><article><h1>{title}</h1>{desc}{body}</article></main>"
            f"<footer>Text of the served corpus (built-in: Wikipedia contributors, CC BY-SA). Passage ids: {ids}.</footer>"
            "</body></html>"
        )


def snippet(text: str, limit: int = 300) -> str:
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0]
    return cut + " …"


def load_docs(corpus: str | None, limit: int | None = None) -> list[Document]:
    """The built-in corpus, or a FlashRAG JSONL file (a folder means its ``corpus.jsonl``)."""
    if corpus in (None, "", "wiki"):
        docs = list(wiki_documents())
        return docs[:limit] if limit else docs
    if corpus == "synthetic":
        try:
            from treegym.retrieval_index.synthetic import synthetic_world
        except ImportError as exc:
            raise ConfigError(f"the synthetic world is not available in this install ({exc})") from exc
        path = Path(synthetic_world(passages=limit or 2000, seed=0).corpus_path)
        return list(read_jsonl(path, limit))
    path = Path(corpus)
    if path.is_dir():
        path = path / "corpus.jsonl"
    if not path.exists():
        raise ConfigError(f"corpus {path} not found: pass a FlashRAG JSONL file, a folder holding corpus.jsonl, or 'wiki'")
    return list(read_jsonl(path, limit))
