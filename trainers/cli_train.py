"""``treegym train``: run GRPO, Tree-GRPO or TreeOPSD from a config, and print a summary table."""

from __future__ import annotations

import argparse
from typing import Any

from treegym.trainers.config_options import add_config_command, config_from_args, env_defaults_text, help_text

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

# flag -> config field; every other field is --section.field=value
FLAGS = {"algo": "algo", "env": "env", "model": "model", "steps": "steps", "seed": "seed", "out": "run.out_dir",
         "name": "run.name"}


def add_commands(subparsers: Any) -> None:
    add_config_command(subparsers, "train", FLAGS, train_command,
                       help="train a policy with GRPO, Tree-GRPO or TreeOPSD",
                       description="Train an LLM agent on a forkable env. Writes a run folder (config, metrics.jsonl, "
                       "TensorBoard events, checkpoints, plots, trees.html) and resumes from its latest checkpoint.",
                       epilog=EXAMPLES.format(env_defaults=env_defaults_text()) + help_text())


def train_command(args: argparse.Namespace) -> int:
    from treegym.trainers.recipe import train_with_recipe

    summary = train_with_recipe(config_from_args(args, FLAGS), progress=not args.no_progress)
    if summary:
        print(summary)
    return 0
