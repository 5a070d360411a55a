"""The built-in question set over the built-in Wikipedia corpus, and ``load_qa`` for any QA data.

Questions are generated, deterministically, from the corpus itself:

- ``identify`` (1 hop): "Which person is described as "Irish mathematician and physicist
  (1805–1865)"?" -> the article title. Made from each article's Wikidata description, skipping
  descriptions that are empty, shared by several articles, or that give the title away.
- ``birth_year`` / ``death_year`` (1 hop): "In what year was Wilhelm Röntgen born?" -> "1845".
- ``born_first`` / ``lived_longer`` (2 hops): "Who was born first, A or B?" -> a title; both
  articles support the answer.

The years come from the life span that closes a person's Wikidata description, e.g.
"German physicist (1845–1923)", "Burmese politician (born 1945)", "(c. 1412 – 1431)": the
lead paragraphs of this corpus had their dates stripped, so the description is where they
live. Only unambiguous spans are used (one parenthesis, no BC, no "1729/30", a plausible
length of life). An item's id names its type and its documents (``birth_year-wiki-01234``),
so ids are stable, and its split (80/10/10 train/dev/test) is a hash of its id.

``load_qa(name)`` also reads the data files Search-R1 and Tree-GRPO train on (see ``qa_files``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import tempfile
import threading
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from treegym.errors import ConfigError
from treegym.paths import cache_dir, seal, seal_problem
from treegym.retrieval_index.corpus import Document, wiki_documents
from treegym.retrieval_index.types import QAItem

GENERATOR_VERSION = 1
SPLITS = ("train", "dev", "test")
QUESTION_TYPES = ("identify", "birth_year", "death_year", "born_first", "lived_longer")
# Percent of items per split, by hash of the item id.
SPLIT_PERCENT = {"train": 80, "dev": 10, "test": 10}

# ---- life spans ------------------------------------------------------------------------------

# The description ends with the life span: "(1845–1923)", "(c. 303 – c. 361)", "(born 1945)".
_LIFE_SPAN = re.compile(
    r"\((?:(?P<born>born) (?P<living>\d{3,4})"
    r"|(?P<bc>c\. ?)?(?P<birth>\d{3,4}) ?[–-] ?(?P<dc>c\. ?)?(?P<death>\d{3,4}))\)$"
)
_ERA = re.compile(r"\b(BC|BCE|AD|CE)\b")
MIN_LIFE, MAX_LIFE = 15, 110  # a span outside this is a reign or an era, not a life


@dataclass(frozen=True)
class LifeSpan:
    """Years parsed from a description, with where each year sits in it (for the proofs)."""

    birth: int
    death: int | None  # None: "(born 1945)"
    birth_circa: bool
    death_circa: bool
    birth_at: tuple[int, int]  # character span of the birth year in the description
    death_at: tuple[int, int] | None

    @property
    def exact(self) -> bool:
        """Both years are stated without "c." (needed to compare two people)."""
        return not self.birth_circa and not self.death_circa


def parse_life_span(description: str) -> LifeSpan | None:
    """The life span that closes a person's description, or None unless it is unambiguous."""
    if description.count("(") != 1 or _ERA.search(description):
        return None
    m = _LIFE_SPAN.search(description.strip())
    if m is None:
        return None
    if m.group("born"):
        year = int(m.group("living"))
        if year < 1900:  # "born 1650" without a death year is an error or a fragment
            return None
        return LifeSpan(year, None, False, False, m.span("living"), None)
    birth, death = int(m.group("birth")), int(m.group("death"))
    if not MIN_LIFE <= death - birth <= MAX_LIFE:
        return None
    return LifeSpan(birth, death, bool(m.group("bc")), bool(m.group("dc")), m.span("birth"), m.span("death"))


def is_person(doc: Document) -> bool:
    return doc.topic == "People"


def person_span(doc: Document) -> LifeSpan | None:
    """The life span of a person article, or None (not a person, or no clean span)."""
    return parse_life_span(doc.description) if is_person(doc) else None


# ---- names, aliases, leaks -------------------------------------------------------------------

_PAREN = re.compile(r"\s*\([^()]*\)$")
_STOP = frozenset(
    ["a", "an", "and", "the", "of", "in", "on", "at", "to", "for", "by", "from", "with", "or", "as", "is", "was", "de", "la", "le", "du", "von", "van", "der", "des", "el", "al"]
)


def aliases(title: str) -> tuple[str, ...]:
    """A title's accepted answers: itself, and without a disambiguating "(…)"."""
    bare = _PAREN.sub("", title).strip()
    return (title, bare) if bare and bare != title else (title,)


