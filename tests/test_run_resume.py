"""Runs never mix with another run's files, and a resume survives a crash: SIGKILL mid-step, a torn
metrics line, an unreadable checkpoint. Real training of the tiny model (tests/tiny_task.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tiny_task import build_tiny_model

from treegym.errors import ConfigError, TreegymError
from treegym.paths import cache_dir
from treegym.trainers.checkpoint import list_checkpoints
from treegym.trainers.config import TrainConfig, load_config
from treegym.trainers.loop import train
from treegym.trainers.metrics import read_metrics

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def tiny_model() -> Path:
    return build_tiny_model(cache_dir("test-models") / "tiny-keys-v1")


SMALL = {
    "env": "tiny_task:TinyKeysEnv", "algo": "grpo", "sampler.max_new_tokens": 1, "sampler.max_turns": 2,
    "prompts_per_step": 2, "sampler.group_size": 4, "optim.lr": 1e-2, "optim.mini_batch_size": 8,
    "optim.micro_batch_size": 8, "run.eval_n": 0, "run.tensorboard": False, "run.plots": False,
    "run.trees_html": False, "run.save_every": 1, "run.name": "run",
}  # fmt: skip


def small_config(model: Path, out: Path, **overrides: Any) -> TrainConfig:
    base: dict[str, Any] = {**SMALL, "model": str(model), "run.out_dir": str(out)}
    base.update({k.replace("__", "."): v for k, v in overrides.items()})
    return load_config(overrides=list(base.items()))


def steps_logged(folder: Path) -> list[int]:
    return [r["step"] for r in read_metrics(folder / "metrics.jsonl") if "reward" in r]


def test_a_fresh_run_into_an_old_run_folder_starts_clean(tiny_model: Path, tmp_path: Path) -> None:
    old = train(small_config(tiny_model, tmp_path, steps=4), progress=False)
    assert [p.name for p in list_checkpoints(old.folder / "checkpoints")] == ["step_3.pt", "step_4.pt"]
    with pytest.warns(UserWarning, match=r"starting .* over \(run.resume=false\)"):
        new = train(small_config(tiny_model, tmp_path, steps=2, run__resume=False), progress=False)
    assert new.folder == old.folder
    # The old run's step_3/step_4 are gone, so they neither crowd out the new checkpoints ...
    assert [p.name for p in list_checkpoints(new.folder / "checkpoints")] == ["step_1.pt", "step_2.pt"]
    assert steps_logged(new.folder) == [1, 2]
    # ... nor get resumed by the next default run: it continues the new run from its step 2.
    again = train(small_config(tiny_model, tmp_path, steps=3), progress=False)
    assert steps_logged(again.folder) == [1, 2, 3]
    assert [r["reward"] for r in again.history if "reward" in r][:2] == [r["reward"] for r in new.history if "reward" in r]


def test_a_resume_with_another_config_is_refused_naming_what_changed(tiny_model: Path, tmp_path: Path) -> None:
    train(small_config(tiny_model, tmp_path, steps=1), progress=False)
    with pytest.raises(ConfigError, match=r"another config \(seed: 0 -> 1; optim.lr: 0.01 -> 0.02\).*run.resume=false"):
        train(small_config(tiny_model, tmp_path, steps=2, optim__lr=0.02, seed=1), progress=False)
    # steps (and where or how often to write) may change on resume
    assert train(small_config(tiny_model, tmp_path, steps=2, run__save_every=2), progress=False).steps == 2


def test_a_torn_last_metrics_line_does_not_break_resume(tiny_model: Path, tmp_path: Path) -> None:
    first = train(small_config(tiny_model, tmp_path, steps=2), progress=False)
    with (first.folder / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "rew')  # killed mid-append
    with pytest.warns(UserWarning, match="unreadable line"):
        resumed = train(small_config(tiny_model, tmp_path, steps=3), progress=False)
    assert steps_logged(resumed.folder) == [1, 2, 3]
    assert all(isinstance(json.loads(line), dict) for line in (resumed.folder / "metrics.jsonl").read_text().splitlines())


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage"])
def test_an_unreadable_newest_checkpoint_falls_back_to_the_previous_one(damage: str, tiny_model: Path, tmp_path: Path) -> None:
    straight = train(small_config(tiny_model, tmp_path, steps=2), progress=False)
    newest = straight.folder / "checkpoints" / "step_2.pt"
    data = newest.read_bytes()
    newest.write_bytes({"empty": b"", "truncated": data[: len(data) // 2], "garbage": b"\x80\x04not a checkpoint"}[damage])
    with pytest.warns(UserWarning, match=r"step_2.pt cannot be loaded .*resuming from step_1.pt instead"):
        resumed = train(small_config(tiny_model, tmp_path, steps=2), progress=False)
    # step 2 was redone from step 1's exact state: the same weights as the straight run
    assert resumed.replica_digests == straight.replica_digests
    assert steps_logged(resumed.folder) == [1, 2]


def test_every_checkpoint_unreadable_is_a_clear_error(tiny_model: Path, tmp_path: Path) -> None:
    first = train(small_config(tiny_model, tmp_path, steps=2), progress=False)
    for path in list_checkpoints(first.folder / "checkpoints"):
        path.write_bytes(b"")
    with pytest.raises(TreegymError, match=r"no checkpoint in .* can be loaded: .*step_2.pt.*step_1.pt.*run.resume=false"):
        train(small_config(tiny_model, tmp_path, steps=3), progress=False)
    assert list_checkpoints(first.folder / "checkpoints")  # nothing of the old run was deleted


def test_a_failed_run_leaves_no_empty_run_folder(tiny_model: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot import NoSuchEnv"):
        train(small_config(tiny_model, tmp_path, steps=1, env="tiny_task:NoSuchEnv"), progress=False)
    assert not (tmp_path / "run").exists()


# ---- a run stays inside its folder, and owns it alone ----------------------------------------------


@pytest.mark.parametrize("name", ["../escaped", "/tmp/treegym-escaped-run", "a/../../escaped", "..", "a\\b", "~/escaped"])
def test_a_run_name_cannot_leave_the_out_folder(name: str, tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    with pytest.raises(ConfigError, match="run.name must be a relative folder name inside run.out_dir"):
        train(small_config(tiny_model, out, steps=1, run__name=name), progress=False)
    assert not (tmp_path / "escaped").exists() and not Path("/tmp/treegym-escaped-run").exists()


def test_starting_over_removes_nothing_that_treegym_did_not_write(tiny_model: Path, tmp_path: Path) -> None:
    theirs = tmp_path / "run"
    (theirs / "plots").mkdir(parents=True)
    for name in ("config.yaml", "metrics.jsonl", "plots/figure.png", "notes.txt"):
        (theirs / name).write_text("not treegym's")
    with pytest.raises(ConfigError, match="holds files that treegym did not write there"):
        train(small_config(tiny_model, tmp_path, steps=1, run__resume=False), progress=False)
    assert sorted(p.name for p in theirs.rglob("*")) == ["config.yaml", "figure.png", "metrics.jsonl", "notes.txt", "plots"]
    # A folder treegym made is cleared of what its manifest lists, and of nothing else.
    ours = train(small_config(tiny_model, tmp_path, steps=1, run__name="ours"), progress=False).folder
    (ours / "notes.txt").write_text("mine")
    with pytest.warns(UserWarning, match="starting .* over"):
        train(small_config(tiny_model, tmp_path, steps=1, run__name="ours", run__resume=False), progress=False)
    assert (ours / "notes.txt").read_text() == "mine"


def test_a_second_run_of_the_same_name_is_refused_while_the_first_runs(tiny_model: Path, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "TINY_PAUSE_AFTER": f"{tmp_path / 'run' / 'metrics.jsonl'}:1"}  # fmt: skip
    cmd = _train_cmd(tiny_model, tmp_path, "run", "grpo", False)
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not steps_logged(tmp_path / "run") and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert steps_logged(tmp_path / "run") == [1], first.stderr.read() if first.poll() is not None else "timeout"
        from treegym.cli import main

        assert main(cmd[3:]) == 2
        err = capsys.readouterr().err.strip()
        assert f"is in use by another run (pid {first.pid})" in err and "\n" not in err
        assert steps_logged(tmp_path / "run") == [1]  # nothing interleaved
    finally:
        first.kill()
        first.wait(timeout=30)
    # The lock died with its process: the next run resumes the killed one.
    again = train(small_config(tiny_model, tmp_path, steps=2), progress=False)
    assert steps_logged(again.folder) == [1, 2]


# ---- SIGKILL in the middle of a step, resumed in a fresh process ---------------------------------

KILLED = [("tree-grpo", False), ("grpo", True), ("treeopsd", False)]


def _train_cmd(model: Path, out: Path, name: str, algo: str, lora: bool) -> list[str]:
    cfg = {**SMALL, "algo": algo, "model": str(model), "run.out_dir": str(out), "run.name": name, "steps": 5,
           "run.save_every": 2, "run.eval_n": 2, "model_opts.lora": lora, "model_opts.lora_r": 4}  # fmt: skip
    return [sys.executable, "-m", "treegym.cli", "train", "--no-progress", *(f"--{k}={v}" for k, v in cfg.items())]


@pytest.mark.parametrize(("algo", "lora"), KILLED, ids=[f"{a}{'-lora' if lo else ''}" for a, lo in KILLED])
def test_a_run_killed_mid_step_and_resumed_in_a_new_process_equals_an_uninterrupted_run(
    algo: str, lora: bool, tiny_model: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    killed = tmp_path / "killed"
    # Killed during step 4's rollout: step 3 is logged but only step 2 is checkpointed.
    kill = {**env, "TINY_KILL_AFTER": f"{killed / 'metrics.jsonl'}:3"}
    proc = subprocess.run(_train_cmd(tiny_model, tmp_path, "killed", algo, lora), env=kill, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert [p.name for p in list_checkpoints(killed / "checkpoints")] == ["step_2.pt"]
    assert steps_logged(killed) == [1, 2, 3]
    # One fresh process resumes the killed run, then runs the same config uninterrupted.
    resume, straight = (_train_cmd(tiny_model, tmp_path, n, algo, lora)[3:] for n in ("killed", "straight"))
    both = "import sys; from treegym.cli import main; n = int(sys.argv[1]); sys.exit(main(sys.argv[2:2 + n]) or main(sys.argv[2 + n:]))"
    proc = subprocess.run([sys.executable, "-c", both, str(len(resume)), *resume, *straight], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resumed from {killed / 'checkpoints' / 'step_2.pt'} (step 2)" in proc.stdout
    a, b = (json.loads((tmp_path / n / "summary.json").read_text()) for n in ("killed", "straight"))
    assert a["steps"] == b["steps"] == 5
    assert a["replica_digests"] == b["replica_digests"]
    assert a["tokens_total"] == b["tokens_total"] and a["success_before"] == b["success_before"] and a["success_after"] == b["success_after"]
    rows = [[(r["step"], r["reward"]) for r in read_metrics(tmp_path / n / "metrics.jsonl") if "reward" in r]
            for n in ("killed", "straight")]  # fmt: skip
    assert rows[0] == rows[1] and [s for s, _ in rows[0]] == [1, 2, 3, 4, 5]


# ---- the same for a 2-process DDP run (torchrun, gloo on CPU) ------------------------------------

def _torchrun(target: list[str], env: dict[str, str]) -> subprocess.Popen:
    """``treegym train`` in two gloo processes under torchrun, started (wait with ``communicate``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
           "-m", "treegym.cli", *target]  # fmt: skip
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return proc.returncode, out, err


