"""The RL step as an older commit's code takes it, on the same workload: the baseline a speed target
names when it says "faster than today".

``bench_rl_step.py --baseline-commit REV`` runs this: the commit's tree is unpacked (``git archive``)
into a temporary folder laid out as the installed package, and this script runs there in a child
process with that tree first on ``sys.path``, so ``treegym`` is the old code. It takes the run's
workload from the parent (``--workload``: the current config's prompts, seed, algorithm, tree shape,
sampler, advantage and loss fields, each applied where the old config has the field; the old code keeps
its own update settings: micro-batch, optimiser, precision), samples the first step ``--reps`` times from
the same generator state, updates the sampled batch from the same weights ``--reps`` times, and prints
one JSON line: seconds of each, tokens, and which workload fields the old config lacked.

    python benchmarks/bench_rl_step.py --baseline-commit 1298b91     # the usual way
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

# Fields that describe the workload (what is sampled and what the loss is), copied from the parent.
WORKLOAD = ("algo", "env", "env_kwargs", "seed", "prompts_per_step", "sampler.", "advantage.", "loss.",
            "optim.lr", "optim.mini_batch_size", "optim.ppo_epochs", "optim.max_grad_norm", "optim.weight_decay")


def workload(cfg: Any) -> dict[str, Any]:
    """The current config's workload fields, by dotted path (JSON-safe values only)."""
    from treegym.trainers.config import get_path, leaf_paths

    out = {}
    for path in leaf_paths():
        if path.startswith(WORKLOAD) or path in WORKLOAD:
            value = get_path(cfg, path)
            if isinstance(value, (bool, int, float, str, dict)):
                out[path] = value
    return out


def unpack(repo: Path, rev: str, into: Path) -> Path:
    """The tree of ``rev`` under ``into/src`` and an importable layout of it under ``into/site``
    (``treegym.X`` at each of the commit's ``package-dir`` folders). Returns the site folder."""
    try:
        tar = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", rev], check=True,
                             capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        err = getattr(exc, "stderr", b"") or b""
        raise SystemExit(f"step_at_commit: cannot read commit {rev!r} from {repo}: "
                         f"{err.decode(errors='replace').strip() or exc}") from None
    src, site = into / "src", into / "site"
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        try:
            archive.extractall(src, filter="data")
        except TypeError:  # a Python without extraction filters (before 3.10.12 / 3.11.4); git's own archive
            archive.extractall(src)
    # package-dir is one inline table in every commit's pyproject.toml (tomllib is Python 3.11+)
    line = next((ln for ln in (src / "pyproject.toml").read_text().splitlines() if ln.startswith("package-dir")), "")
    mapping = dict(re.findall(r'"([\w.]+)"\s*=\s*"([\w./-]+)"', line)) or {"treegym": "treegym"}
    root = site / "treegym"
    shutil.copytree(src / mapping.get("treegym", "treegym"), root)
    for name, folder in mapping.items():
        if name != "treegym":
            target = root.joinpath(*name.split(".")[1:])
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(src / folder, target)
    return site


def run_at_commit(repo: Path, rev: str, model: str, cfg: Any, reps: int, threads: int) -> dict[str, Any]:
    """This script, as a child process on the code of ``rev``, on ``cfg``'s workload from ``model``."""
    with tempfile.TemporaryDirectory(prefix="treegym-rev-") as tmp:
        site = unpack(repo, rev, Path(tmp))
        spec = Path(tmp) / "workload.json"
        spec.write_text(json.dumps(workload(cfg)))
        # The old code gets a home of its own (a copy of the built datasets and indexes), so nothing it
        # writes can touch the caches the current code has sealed.
        from treegym.paths import home

        own = Path(tmp) / "home"
        own.mkdir()
        for name in ("datasets", "indexes"):
            if (home() / name).is_dir():
                shutil.copytree(home() / name, own / name, symlinks=True)
        env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": str(threads), "TREEGYM_HOME": str(own)}
        proc = subprocess.run([sys.executable, __file__, "--child", "--model", model, "--workload", str(spec),
                               "--reps", str(reps), "--threads", str(threads)],
                              env=env, capture_output=True, text=True, cwd=tmp)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode or not lines:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise SystemExit(f"step_at_commit: the step at {rev} failed (exit {proc.returncode}):\n{tail}")
        return {"commit": subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", rev], capture_output=True,
                                         text=True).stdout.strip(), **json.loads(lines[-1])}


