"""The synthetic world as the environments use it: generated once into the cache, then offline.

``synthetic_world(passages=2000, seed=0, hops=3)`` writes the world on first call under
``cache_dir("synthetic", ...)`` (a few seconds at the default size, with a BM25 validation pass
that drops any question the oracle cannot answer through retrieval) and returns a handle whose
``corpus_path`` any retriever can index and whose ``questions(split)`` are ordinary QA items.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from treegym.errors import ConfigError
from treegym.paths import cache_dir, digest, discard, home
from treegym.retrieval_index.synthetic.questions import MAX_HOPS
from treegym.retrieval_index.synthetic.writer import (
    CORPUS_FILE,
    GENERATOR_VERSION,
    MANIFEST_FILE,
    QUESTIONS_FILE,
    Manifest,
    read_questions,
    write_world,
)
from treegym.retrieval_index.types import QAItem

SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class SyntheticWorld:
    """A generated world on disk: its corpus file, questions and manifest."""

    folder: Path

    @property
    def corpus_path(self) -> Path:
        return self.folder / CORPUS_FILE

    @property
    def questions_path(self) -> Path:
        return self.folder / QUESTIONS_FILE

    @property
    def manifest(self) -> Manifest:
        return Manifest.read(self.folder)

    def questions(self, split: str = "train", hops: int | None = None) -> list[QAItem]:
        """The questions of one split (``"all"`` for every split), optionally of one hop count."""
        if split not in (*SPLITS, "all"):
            raise ConfigError(f"split {split!r}: choose one of {', '.join(SPLITS)} or 'all'")
        items = _load_questions(self.questions_path, self.questions_path.stat().st_mtime_ns)
        return [q for q in items if (split == "all" or q.split == split) and (hops is None or q.hops == hops)]


@lru_cache(maxsize=8)
def _load_questions(path: Path, mtime_ns: int) -> tuple[QAItem, ...]:
    return tuple(read_questions(path))


_WORLDS: dict[str, SyntheticWorld] = {}
_WORLDS_LOCK = threading.Lock()


def synthetic_world(
    passages: int = 2000, seed: int = 0, hops: int | None = None, progress: bool = False
) -> SyntheticWorld:
    """The world of this size and seed, generated into the cache on first call.

    ``hops`` (1-4) restricts the questions to that many hops; None keeps all of 1-4.
    """
    if hops is not None and (isinstance(hops, bool) or not isinstance(hops, int) or not 1 <= hops <= MAX_HOPS):
        raise ConfigError(f"hops={hops!r}: choose None (all) or a hop count between 1 and {MAX_HOPS}")
    name = f"{GENERATOR_VERSION}-p{passages}-s{seed}-h{hops or 'all'}"
    with _WORLDS_LOCK:  # one world object per process: every env and fork shares it
        if name not in _WORLDS:
            folder = home() / "synthetic" / name
            problem = world_problem(folder) if (folder / MANIFEST_FILE).exists() or folder.is_file() else None
            if problem is not None:  # (no manifest yet: a write that has not finished, maybe another process's)
                warnings.warn(f"rebuilding the cached synthetic world {folder}: {problem}", stacklevel=2)
                discard(folder)
            folder = cache_dir("synthetic", name)
            if not (folder / MANIFEST_FILE).exists():
                write_world(folder, passages, seed, hops=hops, validate="bm25", progress=progress)
            _WORLDS[name] = SyntheticWorld(folder)
        return _WORLDS[name]


def world_problem(folder: Path) -> str | None:
    """None when ``folder``'s manifest reads and its corpus and questions have the SHA-256 it
    records (the manifest is written last); else what is wrong, in a few words. A cut or garbled
    corpus still parses, and would be used with other results."""
    if folder.is_symlink() or not folder.is_dir():
        return "it is not a folder"
    try:
        manifest = Manifest.read(folder)
    except ConfigError:
        return f"its {MANIFEST_FILE} cannot be read"
    for path, want in ((folder / CORPUS_FILE, manifest.corpus_sha256), (folder / QUESTIONS_FILE, manifest.questions_sha256)):
        if not isinstance(want, str) or not want:
            return f"its {MANIFEST_FILE} records no SHA-256 of {path.name}"
        try:
            if digest(path) != want:
                return f"{path.name} is not what was written (its SHA-256 differs)"
        except OSError as exc:
            return f"{path.name} cannot be read ({type(exc).__name__})"
    return None
