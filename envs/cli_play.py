"""``treegym play``: a person plays an env in the terminal and sees exactly what a model sees."""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

import gymnasium as gym

from treegym.envs import FAMILIES, make
from treegym.envs.core import ForkableEnv, Snapshot
from treegym.options import int_in, parse_kwargs

HELP = """Type your whole turn and press Enter (write \\n for a line break), e.g.
  <think>who?</think><search>Albert Einstein</search>     (QA envs)
  go to cabinet 1                                          (TextHousehold)
Commands:  :snap  save a snapshot     :back [N]  restore snapshot N (default: last)
           :fork  continue in a fork (the original is kept as a snapshot)
           :state show the env state  :reset  new episode     :quit
"""


def play(env: gym.Env, seed: int | None, stdin: TextIO, stdout: TextIO) -> int:
    """The interactive loop; returns the number of episodes finished."""
    base = env.unwrapped
    assert isinstance(base, ForkableEnv)
    snapshots: list[Snapshot] = []
    obs, info = env.reset(seed=seed)
    stdout.write(obs + "\n")
    finished = 0
    while True:
        stdout.write("> ")
        stdout.flush()
        line = stdin.readline()
        if not line:
            return finished
        line = line.rstrip("\n")
        if line in (":quit", ":q"):
            return finished
        if line in (":help", ":h", "?"):
            stdout.write(HELP)
        elif line == ":snap":
            snapshots.append(base.snapshot())
            stdout.write(f"[snapshot {len(snapshots) - 1} saved]\n")
        elif line.startswith(":back"):
            arg = line[5:].strip()
            if not snapshots:
                stdout.write("[no snapshot yet: use :snap]\n")
                continue
            try:
                idx = int(arg) if arg else len(snapshots) - 1
                base.restore(snapshots[idx])
            except (ValueError, IndexError):
                stdout.write(f"[no snapshot {arg!r}; have 0..{len(snapshots) - 1}]\n")
                continue
            stdout.write(f"[restored snapshot {idx}]\n")
        elif line == ":fork":
            snapshots.append(base.snapshot())
            base = base.fork()
            env = base
            stdout.write(f"[forked; the original is snapshot {len(snapshots) - 1}]\n")
        elif line == ":state":
            stdout.write(base.render() + "\n")
        elif line == ":reset":
            obs, info = env.reset()
            stdout.write(obs + "\n")
        else:
            obs, reward, terminated, truncated, info = env.step(line.replace("\\n", "\n"))
            stdout.write(obs + "\n")
            flags = " INVALID" if info.get("invalid_action") else ""
            stdout.write(f"[reward {reward:g} | turn {info.get('turn', '?')}{flags}]\n")
            if terminated or truncated:
                finished += 1
                why = "terminated" if terminated else "truncated (turn budget)"
                stdout.write(f"[episode {why}; answers: {info.get('answers', info.get('won', ''))}. :reset for another]\n")


def _cmd_play(args: argparse.Namespace) -> int:
    env = make(args.env_id, **parse_kwargs(args.kwargs))
    print(HELP)
    play(env, args.seed, sys.stdin, sys.stdout)
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "play",
        help="play an env yourself in the terminal",
        description="Play an env in the terminal: you type the model's turns and see exactly the text it would see.",
        epilog="example: treegym play TreeSearchQA-v0 corpus_limit=500 split=dev",
    )
    p.add_argument("env_id", help=f"one of {', '.join(FAMILIES)}")
    p.add_argument("kwargs", nargs="*", help="env arguments as key=value (values parsed as JSON when possible)")
    p.add_argument("--seed", type=int_in(0), default=None, help="seed for the first reset")
    p.set_defaults(func=_cmd_play)
