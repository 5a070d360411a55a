"""Fuzz every `treegym` subcommand's options: 0 tracebacks and 0 accepted nonsense.

Each invocation is one leaf command (``eval``, ``index build``, ...) with cheap valid arguments
plus a *sentinel* (``NoSuchEnv-v0``, a corpus that does not exist) that makes the command fail
fast once its options are checked, and one option set to one bad value. It runs in-process
through ``treegym.cli.main``, so a traceback is any exception that escapes it (argparse's exit
and treegym's one-line errors are fine). A numeric option set to nonsense (NaN, inf, a negative
count, 10**12) must be refused *for that option*: an error that names the sentinel instead means
the value got through. ``tests/test_cli_hardening.py`` runs the standard sweep (bounded to about
a minute); run this script for the larger one (more values, pairs of options):

    python benchmarks/fuzz_cli.py                 # standard sweep, prints every finding
    python benchmarks/fuzz_cli.py --large         # + random strings and pairs of options
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

SENTINELS = ("NoSuchEnv", "/nonexistent", "a-file")
NUMERIC_NONSENSE = ("nan", "inf", "-inf", "-1", "1000000000000")
ODD_TEXT = ("", "x" * 5000, "/dev/null/x", "os:getcwd", "\x7f\u202e")
BASE: dict[str, list[str]] = {  # valid arguments plus a sentinel that fails fast after the options are checked
    "play": ["NoSuchEnv-v0"],
    "index build": ["--corpus", "/nonexistent/c.jsonl"],
    "index query": ["q", "--corpus", "/nonexistent/c.jsonl"],
    "index serve": ["--corpus", "/nonexistent/c.jsonl", "--port", "0"],
    "data stats": ["--data", "/nonexistent/q.jsonl"],
    "data show": ["--data", "/nonexistent/q.jsonl"],
    "data export": ["--data", "/nonexistent/q.jsonl", "--out", "OUT/x.jsonl"],
    "data synth": ["--passages", "50", "--out", "/nonexistent/w"],
    "data synth-oracle": ["--world", "/nonexistent/w"],
    "web serve": ["--corpus", "/nonexistent/c.jsonl", "--port", "0"],
    "web search": ["q", "--backend", "/nonexistent/backend"],
    "train": ["--env", "NoSuchEnv-v0", "--out", "OUT"],
    "sft": ["--env", "NoSuchEnv-v0", "--out", "OUT"],
    "eval": ["--agent", "heuristic", "--env", "NoSuchEnv-v0"],
    "serve-model": ["--model", "/nonexistent/model", "--port", "0"],
    "study": ["--out", "OUT/a-file"],  # a file: refused once the grid options are checked
    "serve-env": ["NoSuchEnv-v0", "--port", "0"],
}
SKIP = {"bench", "data synth-templates", "web browse"}  # run scripts / take no options / reach the network
# (command, option) -> nonsense values that are meaningful there: a large seed, a slice longer than
# the corpus (all of it), a step count or a server-side cap, an idle timeout of "never"
LARGE = {"1000000000000"}
ALLOWED: dict[tuple[str, str], set[str]] = {
    **{(cmd, "--seed"): LARGE for cmd in ("play", "eval", "train", "sft", "data synth")},
    **{(cmd, "--limit"): LARGE for cmd in ("index build", "index query", "index serve", "web serve")},
    ("data show", "-n"): LARGE, ("train", "--steps"): LARGE, ("eval", "--tree-prompts"): LARGE,
    ("eval", "--max-turns"): LARGE, ("index serve", "--max-queries"): set(),
    **{("serve-env", o): LARGE for o in ("--max-episodes", "--max-forks", "--max-snapshots",
                                         "--max-session-snapshots", "--max-body-bytes")},
    ("serve-env", "--idle-timeout"): {"inf", *LARGE},
}
# Values that are valid for an option that replaces the sentinel, so the command would start its
# real work (serve the built-in corpus, run a study in a new folder): not tried.
RUNS: dict[tuple[str, str], set[str]] = {
    **{(cmd, "--corpus"): {"", "os:getcwd", "\x7f\u202e"} for cmd in ("index build", "index query", "index serve",
                                                                       "web serve")},
    ("study", "--out"): {"os:getcwd", "\x7f\u202e", "x" * 200},
    ("study", "--extra-tasks"): {""},
    ("data synth", "--out"): {"os:getcwd", "\x7f\u202e"},
}


@dataclass(frozen=True)
class Finding:
    argv: tuple[str, ...]
    kind: str  # "traceback", "accepted", "timeout"
    detail: str


class _Timeout(Exception):
    pass


def leaf_commands() -> list[tuple[str, argparse.ArgumentParser]]:
    from treegym.cli import build_parser

    out: list[tuple[str, argparse.ArgumentParser]] = []

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            out.append((prefix, parser))
            return
        for name, child in subs[0].choices.items():
            walk(child, f"{prefix} {name}".strip())

    walk(build_parser(), "")
    return [(name, p) for name, p in out if name not in SKIP]


def value_options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The options that take a value (flags and positionals are left to the base arguments)."""
    return [a for a in parser._actions if a.option_strings and a.nargs != 0 and not isinstance(a, argparse._HelpAction)]


def numeric(action: argparse.Action) -> bool:
    return action.type in (int, float) or (action.type is None and action.dest in NUMERIC_DESTS)


