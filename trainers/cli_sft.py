"""``treegym sft``: a supervised warm start from expert episodes, saved for ``treegym train --model``."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from treegym.trainers.config import SFTConfig
from treegym.trainers.config_options import add_config_command, config_from_args, env_defaults_text

DESCRIPTION = """\
Supervised warm start before RL. An untrained small model rarely writes a well-formed action,
so every RL reward (and advantage) is 0. This command imitates an expert first:

  1. runs a scripted expert (--expert; auto: the env family's heuristic, which reads only what
     the model sees) on the training split of --env, with the turn budget and length `treegym
     train` uses, or reads --traces (`treegym eval --out DIR`), and keeps the solved episodes;
  2. trains the model with AdamW on the expert's action tokens only, in the RL context format;
  3. saves a Hugging Face model folder (safetensors, tokenizer, sft.json) to --out;
  4. prints success and the share of well-formed actions on --eval-n held-out prompts
     (greedy), before and after.

The options are fields of `treegym train`'s config (the sft section, and the run's own env,
model, sampler, run and model_opts fields): every other field can be set as --section.field=value,
and --config reads a YAML file of them.
"""

EXAMPLES = """\
examples:
  treegym sft --out runs/sft-smollm2               # each option at its default (2 CPU cores: minutes)
  treegym train --model runs/sft-smollm2           # then RL from the warm-started model
  treegym eval --agent runs/sft-smollm2 --env TreeSearchQA-v0 --n 50
  treegym eval --agent oracle --env TreeSearchQA-v0 --split train --n 300 --out traces/
  treegym sft --traces traces/traces.jsonl --out runs/sft-from-traces
"""


# flag -> config field: the sft section's own fields, then the run fields SFT shares with train
FLAGS = {
    **{f.name.replace("_", "-"): f"sft.{f.name}" for f in dataclasses.fields(SFTConfig)},
    "model": "model", "env": "env", "env-kwargs": "env_kwargs", "seed": "seed", "max-turns": "sampler.max_turns",
    "max-new-tokens": "sampler.max_new_tokens", "mode": "sampler.context_mode", "eval-n": "run.eval_n",
    "train-split": "run.train_split", "eval-split": "run.eval_split", "device": "model_opts.device",
    "lora": "model_opts.lora",
}  # fmt: skip


def add_commands(subparsers: Any) -> None:
    add_config_command(subparsers, "sft", FLAGS, run_sft_command, description=DESCRIPTION,
                       help="supervised warm start on expert episodes (then: treegym train --model OUT)",
                       epilog=EXAMPLES + "\n" + env_defaults_text())


def run_sft_command(args: argparse.Namespace) -> int:
    from treegym.trainers.sft import run_sft

    result = run_sft(config_from_args(args, FLAGS), progress=not args.no_progress)
    print(summary_table(result))
    print(f"next: treegym train --model {result.folder}")
    return 0


def summary_table(result: Any) -> str:
    def fig(score: Any, name: str) -> str:
        return "n/a" if score is None else f"{100 * score.mean(name):.1f}%"

    rows = [
        ("episodes", f"{result.examples} (dropped {sum(result.dropped.values())}: {result.dropped})"),
        ("action tokens", f"{result.label_tokens:,}"),
        ("steps", str(result.steps)),
        ("loss first -> last", f"{result.loss_first:.3f} -> {result.loss_last:.3f}"),
        ("success before", fig(result.before, "success")),
        ("success after", fig(result.after, "success")),
        ("well-formed before", fig(result.before, "well_formed")),
        ("well-formed after", fig(result.after, "well_formed")),
        ("time", f"{result.seconds:.0f} s"),
        ("model folder", str(result.folder)),
    ]
    width = max(len(k) for k, _ in rows)
    line = "-" * (width + 3 + max(len(v) for _, v in rows))
    return "\n".join([line, *(f"{k:<{width}}   {v}" for k, v in rows), line])
