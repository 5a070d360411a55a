"""FAISS Flat vs HNSW vs IVF-PQ on the synthetic world at up to 1M passages, projected to 21M.

For each index type it measures, in a fresh child process (so peak RSS is that index's own):
build time, serialized bytes per passage, peak RSS, QPS at batch 1 and batch 256, and
recall@5 against Flat's exact top 5. It then PROJECTS memory and QPS to wiki-18's 21M passages
(labelled as projections; nothing at 21M is measured) and prints a recommendation.

Embedding a million passages with all-MiniLM-L6-v2 takes hours on a 2-core CPU, so the scale run
uses a cheaper embedder by default: ``static-minilm``, the mean of MiniLM's own input word-piece
embeddings (no transformer layers). Its vectors have MiniLM's dimension (384) and vocabulary
geometry, which is what index size, build time and QPS depend on; recall@5 of an approximate
index against Flat depends on the vector distribution, so ``--check-minilm N`` repeats the
recall measurement on the first N passages with real MiniLM vectors, side by side.

    python benchmarks/bench_synthetic_scale.py --world /tmp/syn1m          # after treegym data synth
    python benchmarks/bench_synthetic_scale.py --passages 20000 --check-minilm 2000   # quick
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TARGET_PASSAGES = 21_000_000
K = 5


def peak_rss_mb() -> float:
    """This process's peak resident memory. VmHWM, not ru_maxrss: Linux carries ru_maxrss over
    fork and exec, so a child would report its parent's peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---- embedding -------------------------------------------------------------------------------


class StaticMiniLM:
    """Mean of MiniLM's input token embeddings, L2-normalised: a 100x+ cheaper stand-in."""

    def __init__(self) -> None:
        import torch
        from safetensors.torch import load_file
        from transformers import AutoTokenizer

        from treegym.retrieval_index.embedders import minilm_folder

        folder = minilm_folder()
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder))
        weights = load_file(str(folder / "model.safetensors"))
        key = next(k for k in weights if k.endswith("word_embeddings.weight"))
        self.weight = weights[key].float()
        self.torch = torch

    def encode(self, texts: list[str]) -> np.ndarray:
        import torch.nn.functional as F

        ids = self.tokenizer(texts, add_special_tokens=False, truncation=True, max_length=256)["input_ids"]
        lengths = [max(1, len(x)) for x in ids]
        flat = self.torch.tensor([t for x in ids for t in (x or [0])], dtype=self.torch.long)
        offsets = self.torch.tensor(np.concatenate([[0], np.cumsum(lengths)[:-1]]), dtype=self.torch.long)
        vectors = F.embedding_bag(flat, self.weight, offsets, mode="mean").numpy()
        return vectors / np.clip(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12, None)


def embed_corpus(corpus: Path, limit: int, embed, out: Path, chunk: int = 8192, stride: int = 1) -> np.ndarray:  # noqa: ANN001
    """Stream every ``stride``-th passage (``limit`` in all) through ``embed`` into a float32
    .npy memmap. The corpus is ordered by entity type, so a slice smaller than the corpus must
    stride through it to hold people, places, organisations and works alike."""
    from itertools import islice

    from tqdm import tqdm

    from treegym.retrieval_index.corpus import read_jsonl

    vectors = None
    batch: list[str] = []
    row = 0
    with tqdm(total=limit, desc="embed", unit=" passages", unit_scale=True, mininterval=2) as bar:
        for doc in islice(read_jsonl(corpus), 0, limit * stride, stride):
            batch.append(doc.contents)
            if len(batch) == chunk:
                vectors, row = _flush(embed(batch), vectors, row, limit, out)
                bar.update(len(batch))
                batch = []
        if batch:
            vectors, row = _flush(embed(batch), vectors, row, limit, out)
            bar.update(len(batch))
    assert vectors is not None and row == limit, (row, limit)
    vectors.flush()
    return np.load(out, mmap_mode="r")


def _flush(block: np.ndarray, vectors, row: int, limit: int, out: Path):  # noqa: ANN001, ANN202
    if vectors is None:
        vectors = np.lib.format.open_memmap(out, mode="w+", dtype=np.float32, shape=(limit, block.shape[1]))
    vectors[row : row + len(block)] = block
    return vectors, row + len(block)


