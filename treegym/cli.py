"""The ``treegym`` command line: one subcommand per job, each defined next to its code."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from treegym import cli_bench
from treegym.agents import cli_eval, cli_serve
from treegym.envs import cli_play
from treegym.envs.web import cli_web
from treegym.errors import TreegymError
from treegym.integrations import cli_serve_env
from treegym.retrieval_index import cli_data, cli_index
from treegym.study import cli_study
from treegym.trainers import cli_sft, cli_train

# Each module defines ``add_commands(subparsers)``; every parser it adds sets ``func``.
COMMAND_MODULES = [cli_play, cli_bench, cli_index, cli_data, cli_web, cli_train, cli_sft, cli_eval, cli_serve,
                   cli_study, cli_serve_env]


class Parser(argparse.ArgumentParser):
    """argparse with its errors on one line, as treegym's own (the usage is one ``--help`` away).
    Subcommand parsers are made of this class too (``add_subparsers`` uses the parent's)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="treegym",
        description="Forkable ReAct environments and tree-search RL trainers for LLM agents.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.add_commands(sub)
    return parser


def os_error_line(exc: OSError) -> str:
    """One line for an OSError: what the OS said, and about which path (shortened)."""
    what = exc.strerror or str(exc) or type(exc).__name__
    name = exc.filename if exc.filename is not None else None
    if name is None:
        return what
    text = str(name)
    return f"{what}: {text if len(text) <= 120 else text[:100] + '...'}"


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
    except OSError as exc:  # a path the user gave that cannot be used: too long, under a file, not allowed
        print(f"treegym {args.command}: error: {os_error_line(exc)}", file=sys.stderr)
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
