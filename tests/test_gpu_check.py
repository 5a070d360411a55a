"""benchmarks/gpu_check.py runs: its real shapes are the published ones, it skips without a GPU,
and its --cpu-smoke mode drives the same code paths (rollout, update, probe) into its table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check  # noqa: E402

# Parameter counts of the published checkpoints (tied embeddings counted once).
PUBLISHED = {"smollm2-135m": 134.5e6, "qwen2.5-0.5b": 494.0e6, "qwen2.5-1.5b": 1543.7e6}


@pytest.mark.parametrize("name", list(gpu_check.SHAPES))
def test_shapes_have_the_published_parameter_counts(name: str) -> None:
    model = gpu_check.build_model(name, torch.device("meta"), smoke=False)
    count = sum(p.numel() for p in model.parameters())
    assert abs(count - PUBLISHED[name]) / PUBLISHED[name] < 0.005, count
    assert model.config.tie_word_embeddings and model.config.num_key_value_heads < model.config.num_attention_heads


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    return subprocess.run([sys.executable, "-m", "treegym.cli", "bench", "gpu_check", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: the check would run for real")
def test_without_a_gpu_it_skips_and_succeeds() -> None:
    proc = _run()
    assert proc.returncode == 0 and proc.stdout.strip() == "SKIPPED: no GPU", proc.stderr[-2000:]


def test_cpu_smoke_prints_the_whole_table() -> None:
    proc = _run("--cpu-smoke")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == list(gpu_check.COLUMNS)
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert all(len(r) == len(header) for r in rows)
    metrics = {(r[0], r[2].split(" (")[0]) for r in rows}
    for key in [("rollout", "tokens/s, no prefix reuse"), ("rollout", "tokens/s, prefix reuse"), ("train", "tokens/s"),
                ("train", "MFU vs 790 TFLOP/s"), ("train", "peak memory GiB"),
                ("probe", "held-out success"), ("probe", "success gap, cpu vs cpu")]:
        assert key in metrics, (key, metrics)
    assert all(float(r[3]) > 0 for r in rows if r[2].startswith("tokens/s"))
