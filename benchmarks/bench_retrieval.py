"""Retrieval benchmarks: build time, batched vs one-at-a-time search, HTTP vs in-process,
index size and memory, and recall of supporting passages on the built-in dev questions.

Every ratio is measured side by side in one run. Examples:

    python benchmarks/bench_retrieval.py                       # the whole 10,033-doc corpus
    python benchmarks/bench_retrieval.py --limit 300 --skip recall
    python benchmarks/bench_retrieval.py --only build --rebuild   # time a fresh full build
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from treegym.retrieval_index import open_retriever
from treegym.retrieval_index.build import ensure_embeddings, ensure_index, load_corpus
from treegym.retrieval_index.embedders import DEFAULT_EMBEDDER, load_embedder
from treegym.retrieval_index.store import index_folder, read_manifest

SECTIONS = ("build", "batch", "http", "size", "recall")


def rss_mb() -> float:
    """Resident memory of this process now (Linux), else its peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds() -> float:
    """CPU time of this process (user + system): unlike wall time, not inflated by other load."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def folder_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) / 1e6


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    cells = [[str(c) for c in header]] + [[f"{c:.3g}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n## {title}")
    for i, row in enumerate(cells):
        print("  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(row, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    sys.stdout.flush()


def timed(fn: Callable[[], object], repeats: int = 1) -> float:
    """Best wall time of ``repeats`` runs (the least disturbed by other load)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def bench_build(args: argparse.Namespace) -> None:
    corpus = load_corpus(args.corpus, args.limit)
    name = load_embedder(args.embedder).name
    steps: list[tuple[str, Path, Callable[[], Path]]] = [
        (
            "embed passages",
            index_folder(corpus.label, corpus.hash, "embeddings", name),
            lambda: ensure_embeddings(corpus, args.embedder, progress=True, force=args.rebuild),
        )
    ]
    for kind in ("flat", "hnsw", "ivfpq", "bm25"):
        folder = index_folder(corpus.label, corpus.hash, kind, None if kind == "bm25" else name)
        steps.append(
            (kind, folder, lambda kind=kind: ensure_index(corpus, kind, args.embedder, True, force=args.rebuild, reembed=False))
        )
    rows = []
    start, cpu_start = time.perf_counter(), cpu_seconds()
    for step_name, expected, step in steps:
        cached = expected.exists() and not args.rebuild
        t0, cpu0 = time.perf_counter(), cpu_seconds()
        folder = step()
        seconds, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
        built_in = read_manifest(folder).build_seconds
        wall = f"cached (built in {built_in:.1f})" if cached and built_in is not None else "cached" if cached else f"{seconds:.1f}"
        rows.append((step_name, wall, "" if cached else f"{cpu:.1f}", f"{folder_mb(folder):.1f}", folder.name))
    rows.append(("total", f"{time.perf_counter() - start:.1f}", f"{cpu_seconds() - cpu_start:.1f}", "", f"{len(corpus.docs)} docs"))
    table(
        f"build: {corpus.label} ({len(corpus.docs)} docs, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f})",
        ["step", "wall s", "CPU s", "MB on disk", "folder"],
        rows,
    )
    if any(r[1] == "cached" for r in rows):
        print("(cached steps were built earlier; --rebuild times a fresh build)")


def bench_batch(args: argparse.Namespace, queries: list[str]) -> None:
    rows = []
    for kind in args.kinds:
        retriever = open_retriever(args.corpus, kind, args.embedder, limit=args.limit, progress=True)
        retriever.search(queries[:8], args.k)  # warm up
        batched = timed(lambda r=retriever: r.search(queries, args.k), args.repeats)
        single = timed(lambda r=retriever: [r.search([q], args.k) for q in queries])
        rows.append((kind, len(queries) / batched, len(queries) / single, f"{single / batched:.1f}x"))
    table(
        f"batched vs one-at-a-time: {len(queries)} queries, k={args.k} (target >= 5x)",
        ["index", "batched q/s", "one-at-a-time q/s", "speed-up"],
        rows,
    )


def bench_http(args: argparse.Namespace, queries: list[str]) -> None:
    from treegym.retrieval_index.client import RemoteRetriever
    from treegym.retrieval_index.server import ServerLimits, serve_in_background

    rows = []
    for kind in args.kinds:
        local = open_retriever(args.corpus, kind, args.embedder, limit=args.limit, progress=True)
        with serve_in_background(local, limits=ServerLimits(max_queries=max(512, len(queries)))) as server:
            remote = RemoteRetriever(server.url, max_batch=len(queries))
            assert remote.search(queries[:8], args.k) == local.search(queries[:8], args.k)
            in_batched = timed(lambda r=local: r.search(queries, args.k), args.repeats)
            http_batched = timed(lambda r=remote: r.search(queries, args.k), args.repeats)
            few = queries[: args.single_http]
            in_single = timed(lambda r=local, few=few: [r.search([q], args.k) for q in few])
            http_single = timed(lambda r=remote, few=few: [r.search([q], args.k) for q in few])
        rows.append((kind, "batched", len(queries) / in_batched, len(queries) / http_batched, f"{http_batched / in_batched:.2f}x"))
        rows.append((kind, f"one-at-a-time ({len(few)})", len(few) / in_single, len(few) / http_single, f"{http_single / in_single:.2f}x"))
    table(
        f"HTTP server vs in-process: {len(queries)} queries, k={args.k}",
        ["index", "mode", "in-process q/s", "HTTP q/s", "HTTP time / in-process"],
        rows,
    )


