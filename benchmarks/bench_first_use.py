"""First use of ``gym.make("TreeSearchQA-v0")`` on a cold cache, old embedding path vs new.

Each path runs in a fresh process with an empty ``TREEGYM_HOME``, so the time includes
importing treegym, reading the corpus and the questions, loading the embedder, embedding
every passage, building the FAISS Flat index, one reset and one search step. The same
process then measures recall@3 of the supporting passages of the built-in dev questions.

    python benchmarks/bench_first_use.py                                # old vs new, about 7 min
    python benchmarks/bench_first_use.py --embedders minilm@24,minilm@48 --skip-old
    python benchmarks/bench_first_use.py --corpus-limit 500             # a quick smoke run

``minilm@256`` is the old path (sentence-transformers' 256 tokens per passage, what
``minilm`` meant before); ``minilm`` is the new default (its first 24 tokens). Wall time
on a shared machine is pessimistic: the table shows the load average around each run and
the child's CPU seconds, which other load inflates far less.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

OLD, NEW = "minilm@256", "minilm"


def child(embedder: str, corpus_limit: int | None) -> dict:
    """Runs in the timed process: first use, then recall (not timed)."""
    started = time.perf_counter()
    import gymnasium as gym

    import treegym  # noqa: F401  registers the envs

    imported = time.perf_counter()
    env = gym.make("TreeSearchQA-v0", embedder=embedder, corpus_limit=corpus_limit)
    env.reset(seed=0)
    made = time.perf_counter()
    obs, *_ = env.step("<search>Albert Einstein</search>")
    ready = time.perf_counter()
    assert "<information>" in obs, obs

    from treegym.retrieval_index import open_retriever
    from treegym.retrieval_index.build import load_corpus
    from treegym.retrieval_index.qa import load_qa

    ids = {doc.id for doc in load_corpus("wiki", corpus_limit).docs}
    items = [it for it in load_qa("wiki", "dev") if it.supporting_ids and set(it.supporting_ids) <= ids]
    results = open_retriever(index="flat", embedder=embedder, limit=corpus_limit, progress=False).search(
        [it.question for it in items], 3
    )
    recall = [len(set(it.supporting_ids) & {h.doc_id for h in hits}) / len(it.supporting_ids) for it, hits in zip(items, results)]
    by_type: dict[str, list[float]] = {}
    for it, r in zip(items, recall):
        by_type.setdefault(it.type, []).append(r)
    return {
        "import_s": imported - started,
        "make_s": made - imported,
        "step_s": ready - made,
        "ready_s": ready - started,
        "questions": len(items),
        "recall3": statistics.fmean(recall) if recall else float("nan"),
        "recall3_by_type": {k: statistics.fmean(v) for k, v in sorted(by_type.items())},
    }


def run_cold(embedder: str, corpus_limit: int | None) -> dict:
    """One fresh process with an empty cache; its wall and CPU time measured from outside."""
    with tempfile.TemporaryDirectory(prefix="treegym-cold-") as home:
        env = {**os.environ, "TREEGYM_HOME": home}
        argv = [sys.executable, __file__, "--in-child", "--embedders", embedder]
        if corpus_limit is not None:
            argv += ["--corpus-limit", str(corpus_limit)]
        load_before = os.getloadavg()[0]
        cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, text=True)  # stderr: its progress bar
        wall = time.perf_counter() - start
        cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise SystemExit(f"{embedder}: the child process failed with exit status {proc.returncode}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    return {**result, "embedder": embedder, "process_s": wall, "cpu_s": cpu, "load": (load_before, os.getloadavg()[0])}


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:04.1f} s" if seconds >= 60 else f"{seconds:.1f} s"


def report(rows: Sequence[dict]) -> None:
    header = ["path", "embedder", "ready (in process)", "process wall", "CPU s", "load avg before/after", "R@3", "questions"]
    cells = [header] + [
        [
            "old" if r["embedder"] == OLD else "new" if r["embedder"] == NEW else "",
            r["embedder"],
            minutes(r["ready_s"]),
            minutes(r["process_s"]),
            f"{r['cpu_s']:.0f}",
            f"{r['load'][0]:.1f} / {r['load'][1]:.1f}",
            f"{r['recall3']:.3f}",
            str(r["questions"]),
        ]
        for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    print(f"\n## first use of TreeSearchQA-v0, cold cache ({os.cpu_count()} CPUs; other work may have been running)")
    for i, row in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print("\nrecall@3 by question type:")
    for r in rows:
        print(f"  {r['embedder']}: " + ", ".join(f"{k} {v:.3f}" for k, v in r["recall3_by_type"].items()))
    print("\nphases (s): " + "; ".join(
        f"{r['embedder']}: import {r['import_s']:.1f}, make+reset {r['make_s']:.1f}, first search {r['step_s']:.2f}" for r in rows
    ))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--embedders", default=f"{OLD},{NEW}", help=f"embedder specs to compare (default: {OLD},{NEW})")
    parser.add_argument("--skip-old", action="store_true", help=f"leave out {OLD}, the slow old path")
    parser.add_argument("--corpus-limit", type=int, default=None, help="index only the first N passages (default: all)")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    parser.add_argument("--in-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    embedders = [e for e in args.embedders.split(",") if e and not (args.skip_old and e == OLD)]
    if args.in_child:
        print(json.dumps(child(embedders[0], args.corpus_limit)))
        return 0
    rows = []
    for embedder in embedders:
        print(f"# {embedder}: cold first use ...", flush=True)
        rows.append(run_cold(embedder, args.corpus_limit))
        print(f"#   ready in {minutes(rows[-1]['ready_s'])}, recall@3 {rows[-1]['recall3']:.3f}", flush=True)
    report(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
