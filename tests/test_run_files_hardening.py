"""Nothing outside the run folder, and no code from data: a symlink planted in a run folder
cannot make ``treegym train`` write through it, and a crafted checkpoint cannot run code when a
run resumes (checkpoints are read with ``torch.load(weights_only=True)``). Real training of the
tiny model (tests/tiny_task.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from test_run_resume import small_config, steps_logged
from tiny_task import build_tiny_model

from treegym.errors import ConfigError
from treegym.paths import cache_dir
from treegym.trainers.checkpoint import CheckpointError, list_checkpoints
from treegym.trainers.loop import train


@pytest.fixture(scope="module")
def tiny_model() -> Path:
    return build_tiny_model(cache_dir("test-models") / "tiny-keys-v1")


@pytest.mark.parametrize("name", [".treegym-run.lock", ".treegym-run.json", "config.yaml", "metrics.jsonl",
                                  "checkpoints"])
def test_a_planted_symlink_in_a_run_folder_is_refused_and_its_target_untouched(name, tiny_model, tmp_path):
    out, outside = tmp_path / "runs", tmp_path / "outside"
    outside.mkdir()
    victim = outside / ("dir" if name == "checkpoints" else "victim.txt")
    if name == "checkpoints":
        victim.mkdir()
    else:
        victim.write_text("precious")
    folder = train(small_config(tiny_model, out, steps=1), progress=False).folder  # a run to resume
    planted = folder / name
    if planted.is_dir():
        shutil.rmtree(planted)
    else:
        planted.unlink()
    planted.symlink_to(victim)
    with pytest.raises(ConfigError, match=f"{name} is a symbolic link: treegym writes nothing .* through a link"):
        train(small_config(tiny_model, out, steps=2), progress=False)
    if name == "checkpoints":
        assert list(victim.iterdir()) == []
    else:
        assert victim.read_text() == "precious"


class _RunsCode:
    """What a crafted checkpoint holds: unpickling it calls ``os.system``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_checkpoint_runs_no_code_on_resume(tiny_model, tmp_path):
    marker = tmp_path / "code-ran"
    first = train(small_config(tiny_model, tmp_path, steps=1), progress=False).folder
    crafted = {"model": {}, "optimizer": {}, "rng": [_RunsCode(marker)], "state": {"step": 5}}
    torch.save(crafted, first / "checkpoints" / "step_5.pt")
    with pytest.warns(UserWarning, match=r"step_5.pt holds more than tensors and plain data \(posix.system\)"):
        train(small_config(tiny_model, tmp_path, steps=2), progress=False)  # falls back to step_1, a safe one
    assert not marker.exists()
    assert steps_logged(first) == [1, 2]
    # With no other checkpoint to fall back to, the error is clear, and still no code ran.
    for path in list_checkpoints(first / "checkpoints"):
        path.unlink()
    torch.save(crafted, first / "checkpoints" / "step_5.pt")
    with pytest.raises(CheckpointError, match="no checkpoint in .* can be loaded: .*posix.system"):
        train(small_config(tiny_model, tmp_path, steps=6), progress=False)
    assert not marker.exists()
