"""The persistent response cache: TTL, single flight, corruption, and several processes."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from treegym.envs.web.cache import ResponseCache, request_key, shared_cache


def test_key_depends_on_backend_and_request_not_dict_order():
    assert request_key("a", {"q": "x", "k": 3}) == request_key("a", {"k": 3, "q": "x"})
    assert request_key("a", {"q": "x"}) != request_key("b", {"q": "x"})


def test_values_survive_reopening_the_file(tmp_path):
    path = tmp_path / "c.sqlite"
    ResponseCache(path).put("k", "b", [{"title": "Ünïcode"}])
    assert ResponseCache(path).get("k") == [{"title": "Ünïcode"}]


def test_expired_entries_are_misses_and_get_pruned(tmp_path):
    cache = ResponseCache(tmp_path / "c.sqlite", ttl_s=0.05)
    cache.put("k", "b", 1)
    assert cache.get("k") == 1
    time.sleep(0.1)
    assert cache.get("k") is None
    assert cache.prune() == 1 and len(cache) == 0


def test_concurrent_identical_requests_are_computed_once(tmp_path):
    cache = ResponseCache(tmp_path / "c.sqlite")
    calls = []
    gate = threading.Event()

    def compute():
        calls.append(1)
        gate.wait(2)
        return {"v": 42}

    out = []
    threads = [threading.Thread(target=lambda: out.append(cache.get_or_compute("b", "q", compute))) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    gate.set()
    for t in threads:
        t.join()
    assert len(calls) == 1 and [v for v, _ in out] == [{"v": 42}] * 8
    assert cache.stats.misses == 1 and cache.stats.hits == 7


def test_a_failed_computation_is_not_cached(tmp_path):
    cache = ResponseCache(tmp_path / "c.sqlite")

    def boom():
        raise RuntimeError("down")

    with pytest.raises(RuntimeError):
        cache.get_or_compute("b", "q", boom)
    assert cache.get_or_compute("b", "q", lambda: 7) == (7, False)


def test_a_corrupt_file_is_moved_aside_with_a_warning(tmp_path):
    path = tmp_path / "c.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.warns(UserWarning, match="unreadable"):
        cache = ResponseCache(path)
    cache.put("k", "b", 1)
    assert cache.get("k") == 1
    assert len(list(tmp_path.glob("c.sqlite.corrupt-*"))) == 1


def test_shared_cache_is_one_object_per_file(tmp_path):
    assert shared_cache(tmp_path / "s.sqlite") is shared_cache(tmp_path / "s.sqlite")


WRITER = """
import sys
from treegym.envs.web.cache import ResponseCache
c = ResponseCache(sys.argv[1])
for i in range(300):
    c.put(f"child-{i}", "b", {"i": i})
    assert c.get(f"child-{i}") == {"i": i}
"""


def test_two_processes_write_one_file_without_losing_entries(tmp_path):
    path = tmp_path / "c.sqlite"
    cache = ResponseCache(path)
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(path)])
    for i in range(300):
        cache.put(f"parent-{i}", "b", {"i": i})
    assert child.wait(timeout=60) == 0
    assert len(cache) == 600
    assert cache.get("child-299") == {"i": 299} and cache.get("parent-0") == {"i": 0}
