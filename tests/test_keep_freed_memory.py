"""``parallel.keep_freed_memory``: glibc's malloc keeps freed blocks for the next allocation, so a
freed buffer's pages come back without new page faults; ``TREEGYM_MALLOC=default`` leaves malloc alone."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from treegym.trainers import parallel

PROBE = """
import resource, sys, torch
from treegym.trainers import parallel
took = parallel.keep_freed_memory()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(2):  # warm the allocator, then count the faults of the same 256 MB reallocated
    x = torch.ones(64 * 2**20); del x
before = faults()
for _ in range(5):
    x = torch.ones(64 * 2**20); del x
print(int(took), faults() - before)
"""


def _faults(env_value: str) -> tuple[bool, int]:
    env = {**os.environ, "TREEGYM_MALLOC": env_value}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True).stdout
    took, faults = out.split()
    return took == "1", int(faults)


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_freed_memory_is_reused_without_new_page_faults() -> None:
    took, kept = _faults("")
    left, default = _faults("default")
    assert took and not left
    pages = 5 * 64 * 2**20 * 4 // 4096  # each reallocation of 256 MB touches this many fresh pages under default malloc
    assert default > pages // 2  # malloc hands the block back and the pages fault again
    assert kept <= pages // 4  # at most about one of the five faults its pages (where the heap first grows)


def test_an_opt_out_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TREEGYM_MALLOC", "default")
    assert parallel.keep_freed_memory() is False
