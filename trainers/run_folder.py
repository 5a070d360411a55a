"""Open a run folder so that a run never mixes with another run's files, nor touches files
that are not a run's.

- A run folder is ``run.out_dir/run.name``, and the name is a relative path without ``..``
  (the study nests ``phase/method`` names): an absolute path, a ``..`` or a symlink cannot
  take a run (or its clean-up) outside ``run.out_dir``.
- A fresh run (``run.resume=false``, or nothing to resume from) starts from a clean folder: the
  files that an older run wrote there are removed first, so its checkpoints can neither crowd
  out the new ones nor be resumed later. Only what the folder's manifest (``MANIFEST``, written
  by treegym when it made the folder) lists is removed; a folder with run-like files and no
  manifest is someone else's, and is refused.
- A running run holds the folder's lock (``LOCK``, an ``flock`` that dies with its process), so
  a second run of the same name is refused at once instead of interleaving with the first.
- Nothing is written through a symlink: the lock, the manifest and ``config.yaml`` are opened
  with ``O_NOFOLLOW``, and a folder where any name a run writes is a symlink is refused before
  anything is written, so a planted link cannot make a run overwrite a file outside ``out_dir``.
- A resumed run must have the config that the folder was started with, except for the fields
  in ``MAY_CHANGE_ON_RESUME``; otherwise it is refused with the list of what changed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from treegym.errors import ConfigError
from treegym.trainers.checkpoint import list_checkpoints
from treegym.trainers.config import TrainConfig, get_path, leaf_paths
from treegym.trainers.metrics import read_metrics

# What a resume may change: how long to run, where and how often to write, and the device.
# Everything else decides what the run computes, so a change there would resume another run.
MAY_CHANGE_ON_RESUME = frozenset({
    "steps", "token_budget", "tool_budget", "run.out_dir", "run.name", "run.resume", "run.log_every", "run.save_every",
    "run.plots", "run.tensorboard", "run.wandb", "run.trees_html", "run.keep_checkpoints", "model_opts.device",
})  # fmt: skip

# The files and folders a run writes (its metrics, plots, checkpoints, final weights); only these are ever removed.
RUN_FILES = ("config.yaml", "metrics.jsonl", "metrics.tmp", "summary.json", "trees.html", "phases.json")
RUN_DIRS = ("checkpoints", "tb", "plots", "wandb", "final")
MANIFEST = ".treegym-run.json"  # what treegym writes in this folder: the only names it ever removes
LOCK = ".treegym-run.lock"  # held by the run that is writing the folder now


class RunLock:
    """The folder's lock, held until ``release`` (or the process's death: the OS drops it)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / LOCK
        self._fd: int | None = open_no_symlink(self.path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(self._fd, 32, 0).decode("ascii", "replace").strip() or "?"
            os.close(self._fd)
            self._fd = None
            raise ConfigError(f"run folder {folder} is in use by another run (pid {holder}); wait for it to "
                              "finish, or choose another run.name") from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, str(os.getpid()).encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None


def open_no_symlink(path: Path, flags: int) -> int:
    """``os.open(path, flags | O_NOFOLLOW)``; a symlink there is a clear ``ConfigError``."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(_link_message(path)) from None
        raise


def write_no_symlink(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (created or truncated), never through a symlink."""
    fd = open_no_symlink(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def _link_message(path: Path) -> str:
    return (f"{path} is a symbolic link: treegym writes nothing in a run folder through a link (it could lead "
            "outside run.out_dir); remove it, or choose another run.name")


def refuse_symlinks(folder: Path) -> None:
    """Refuse ``folder`` if any name a run writes there is a symlink."""
    for name in (LOCK, MANIFEST, *RUN_FILES, *RUN_DIRS):
        if (folder / name).is_symlink():
            raise ConfigError(_link_message(folder / name))


def run_folder_path(cfg: TrainConfig, stamp: str) -> Path:
    """``run.out_dir/run.name`` (a stamped default name); a name that would leave ``out_dir`` is refused."""
    name = cfg.run.name or f"{cfg.algo}-{cfg.env.replace(':', '_').replace('/', '_')}-{stamp}"
    parts = Path(name).parts
    if not parts or Path(name).is_absolute() or ".." in parts or "\\" in name or name.startswith("~"):
        raise ConfigError(f"run.name must be a relative folder name inside run.out_dir (no absolute path, '..', "
                          f"'~' or '\\'), got {name!r}; set run.out_dir to choose where runs go")  # fmt: skip
    if any(len(part.encode("utf-8", "surrogateescape")) > 255 for part in parts):
        raise ConfigError(f"run.name {name[:60]!r}... has a folder name over 255 bytes, more than a file system holds")
    out = Path(cfg.run.out_dir).expanduser()
    folder = out / name
    if not folder.resolve().is_relative_to(out.resolve()):  # a symlink out of it
        raise ConfigError(f"run folder {folder} leads outside run.out_dir ({out}); choose another run.name")
    return folder


def refuse_unmakeable(folder: Path) -> None:
    """Refuse a run folder that is a file, or lies under one (checked before anything is loaded)."""
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"run folder {folder} is a file; choose another run.name or run.out_dir")
    parent = folder.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if parent.exists() and not parent.is_dir():
        raise ConfigError(f"cannot make run folder {folder} (Not a directory): {parent} is a file")


def open_run_folder(cfg: TrainConfig, stamp: str) -> tuple[Path, RunLock]:
    """Create (or check, to resume) the run folder of ``cfg`` and lock it; write its manifest
    and config.yaml. The caller releases the lock when the run ends."""
    folder = run_folder_path(cfg, stamp)
    refuse_unmakeable(folder)
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # under a file, not allowed, too deep
        raise ConfigError(f"cannot make run folder {str(folder)[:160]} ({exc.strerror or exc}); choose another "
                          "run.name or run.out_dir") from None
    try:
        refuse_symlinks(folder)
    except ConfigError:
        if created:
            _remove_empty(folder)
        raise
    new_lock = not (folder / LOCK).exists()
    lock = None
    try:
        lock = RunLock(folder)
        _prepare(cfg, folder)
    except BaseException:
        if lock is not None:
            lock.release()
            if new_lock:  # a refused run leaves no trace in a folder that is not a run's
                (folder / LOCK).unlink(missing_ok=True)
        if created:
            _remove_empty(folder)
        raise
    return folder, lock


def _prepare(cfg: TrainConfig, folder: Path) -> None:
    resuming = cfg.run.resume and bool(list_checkpoints(folder / "checkpoints"))
    if resuming:
        changed = config_changes(folder / "config.yaml", cfg)
        if changed:
            raise ConfigError(
                f"run folder {folder} holds a run with another config ({'; '.join(changed)}); resume it with "
                "the same config, set run.resume=false to start it over, or choose another run.name")
    elif any((folder / name).exists() for name in (*RUN_FILES, *RUN_DIRS)):
        if not (folder / MANIFEST).is_file():
            raise ConfigError(f"{folder} holds files that treegym did not write there (it has no {MANIFEST}); "
                              "choose another run.name, or move them away")  # fmt: skip
        why = "run.resume=false" if not cfg.run.resume else "it has no checkpoint to resume from"
        warnings.warn(f"starting {folder} over ({why}): removing the old run's files", stacklevel=3)
        clear_run_files(folder)
    write_no_symlink(folder / MANIFEST, json.dumps({"written_by": "treegym", "files": [*RUN_FILES, *RUN_DIRS]}) + "\n")
    (folder / "checkpoints").mkdir(parents=True, exist_ok=True)
    write_no_symlink(folder / "config.yaml", yaml.safe_dump(asdict(cfg), sort_keys=False))


def config_changes(saved_path: Path, cfg: TrainConfig) -> list[str]:
    """``["optim.lr: 0.01 -> 0.02", ...]`` for the fields that differ from the saved config and
    may not change on resume; a missing or unreadable saved config is one change."""
    try:
        saved = yaml.safe_load(saved_path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        return [f"its config.yaml cannot be read ({type(exc).__name__})"]
    if not isinstance(saved, dict):
        return ["its config.yaml is not a mapping"]
    out = []
    for path in leaf_paths():
        if path in MAY_CHANGE_ON_RESUME:
            continue
        old, new = _get(saved, path), get_path(cfg, path)
        if old != new:
            out.append(f"{path}: {'(unset)' if old is _MISSING else repr(old)} -> {new!r}")
    return out


def written_by_treegym(folder: Path) -> set[str]:
    """The names the folder's manifest says treegym wrote (only names a run writes; none without one)."""
    try:
        listed = json.loads((folder / MANIFEST).read_text()).get("files", [])
    except (OSError, ValueError, AttributeError):
        return set()
    return {n for n in listed if isinstance(n, str)} & {*RUN_FILES, *RUN_DIRS}


def clear_run_files(folder: Path) -> None:
    """Remove what the manifest lists (a symlink is removed, never followed)."""
    for name in sorted(written_by_treegym(folder)):
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def _remove_empty(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not empty: not ours to remove
        folder.rmdir()


def remove_if_unused(folder: Path) -> bool:
    """Remove a run folder that a failed run left with nothing in it to keep: no checkpoint and
    no logged training step. Returns whether it was removed."""
    if not folder.is_dir() or list_checkpoints(folder / "checkpoints"):
        return False
    if any(r.get("step", 0) > 0 for r in read_metrics(folder / "metrics.jsonl")):
        return False
    known = written_by_treegym(folder) | {MANIFEST, LOCK}
    if any(p.name not in known for p in folder.iterdir()):
        return False  # someone else's files: leave the folder alone
    clear_run_files(folder)
    (folder / MANIFEST).unlink(missing_ok=True)
    (folder / LOCK).unlink(missing_ok=True)
    _remove_empty(folder)
    return not folder.exists()


_MISSING: Any = object()


def _get(data: dict[str, Any], path: str) -> Any:
    obj: Any = data
    for part in path.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return _MISSING
        obj = obj[part]
    return obj