# train/sft options come from their config sections, typed there, not by argparse
NUMERIC_DESTS = {"steps", "seed", "episodes", "epochs", "lr", "batch_size", "micro_batch_size", "weight_decay",
                 "warmup", "max_grad_norm", "max_turns", "max_new_tokens", "eval_n"}


def run_one(argv: Sequence[str], limit_s: float) -> tuple[int | None, str, str | None]:
    """(exit status, stderr, traceback summary) of ``treegym ARGV`` in-process, stopped after ``limit_s``."""
    from treegym.cli import main

    err, out = io.StringIO(), io.StringIO()

    def alarm(signum: int, frame: object) -> None:
        raise _Timeout

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code: int | None = main(list(argv))
        return code, err.getvalue(), None
    except SystemExit as exc:
        return (exc.code if isinstance(exc.code, int) else 1), err.getvalue(), None
    except _Timeout:
        return None, err.getvalue(), None
    except BaseException as exc:  # noqa: BLE001  (what the fuzz counts)
        return 1, err.getvalue(), f"{type(exc).__name__}: {str(exc)[:200]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def cases(values_numeric: Sequence[str], values_text: Sequence[str], out: str,
          pairs: bool = False, seed: int = 0) -> Iterator[tuple[str, str, tuple[str, ...], str]]:
    """(command, option, argv, value) to try."""
    rng = random.Random(seed)
    for name, parser in leaf_commands():
        base = [a.replace("OUT", out) for a in BASE.get(name, [])]
        options = value_options(parser)
        for action in options:
            opt = action.option_strings[-1]
            for value in (*values_numeric, *values_text) if numeric(action) else values_text:
                if value not in RUNS.get((name, opt), set()):
                    yield name, opt, (*name.split(), *base, opt, value), value
            if pairs and len(options) > 1:
                other = rng.choice([o for o in options if o is not action])
                yield name, opt, (*name.split(), *base, other.option_strings[-1], rng.choice(values_text), opt,
                                  rng.choice(values_numeric) if numeric(action) else rng.choice(values_text)), "pair"


def sweep(values_numeric: Sequence[str] = NUMERIC_NONSENSE, values_text: Sequence[str] = ODD_TEXT,
          pairs: bool = False, limit_s: float = 10.0, budget_s: float | None = None) -> tuple[int, list[Finding]]:
    """Run every case (round-robin over the commands, so that a ``budget_s`` that stops the sweep
    early still reaches every command); returns (invocations, findings)."""
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as out:
        os.chdir(out)  # a relative path the fuzz gives lands in the scratch folder
        open(os.path.join(out, "a-file"), "w").close()
        try:
            n, findings = _run_cases(values_numeric, values_text, out, pairs, limit_s, budget_s)
        finally:
            os.chdir(here)
    return n, findings


def _round_robin(items: list[tuple[str, str, tuple[str, ...], str]]) -> list[tuple[str, str, tuple[str, ...], str]]:
    by_command: dict[str, list[tuple[str, str, tuple[str, ...], str]]] = {}
    for item in items:
        by_command.setdefault(item[0], []).append(item)
    queues = list(by_command.values())
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]


def _run_cases(values_numeric: Sequence[str], values_text: Sequence[str], out: str, pairs: bool,
               limit_s: float, budget_s: float | None) -> tuple[int, list[Finding]]:
    for name, _ in leaf_commands():  # warm up: a command's first run imports its modules (openenv: 10 s and more)
        run_one((*name.split(), *(a.replace("OUT", out) for a in BASE.get(name, []))), 120.0)
    findings: list[Finding] = []
    n = 0
    deadline = time.monotonic() + budget_s if budget_s is not None else None
    for name, opt, argv, value in _round_robin(list(cases(values_numeric, values_text, out, pairs))):
        if deadline is not None and time.monotonic() > deadline:
            break
        n += 1
        code, err, tb = run_one(argv, limit_s)
        if tb is not None:
            findings.append(Finding(argv, "traceback", tb))
        elif code is None:
            findings.append(Finding(argv, "timeout", f"still running after {limit_s:g} s"))
        elif value in values_numeric and value not in ALLOWED.get((name, opt), set()):
            line = err.strip().splitlines()[-1] if err.strip() else ""
            if code == 0 or any(s in line for s in SENTINELS):
                findings.append(Finding(argv, "accepted", line[:200] or f"exit {code}"))
    return n, findings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", action="store_true", help="more values, random strings, pairs of options")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    numeric_values, text_values = list(NUMERIC_NONSENSE), list(ODD_TEXT)
    if args.large:
        rng = random.Random(args.seed)
        numeric_values += ["-0", "1e309", "0x10", "9" * 40, "-2147483649", "1_000", " 3 "]
        text_values += ["".join(chr(rng.randrange(1, 0x2FFF)) for _ in range(rng.randrange(1, 40))) for _ in range(6)]
        text_values += ["~/x", "../../x", "-", "--", "a\nb", "{}", "[]", "null", "%s%n", "\\\\x00"]
    os.environ.setdefault("TQDM_DISABLE", "1")
    n, findings = sweep(numeric_values, text_values, pairs=args.large)
    for f in findings:
        print(f"{f.kind:9s} {' '.join(repr(a) if (not a or ' ' in a) else a[:60] for a in f.argv)}\n          {f.detail}")
    kinds = {k: sum(f.kind == k for f in findings) for k in ("traceback", "accepted", "timeout")}
    print(f"{n} invocations: {kinds['traceback']} tracebacks, {kinds['accepted']} accepted nonsense, "
          f"{kinds['timeout']} timeouts", file=sys.stderr)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
