"""Shared test setup: a private cache root, so tests never touch ~/.cache/treegym."""

from __future__ import annotations

import os
from pathlib import Path

# Built indexes and converted models are cached across test sessions here (CI sets its own).
os.environ.setdefault("TREEGYM_HOME", str(Path(__file__).resolve().parent.parent / ".cache" / "treegym"))