def test_a_two_process_ddp_run_killed_mid_step_and_resumed_equals_an_uninterrupted_one(
    tiny_model: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    killed = tmp_path / "killed"
    args = {name: [*_train_cmd(tiny_model, tmp_path, name, "grpo", False)[3:], "--steps=4"] for name in ("killed", "straight")}
    # The uninterrupted run goes alongside (its own folder and port): the same config, two fresh processes.
    straight = _torchrun(args["straight"], env)
    # Both processes SIGKILL themselves in step 4's rollout, once rank 0 has logged step 3 (one
    # that gets there first waits in the gradient all-reduce and is torn down with the group).
    code, _, err = _finish(_torchrun(args["killed"], {**env, "TINY_KILL_AFTER": f"{killed / 'metrics.jsonl'}:3"}))
    assert code != 0 and "Signal 9 (SIGKILL) received" in err, err[-3000:]
    assert [p.name for p in list_checkpoints(killed / "checkpoints")] == ["step_2.pt"]
    assert steps_logged(killed) == [1, 2, 3]
    # Two fresh processes resume the killed run.
    code, out, err = _finish(_torchrun(args["killed"], env))
    assert code == 0, err[-3000:]
    assert f"resumed from {killed / 'checkpoints' / 'step_2.pt'} (step 2)" in out
    code, _, err = _finish(straight)
    assert code == 0, err[-3000:]
    a, b = (json.loads((tmp_path / n / "summary.json").read_text()) for n in ("killed", "straight"))
    assert a["world"] == b["world"] == 2 and a["steps"] == b["steps"] == 4
    assert a["replica_digests"] == b["replica_digests"] and len(set(a["replica_digests"])) == 1
    assert a["tokens_total"] == b["tokens_total"] and a["success_before"] == b["success_before"] and a["success_after"] == b["success_after"]
    rows = [[(r["step"], r["reward"], r["generated_tokens"]) for r in read_metrics(tmp_path / n / "metrics.jsonl")
             if "reward" in r] for n in ("killed", "straight")]  # fmt: skip
    assert rows[0] == rows[1] and [s for s, _, _ in rows[0]] == [1, 2, 3, 4]