_NON_WORD = re.compile(r"[^\w\s]+")


def _content_tokens(text: str) -> list[str]:
    return [t for t in _NON_WORD.sub(" ", text.lower()).split() if len(t) >= 3 and t not in _STOP]


def _desc_key(description: str) -> str:
    """Descriptions that differ only in case or punctuation count as the same."""
    return " ".join(_NON_WORD.sub(" ", description.lower()).split())


def leaks_title(title: str, description: str) -> bool:
    """True if the description gives the title away (a shared word, or a shared 5-letter stem)."""
    desc = _content_tokens(description)
    desc_set, desc_stems = set(desc), {t[:5] for t in desc if len(t) >= 5}
    for token in _content_tokens(_PAREN.sub("", title)):
        if token in desc_set or (len(token) >= 5 and token[:5] in desc_stems):
            return True
    return False


_KIND = {"People": "person", "Geography": "place"}


# ---- generation ------------------------------------------------------------------------------


def split_of(item_id: str) -> str:
    """train / dev / test by a stable hash of the id (80/10/10)."""
    bucket = int.from_bytes(hashlib.sha256(item_id.encode()).digest()[:8], "big") % 100
    edge = 0
    for split, percent in SPLIT_PERCENT.items():
        edge += percent
        if bucket < edge:
            return split
    return SPLITS[-1]


def _item(item_id: str, question: str, answers: tuple[str, ...], docs: Sequence[Document], qtype: str) -> QAItem:
    return QAItem(
        id=item_id,
        question=question,
        answers=answers,
        supporting_ids=tuple(d.id for d in docs),
        hops=len(docs),
        type=qtype,
        split=split_of(item_id),
        source="wiki",
    )


def identify_questions(docs: Sequence[Document]) -> list[QAItem]:
    counts = Counter(_desc_key(d.description) for d in docs if d.description)
    items = []
    for doc in docs:
        desc = doc.description.strip()
        if len(desc.split()) < 2 or counts[_desc_key(desc)] > 1 or '"' in desc:
            continue
        if leaks_title(doc.title, desc):
            continue
        kind = _KIND.get(doc.topic, "subject")
        question = f'Which {kind} is described as "{desc}"?'
        items.append(_item(f"identify-{doc.id}", question, aliases(doc.title), [doc], "identify"))
    return items


def year_questions(docs: Sequence[Document]) -> list[QAItem]:
    items = []
    for doc in docs:
        span = person_span(doc)
        if span is None:
            continue
        items.append(
            _item(f"birth_year-{doc.id}", f"In what year was {doc.title} born?", (str(span.birth),), [doc], "birth_year")
        )
        if span.death is not None:
            items.append(
                _item(f"death_year-{doc.id}", f"In what year did {doc.title} die?", (str(span.death),), [doc], "death_year")
            )
    return items


def _hash_order(docs: Sequence[Document], salt: str) -> list[Document]:
    return sorted(docs, key=lambda d: hashlib.sha256(f"{salt}:{d.id}".encode()).hexdigest())


def comparison_questions(docs: Sequence[Document], rounds: int = 2) -> list[QAItem]:
    """Pairs of people, matched by hash order (``rounds`` partners each); ties are skipped."""
    people = [(d, s) for d in docs if (s := person_span(d)) is not None and s.exact]
    spans = {d.id: s for d, s in people}
    by_id = {d.id: d for d, _ in people}
    templates = {
        "born_first": ("Who was born first, {a} or {b}?", [d for d, _ in people]),
        "lived_longer": ("Who lived longer, {a} or {b}?", [d for d, s in people if s.death is not None]),
    }
    items: dict[str, QAItem] = {}
    for qtype, (template, pool) in templates.items():
        for r in range(rounds):
            order = _hash_order(pool, f"{qtype}:{r}")
            for x, y in zip(order[0::2], order[1::2]):
                first, second = sorted((x.id, y.id))
                item_id = f"{qtype}-{first}-{second}"
                winner = compare(qtype, spans[first], spans[second])
                if winner is None or item_id in items:
                    continue
                a, b = by_id[first], by_id[second]
                if hashlib.sha256(item_id.encode()).digest()[0] & 1:  # the answer is not always first
                    a, b = b, a
                answer = by_id[first] if winner == 0 else by_id[second]
                question = template.format(a=a.title, b=b.title)
                items[item_id] = _item(item_id, question, aliases(answer.title), [a, b], qtype)
    return list(items.values())


