"""Index folders on disk: a ``manifest.json`` next to the index files, written atomically.

A build writes into a temporary folder beside the final one and renames it into place, so a
crash or an exception mid-build leaves no half index under the final name. The manifest
records what the index was built from (corpus hash, embedder, type, format version) and the
size and SHA-256 of every file, so a mismatched, truncated or corrupt index is a clear
:class:`~treegym.errors.IndexFormatError` that says how to rebuild it, never a crash deep
inside FAISS.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from treegym.errors import IndexFormatError
from treegym.paths import cache_dir

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Manifest:
    """What an index folder holds and what it was built from."""

    type: str  # flat | hnsw | ivfpq | bm25 | embeddings
    corpus_hash: str
    count: int
    embedder: str | None = None
    dim: int | None = None
    params: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    created: str = ""
    build_seconds: float | None = None  # wall time of the build that wrote this folder
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> {"bytes", "sha256"}

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)


def slug(text: str) -> str:
    """A short, file-system-safe name for a corpus or embedder label."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")[-40:] or "x"
    if cleaned == text:
        return cleaned
    return f"{cleaned}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def index_folder(corpus_label: str, corpus_hash: str, kind: str, embedder: str | None = None) -> Path:
    """Where the cache keeps one index: ``indexes/<corpus>-<hash>/<type>[-<embedder>]``."""
    corpus_part = f"{slug(corpus_label)}-{corpus_hash[:12]}"
    name = kind if embedder is None else f"{kind}-{slug(embedder)}"
    return cache_dir("indexes") / corpus_part / name


def rebuild_hint(command: str | None) -> str:
    return f"rebuild it with `{command}`" if command else "delete the folder to rebuild it"


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def _build_lock(folder: Path) -> Iterator[None]:
    """Serialise builds of one folder across processes (no-op where flock is missing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def write_index(
    folder: Path,
    manifest: Manifest,
    write_files: Callable[[Path], dict[str, Any] | None],
    force: bool = False,
) -> Manifest:
    """Build an index folder atomically and return its manifest.

    ``write_files(tmp)`` writes the index files into ``tmp`` and may return extra params for
    the manifest. If the folder exists already (another process built it meanwhile) and
    ``force`` is off, it is kept as is.
    """
    with _build_lock(folder):
        if folder.exists() and not force:
            return read_manifest(folder)
        # Leftovers of a build that was killed outright; we hold the lock, so none is live.
        for stale in [*folder.parent.glob(f".{folder.name}.tmp-*"), *folder.parent.glob(f".{folder.name}.old-*")]:
            shutil.rmtree(stale, ignore_errors=True)
        started = time.perf_counter()
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.tmp-"))
        try:
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared like any folder
            extra = write_files(tmp) or {}
            files = {
                p.name: {"bytes": p.stat().st_size, "sha256": file_digest(p)}
                for p in sorted(tmp.iterdir())
                if p.is_file()
            }
            final = Manifest(
                **{
                    **asdict(manifest),
                    "params": {**manifest.params, **extra},
                    "build_seconds": round(time.perf_counter() - started, 2),
                    "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "files": files,
                }
            )
            (tmp / MANIFEST).write_text(final.to_json())
            if folder.exists():  # --force: move the old index aside, then swap
                old = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.old-"))
                os.replace(folder, old / "index")
                os.replace(tmp, folder)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, folder)
            return final
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


def read_manifest(folder: Path, rebuild: str | None = None) -> Manifest:
    """The manifest of an index folder; a missing or garbled one is an IndexFormatError."""
    path = folder / MANIFEST
    if folder.exists() and not folder.is_dir():
        raise IndexFormatError(f"{folder} is a file, not an index folder; {rebuild_hint(rebuild)}")
    if path.is_dir():
        raise IndexFormatError(f"{path} is a folder, not a manifest file; {rebuild_hint(rebuild)}")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            raise TypeError(f"a JSON {type(raw).__name__}, not an object")
        manifest = Manifest(**raw)
        _check_field_types(manifest)
        return manifest
    except FileNotFoundError as exc:
        raise IndexFormatError(f"{folder} is not an index folder (no {MANIFEST}); {rebuild_hint(rebuild)}") from exc
    except (ValueError, TypeError, RecursionError, OSError) as exc:
        raise IndexFormatError(f"{path} is corrupt ({exc}); {rebuild_hint(rebuild)}") from exc


def _check_field_types(m: Manifest) -> None:
    """A manifest edited by hand or by another tool: wrong types are corruption, not a crash later."""
    want = {"type": str, "corpus_hash": str, "count": int, "params": dict, "format_version": int, "files": dict}
    for name, kind in want.items():
        value = getattr(m, name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise TypeError(f"field {name!r} is {type(value).__name__}, not {kind.__name__}")
    for name, meta in m.files.items():
        if not isinstance(meta, dict):
            raise TypeError(f"files[{name!r}] is {type(meta).__name__}, not an object")


def check_index(folder: Path, expected: dict[str, Any], rebuild: str | None = None, verify: bool = True) -> Manifest:
    """Read and validate a manifest against what the caller needs, then check the files.

    ``expected`` maps manifest fields (type, corpus_hash, count, embedder, dim) to the values
    the caller's corpus and embedder have. ``verify`` also checks every file's SHA-256.
    """
    manifest = read_manifest(folder, rebuild)
    hint = rebuild_hint(rebuild)
    if manifest.format_version != FORMAT_VERSION:
        raise IndexFormatError(
            f"index {folder} has format version {manifest.format_version}, this treegym reads "
            f"version {FORMAT_VERSION}; {hint}"
        )
    for key, want in expected.items():
        have = getattr(manifest, key)
        if have != want:
            raise IndexFormatError(f"index {folder} was built for {key}={have!r}, not {want!r}; {hint}")
    for name, meta in manifest.files.items():
        path = folder / name
        if not path.is_file():
            raise IndexFormatError(f"index {folder} is missing its file {name}; {hint}")
        size = path.stat().st_size
        if size != meta.get("bytes"):
            raise IndexFormatError(
                f"index file {path} is truncated or changed ({size} bytes, manifest says {meta.get('bytes')}); {hint}"
            )
        if verify and file_digest(path) != meta.get("sha256"):
            raise IndexFormatError(f"index file {path} is corrupt (checksum mismatch); {hint}")
    return manifest