# ---- one index, in a child process -----------------------------------------------------------


def _build(kind: str, vectors: np.ndarray, params: dict):  # noqa: ANN202
    import faiss

    n, dim = vectors.shape
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, params["M"], faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = params["efConstruction"]
    else:
        index = faiss.index_factory(dim, f"IVF{params['nlist']},PQ{params['m']}", faiss.METRIC_INNER_PRODUCT)
        faiss.extract_index_ivf(index).cp.niter = params.get("niter", 20)
        rng = np.random.default_rng(0)
        sample = np.sort(rng.choice(n, size=min(n, params["train"]), replace=False))
        index.train(np.ascontiguousarray(vectors[sample]))
    for start in range(0, n, 100_000):  # add in blocks: the memmap is read once, never copied whole
        index.add(np.ascontiguousarray(vectors[start : start + 100_000]))
    return index


def _set_search(index, kind: str, params: dict) -> None:  # noqa: ANN001
    import faiss

    if kind == "hnsw":
        index.hnsw.efSearch = params["efSearch"]
    elif kind == "ivfpq":
        faiss.extract_index_ivf(index).nprobe = params["nprobe"]


def measure(kind: str, vectors_path: str, queries: np.ndarray, params: dict, single: int) -> dict:
    """Runs in a spawned child: build, size, QPS, top-5 ids; peak RSS is this process's own."""
    import faiss

    faiss.omp_set_num_threads(params["threads"])
    base_rss = peak_rss_mb()
    vectors = np.load(vectors_path, mmap_mode="r")
    t0 = time.perf_counter()
    index = _build(kind, vectors, params)
    build_s = time.perf_counter() - t0
    size = faiss.serialize_index(index).nbytes
    results = {}
    for variant in params.get("search_variants", [params]):
        _set_search(index, kind, variant)
        rerank = variant.get("rerank", 0)

        def search(q: np.ndarray, variant: dict = variant, rerank: int = rerank) -> np.ndarray:
            if not rerank:
                return index.search(q, K)[1]
            # Re-score PQ's top candidates exactly, reading their float vectors from the
            # on-disk .npy (memory-mapped): RAM holds only the PQ codes.
            cand = index.search(q, rerank)[1]
            rows = np.sort(np.unique(cand[cand >= 0]))
            exact = dict(zip(rows.tolist(), np.asarray(vectors[rows])))
            out = np.empty((len(q), K), dtype=np.int64)
            for i, c in enumerate(cand):
                c = c[c >= 0]
                scores = np.stack([exact[j] for j in c.tolist()]) @ q[i]
                out[i] = c[np.argsort(-scores)[:K]]
            return out

        n1 = single if kind != "flat" else max(10, single // 4)
        t0 = time.perf_counter()
        for q in queries[:n1]:
            search(q[None, :])
        qps1 = n1 / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        ids = np.concatenate([search(queries[i : i + 256]) for i in range(0, len(queries), 256)])
        qps256 = len(queries) / (time.perf_counter() - t0)
        label = ",".join(f"{k}={variant[k]}" for k in ("efSearch", "nprobe", "rerank") if variant.get(k))
        results[label] = {"qps1": qps1, "qps256": qps256, "ids": ids.tolist()}
    return {"kind": kind, "build_s": build_s, "bytes": size, "n": index.ntotal, "peak_rss_mb": peak_rss_mb(),
            "base_rss_mb": base_rss, "search": results}


def run_child(kind: str, vectors_path: Path, queries: np.ndarray, params: dict, single: int) -> dict:
    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(measure, (kind, str(vectors_path), queries, params, single))


def recall_at_k(ids: list[list[int]], exact: list[list[int]]) -> float:
    return float(np.mean([len(set(a) & set(b)) / K for a, b in zip(ids, exact)]))


def compare(vectors_path: Path, queries: np.ndarray, configs: dict[str, dict], single: int, label: str) -> dict:
    """Measure every index on one set of vectors and print a table; returns Flat's figures."""
    n = np.load(vectors_path, mmap_mode="r").shape[0]
    print(f"\n== {label}: {n:,} passages, {len(queries)} queries (batch-1 QPS over {single}) ==")
    rows = {name: run_child(cfg["kind"], vectors_path, queries, cfg, single) for name, cfg in configs.items()}
    exact = next(iter(rows["flat"]["search"].values()))["ids"]
    flat_bytes = rows["flat"]["bytes"]
    print("memory = serialized index (RAM at search time); rerank variants also read float vectors from disk")
    print(f"{'index':44s} {'build s':>8s} {'B/passage':>10s} {'mem vs Flat':>11s} {'peak RSS MB':>12s} "
          f"{'QPS b=1':>9s} {'QPS b=256':>10s} {'recall@5':>9s}")
    summary = {}
    for name, row in rows.items():
        for variant, s in row["search"].items():
            rec = recall_at_k(s["ids"], exact)
            tag = f"{name}" + (f" ({variant})" if variant else "")
            print(f"{tag:44s} {row['build_s']:8.1f} {row['bytes'] / n:10.1f} {row['bytes'] / flat_bytes:11.3f} "
                  f"{row['peak_rss_mb']:12.0f} {s['qps1']:9.3g} {s['qps256']:10.3g} {rec:9.3f}")
            summary[tag] = {"kind": row["kind"], "bytes_per_passage": row["bytes"] / n, "recall": rec,
                            "qps1": s["qps1"], "qps256": s["qps256"], "build_s": row["build_s"],
                            "peak_rss_mb": row["peak_rss_mb"], "mem_ratio": row["bytes"] / flat_bytes}
    return {"n": n, "rows": summary}


def project(result: dict) -> None:
    """Scale measured figures to 21M passages; every number printed here is a projection."""
    n = result["n"]
    f = TARGET_PASSAGES / n
    print(f"\n== PROJECTED to {TARGET_PASSAGES:,} passages (x{f:.1f}; not measured) ==")
    print(f"memory: bytes/passage x 21M. QPS: Flat scans all n, so / {f:.0f}; IVF-PQ with nlist ~ sqrt(n) at fixed")
    print(f"nprobe scans ~sqrt(n) codes, so / {f**0.5:.1f} (rerank adds a cost that does not grow); HNSW ~log(n) hops.")
    for tag, r in result["rows"].items():
        mem_gb = r["bytes_per_passage"] * TARGET_PASSAGES / 1e9
        scale = {"flat": f, "ivfpq": f**0.5, "hnsw": np.log(TARGET_PASSAGES) / np.log(n)}[r["kind"]]
        print(f"{tag:44s} index ~{mem_gb:7.1f} GB   QPS b=1 ~{r['qps1'] / scale:8.3g}   b=256 ~{r['qps256'] / scale:8.3g}")


def configs_for(n: int, hnsw: bool, threads: int, pq_bytes: tuple[int, ...] = (48, 96)) -> dict[str, dict]:
    # ~sqrt(n) lists: 1,000 at 1M keeps k-means training short on one core.
    nlist = max(16, int(np.sqrt(n)))
    big = n >= 500_000
    train = min(n, (16 if big else 64) * nlist)
    configs: dict[str, dict] = {"flat": {"kind": "flat", "threads": threads}}
    if hnsw:
        configs["hnsw M=32"] = {"kind": "hnsw", "M": 32, "efConstruction": 80, "threads": threads,
                                "search_variants": [{"efSearch": 64}, {"efSearch": 128}]}
    for m in pq_bytes:
        configs[f"ivfpq nlist={nlist} m={m}"] = {
            "kind": "ivfpq", "nlist": nlist, "m": m, "train": train, "threads": threads,
            "niter": 10 if big else 20,
            "search_variants": [{"nprobe": 16}, {"nprobe": 64}, {"nprobe": 16, "rerank": 64},
                                {"nprobe": 64, "rerank": 100}],
        }
    return configs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=Path, help="a folder written by `treegym data synth` (else one is generated)")
    parser.add_argument("--passages", type=int, default=1_000_000, help="passages to index (default 1M)")
    parser.add_argument("--queries", type=int, default=1024, help="queries (synthetic questions) to search")
    parser.add_argument("--single", type=int, default=200, help="queries timed one at a time")
    parser.add_argument("--no-hnsw", action="store_true", help="skip HNSW (its 1M build is the slowest step)")
    parser.add_argument("--check-minilm", type=int, default=0, metavar="N",
                        help="also compare recall on the first N passages embedded with real MiniLM")
    parser.add_argument("--pq-m", type=int, nargs="+", default=[48, 96],
                        help="PQ sub-quantizers (= bytes per passage) to try (default: 48 96)")
    parser.add_argument("--vectors", type=Path, help="reuse a static-minilm .npy from an earlier run (same world, size)")
    parser.add_argument("--threads", type=int, default=1, help="FAISS threads per index (default 1: stable on a shared box)")
    parser.add_argument("--json", type=Path, help="write the measured tables here")
    args = parser.parse_args()
    # Busy-waiting OpenMP/OpenBLAS threads crawl on an oversubscribed machine, so the children
    # (which inherit this environment) run exactly --threads threads that sleep when idle.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)

    from treegym.retrieval_index.synthetic.writer import read_questions, write_world

    world = args.world
    if world is None or not (world / "manifest.json").exists():
        world = world or Path(tempfile.mkdtemp(prefix="synth-scale-"))
        t0 = time.perf_counter()
        write_world(world, args.passages, seed=0, validate="none")
        print(f"generated {args.passages:,} passages in {time.perf_counter() - t0:.0f} s into {world}")
    questions = [q.question for q in read_questions(world / "questions.jsonl")][: args.queries]
    work = Path(tempfile.mkdtemp(prefix="synth-vectors-"))
    out: dict = {}

    total = json.loads((world / "manifest.json").read_text())["passages"]
    if args.passages > total:
        parser.error(f"--passages {args.passages} is more than the world's {total}")
    stride = total // args.passages
    if stride > 1:
        print(f"indexing every {stride}th passage of the {total:,}-passage world")
    static = StaticMiniLM()
    if args.vectors:
        vectors = np.load(args.vectors, mmap_mode="r")
        if len(vectors) != args.passages:
            parser.error(f"{args.vectors} holds {len(vectors)} vectors, not --passages {args.passages}")
        (work / "static.npy").symlink_to(args.vectors.resolve())
        print(f"reusing {len(vectors):,} static-minilm vectors from {args.vectors}")
    else:
        t0 = time.perf_counter()
        vectors = embed_corpus(world / "corpus.jsonl", args.passages, static.encode, work / "static.npy", stride=stride)
        embed_s = time.perf_counter() - t0
        print(f"embedded {len(vectors):,} passages with static-minilm in {embed_s:.0f} s "
              f"({len(vectors) / embed_s:.0f}/s); parent peak RSS {peak_rss_mb():.0f} MB")
    queries = static.encode(questions).astype(np.float32)
    configs = configs_for(len(vectors), hnsw=not args.no_hnsw, threads=args.threads, pq_bytes=tuple(args.pq_m))
    out["static"] = compare(work / "static.npy", queries, configs, args.single, "static-minilm vectors")
    project(out["static"])

    if args.check_minilm:
        from treegym.retrieval_index.embedders import load_embedder

        minilm = load_embedder("minilm")
        t0 = time.perf_counter()
        small_stride = total // args.check_minilm
        print(f"\nreal-MiniLM check: every {small_stride}th passage, {args.check_minilm:,} in all")
        real = embed_corpus(world / "corpus.jsonl", args.check_minilm,
                            lambda b: minilm.encode(b, "passage", batch_size=64), work / "minilm.npy",
                            chunk=1024, stride=small_stride)
        print(f"embedded {len(real):,} passages with MiniLM in {time.perf_counter() - t0:.0f} s")
        small = configs_for(args.check_minilm, hnsw=not args.no_hnsw, threads=args.threads, pq_bytes=tuple(args.pq_m))
        real_q = minilm.encode(questions, "query")
        out["minilm"] = compare(work / "minilm.npy", real_q, small, args.single, "real MiniLM vectors")
        static_small = embed_corpus(world / "corpus.jsonl", args.check_minilm, static.encode,
                                    work / "static_small.npy", stride=small_stride)
        del static_small
        out["static_small"] = compare(work / "static_small.npy", queries, small, args.single,
                                      "static-minilm vectors, same slice")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
