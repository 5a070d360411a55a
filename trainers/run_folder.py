"""Open a run folder so that a run never mixes with another run's files.

A fresh run (``run.resume=false``, or nothing to resume from) starts from a clean folder: the
files that an older run wrote there are removed first, so its checkpoints can neither crowd
out the new ones nor be resumed later. A resumed run must have the config that the folder was
started with, except for the fields in ``MAY_CHANGE_ON_RESUME``; otherwise it is refused with
the list of what changed.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import yaml

from treegym.errors import ConfigError
from treegym.trainers.checkpoint import list_checkpoints
from treegym.trainers.config import TrainConfig, leaf_paths, to_dict
from treegym.trainers.runlog import read_metrics

# What a resume may change: how long to run, where and how often to write, and the device.
# Everything else decides what the run computes, so a change there would resume another run.
MAY_CHANGE_ON_RESUME = frozenset({
    "steps", "token_budget", "tool_budget", "run.out_dir", "run.name", "run.resume", "run.log_every", "run.save_every",
    "run.plots", "run.tensorboard", "run.wandb", "run.trees_html", "run.keep_checkpoints", "model_opts.device",
})  # fmt: skip

# The files and folders a run writes (see treegym.trainers.runlog); only these are ever removed.
RUN_FILES = ("config.yaml", "metrics.jsonl", "metrics.tmp", "summary.json", "trees.html", "phases.json")
RUN_DIRS = ("checkpoints", "tb", "plots", "wandb", "final")


def run_folder_path(cfg: TrainConfig, stamp: str) -> Path:
    name = cfg.run.name or f"{cfg.algo}-{cfg.env.replace(':', '_').replace('/', '_')}-{stamp}"
    return Path(cfg.run.out_dir).expanduser() / name


def open_run_folder(cfg: TrainConfig, stamp: str) -> Path:
    """Create (or check, to resume) the run folder of ``cfg``; write its config.yaml."""
    folder = run_folder_path(cfg, stamp)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"run folder {folder} is a file; choose another run.name or run.out_dir")
    resuming = cfg.run.resume and bool(list_checkpoints(folder / "checkpoints"))
    if resuming:
        changed = config_changes(folder / "config.yaml", cfg)
        if changed:
            raise ConfigError(
                f"run folder {folder} holds a run with another config ({'; '.join(changed)}); resume it with "
                "the same config, set run.resume=false to start it over, or choose another run.name")
    elif has_run_files(folder):
        why = "run.resume=false" if not cfg.run.resume else "it has no checkpoint to resume from"
        warnings.warn(f"starting {folder} over ({why}): removing the old run's files", stacklevel=2)
        clear_run_files(folder)
    (folder / "checkpoints").mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    return folder


def config_changes(saved_path: Path, cfg: TrainConfig) -> list[str]:
    """``["optim.lr: 0.01 -> 0.02", ...]`` for the fields that differ from the saved config and
    may not change on resume; a missing or unreadable saved config is one change."""
    try:
        saved = yaml.safe_load(saved_path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        return [f"its config.yaml cannot be read ({type(exc).__name__})"]
    if not isinstance(saved, dict):
        return ["its config.yaml is not a mapping"]
    now = to_dict(cfg)
    out = []
    for path in leaf_paths():
        if path in MAY_CHANGE_ON_RESUME:
            continue
        old, new = _get(saved, path), _get(now, path)
        if old != new:
            out.append(f"{path}: {'(unset)' if old is _MISSING else repr(old)} -> {new!r}")
    return out


def has_run_files(folder: Path) -> bool:
    return any((folder / name).exists() for name in (*RUN_FILES, *RUN_DIRS))


def clear_run_files(folder: Path) -> None:
    for name in RUN_FILES:
        (folder / name).unlink(missing_ok=True)
    for name in RUN_DIRS:
        if (folder / name).is_dir():
            shutil.rmtree(folder / name)


def remove_if_unused(folder: Path) -> bool:
    """Remove a run folder that a failed run left with nothing in it to keep: no checkpoint and
    no logged training step. Returns whether it was removed."""
    if not folder.is_dir() or list_checkpoints(folder / "checkpoints"):
        return False
    if any(r.get("step", 0) > 0 for r in read_metrics(folder / "metrics.jsonl")):
        return False
    known = {*RUN_FILES, *RUN_DIRS}
    if any(p.name not in known for p in folder.iterdir()):
        return False  # someone else's files: leave the folder alone
    clear_run_files(folder)
    folder.rmdir()
    return True


_MISSING: Any = object()


def _get(data: dict[str, Any], path: str) -> Any:
    obj: Any = data
    for part in path.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return _MISSING
        obj = obj[part]
    return obj