def bench_size(args: argparse.Namespace, argv: Sequence[str]) -> None:
    """Runs in a fresh interpreter, so memory already held by other sections does not hide."""
    if not args.in_child:
        subprocess.run([sys.executable, __file__, *argv, "--only", "size", "--in-child"], check=True)
        return
    corpus = load_corpus(args.corpus, args.limit)
    rows = []
    before = rss_mb()
    load_embedder(args.embedder)
    rows.append(("embedder (torch + model)", "", f"{rss_mb() - before:.0f}"))
    for kind in ("flat", "hnsw", "ivfpq", "bm25"):
        folder = ensure_index(corpus, kind, args.embedder, progress=True)
        before = rss_mb()
        open_retriever(args.corpus, kind, args.embedder, limit=args.limit, progress=True)
        rows.append((kind, f"{folder_mb(folder):.1f}", f"{rss_mb() - before:.0f}"))
    rows.append(("process total", "", f"{rss_mb():.0f}"))
    table(f"index size and memory ({len(corpus.docs)} docs)", ["part", "MB on disk", "RSS MB added"], rows)


def bench_recall(args: argparse.Namespace) -> None:
    try:
        from treegym.retrieval_index.qa import load_qa
    except ImportError:
        print("\n## recall: skipped (treegym.retrieval_index.qa is missing)")
        return
    ids = {doc.id for doc in load_corpus(args.corpus, args.limit).docs}
    items = [it for it in load_qa("wiki", "dev") if it.supporting_ids and set(it.supporting_ids) <= ids]
    if not items:
        print("\n## recall: no dev question has all its supporting passages in this corpus slice")
        return
    cutoffs = (1, 3, 5)
    rows = []
    for kind in args.recall_kinds:
        retriever = open_retriever(args.corpus, kind, args.embedder, limit=args.limit, progress=True)
        results = retriever.search([it.question for it in items], max(cutoffs))
        for label, subset in (("all", None), ("1-hop", 1), ("2-hop", 2)):
            pairs = [(it, hits) for it, hits in zip(items, results) if subset is None or it.hops == subset]
            if not pairs:
                continue
            recalls = [
                statistics.fmean(
                    len(set(it.supporting_ids) & {h.doc_id for h in hits[:c]}) / len(it.supporting_ids) for it, hits in pairs
                )
                for c in cutoffs
            ]
            rows.append((kind, label, len(pairs), *recalls))
    table(
        f"recall of supporting passages, built-in dev split ({len(items)} questions)",
        ["index", "questions", "n", *[f"R@{c}" for c in cutoffs]],
        rows,
    )


def bench_queries(args: argparse.Namespace) -> list[str]:
    """Real questions from the dev split when the QA data exists, else article descriptions."""
    try:
        from treegym.retrieval_index.qa import load_qa

        questions = [it.question for it in load_qa("wiki", "dev")]
    except ImportError:
        questions = []
    if len(questions) < args.queries:
        questions += [d.description or d.title for d in load_corpus(args.corpus, args.limit).docs]
    return questions[: args.queries]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="wiki", help="'wiki' or a FlashRAG JSONL file (default: wiki)")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N documents (default: all)")
    parser.add_argument("--embedder", default=DEFAULT_EMBEDDER, help="embedder spec (default: minilm)")
    parser.add_argument("--queries", type=int, default=256, help="queries per throughput run (default: 256)")
    parser.add_argument("-k", type=int, default=3, help="top-k for throughput runs (default: 3, as the envs use)")
    parser.add_argument("--kinds", default="flat,bm25,hybrid", help="indexes for the throughput tables")
    parser.add_argument("--recall-kinds", default="flat,hnsw,ivfpq,bm25,hybrid", help="indexes for the recall table")
    parser.add_argument("--repeats", type=int, default=3, help="batched runs per figure; the best counts (default: 3)")
    parser.add_argument("--single-http", type=int, default=64, help="queries for the one-at-a-time HTTP row (default: 64)")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"sections to run, from {','.join(SECTIONS)}")
    parser.add_argument("--skip", default="", help="sections to leave out")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the indexes, so 'build' times a fresh build")
    parser.add_argument("--in-child", action="store_true", help=argparse.SUPPRESS)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.kinds = [k for k in args.kinds.split(",") if k]
    args.recall_kinds = [k for k in args.recall_kinds.split(",") if k]
    sections = [s for s in args.only.split(",") if s and s not in args.skip.split(",")]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {','.join(SECTIONS)}")

    if not args.in_child:
        print(f"# bench_retrieval: corpus={args.corpus} limit={args.limit} embedder={args.embedder} CPUs={os.cpu_count()}")
    if "build" in sections:
        bench_build(args)
    queries = bench_queries(args) if {"batch", "http"} & set(sections) else []
    if "batch" in sections:
        bench_batch(args, queries)
    if "http" in sections:
        bench_http(args, queries)
    if "size" in sections:
        child_argv = [a for a in argv if a not in ("--rebuild",)]
        bench_size(args, child_argv)
    if "recall" in sections:
        bench_recall(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
