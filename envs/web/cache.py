"""A persistent response cache: SQLite, keyed by backend and request, with a TTL.

One ``ResponseCache`` per file per process (``shared_cache``), shared by every env and fork,
so a forked branch that repeats a query is served from here. Several processes may use the
same file: the database runs in WAL mode (readers never block the writer), every write is
one short autocommit statement, and a busy timeout absorbs the rare lock contention.

``get_or_compute`` is single-flight: when two threads ask for the same missing key at once
(sibling branches of a tree issuing the same search in one pool step), one computes and the
other waits for its result, so the request is paid once.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from treegym.paths import cache_dir

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    key TEXT PRIMARY KEY,
    backend TEXT NOT NULL,
    value TEXT NOT NULL,
    created REAL NOT NULL
)
"""


def request_key(backend: str, request: Any) -> str:
    """A stable key for (backend, request): SHA-256 of canonical JSON."""
    blob = json.dumps([backend, request], sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass
class CacheStats:
    """Lookups served from the cache (``hits``) and those that had to be paid (``misses``)."""

    hits: int = 0
    misses: int = 0

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class ResponseCache:
    """JSON values in SQLite with a TTL. Thread-safe: one connection per thread.

    Args:
        path: the database file; created with its folder.
        ttl_s: entries older than this are misses (and get overwritten).
    """

    def __init__(self, path: str | os.PathLike[str], ttl_s: float = 7 * 86400.0) -> None:
        self.path = Path(path)
        self.ttl_s = float(ttl_s)
        self.stats = CacheStats()
        self._local = threading.local()
        self._lock = threading.Lock()
        self._inflight: dict[str, Future] = {}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._setup(self._conn())
        except sqlite3.DatabaseError as exc:
            self._quarantine(exc)

    def _quarantine(self, exc: Exception) -> None:
        # A corrupt file is moved aside, not deleted: nothing is lost, and the env keeps working.
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        self._local = threading.local()
        os.replace(self.path, aside)
        for suffix in ("-wal", "-shm"):
            side = Path(str(self.path) + suffix)
            if side.exists():
                side.unlink()
        warnings.warn(f"web cache {self.path} was unreadable ({exc}); moved it to {aside} and started a new one",
                      stacklevel=3)
        self._setup(self._conn())

    @staticmethod
    def _setup(conn: sqlite3.Connection) -> None:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(_SCHEMA)

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            # isolation_level=None: autocommit, so each statement is its own short transaction.
            conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA busy_timeout=10000")
            self._local.conn = conn
        return conn

    def get(self, key: str) -> Any | None:
        """The cached value, or None when absent or older than the TTL."""
        row = self._conn().execute("SELECT value, created FROM responses WHERE key = ?", (key,)).fetchone()
        if row is None or time.time() - row[1] > self.ttl_s:
            return None
        return json.loads(row[0])

    def put(self, key: str, backend: str, value: Any) -> None:
        self._conn().execute(
            "INSERT OR REPLACE INTO responses (key, backend, value, created) VALUES (?, ?, ?, ?)",
            (key, backend, json.dumps(value, ensure_ascii=False), time.time()),
        )

    def count(self, hits: int = 0, misses: int = 0) -> None:
        """Record lookups made outside ``get_or_compute`` (batched backends)."""
        with self._lock:
            self.stats.hits += hits
            self.stats.misses += misses

    def get_or_compute(self, backend: str, request: Any, compute: Callable[[], Any]) -> tuple[Any, bool]:
        """(value, was_cached). ``compute`` runs at most once per key at a time; its
        exceptions propagate to every waiter and nothing is stored."""
        key = request_key(backend, request)
        value = self.get(key)
        if value is not None:
            with self._lock:
                self.stats.hits += 1
            return value, True
        with self._lock:
            fut = self._inflight.get(key)
            owner = fut is None
            if owner:
                fut = self._inflight[key] = Future()
                self.stats.misses += 1
            else:
                self.stats.hits += 1  # served by the flight already paying for it
        assert fut is not None
        if not owner:
            return fut.result(), True
        try:
            value = compute()
            self.put(key, backend, value)
            fut.set_result(value)
            return value, False
        except BaseException as exc:
            fut.set_exception(exc)
            raise
        finally:
            with self._lock:
                self._inflight.pop(key, None)

    def prune(self) -> int:
        """Delete expired entries; returns how many."""
        cur = self._conn().execute("DELETE FROM responses WHERE created < ?", (time.time() - self.ttl_s,))
        return cur.rowcount

    def __len__(self) -> int:
        return int(self._conn().execute("SELECT COUNT(*) FROM responses").fetchone()[0])


_SHARED: dict[tuple[str, float], ResponseCache] = {}
_SHARED_LOCK = threading.Lock()


def default_cache_path() -> Path:
    return cache_dir("web") / "responses.sqlite"


def shared_cache(path: str | os.PathLike[str] | None = None, ttl_s: float = 7 * 86400.0) -> ResponseCache:
    """The process-wide cache for ``path`` (default: under the treegym cache folder)."""
    resolved = str(Path(path).resolve()) if path is not None else str(default_cache_path())
    with _SHARED_LOCK:
        cache = _SHARED.get((resolved, float(ttl_s)))
        if cache is None:
            cache = _SHARED[(resolved, float(ttl_s))] = ResponseCache(resolved, ttl_s)
        return cache
