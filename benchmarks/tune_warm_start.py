"""Tune the warm start of ``treegym train`` on held-out tasks that the run does not report.

``treegym train`` reports its phases on the first ``eval_n`` tasks of the eval split. This
script trains warm starts with several settings (``--grid``, each ``episodes:epochs:lr:batch``)
and scores each on the *next* ``--n`` tasks of the same split (``--offset``, default 32: the
report's prompts are never used to choose), greedy, by the run's own held-out protocol
(``heldout.run_protocol``: turn budget, turn length, context mode and cap, the env's stops) and
policy (``model.make_policy``), so a tuning figure and the run's figure are measured alike.
It prints success (EM on QA) with its Wilson 95% interval, well-formed actions, SFT time and
label tokens per setting, side by side.

    python benchmarks/tune_warm_start.py --env TextHousehold-v0 \
        --grid 64:1:2e-4:8 64:1:5e-4:4 32:2:5e-4:4
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

import treegym  # noqa: F401  (registers the envs)
from treegym.agents.models import load_model
from treegym.agents.protocol import play_protocol
from treegym.agents.rollout.scoring import heldout_from_batch
from treegym.envs import registry as env_registry
from treegym.stats import paired_difference
from treegym.trainers.config import load_config
from treegym.trainers.heldout import run_protocol
from treegym.trainers.model import make_policy
from treegym.trainers.parallel import decode_bf16
from treegym.trainers.prompts import make_env
from treegym.trainers.sft import run_sft


def _write_traces(tok, batch, path: Path, limit: int = 8) -> None:
    """The first ``limit`` greedy episodes of the tuning batch, as text: what the model does, to read."""
    lines = []
    for tree in batch.trees[:limit]:
        lines.append(tok.decode(tree.prompt_ids).rsplit("Your task is to:", 1)[-1].split("<|")[0].strip())
        for node in tree.nodes:
            if node.turn is not None:
                lines.append(f"{node.turn.action_text!r} -> {node.turn.obs_text[:90]!r}")
        lines.append("")
    path.write_text("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="TextHousehold-v0")
    ap.add_argument("--grid", nargs="*", default=["64:1:2e-4:8"], help="settings, each episodes:epochs:lr:batch (none: only --baseline)")
    ap.add_argument("--n", type=int, default=32, help="tuning tasks")
    ap.add_argument("--offset", type=int, default=32, help="first tuning task in the eval split (the run reports 0..eval_n-1)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the episode draw and shuffling (the default run uses 0)")
    ap.add_argument("--out", default="", help="write the results as JSON here")
    ap.add_argument("--baseline", default="", help="also score this model folder (e.g. the cached warm start) on the same tasks, first")
    ap.add_argument("--each-pass", action="store_true",
                    help="score each setting after every pass too (a learning curve over passes from one SFT run; "
                         "the learning rate still decays over all the setting's passes)")
    ap.add_argument("--keep", default="", help="keep each setting's model and its tuning traces under this folder")
    args = ap.parse_args()

    cfg = load_config(None, [("env", args.env)])
    eval_env = make_env(cfg, cfg.run.eval_split)
    ids = env_registry.task_ids(eval_env)
    prompts = [{"task_id": t} for t in ids[args.offset : args.offset + args.n]]
    protocol = run_protocol(cfg, temperature=0.0)  # the run's, on the tasks after its report's

    def score_model(model, tok):
        with torch.no_grad():
            batch = play_protocol(make_policy(model, tok, seed=args.seed, bf16=decode_bf16(model.device, cfg.model_opts)),
                                  eval_env, prompts, protocol)
        return heldout_from_batch(batch), batch

    rows = []

    def add_row(setting: str, score, note: str, **extra) -> None:
        """One setting's tuning figures: a row of the JSON, and a line printed beside the others."""
        iv = score.intervals()["success"]
        rows.append({"setting": setting, "success": iv.mean, "ci": [iv.low, iv.high], "well_formed": score.mean("well_formed"),
                     "per_task": score.values("success"), **extra})
        print(f"{setting:>16}  success {iv.mean:6.1%} [{iv.low:.1%}, {iv.high:.1%}]  well-formed "
              f"{score.mean('well_formed'):5.1%}  {note}", flush=True)

    if args.baseline:
        add_row("baseline", score_model(*load_model(args.baseline, device="cpu", dtype=torch.float32))[0],
                f"({args.baseline})", model=args.baseline)
    for spec in args.grid:
        episodes, epochs, lr, batch_size = spec.split(":")
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(args.keep) / spec.replace(":", "_") if args.keep else Path(tmp) / "m"
            sft = load_config(None, [("env", args.env), ("sft.out", str(out)), ("sft.episodes", episodes),
                                     ("sft.epochs", epochs), ("sft.lr", lr), ("sft.batch_size", batch_size),
                                     ("sft.micro_batch_size", min(cfg.sft.micro_batch_size, int(batch_size))), ("run.eval_n", 0),
                                     ("seed", args.seed), ("model_opts.device", "cpu")])
            t0 = time.perf_counter()
            scoring = [0.0]  # seconds spent scoring between passes, left out of the SFT time

            def after_pass(k: int, model, tok, spec=spec, epochs=int(epochs), t0=t0, scoring=scoring) -> None:
                if k == epochs:
                    return  # the last pass is scored below, as every setting is
                t = time.perf_counter()
                sft_s = t - t0 - scoring[0]  # SFT so far (the episodes, the passes), without earlier scoring
                got = score_model(model, tok)[0]
                scoring[0] += time.perf_counter() - t
                add_row(f"{spec}@{k}", got, f"after pass {k} of {epochs}", sft_s=sft_s)

            result = run_sft(sft, progress=False, log=lambda *_: None, after_pass=after_pass if args.each_pass else None)
            seconds = time.perf_counter() - t0 - scoring[0]
            model, tok = load_model(str(result.folder), device="cpu", dtype=torch.float32)
            score, batch = score_model(model, tok)
            if args.keep:
                _write_traces(tok, batch, out / "tuning_traces.txt")
        add_row(spec, score, f"kept {result.examples:3d}  sft {seconds:4.0f} s  loss {result.loss_first:.3f} -> {result.loss_last:.3f}",
                examples=result.examples, label_tokens=result.label_tokens, sft_s=seconds, loss_last=result.loss_last)
    if args.baseline:
        for row in rows[1:]:
            d = paired_difference(row["per_task"], rows[0]["per_task"])
            print(f"{row['setting']:>16}  minus baseline: {100 * d.mean:+.1f} pts [{100 * d.low:+.1f}, {100 * d.high:+.1f}] "
                  f"(paired bootstrap over the {len(prompts)} tasks)")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
