"""``treegym train``: run GRPO, Tree-GRPO or TreeOPSD from a config, and print a summary table."""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path
from typing import Any

from treegym.envs.registry import score_name
from treegym.trainers.config import env_defaults_text, help_text, load_config, parse_overrides

EXAMPLES = """\
examples:
  treegym train                                   # Tree-GRPO, TreeSearchQA-v0, SmolLM2-135M (CPU: < 10 min)
  treegym train --algo grpo --steps 20 --optim.lr=1e-5
  treegym train --algo treeopsd --config my.yaml --loss.beta=0.5
  torchrun --nproc_per_node 2 -m treegym.cli train --algo grpo   # data-parallel replicas
  treegym train --env TextHousehold-v0            # household, on its family defaults (below)
  treegym train --env WebSearchQA-v0              # web: search, browse, answer

{env_defaults}
Every config field can be overridden as --section.field=value (or --field=value when the
name is unique). Fields, with their defaults:
"""


def add_commands(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a policy with GRPO, Tree-GRPO or TreeOPSD",
        description="Train an LLM agent on a forkable env. Writes a run folder (config, metrics.jsonl, "
        "TensorBoard events, checkpoints, plots, trees.html) and resumes from its latest checkpoint.",
        epilog=EXAMPLES.format(env_defaults=env_defaults_text()) + help_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--algo", choices=["grpo", "tree-grpo", "treeopsd"], help="algorithm (default: tree-grpo)")
    p.add_argument("--env", help="env id, or module:Class (default: TreeSearchQA-v0)")
    p.add_argument("--model", help="smollm2, or a local HF model folder (default: smollm2)")
    p.add_argument("--config", help="YAML file of config fields (nested by section)")
    p.add_argument("--steps", type=int, help="training steps")
    p.add_argument("--seed", type=int, help="seed")
    p.add_argument("--out", help="folder for run folders (run.out_dir)")
    p.add_argument("--name", help="run folder name; an existing run of that name is resumed")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_train, accepts_overrides=True)


def run_train(args: argparse.Namespace) -> int:
    from treegym.trainers import engines
    from treegym.trainers import runtime as rt
    from treegym.trainers.loop import train
    from treegym.trainers.recipe import wants_warm_start, warm_start

    overrides: list[tuple[str, Any]] = []
    for key, path in (("algo", "algo"), ("env", "env"), ("model", "model"), ("steps", "steps"),
                      ("seed", "seed"), ("out", "run.out_dir"), ("name", "run.name")):  # fmt: skip
        value = getattr(args, key)
        if value is not None:
            overrides.append((path, value))
    overrides += parse_overrides(getattr(args, "overrides", []) or [])
    cfg = load_config(args.config, overrides)
    rt.preflight(cfg)
    engines.preflight(cfg)  # e.g. sampler.backend=vllm without vllm: before a warm start
    main = int(os.environ.get("RANK", "0")) == 0
    base_model = cfg.model
    ws = None
    if wants_warm_start(cfg):
        ws = warm_start(cfg, progress=not args.no_progress, log=print if main else (lambda *_: None))
        cfg.model = str(ws.folder)
    result = train(cfg, progress=not args.no_progress)
    if main and not cfg.run.keep_checkpoints:
        # The run is finished: its resumable state (optimiser included) is no longer needed.
        shutil.rmtree(Path(result.folder) / "checkpoints", ignore_errors=True)
    if main:
        phases = phase_summary(result, ws)
        (result.folder / "phases.json").write_text(json.dumps(phases, indent=2) + "\n")
        plot_phases(phases, Path(result.folder) / "plots" / "phases.png", f"{cfg.algo} on {cfg.env}")
        print(summary_table(cfg, base_model, result, ws, phases))
    return 0


def _iv(iv: Any) -> list[float]:
    return [iv.mean, iv.low, iv.high]


