"""``treegym data synth``: write a synthetic multi-hop world (corpus, questions, manifest)."""

from __future__ import annotations

import argparse
from pathlib import Path

from treegym.options import int_in
from treegym.retrieval_index.retrievers import MAX_K
from treegym.retrieval_index.synthetic.questions import FAMILIES, MAX_HOPS
from treegym.retrieval_index.synthetic.world import MAX_PASSAGES, MIN_PASSAGES

_DESCRIPTION = f"""\
Generate an encyclopedia of fictional people, cities, countries, organisations and works, with
multi-hop questions over it (families: {', '.join(FAMILIES)}; 1 to {MAX_HOPS} hops). Writes
DIR/corpus.jsonl (FlashRAG records), DIR/questions.jsonl and DIR/manifest.json, streaming, so
a million passages need no more memory than a thousand. Same arguments, same bytes.

Every question is checked by an oracle that must answer it through real searches (BM25 by
default up to 200k passages); those it cannot answer at depth -k are dropped and counted in
the manifest. Then index the corpus: treegym index build --corpus DIR/corpus.jsonl
"""


def add_synth(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser(
        "synth",
        help="generate a synthetic multi-hop world (corpus + questions)",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--passages", type=int, required=True, metavar="N",
                   help=f"corpus size in passages ({MIN_PASSAGES:,} to {MAX_PASSAGES:,}; two per entity)")
    p.add_argument("--seed", type=int_in(0), default=0, metavar="S", help="world seed (default: 0)")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="folder to write into (created)")
    p.add_argument("--questions", type=int, metavar="Q",
                   help="how many questions to generate (default: passages/2, at most 20,000)")
    p.add_argument("--families", nargs="+", metavar="F", help=f"only these families ({', '.join(FAMILIES)})")
    p.add_argument("--hops", nargs="+", type=int, metavar="H", help=f"only these hop counts (1-{MAX_HOPS})")
    p.add_argument("--holdout-templates", nargs="+", default=[], metavar="T",
                   help="templates whose questions all go to the test split (list them: treegym data synth-templates)")
    p.add_argument("--validate", default="auto", metavar="INDEX",
                   help="retriever the oracle checks questions with: auto (bm25 up to 200k passages, "
                        "else none), none, bm25, flat, hnsw, ivfpq, hybrid (default: auto)")
    p.add_argument("-k", type=int_in(1, MAX_K), default=3, help="search depth for validation (default: 3)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run_synth)

    oracle = actions.add_parser(
        "synth-oracle",
        help="answer a synthetic world's questions by following their chains through real searches",
        description="Run the chain-following oracle over a synthetic world's questions with each given "
        "retriever and print exact match per hop count and per family. The oracle reads only the "
        "question text and the retrieved passages, never the gold supporting ids.",
    )
    oracle.add_argument("--world", type=Path, required=True, metavar="DIR", help="a folder from `treegym data synth`")
    oracle.add_argument("--index", nargs="+", default=["bm25", "hybrid"], metavar="TYPE",
                        help="retrievers to try: flat, hnsw, ivfpq, bm25, hybrid (default: bm25 hybrid)")
    oracle.add_argument("-k", type=int_in(1, MAX_K), default=3, help="passages per search (default: 3)")
    oracle.add_argument("--split", default="all", help="train, dev, test or all (default: all)")
    oracle.set_defaults(func=run_oracle)

    lst = actions.add_parser("synth-templates", help="list the synthetic question templates",
                             description="Print every synthetic question template id and its pattern.")
    lst.set_defaults(func=run_list_templates)


def run_synth(args: argparse.Namespace) -> int:
    from treegym.retrieval_index.synthetic.writer import write_world

    manifest = write_world(
        args.out, args.passages, args.seed, questions=args.questions, families=args.families, hops=args.hops,
        holdout=args.holdout_templates, validate=args.validate, k=args.k, progress=not args.no_progress,
    )
    v = manifest.validation
    print(f"wrote {manifest.passages:,} passages and {manifest.questions:,} questions to {args.out}")
    print(f"  splits: {manifest.splits}  hops: {manifest.by_hops}")
    print(f"  validation: {v['retriever']} at k={v['k']}, dropped {v['dropped']} of {v['generated']}")
    print(f"next: treegym index build --corpus {args.out / 'corpus.jsonl'}")
    return 0


def run_oracle(args: argparse.Namespace) -> int:
    from treegym.retrieval_index import open_retriever
    from treegym.retrieval_index.synthetic.api import SyntheticWorld
    from treegym.retrieval_index.synthetic.oracle import evaluate_oracle

    world = SyntheticWorld(args.world)
    world.manifest  # noqa: B018 - a clear error if DIR is not a synthetic world
    items = world.questions(args.split)
    for kind in args.index:
        retriever = open_retriever(str(world.corpus_path), kind)
        print(evaluate_oracle(retriever, items, k=args.k, name=kind).table())
    return 0


def run_list_templates(args: argparse.Namespace) -> int:
    from treegym.retrieval_index.synthetic.questions import TEMPLATES

    for t in TEMPLATES:
        print(f"{t.id:42s} {t.hops} hop(s)  {t.text}")
    return 0
