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
import shutil
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

SEAL_VERSION = 1
FOLDER_SEAL = "seal.json"  # the seal of a cached folder (a model, an index), inside it


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


def write_atomically(path: Path, write: Callable[[Path], None]) -> Path:
    """``write(tmp)`` into a fresh file beside ``path``, then rename it into place: a reader sees
    the old file or the whole new one, never half of it; a failed write leaves nothing behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


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


def seal_folder(folder: Path) -> None:
    """Seal every file in ``folder`` and below; call it last, when the folder is whole."""
    seal(folder / FOLDER_SEAL, [p for p in sorted(folder.rglob("*")) if p.is_file() and p.name != FOLDER_SEAL])


def folder_problem(folder: Path) -> str | None:
    """None when ``folder`` is a folder whose seal holds; else what is wrong, in a few words."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        return "it is not a folder"
    if not folder.is_dir():
        return "it is not there"
    return seal_problem(folder / FOLDER_SEAL)


def discard(path: Path) -> None:
    """Remove a cached artefact, whatever it has become (a folder, a file, a link)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def sealed_folder(target: Path, build: Callable[[Path], None], what: str) -> Path:
    """``target`` when its seal holds; else ``build`` it again, with a one-line warning when a
    broken one was there (cut, emptied, garbled, unsealed, or a file in its place).

    ``build(tmp)`` writes the artefact's files into a fresh folder beside ``target``, which is
    sealed and then renamed into place, so a reader never sees half of it. If another process
    renames its own whole copy first, that copy is kept."""
    if target.exists() or target.is_symlink():
        problem = folder_problem(target)
        if problem is None:
            return target
        warnings.warn(f"rebuilding the cached {what} {target}: {problem}", stacklevel=2)
        discard(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        build(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is shared like any other
        seal_folder(tmp)  # last: the folder is whole
        try:
            os.replace(tmp, target)
        except OSError:  # another process renamed its copy first: keep it when it is whole
            if folder_problem(target) is not None:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
