"""The README is a front door: at most 250 lines, and every ``treegym`` command it shows parses."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from treegym.cli import build_parser
from treegym.trainers.cli_train import FLAGS as TRAIN_FLAGS
from treegym.trainers.config import load_config, parse_overrides
from treegym.trainers.config_options import given_overrides

README = Path(__file__).resolve().parents[1] / "README.md"
MAX_LINES = 250


def readme_commands() -> list[list[str]]:
    """Each ``treegym ...`` command in the README's code blocks and inline code, as argv (without
    ``treegym``); ``torchrun ... -m treegym.cli ARGS`` counts as ``treegym ARGS``."""
    text = README.read_text()
    lines, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif fenced or line.startswith("    "):  # a fenced or an indented block
            lines.append(line)
        else:
            lines += re.findall(r"`([^`]*treegym [^`]*)`", line)
    out = []
    for line in lines:
        line = line.split("#", 1)[0].strip()
        m = re.search(r"(?:^|&& |\s-m )(?:\.venv/bin/)?treegym(?:\.cli)? (.*)", line)
        if m and not line.startswith(("import", "from")):
            out.append(shlex.split(m.group(1)))
    return out


COMMANDS = readme_commands()


def test_readme_is_at_most_250_lines() -> None:
    assert len(README.read_text().splitlines()) <= MAX_LINES


def test_readme_shows_the_main_commands() -> None:
    shown = {tuple(c[:1]) for c in COMMANDS}
    assert {("train",), ("eval",), ("sft",), ("play",)} <= shown


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_readme_command_parses(argv: list[str]) -> None:
    if "--help" in argv:
        with contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as exit_:
            build_parser().parse_known_args(argv)
        assert exit_.value.code == 0
        return
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    assert getattr(args, "func", None) is not None, f"treegym {' '.join(argv)} names no command"
    if extra:
        assert getattr(args, "accepts_overrides", False), f"unrecognized arguments: {extra}"
    if args.command == "train":  # its overrides are config fields: they must load and validate
        load_config(None, given_overrides(args, TRAIN_FLAGS) + parse_overrides(extra))
    subcommand = [a for a in argv if not a.startswith("-")][:2]
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as exit_:
        build_parser().parse_known_args([*subcommand[: _depth(argv[0])], "--help"])
    assert exit_.value.code == 0


def _depth(command: str) -> int:
    """How many words name the subcommand (``index build`` is two, ``train`` one)."""
    return 2 if command in ("index", "data", "web") else 1
