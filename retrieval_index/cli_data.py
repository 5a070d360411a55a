"""``treegym data``: look at the QA data (stats, show) and export it for Search-R1 / FlashRAG.

Each action is one ``add_<action>(actions)`` function listed in ``DATA_COMMANDS``; a new
action is a function of that shape plus one entry in the list.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from treegym.errors import ConfigError
from treegym.options import int_in
from treegym.retrieval_index.qa import QUESTION_TYPES, SPLITS, load_qa
from treegym.retrieval_index.synthetic.cli_synth import add_synth
from treegym.retrieval_index.types import QAItem

_DATA_HELP = "'wiki' (the built-in questions) or a Search-R1 .parquet / FlashRAG .jsonl file"


def _add_selection(parser: argparse.ArgumentParser, split_default: str = "dev") -> None:
    parser.add_argument("--data", default="wiki", metavar="NAME", help=f"{_DATA_HELP} (default: wiki)")
    parser.add_argument("--split", default=split_default, help=f"{', '.join(SPLITS)} or all (default: {split_default})")
    parser.add_argument(
        "--types", nargs="+", metavar="TYPE", help=f"keep only these question types ({', '.join(QUESTION_TYPES)})"
    )


def _select(args: argparse.Namespace) -> list[QAItem]:
    return load_qa(args.data, split=args.split, types=args.types)


# ---- stats -----------------------------------------------------------------------------------


def add_stats(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser(
        "stats",
        help="count questions per split and type",
        description="Print a table of question counts: one row per split, one column per type.",
    )
    p.add_argument("--data", default="wiki", metavar="NAME", help=f"{_DATA_HELP} (default: wiki)")
    p.set_defaults(func=run_stats)


def stats_table(items: list[QAItem]) -> str:
    """A plain-text table: rows are splits, columns are types, with totals."""
    counts = Counter((it.split, it.type) for it in items)
    splits = [s for s in (*SPLITS, *sorted({it.split for it in items})) if any(k[0] == s for k in counts)]
    splits = list(dict.fromkeys(splits))
    types = [t for t in (*QUESTION_TYPES, *sorted({it.type for it in items})) if any(k[1] == t for k in counts)]
    types = list(dict.fromkeys(types))
    width = max(len(t) for t in [*types, "total"]) + 2
    lines = ["split".ljust(7) + "".join(t.rjust(width) for t in [*types, "total"])]
    for s in [*splits, "total"]:
        row = [sum(v for (sp, t), v in counts.items() if t == ty and (s == "total" or sp == s)) for ty in types]
        lines.append(s.ljust(7) + "".join(str(v).rjust(width) for v in [*row, sum(row)]))
    return "\n".join(lines)


def run_stats(args: argparse.Namespace) -> int:
    print(stats_table(load_qa(args.data, split="all")))
    return 0


# ---- show ------------------------------------------------------------------------------------


def add_show(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser(
        "show",
        help="print a few questions with their answers and supporting passages",
        description="Print the first N questions of a split: question, answers, type, hops and supporting ids.",
    )
    _add_selection(p)
    p.add_argument("-n", type=int_in(1), default=5, help="how many questions (default: 5)")
    p.set_defaults(func=run_show)


def run_show(args: argparse.Namespace) -> int:
    if args.n < 1:
        raise ConfigError(f"-n must be at least 1, got {args.n}")
    titles = _titles() if args.data == "wiki" else {}
    for it in _select(args)[: args.n]:
        support = ", ".join(f"{i} ({titles[i]})" if i in titles else i for i in it.supporting_ids) or "-"
        print(f"[{it.id}] {it.type}, {it.hops} hop(s), {it.split}")
        print(f"  Q: {it.question}")
        print(f"  A: {' | '.join(it.answers)}")
        print(f"  supporting: {support}")
    return 0


def _titles() -> dict[str, str]:
    from treegym.retrieval_index.corpus import wiki_documents

    return {d.id: d.title for d in wiki_documents()}


# ---- export ----------------------------------------------------------------------------------


def add_export(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser(
        "export",
        help="write questions as FlashRAG JSONL or Search-R1 parquet",
        description=(
            "Write a split in the format another codebase trains on: FlashRAG JSONL "
            "({id, question, golden_answers, metadata}) or Search-R1 parquet (its nq_search.py "
            "columns, with the env's prompt), e.g. `treegym data export --split train --format "
            "parquet --out data/train.parquet`."
        ),
    )
    _add_selection(p)
    p.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl", help="jsonl (FlashRAG) or parquet (Search-R1)")
    p.add_argument("--out", required=True, type=Path, metavar="FILE", help="the file to write (atomically)")
    p.set_defaults(func=run_export)


def check_out_file(out: Path) -> None:
    """``--out`` must name a file whose folder exists: checked before any work, in one line."""
    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder; name the file to write in it (e.g. {out / 'questions.jsonl'})")
    if not out.parent.is_dir():
        raise ConfigError(f"--out {out}: its folder {out.parent} does not exist, or is not a folder")


def run_export(args: argparse.Namespace) -> int:
    from treegym.retrieval_index.qa_files import write_flashrag_jsonl, write_search_r1_parquet

    check_out_file(args.out)
    items = _select(args)
    if args.format == "jsonl":
        write_flashrag_jsonl(items, args.out)
    else:
        write_search_r1_parquet(items, args.out)
    print(f"wrote {len(items)} questions ({args.split}) to {args.out}")
    return 0


# ---- the command -----------------------------------------------------------------------------

# One entry per action; each adds its parser and sets ``func``.
DATA_COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [add_stats, add_show, add_export, add_synth]


def add_commands(sub: argparse._SubParsersAction) -> None:
    data = sub.add_parser(
        "data",
        help="QA data: stats, show, export",
        description="Look at the QA data (built-in or a Search-R1 / FlashRAG file) and export it.",
    )
    actions = data.add_subparsers(dest="data_command", metavar="ACTION")
    for add in DATA_COMMANDS:
        add(actions)
    data.set_defaults(func=lambda _args: data.print_help() or 0)
