"""Where treegym keeps what it builds (indexes, converted models, run folders), and the seal that
says a cached artefact is what was written.

A seal, written last, records the size and SHA-256 of each file of an artefact; a reader checks
it (``seal_problem``) before it trusts any byte. A cut, emptied or garbled file then fails the
check and its owner rebuilds it, instead of using it silently; a crash mid-write leaves an
unsealed artefact, rebuilt too.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

SEAL_VERSION = 1


def home() -> Path:
    """The cache root: ``$TREEGYM_HOME`` if set, else ``~/.cache/treegym``."""
    root = os.environ.get("TREEGYM_HOME")
    path = Path(root).expanduser() if root else Path.home() / ".cache" / "treegym"
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_dir(*parts: str) -> Path:
    """A sub-folder of the cache root, created on demand."""
    path = home().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path



def digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def seal(seal_path: Path, files: Sequence[Path]) -> None:
    """Write ``seal_path`` (atomically) with the size and SHA-256 of ``files``, which must lie in
    its folder or below it."""
    root = seal_path.parent
    sums = {str(p.relative_to(root)): {"bytes": p.stat().st_size, "sha256": digest(p)} for p in files}
    fd, tmp = tempfile.mkstemp(dir=root, prefix=f".{seal_path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"version": SEAL_VERSION, "files": sums}, f, sort_keys=True)
    os.replace(tmp, seal_path)


def seal_problem(seal_path: Path) -> str | None:
    """None when every file ``seal_path`` lists is there with its size and SHA-256; else what is
    wrong, in a few words (no seal, a file cut or changed)."""
    try:
        data = json.loads(seal_path.read_text(encoding="utf-8"))
        files = data["files"]
        if data.get("version") != SEAL_VERSION or not isinstance(files, dict) or not files:
            return "its seal is not one this version wrote"
    except FileNotFoundError:
        return "it has no seal (an older or interrupted write)"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return "its seal cannot be read"
    root = seal_path.parent
    for name, want in files.items():
        path = root / str(name)
        try:
            if not path.is_file() or path.stat().st_size != want["bytes"]:
                return f"{name} is missing or has another size than was written"
            if digest(path) != want["sha256"]:
                return f"{name} is not what was written (its SHA-256 differs)"
        except (OSError, KeyError, TypeError) as exc:
            return f"{name} cannot be checked ({type(exc).__name__})"
    return None
