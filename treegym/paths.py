"""Where treegym keeps what it builds: indexes, converted models, run folders."""

from __future__ import annotations

import os
from pathlib import Path


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
