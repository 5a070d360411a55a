"""Run the grid's training runs in parallel worker processes, appending each result to JSONL.

The results file is the study's state: a run whose key is already in it is skipped, so an
interrupted study resumes where it stopped, and a finished one reprints its report at once.
A run that fails is recorded with its error (and retried on the next invocation). A line that
a kill tore (no newline at the end, or not JSON) is moved to ``<results>.torn`` with a message
before anything is appended, so no record is ever glued onto a fragment.

Workers die with the study: on Linux each asks the kernel for SIGKILL when its parent dies
(``PR_SET_PDEATHSIG``), elsewhere a thread watches the parent's pid. SIGTERM (or Ctrl-C) stops
the grid at once: pending runs are cancelled, running ones killed, finished ones kept.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from treegym.errors import TreegymError
from treegym.study.grid import RunSpec

MODELLED_TOOL_LATENCY = 0.5  # seconds per tool call, like a web search API

# Each worker is one single-threaded trainer: two workers use two cores without oversubscribing.
_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class StudyStopped(TreegymError):
    """A signal stopped the study; every run it finished is in the results file."""


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int) -> None:
    """Make this process end when ``parent`` does (a killed study leaves no orphans)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    else:
        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(1.0)
            os._exit(1)

        threading.Thread(target=watch, name="treegym-parent-watch", daemon=True).start()
    if os.getppid() != parent:  # it died before the request above
        os._exit(1)


def _init_worker(parent: int) -> None:
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops the workers
    for var in _THREAD_VARS:
        os.environ[var] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    import torch
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(1)
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def probe_model_for(spec: RunSpec) -> str:
    import gymnasium as gym

    import treegym  # noqa: F401  (registers the probe ids)
    from treegym.envs.probe_model import build_probe_model

    env = gym.make(spec.task.env, **spec.task.make_kwargs()).unwrapped
    return str(build_probe_model(env, spec.task.turn_tokens, prior=spec.task.prior))