def compare(qtype: str, x: LifeSpan, y: LifeSpan) -> int | None:
    """0 if ``x`` answers the comparison, 1 if ``y`` does, None if years cannot tell them apart."""
    if qtype == "born_first":
        if x.birth == y.birth:
            return None
        return 0 if x.birth < y.birth else 1
    assert x.death is not None and y.death is not None
    # Years only: lifetimes within a year of each other could go either way.
    lx, ly = x.death - x.birth, y.death - y.birth
    if abs(lx - ly) < 2:
        return None
    return 0 if lx > ly else 1


def generate(docs: Sequence[Document]) -> list[QAItem]:
    """Every question over ``docs``, sorted by id."""
    items = identify_questions(docs) + year_questions(docs) + comparison_questions(docs)
    return sorted(items, key=lambda it: it.id)


@lru_cache(maxsize=1)
def wiki_questions() -> tuple[QAItem, ...]:
    """The built-in question set, cached as JSONL keyed by generator version and corpus hash."""
    docs = wiki_documents()
    path = cache_dir("datasets") / f"wiki-qa-v{GENERATOR_VERSION}-{source_hash(docs)[:16]}.jsonl"
    sealed = path.with_name(path.name + ".seal.json")
    if path.exists() or sealed.exists():
        problem = seal_problem(sealed)  # a file cut to 1,000 lines still parses: the seal catches it
        if problem is None:
            try:
                return tuple(_item_from_record(json.loads(line))
                             for line in path.read_text(encoding="utf-8").splitlines())
            except (ValueError, KeyError, TypeError) as exc:
                problem = f"it cannot be read ({type(exc).__name__})"
        warnings.warn(f"rebuilding the cached QA dataset {path.name}: {problem}", stacklevel=2)
    items = tuple(generate(docs))
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(dataclasses.asdict(it), ensure_ascii=False) + "\n" for it in items)
    os.replace(tmp, path)
    seal(sealed, [path])  # last: an unsealed file is one whose write did not finish
    return items


def source_hash(docs: Sequence[Document]) -> str:
    """A hash of everything the generator reads (descriptions and topics included)."""
    h = hashlib.sha256()
    for d in docs:
        h.update("\0".join((d.id, d.title, d.text, d.description, d.topic)).encode())
        h.update(b"\n")
    return h.hexdigest()


def _item_from_record(r: dict) -> QAItem:
    return QAItem(
        id=r["id"], question=r["question"], answers=tuple(r["answers"]), supporting_ids=tuple(r["supporting_ids"]),
        hops=int(r["hops"]), type=r["type"], split=r["split"], source=r["source"],
    )


# ---- loading ---------------------------------------------------------------------------------


_READ_FILES: dict[tuple, tuple[QAItem, ...]] = {}
_FILES_LOCK = threading.Lock()


def load_qa(name: str = "wiki", split: str = "train", types: Sequence[str] | None = None) -> list[QAItem]:
    """Questions by name: ``"wiki"`` (built-in), or a Search-R1 ``.parquet`` / FlashRAG ``.jsonl`` file.

    ``split`` is ``train``, ``dev``, ``test`` or ``all``. A data file holds one split, so for a
    file ``split`` only labels its items. ``types`` keeps only those question types. Both the
    built-in set and a file are read once per process; every env and fork shares them.
    """
    if split not in (*SPLITS, "all"):
        raise ConfigError(f"unknown split {split!r}; valid splits: {', '.join((*SPLITS, 'all'))}")
    if name == "wiki":
        items = list(wiki_questions())
        if split != "all":
            items = [it for it in items if it.split == split]
        valid_types: Sequence[str] = QUESTION_TYPES
    else:
        from treegym.retrieval_index.qa_files import read_qa_file

        path = Path(name).expanduser()
        if not path.exists():
            raise ConfigError(f"unknown QA data {name!r}: use 'wiki' (built-in) or a path to a .parquet or .jsonl file")
        stat = path.stat()
        key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size, split)
        with _FILES_LOCK:
            if key not in _READ_FILES:  # read once per process (and again only if the file changes)
                _READ_FILES[key] = tuple(read_qa_file(path, split=split))
        items = list(_READ_FILES[key])
        valid_types = sorted({it.type for it in items})
    if types:
        unknown = [t for t in types if t not in valid_types]
        if unknown:
            raise ConfigError(f"unknown question type(s) {', '.join(unknown)}; valid types: {', '.join(valid_types)}")
        items = [it for it in items if it.type in set(types)]
    return items