def child(model: str, spec: Path, reps: int, threads: int) -> None:
    import statistics

    import torch

    import treegym
    from treegym.trainers import loop
    from treegym.trainers.config import leaf_paths, load_config
    from treegym.trainers.parallel import Dist

    torch.set_num_threads(threads)
    for module in (treegym, loop):
        code = Path(module.__file__).resolve()
        if not code.is_relative_to(Path.cwd().resolve()):
            raise SystemExit(f"step_at_commit: imported {module.__name__} from {code}, not the unpacked commit")
    wanted = {**json.loads(spec.read_text()), "run.eval_n": 0, "run.tensorboard": False, "run.plots": False,
              "run.trees_html": False, "run.resume": False}
    known = leaf_paths()
    missing = sorted(k for k in wanted if k not in known)
    cfg = load_config(overrides=[(k, v) for k, v in wanted.items() if k in known])
    cfg = dataclasses.replace(cfg, model=model)
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(sys.stderr):
        run = loop.setup(cfg, Path(tmp), Dist(), torch.device("cpu"))
        policy = run.engine.policy
        fresh = policy.generator.get_state()
        samples = []
        for _ in range(reps):
            if hasattr(policy, "clear_cache"):
                policy.clear_cache()
            policy.generator.set_state(fresh)
            run.state.data_position = 0
            t0 = time.perf_counter()
            batch = loop.sample(run)
            samples.append((time.perf_counter() - t0, batch.budget.generated_tokens, batch.budget.prefill_tokens))
        weights = copy.deepcopy(run.model.state_dict())
        optimizer_state = copy.deepcopy(run.updater.optimizer.state_dict())
        updates = []
        for _ in range(reps):
            run.model.load_state_dict(weights)
            run.updater.optimizer.load_state_dict(optimizer_state)
            for p in run.updater.params:  # AdamW's state made by one step on zero gradients, as from step 2 on
                p.grad = torch.zeros_like(p)
            run.updater.optimizer.step()
            run.updater.optimizer.zero_grad(set_to_none=True)
            run.sample_seconds = 0.0
            torch.manual_seed(0)
            t0 = time.perf_counter()
            metrics = loop.train_step(run, batch)
            updates.append(time.perf_counter() - t0)
    print(json.dumps({
        "sample_seconds": statistics.median(s for s, _, _ in samples), "samples": samples,
        "update_seconds": statistics.median(updates), "updates": updates,
        "generated_tokens": batch.budget.generated_tokens, "prefill_tokens": batch.budget.prefill_tokens,
        "trajectories": len(batch.rollouts), "micro_batch_size": cfg.optim.micro_batch_size,
        "trainer_tokens": int(metrics.get("trainer_tokens", 0)), "fields_missing_at_commit": missing,
        "threads": torch.get_num_threads(),
    }))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", required=True, help="model folder both steps start from")
    parser.add_argument("--workload", default="", help="JSON of workload fields (the parent writes it)")
    parser.add_argument("--rev", default="", help="commit whose code takes the step (standalone use)")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: all cores)")
    args = parser.parse_args()
    threads = args.threads or os.cpu_count() or 1
    if args.child:
        child(args.model, Path(args.workload), args.reps, threads)
        return
    if not args.rev:
        raise SystemExit("step_at_commit: give --rev (or run bench_rl_step.py --baseline-commit REV)")
    from treegym.trainers.config import load_config

    print(json.dumps(run_at_commit(Path(__file__).resolve().parents[1], args.rev, args.model, load_config(),
                                   args.reps, threads), indent=2))


if __name__ == "__main__":
    main()