def run_one(spec: RunSpec, out_dir: str) -> dict[str, Any]:
    """Train one run of the grid; return its record (never raises: failures are records)."""
    import warnings

    from treegym.trainers.config import load_config
    from treegym.trainers.loop import train

    t0 = time.time()
    base = {"key": spec.key, "phase": spec.phase, "task": spec.task.name, "method": spec.method.name,
            "algo": spec.method.algo, "budget": spec.budget, "seed": spec.seed, "setting": dict(spec.setting)}  # fmt: skip
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg = load_config(overrides=list(spec.overrides(probe_model_for(spec), out_dir).items()))
            result = train(cfg, progress=False)
    except Exception as exc:  # a failed run is a record, so that the grid goes on
        return {**base, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
    shutil.rmtree(result.folder, ignore_errors=True)  # the record holds all the study needs
    steps = [h for h in result.history if "reward" in h]
    evals = [h for h in result.history if "eval_success" in h]

    def mean(key: str) -> float:
        xs = [h[key] for h in steps if key in h]
        return statistics.fmean(xs) if xs else float("nan")

    generated = sum(h["generated_tokens"] for h in steps)
    trajectories = sum(h["trajectories"] for h in steps)
    return {
        **base,
        "steps": result.steps, "tokens": result.tokens_total, "trajectories": trajectories,
        "tool_calls": sum(h["tool_calls"] for h in steps), "env_steps": sum(h["env_steps"] for h in steps),
        "success_before": evals[0]["eval_success"] if evals else None,
        "success_before_t1": evals[0].get("eval_success_t1") if evals else None,
        "success": evals[-1]["eval_success"] if evals else None,
        "success_t1": evals[-1].get("eval_success_t1") if evals else None,
        "curve": [(h["tokens_total"], h["eval_success"], h.get("eval_success_t1")) for h in evals],
        # Held-out success (T=1) against every budget currency, at each evaluation.
        "currency_curve": [{"tokens": h["tokens_total"], "tool_calls": h.get("tool_calls_total", 0),
                            "trainer_tokens": h.get("trainer_tokens_total", 0),
                            "modelled_seconds": h.get("seconds_total", 0.0)
                            + MODELLED_TOOL_LATENCY * h.get("tool_rounds_total", 0),
                            "success_t1": h.get("eval_success_t1")} for h in evals],
        "trainer_tokens": sum(h.get("trainer_tokens", 0) for h in steps),
        "tool_rounds": sum(h.get("tool_rounds", 0) for h in steps),
        # Wall time with every tool call costing MODELLED_TOOL_LATENCY s; a step's calls run at once.
        "modelled_seconds": sum(h.get("time_step", 0.0) for h in steps)
        + MODELLED_TOOL_LATENCY * sum(h.get("tool_rounds", 0) for h in steps),
        "distinct_frac": mean("distinct_frac"), "single_child_frac": mean("single_child_frac"),
        "resampled": sum(h.get("resampled", 0) for h in steps),
        "reward_first": statistics.fmean(h["reward"] for h in steps[:3]) if steps else None,
        "reward_last": statistics.fmean(h["reward"] for h in steps[-3:]) if steps else None,
        "trajectories_per_1k_tokens": 1000 * trajectories / max(generated, 1),
        # Trees against chains (agents/rollout/diagnostics.py): distinct first moves per group, and
        # trajectories discounted for the prefix siblings share, per 1k generated tokens.
        "distinct_first": mean("distinct_first"),
        "eff_traj_per_1k_tokens": 1000 * sum(h.get("eff_trajectories", 0.0) for h in steps) / max(generated, 1),
        "zero_adv_frac": mean("zero_adv_frac"), "pg_weight": mean("pg_weight"), "adv_abs": mean("adv_abs"),
        "approx_kl": mean("approx_kl"), "seconds": time.time() - t0,
    }  # fmt: skip


def read_results(path: Path) -> list[dict[str, Any]]:
    """Every record in ``path``; a torn line (a kill mid-append) is skipped (``repair_results`` moves it away)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "key" in record:
            out.append(record)
    return out


def repair_results(path: Path) -> int:
    """Move every line of ``path`` that is not a whole record (a torn last line, without its
    newline) to ``<path>.torn``, say so, and leave ``path`` ending in a newline; returns how many."""
    if not path.exists():
        return 0
    data = path.read_bytes()
    lines = data.split(b"\n")
    tail = lines[-1]  # what follows the last newline: b"" unless the last line lost its newline
    good, bad = [], []
    for line in lines:
        try:
            ok = isinstance(json.loads(line), dict)
        except ValueError:
            ok = not line.strip()
        (good if ok else bad).append(line)
    if not bad and not tail:
        return 0
    torn = path.with_name(path.name + ".torn")
    with torn.open("ab") as fh:
        fh.write(b"".join(line + b"\n" for line in bad))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(b"".join(line + b"\n" for line in good if line.strip()))
    os.replace(tmp, path)
    if bad:
        print(f"study: {path} had {len(bad)} torn line(s) (a kill mid-write); moved them to {torn}; "
              "their runs are done again", file=sys.stderr, flush=True)
    return len(bad)


def append_result(path: Path, record: dict[str, Any]) -> None:
    """Append one record as one whole line, never onto a line without its newline."""
    line = (json.dumps(record) + "\n").encode()
    with path.open("ab+") as fh:
        if fh.tell() > 0:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":
                line = b"\n" + line
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def run_all(specs: Sequence[RunSpec], results: Path, out_dir: Path, workers: int, label: str,
            progress: bool = True) -> list[dict[str, Any]]:
    """Run every spec not yet in ``results`` (in ``workers`` processes); return all its records."""
    repair_results(results)
    done = {r["key"] for r in read_results(results) if "error" not in r}
    todo = [s for s in specs if s.key not in done]
    if todo:
        _build_models(todo)
        _execute(todo, results, out_dir, workers, label, progress)
    by_key = {r["key"]: r for r in read_results(results)}
    return [by_key[s.key] for s in specs if s.key in by_key]


def _build_models(specs: Iterable[RunSpec]) -> None:
    """Build each task's probe model once, here, before the workers race for it."""
    seen = set()
    for spec in specs:
        if spec.task not in seen:
            seen.add(spec.task)
            probe_model_for(spec)


def _execute(todo: list[RunSpec], results: Path, out_dir: Path, workers: int, label: str, progress: bool) -> None:
    from tqdm import tqdm

    results.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=len(todo), desc=label, unit="run", disable=not progress)
    failed = 0
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"), initializer=_init_worker,
                               initargs=(os.getpid(),))
    try:
        pending = {pool.submit(run_one, spec, str(out_dir)) for spec in todo}
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                record = fut.result()
                failed += "error" in record
                append_result(results, record)
                bar.update(1)
                if failed:
                    bar.set_postfix(failed=failed)
    except BaseException:
        _stop_workers(pool)
        raise
    pool.shutdown()
    bar.close()
    if failed:
        errors = [r for r in read_results(results) if "error" in r][-1:]
        print(f"{failed} run(s) failed; the last: {errors[0]['error'] if errors else '?'} (rerun to retry them)")


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Cancel what has not started and kill what runs: a stopped study stops now, not after its runs."""
    procs = list((getattr(pool, "_processes", None) or {}).values())  # the executor offers no public handle
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()


def stop_on_signals(results: Path) -> dict[int, Any]:
    """Turn SIGTERM into a ``StudyStopped`` in the main thread; returns the handlers it replaced."""
    def stop(signum: int, frame: Any) -> None:
        raise StudyStopped(f"stopped by {signal.Signals(signum).name}: the finished runs are in {results}; "
                           "run the same command again to resume")

    return {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM,)}
