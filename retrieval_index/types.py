"""The retrieval interface every index, hybrid and remote client implements."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


def clean_text(text: str) -> str:
    """Drop what cannot be encoded (lone surrogates, NULs), so no backend or tokenizer chokes on it.
    A JSON ``"\\udcff"`` escape is valid JSON and arrives as such a surrogate."""
    return text.encode("utf-8", "replace").decode("utf-8").replace("\x00", "")


@dataclass(frozen=True)
class Hit:
    """One retrieved passage. ``contents`` is the wiki-18 / FlashRAG form ``"Title"\\ntext``."""

    doc_id: str
    title: str
    text: str
    score: float

    @property
    def contents(self) -> str:
        return f'"{self.title}"\n{self.text}'


@runtime_checkable
class Retriever(Protocol):
    """Batched top-k search. One call serves every pending query of an env pool."""

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]: ...


@dataclass(frozen=True)
class QAItem:
    """One question with its gold answers and the passages that support them."""

    id: str
    question: str
    answers: tuple[str, ...]  # aliases; any of them counts as correct
    supporting_ids: tuple[str, ...] = ()
    hops: int = 1
    type: str = "unknown"  # e.g. identify, birth_year, death_year, born_first, lived_longer
    split: str = "train"
    source: str = "wiki"
