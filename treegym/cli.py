"""The ``treegym`` command line: one subcommand per job, each defined next to its code."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from treegym.errors import TreegymError

# Each module defines ``add_commands(subparsers)``; every parser it adds sets ``func``.
COMMAND_MODULES = [
    "treegym.envs.cli_play",
    "treegym.cli_bench",
    "treegym.retrieval_index.cli_index",
    "treegym.retrieval_index.cli_data",
    "treegym.envs.web.cli_web",
    "treegym.trainers.cli_train",
    "treegym.trainers.cli_sft",
    "treegym.agents.cli_eval",
    "treegym.agents.cli_serve",
    "treegym.study.cli_study",
    "treegym.integrations.cli_serve_env",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="treegym",
        description="Forkable ReAct environments and tree-search RL trainers for LLM agents.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    # Commands that take free-form config overrides (--section.field=value) get the rest.
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "accepts_overrides", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.overrides = extra
    if not getattr(args, "func", None):
        parser.print_help()
        return 0 if args.command is None else 2
    try:
        code = int(args.func(args) or 0)
    except TreegymError as exc:
        print(f"treegym {args.command}: error: {exc}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print(f"treegym {args.command}: interrupted", file=sys.stderr)
        code = 130
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and argv is None:
        # One process of a torchrun job, done and with every file written and closed: leave now.
        # The interpreter's own teardown can destroy gloo's C++ threads while they are joinable,
        # which aborts the process (SIGABRT, "terminate called without an active exception")
        # after a run that succeeded, and torchrun then reports the whole job as failed.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
