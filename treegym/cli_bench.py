"""``treegym bench``: list and run the benchmark scripts of a source checkout."""

from __future__ import annotations

import argparse
import ast
import runpy
import sys
from pathlib import Path

from treegym.errors import ConfigError

BENCH_DIR = Path(__file__).resolve().parent.parent / "benchmarks"


def available() -> dict[str, Path]:
    """name -> script, for ``benchmarks/bench_<name>.py`` next to the package."""
    if not BENCH_DIR.is_dir():
        return {}
    return {p.stem.removeprefix("bench_"): p for p in sorted(BENCH_DIR.glob("*.py")) if not p.name.startswith("_")}


def _summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def _cmd_bench(args: argparse.Namespace) -> int:
    scripts = available()
    if not scripts:
        raise ConfigError(f"no benchmarks found in {BENCH_DIR}: they ship with a source checkout (git clone), not the wheel")
    if not args.name:
        width = max(map(len, scripts))
        for name, path in scripts.items():
            print(f"{name:<{width}}  {_summary(path)}")
        return 0
    if args.name not in scripts:
        raise ConfigError(f"unknown benchmark {args.name!r}; available: {', '.join(scripts)}")
    sys.argv = [str(scripts[args.name]), *args.args]
    runpy.run_path(str(scripts[args.name]), run_name="__main__")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="list or run the benchmarks",
        description="Without a name, list the benchmarks; with one, run it (arguments after the name go to the script).",
        epilog="example: treegym bench fork --repeats 500",
    )
    p.add_argument("name", nargs="?", help="benchmark name (see the list)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark script")
    p.set_defaults(func=_cmd_bench)
