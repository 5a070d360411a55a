"""A run folder's metrics (``metrics.jsonl``, TensorBoard events in ``tb/``, optional W&B), and
their plots in ``plots/`` (the folder's other files: ``treegym.trainers.run_folder.RUN_FILES``)."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

from treegym.errors import MissingPackageError


class MetricsLog:
    """Append-only metrics sink: JSONL always, TensorBoard and W&B when asked."""

    def __init__(self, folder: Path, resume_step: int, *, tensorboard: bool, wandb: bool, config: dict[str, Any]) -> None:
        """Rows logged after ``resume_step`` are dropped: they belong to steps a resume will redo."""
        self.path = folder / "metrics.jsonl"
        kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        tmp.replace(self.path)
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(folder / "tb"), purge_step=resume_step + 1)
            except ImportError:
                warnings.warn("tensorboard is not installed: metrics go to metrics.jsonl only", stacklevel=2)
        self._wandb = None
        if wandb:
            try:
                import wandb as wb
            except ImportError as exc:
                raise MissingPackageError("wandb", "logging to Weights & Biases (run.wandb=true)") from exc
            self._wandb = wb.init(project="treegym", name=folder.name, config=config, dir=str(folder), resume="allow")

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, **metrics}
        with self.path.open("a") as f:
            f.write(json.dumps(row, default=float) + "\n")
        scalars = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(float(v))}
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


# Names that older runs logged success under: a resumed run reads them as today's.
OLD_NAMES = {"em": "success", "eval_em": "eval_success", "eval_em_t1": "eval_success_t1"}


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of a metrics file (older names read as ``OLD_NAMES`` says). A line that is not
    a JSON object (a run killed mid-append leaves a torn last line) is skipped with a warning:
    the steps it logged are redone."""
    if not path.exists():
        return []
    rows, bad = [], 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict):
            rows.append({OLD_NAMES.get(k, k): v for k, v in row.items()})
        else:
            bad += 1
    if bad:
        warnings.warn(f"{path}: skipped {bad} unreadable line(s) (a torn write?)", stacklevel=2)
    return rows


def _pyplot() -> Any:
    """matplotlib's pyplot on the file-only backend, or None (with a warning) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        warnings.warn("matplotlib is not installed: no plots (pip install matplotlib)", stacklevel=3)
        return None
    return plt


def plot_metrics(folder: Path, keys: tuple[str, ...] = ("reward", "success")) -> list[Path]:
    """Plot each key against step and against cumulative generated tokens; return the files."""
    rows = [r for r in read_metrics(folder / "metrics.jsonl") if "reward" in r]
    plt = _pyplot() if rows else None
    if plt is None:
        return []
    out_dir = folder / "plots"
    out_dir.mkdir(exist_ok=True)
    files = []
    for x_key, x_label in (("step", "step"), ("tokens_total", "generated tokens")):
        fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.5))
        for ax, key in zip(axes if len(keys) > 1 else [axes], keys):
            pts = [(r[x_key], r[key]) for r in rows if key in r and x_key in r]
            if pts:
                ax.plot(*zip(*pts), marker=".")
            ax.set_xlabel(x_label)
            ax.set_ylabel(key)
            ax.grid(alpha=0.3)
        fig.suptitle(folder.name)
        fig.tight_layout()
        path = out_dir / f"{'_'.join(keys)}_vs_{x_key}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        files.append(path)
    return files


def plot_phases(phases: dict[str, Any], path: Path, title: str) -> None:
    """Held-out success of each phase (``heldout.phase_summary``) with its 95% interval."""
    names = list(phases["phases"])
    plt = _pyplot() if names else None
    if plt is None:
        return
    rates = [phases["phases"][n]["success"] for n in names]
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(names), 3.4))
    ax.errorbar(range(len(names)), [e[0] for e in rates],
                yerr=[[e[0] - e[1] for e in rates], [e[2] - e[0] for e in rates]], marker="o", capsize=4)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel(f"held-out EM / success (n={phases['phases'][names[0]]['n']})")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
