"""``treegym study`` when things go wrong: bad arguments, a torn results file, a kill or a
SIGTERM mid-grid. Real training runs of a tiny probe grid, real worker processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from treegym.cli import main
from treegym.study import grid as study_grid

TINY = study_grid.Task("tiny", "ProbeLock-v0", 2, 2, 1, chains=48)
ONE_SETTING = ((("optim.lr", 3e-3),),)


@pytest.fixture
def tiny_grid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(study_grid.TASKS, "tiny", TINY)
    monkeypatch.setitem(study_grid.METHODS, "grpo", study_grid.Method("grpo", "grpo", tune=ONE_SETTING))


def _args(out: Path, seeds: int = 2) -> list[str]:
    return ["study", "--out", str(out), "--tasks", "tiny", "--methods", "grpo", "--budgets", "2", "--seeds",
            str(seeds), "--tune-seeds", "1", "--no-ablations", "--extra-tasks", "", "--workers", "2", "--quiet"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--workers", "-2"], "--workers must be at least 1 (0 for the default), got -2"),
    (["--seeds", "-1"], "--seeds must be at least 1"),
    (["--budgets", ""], "name at least one budget"),
    (["--budgets", "2,x"], "budgets are comma-separated ints"),
    (["--tasks", ""], "name at least one task"),
])  # fmt: skip
def test_bad_study_arguments_are_refused_at_once_with_a_clear_message(argv, message, tmp_path, capsys) -> None:
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as exit_:
        main(["study", "--out", str(tmp_path), *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err and time.monotonic() - t0 < 5


def test_an_out_path_that_is_a_file_is_a_one_line_error(tmp_path, capsys) -> None:
    file = tmp_path / "taken"
    file.write_text("x")
    assert main(["study", "--quick", "--out", str(file)]) == 2
    err = capsys.readouterr().err.strip()
    assert "is a file" in err and "\n" not in err and "Traceback" not in err


def test_a_torn_last_line_is_moved_aside_and_never_appended_onto(tiny_grid: None, tmp_path, capsys) -> None:
    assert main(_args(tmp_path)) == 0
    results = tmp_path / "results.jsonl"
    lines = results.read_bytes().splitlines(keepends=True)
    report = [json.loads(line) for line in lines if json.loads(line)["phase"] == "report"]
    assert len(lines) == 3 and len(report) == 2
    torn = lines[-1][: len(lines[-1]) // 2]  # a kill in the middle of the last append
    results.write_bytes(b"".join(lines[:-1]) + torn)
    capsys.readouterr()
    assert main(_args(tmp_path)) == 0
    assert "1 torn line(s)" in capsys.readouterr().err
    assert (tmp_path / "results.jsonl.torn").read_bytes() == torn + b"\n"
    records = [json.loads(line) for line in results.read_text().splitlines()]  # every line is whole
    assert len(records) == 3 and sorted(r["seed"] for r in records if r["phase"] == "report") == [0, 1]
    assert "| tiny | 2 | grpo | 2 |" in (tmp_path / "report.md").read_text()  # both report seeds


# ---- workers die with the study ------------------------------------------------------------------

RUNNER = """
import sys
from treegym.study import grid
grid.TASKS["tiny"] = grid.Task("tiny", "ProbeLock-v0", 2, 2, 1, chains=100000)  # runs far longer than the test
grid.METHODS["grpo"] = grid.Method("grpo", "grpo", tune=((("optim.lr", 3e-3),), (("optim.lr", 1e-3),)))
from treegym.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _descendants(pid: int) -> set[int]:
    out, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                kids = {int(k) for k in (task / "children").read_text().split()}
            except OSError:
                continue
            todo += kids - out
            out |= kids
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie has ended; only its exit status is left


def _start_study(tmp_path: Path) -> tuple[subprocess.Popen, set[int]]:
    """A study whose 2 workers are each in a run (past their start-up); returns it and its children."""
    # Output to a file, not a pipe: an orphan holding a pipe open would hang the test, not fail it.
    with (tmp_path / "stderr.txt").open("w") as err:
        proc = subprocess.Popen([sys.executable, "-c", RUNNER, *_args(tmp_path / "study", seeds=1)],
                                stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        kids = _descendants(proc.pid)
        workers = [k for k in kids if b"spawn_main" in Path(f"/proc/{k}/cmdline").read_bytes()] if kids else []
        if len(workers) == 2 and len(list(tmp_path.glob("study/runs/**/.treegym-run.lock"))) == 2:  # both in a run
            return proc, kids
        time.sleep(0.3)
    proc.kill()
    proc.wait()
    raise AssertionError(f"the study did not start its workers: {(tmp_path / 'stderr.txt').read_text()[-2000:]}")


def _gone_within(pids: set[int], seconds: float) -> set[int]:
    """The processes of ``pids`` still alive after ``seconds``; they are killed (no orphan outlives a test)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    left = {p for p in pids if _alive(p)}
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_sigkilled_study_leaves_no_worker_or_resource_tracker_behind(tmp_path) -> None:
    proc, kids = _start_study(tmp_path)
    assert len(kids) >= 3  # 2 workers and the resource tracker
    proc.kill()
    proc.wait()
    assert not _gone_within(kids, 20)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigterm_stops_the_grid_at_once_with_a_message_and_no_traceback(tmp_path) -> None:
    proc, kids = _start_study(tmp_path)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    finally:
        left = _gone_within(kids, 20)
    err = (tmp_path / "stderr.txt").read_text()
    assert time.monotonic() - t0 < 30 and not left
    assert proc.returncode == 2 and "stopped by SIGTERM" in err and "Traceback" not in err, err[-2000:]