def phase_summary(result: Any, ws: Any) -> dict[str, Any]:
    """Held-out EM (or success), well-formed rate and tool calls per phase, with 95% intervals,
    and each phase's paired gain on the same prompts, of the score (``gains``) and of the
    well-formed rate (``well_formed_gains``)."""
    from treegym.trainers.heldout import paired_difference

    stages = [("untrained", ws.untrained if ws is not None else None),
              ("after warm start" if ws is not None else "before RL", result.eval_before),
              ("after RL", result.eval_after)]  # fmt: skip
    out: dict[str, Any] = {"phases": {}, "gains": {}, "well_formed_gains": {}}
    for name, h in stages:
        if h is not None:
            iv = h.intervals()
            out["phases"][name] = {"n": h.n, "em": _iv(iv["em"]), "well_formed": _iv(iv["well_formed"]),
                                   "tool_calls": _iv(iv["tool_calls"])}  # fmt: skip
    got = [(n, h) for n, h in stages if h is not None]
    pairs = list(zip(got, got[1:]))
    if len(got) > 2:
        pairs.append((got[0], got[-1]))
    for (n0, h0), (n1, h1) in pairs:
        if h0.n == h1.n:
            out["gains"][f"{n0} -> {n1}"] = _iv(paired_difference(h1, h0))
            out["well_formed_gains"][f"{n0} -> {n1}"] = _iv(paired_difference(h1, h0, "well_formed"))
    return out


def plot_phases(phases: dict[str, Any], path: Path, title: str) -> None:
    """Held-out EM (success) of each phase with its 95% interval: what each phase contributed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(phases["phases"])
    if not names:
        return
    ems = [phases["phases"][n]["em"] for n in names]
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(names), 3.4))
    ax.errorbar(range(len(names)), [e[0] for e in ems], yerr=[[e[0] - e[1] for e in ems], [e[2] - e[0] for e in ems]],
                marker="o", capsize=4)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel(f"held-out EM / success (n={phases['phases'][names[0]]['n']})")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_table(cfg: Any, base_model: str, result: Any, ws: Any, phases: dict[str, Any]) -> str:
    def pct(v: list[float]) -> str:
        return f"{100 * v[0]:5.1f}% [{100 * v[1]:.1f}, {100 * v[2]:.1f}]"

    def pts(v: list[float]) -> str:
        return f"{100 * v[0]:+.1f} pts [{100 * v[1]:+.1f}, {100 * v[2]:+.1f}]"

    metric = score_name(cfg.env)
    warm = "" if ws is None else (f" after a warm start on {ws.examples} expert episodes "
                                  f"({'cached' if ws.cached else f'built in {ws.seconds:.0f} s'})")
    rows = [("algorithm", f"{cfg.algo}{warm}"), ("env / model", f"{cfg.env} / {base_model}"),
            ("steps / tokens", f"{result.steps} / {result.tokens_total:,} generated")]
    table = []
    for name, p in phases["phases"].items():
        table.append((f"{metric} {name}", f"{pct(p['em'])}  well-formed {100 * p['well_formed'][0]:.0f}%, "
                                          f"tool calls/episode {p['tool_calls'][0]:.2f}  (n={p['n']})"))
    for name, g in phases["gains"].items():
        wf = phases.get("well_formed_gains", {}).get(name)
        table.append((f"gain {name}", pts(g) + (f"  well-formed {pts(wf)}" if wf else "")))
    rows += table
    rows += [("time (RL phase)", f"{result.seconds:.0f} s"), ("run folder", str(result.folder))]
    final = Path(result.folder) / "final"
    if final.exists():
        rows.append(("trained policy", f"{final}  (treegym eval --agent {final})"))
    width = max(len(k) for k, _ in rows)
    line = "-" * (width + 3 + max(len(v) for _, v in rows))
    note = "(95% intervals: Wilson for EM, paired bootstrap over the same held-out prompts for gains)"
    return "\n".join([line, *(f"{k:<{width}}   {v}" for k, v in rows), note, line])
