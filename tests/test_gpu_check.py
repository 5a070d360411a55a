"""benchmarks/gpu_check.py runs: its real shapes are the published ones, it skips without a GPU,
its default plan fits 8 minutes by its own estimate, and its --cpu-smoke mode drives the same
code paths (rollout, update, bf16 agreement, a training step, probe) into its table and --out file."""

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


def test_the_default_gpu_plan_fits_8_minutes_by_its_own_estimate() -> None:
    parts = gpu_check.plan(gpu_check.parse_args([]))
    total = gpu_check.RATES["start_s"] + sum(p.estimate_s for p in parts)
    assert total <= 480 and all(p.estimate_s > 0 for p in parts), [(p.name, p.estimate_s) for p in parts]
    names = " ".join(p.name for p in parts)
    assert all(s in names for s in gpu_check.SHAPES) and "one training step" in names and "ProbeLock on cuda and cpu" in names


def test_a_part_that_would_end_past_the_budget_is_skipped() -> None:
    parts = [gpu_check.Part("quick", 0.0, lambda: [("x", "quick", "m", "1", "", "ok")]),
             gpu_check.Part("slow", 1e6, lambda: pytest.fail("a part over the budget ran"))]
    rows = gpu_check.run_parts(parts, budget_s=60.0, spent_s=0.0)
    assert rows[0] == ("x", "quick", "m", "1", "", "ok") and rows[1][0] == "time"
    assert rows[2][:2] == ("skipped", "slow") and rows[2][-1].startswith("SKIPPED")
    assert rows[-1][:2] == ("time", "total") and rows[-1][-1] == "ok"


def test_a_plan_over_the_budget_is_refused_before_it_starts() -> None:
    assert gpu_check.main(["--cpu-smoke", "--budget", "1"]) == 2


def test_cpu_smoke_prints_its_plan_and_the_whole_table(tmp_path: Path) -> None:
    out = tmp_path / "gpu-check.md"
    proc = _run("--cpu-smoke", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = proc.stdout.split("plan", 1)[1].split("| section")[0]
    assert "in all, estimated (budget 480 s)" in plan and "one training step" in plan
    lines = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    written = out.read_text().splitlines()
    assert written[0].startswith("gpu_check 20") and "UTC" in written[0] and [w for w in written if w.startswith("| ")] == lines
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == list(gpu_check.COLUMNS)
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert all(len(r) == len(header) for r in rows)
    metrics = {(r[0], r[2].split(" (")[0]) for r in rows}
    for key in [("rollout", "tokens/s, no prefix reuse"), ("rollout", "tokens/s, prefix reuse"), ("train", "tokens/s"),
                ("train", "MFU vs 790 TFLOP/s"), ("train", "peak memory GiB"),
                ("bf16", "trainer's loss fp32 -> bf16"), ("bf16", "token NLL fp32 -> bf16"),
                ("bf16", "token log-prob abs. diff: mean"), ("bf16", "gradient cosine, bf16 vs fp32"),
                ("step", "rollouts, action tokens per rollout"), ("step", "update: finite, and the weights moved"),
                ("probe", "held-out success"), ("probe", "success gap, cpu vs cpu"), ("time", "seconds, start to table")]:
        assert key in metrics, (key, metrics)
    assert all(float(r[3]) > 0 for r in rows if r[2].startswith("tokens/s"))
    step = {r[2]: r[3] for r in rows if r[0] == "step"}
    assert step["update: finite, and the weights moved"] == "True, True"
