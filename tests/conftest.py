"""Shared test setup: a private cache root, so tests never touch ~/.cache/treegym; the serve-env
server fixture that the OpenEnv tests share."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Built indexes and converted models are cached across test sessions here (CI sets its own).
os.environ.setdefault("TREEGYM_HOME", str(Path(__file__).resolve().parent.parent / ".cache" / "treegym"))
# The suite's exactness checks (packed = per-leaf to 1e-5, resumed = uninterrupted) are written for fp32: pin
# it on CPUs with bf16 units too, in this process and in the ones it starts. test_cpu_bf16 turns bf16 on.
os.environ["TREEGYM_CPU_BF16"] = "off"


@pytest.fixture()
def server_factory():
    """``start(env_id="ProbeKeys-v0", **serve_kwargs)``: a started ``serve-env`` server on a free
    port, stopped when the test ends. Its tests skip themselves where openenv is missing."""
    from treegym.integrations.openenv import serve

    started = []

    def start(env_id: str = "ProbeKeys-v0", **kwargs):
        server = serve(env_id, port=0, **kwargs).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
