"""Checkpoints that make a run resumable exactly: model, optimiser, RNG streams, data position.

A checkpoint is one file ``checkpoints/step_N.pt`` written atomically (temp file, then
rename), so an interrupted save never leaves a half-file that a resume would pick up. It holds
tensors and plain data only (numpy's RNG state as a list of ints), and is read with
``torch.load(weights_only=True)``: a crafted checkpoint cannot run code when a run resumes.
``save_policy`` writes what a finished run keeps: the weights alone, as a HF folder.
"""

from __future__ import annotations

import os
import pickle
import random
import re
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from treegym.errors import TreegymError
from treegym.trainers import parallel
from treegym.trainers.model import trainable_names


class CheckpointError(TreegymError):
    """A checkpoint file cannot be read, or does not fit the model being trained."""


@dataclass
class TrainState:
    """What the loop carries between steps besides the weights."""

    step: int = 0  # steps completed
    data_position: int = 0  # prompts consumed from the training stream
    tokens_total: int = 0  # generated tokens so far (the rollout budget)
    nonfinite_streak: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def rng_state(generators: dict[str, torch.Generator]) -> dict[str, Any]:
    """Every RNG stream of this process: global ones, plus named private generators."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    numpy_state = (kind, [int(k) for k in keys], int(pos), int(has_gauss), float(gauss))  # no ndarray: loads safely
    state: dict[str, Any] = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    state["generators"] = {k: g.get_state() for k, g in generators.items()}
    return state


def set_rng_state(state: dict[str, Any], generators: dict[str, torch.Generator] | None = None) -> None:
    random.setstate(state["python"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    for k, g in (generators or {}).items():
        if k in state.get("generators", {}):
            g.set_state(state["generators"][k])


def save_checkpoint(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    state: TrainState, rngs: list[dict[str, Any]], keep: int = 2, *,
                    gathered: tuple[dict[str, Any], dict[str, Any]] | None = None) -> Path:
    """Write ``step_N.pt``; ``rngs`` holds every process's RNG state (``rng_state``), by rank.

    ``gathered``: the full weights and optimiser state of a sharded (FSDP) model, as
    ``treegym.trainers.parallel.checkpoint_state`` gathered them on this process.
    """
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step_{state.step}.pt"
    tmp = folder / f".step_{state.step}.pt.tmp"
    if gathered is None:  # an unsharded model: the weights that training changes, copied to the CPU
        names = trainable_names(model)
        gathered = ({k: v.detach().cpu().clone() for k, v in model.state_dict().items() if k in names},
                    optimizer.state_dict())
    weights, optim_state = gathered
    with tmp.open("wb") as f:
        torch.save({"model": weights, "optimizer": optim_state, "rng": rngs, "state": state.__dict__}, f)
        f.flush()
        os.fsync(f.fileno())  # a crash after the rename must not leave an empty file under the name
    os.replace(tmp, path)
    for old in list_checkpoints(folder)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def list_checkpoints(folder: Path) -> list[Path]:
    """Checkpoint files in ``folder``, oldest first."""
    if not folder.is_dir():
        return []
    found = [p for p in folder.glob("step_*.pt") if p.stem.split("_", 1)[1].isdigit()]
    return sorted(found, key=lambda p: int(p.stem.split("_", 1)[1]))


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int = 0,
                    generators: dict[str, torch.Generator] | None = None) -> TrainState:
    """Restore weights, optimiser and RNG from ``path``; return the loop state to continue from."""
    try:
        data = _load_plain_data(path)
        if not isinstance(data, dict) or not {"model", "optimizer", "rng", "state"} <= set(data):
            raise ValueError("not a treegym checkpoint")
        missing = trainable_names(model) - set(data["model"])
        if missing:
            raise KeyError(f"weights missing for {sorted(missing)[:3]}")
        rngs = data["rng"]
        state = TrainState(**data["state"])
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        if found:  # weights_only refused a callable: say which, in one line
            raise CheckpointError(f"checkpoint {path} holds more than tensors and plain data ({found.group(1)}), so it "
                                  "is not loaded (a checkpoint may not run code); delete it to resume from an older "
                                  "one") from None
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise CheckpointError(f"checkpoint {path} cannot be loaded (UnpicklingError: {first}); delete it to resume "
                              "from an older one") from None
    except Exception as exc:  # torch.load of a torn or foreign file raises almost anything
        raise CheckpointError(f"checkpoint {path} cannot be loaded ({type(exc).__name__}: {exc}); "
                              "delete it to resume from an older one") from exc
    if rank >= len(rngs):
        raise TreegymError(f"checkpoint {path} was written by {len(rngs)} processes; resume it with as many")
    try:
        if parallel.is_sharded(model):
            parallel.load_checkpoint_state(model, optimizer, data["model"], data["optimizer"])
        else:
            model.load_state_dict(data["model"], strict=False)
            optimizer.load_state_dict(data["optimizer"])
    except (RuntimeError, KeyError, ValueError, TypeError, AssertionError) as exc:
        raise CheckpointError(f"checkpoint {path} does not fit this model or optimiser ({exc}); "
                              "resume with the config it was written with") from exc
    set_rng_state(rngs[rank], generators)
    return state


def _load_plain_data(path: Path) -> Any:
    """``torch.load`` of tensors and plain data only: a pickle that names any other callable is
    refused before anything in it runs. Checkpoints written before numpy's RNG state was a list
    hold numpy arrays; these alone are allowed besides (an array is data, not code)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "numpy" not in str(exc):
            raise
    multiarray = np._core.multiarray if hasattr(np, "_core") else np.core.multiarray  # numpy 2, numpy 1
    arrays = [multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    with torch.serialization.safe_globals(arrays):
        return torch.load(path, map_location="cpu", weights_only=True)


def load_latest_checkpoint(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int = 0,
                           generators: dict[str, torch.Generator] | None = None) -> tuple[TrainState, Path] | None:
    """Load the newest readable checkpoint in ``folder`` (None when there is none). An
    unreadable newer one (empty, torn, garbage) is skipped with a warning; when every one is
    unreadable, raise a CheckpointError naming them."""
    found = list_checkpoints(folder)
    errors = []
    for path in reversed(found):
        try:
            state = load_checkpoint(path, model, optimizer, rank, generators)
        except CheckpointError as exc:
            errors.append(str(exc))
            continue
        for err in errors:
            warnings.warn(f"{err}; resuming from {path.name} instead", stacklevel=2)
        return state, path
    if errors:
        raise CheckpointError(f"no checkpoint in {folder} can be loaded: {'; '.join(errors)}. Delete them (or "
                              "set run.resume=false) to start the run over")
    return None


def save_policy(model: torch.nn.Module, tokenizer: Any, folder: Path) -> Path:
    """The trained policy as a HF folder that ``--model`` loads: weights only (LoRA: the adapters)."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return folder
