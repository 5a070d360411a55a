"""FAISS Flat vs HNSW vs IVF-PQ on the synthetic world at up to 1M passages, projected to 21M.

For each index type it measures, in a fresh child process (so peak RSS is that index's own):
build time, serialized bytes per passage, peak RSS, QPS at batch 1 and batch 256, and
recall@5 against Flat's exact top 5. It then PROJECTS memory and QPS to wiki-18's 21M passages
(labelled as projections; nothing at 21M is measured) and prints a recommendation.

Embedding a million passages with all-MiniLM-L6-v2 takes about 3 hours on a 2-core CPU (96
passages/s), so the scale run uses a stand-in embedder: MiniLM's own input word-piece vectors,
frequency-weighted and centred (``--embedder sif``, 7,800 passages/s). It has MiniLM's dimension
(384), which is what index size, build time and QPS depend on. Recall against Flat depends on
the vector distribution, so every vector set gets a "realism" line (neighbour scores against
random pairs), and ``--check-minilm N`` measures N passages with real MiniLM and with the
stand-in side by side. IVF-PQ rows come with and without exact re-scoring of the top
``--rerank`` candidates from the float vectors on disk (what ``index="ivfpq"`` does).

    python benchmarks/bench_synthetic_scale.py --world /tmp/syn1m          # after treegym data synth
    python benchmarks/bench_synthetic_scale.py --passages 20000 --check-minilm 2000   # quick
    python benchmarks/bench_synthetic_scale.py --from-json benchmarks/results/synthetic_scale_1m_run2.json
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
    """A 100x+ cheaper stand-in for MiniLM: a weighted mean of MiniLM's own input word-piece
    embeddings (no transformer layers), centred and L2-normalised.

    ``mode="sif"`` (the default) weights each word piece by a / (a + p(w)), p its frequency in
    a sample of the corpus, and subtracts the sample's mean vector. Without that (``mode="mean"``)
    every passage and question shares one dominant direction: a random passage pair has cosine
    about 0.7 and a question's 5th neighbour scores barely above a random passage, so the order
    of its top 5 is decided by ties and no approximate index can agree with Flat. The weighted,
    centred vectors are much closer to real MiniLM's geometry; ``realism()`` prints the
    figures for every vector set so a reader can compare them with real MiniLM's.
    """

    SIF_A = 1e-2

    def __init__(self, mode: str = "sif") -> None:
        import torch
        from safetensors.torch import load_file
        from transformers import AutoTokenizer

        from treegym.retrieval_index.embedders import minilm_folder

        folder = minilm_folder()
        self.mode = mode
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder))
        weights = load_file(str(folder / "model.safetensors"))
        key = next(k for k in weights if k.endswith("word_embeddings.weight"))
        self.weight = weights[key].float()
        self.torch = torch
        self.token_weight = None  # per word piece; set by fit() in sif mode
        self.center = np.zeros(self.weight.shape[1], dtype=np.float32)

    def fit(self, sample: list[str]) -> StaticMiniLM:
        """Word-piece frequencies and the mean vector, from a sample of passages."""
        if self.mode != "sif":
            return self
        ids = self._ids(sample)
        counts = np.bincount(np.concatenate([np.asarray(x, dtype=np.int64) for x in ids if x]),
                             minlength=self.weight.shape[0]).astype(np.float64)
        freq = counts / counts.sum()
        self.token_weight = self.torch.tensor(self.SIF_A / (self.SIF_A + freq), dtype=self.torch.float32)
        self.center = self._pool(ids).mean(axis=0).astype(np.float32)
        return self

    def _ids(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer(texts, add_special_tokens=False, truncation=True, max_length=256)["input_ids"]

    def _pool(self, ids: list[list[int]]) -> np.ndarray:
        import torch.nn.functional as F

        torch = self.torch
        lengths = [max(1, len(x)) for x in ids]
        flat = torch.tensor([t for x in ids for t in (x or [0])], dtype=torch.long)
        offsets = torch.tensor(np.concatenate([[0], np.cumsum(lengths)[:-1]]), dtype=torch.long)
        if self.token_weight is None:
            return F.embedding_bag(flat, self.weight, offsets, mode="mean").numpy()
        summed = F.embedding_bag(flat, self.weight, offsets, mode="sum", per_sample_weights=self.token_weight[flat])
        return summed.numpy() / np.asarray(lengths, dtype=np.float32)[:, None]

    def encode(self, texts: list[str]) -> np.ndarray:
        vectors = self._pool(self._ids(texts)) - self.center
        return (vectors / np.clip(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12, None)).astype(np.float32)


def realism(vectors: np.ndarray, queries: np.ndarray, label: str) -> dict:
    """How separable the neighbours are: what makes recall@5 against Flat easy or hard."""
    # A strided sample: a world's corpus is ordered by entity type, its head is all people.
    rows = np.asarray(vectors[:: max(1, len(vectors) // 20_000)][:20_000])
    scores = np.sort(queries @ rows.T, axis=1)[:, ::-1]
    half = min(2000, len(rows) // 2)
    pairs = rows[:half] @ rows[half : 2 * half].T
    figures = {"top1": float(scores[:, 0].mean()), "top5": float(scores[:, 4].mean()),
               "random_pair": float(pairs.mean()), "random_pair_std": float(pairs.std()),
               "gap_5_6": float(np.median(scores[:, 4] - scores[:, 5]))}
    print(f"{label} on {len(rows):,} passages: mean query-top1 score {figures['top1']:.3f}, top5 {figures['top5']:.3f}; "
          f"random passage pair {figures['random_pair']:.3f} +- {figures['random_pair_std']:.3f}; "
          f"median gap 5th-6th {figures['gap_5_6']:.4f}")
    return figures


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


def _anon_rss_mb() -> float:
    """Anonymous resident memory now: the index itself, without the page cache that a
    memory-mapped vector file adds to VmHWM when it is read for re-scoring."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(kind: str, vectors_path: str, queries: np.ndarray, params: dict, single: int) -> dict:
    """Runs in a spawned child: build, size, QPS, top-5 ids; peak RSS is this process's own."""
    import faiss

    from treegym.retrieval_index.build import apply_search_params
    from treegym.retrieval_index.retrievers import rescore, use_blas_for_batches

    use_blas_for_batches()  # as the library's retrievers do: batched Flat search through BLAS
    faiss.omp_set_num_threads(params.get("build_threads", params["threads"]))
    base_rss = peak_rss_mb()
    vectors = np.load(vectors_path, mmap_mode="r")
    t0 = time.perf_counter()
    index = _build(kind, vectors, params)
    build_s = time.perf_counter() - t0
    faiss.omp_set_num_threads(params["threads"])
    size = faiss.serialize_index(index).nbytes
    results = {}
    for variant in params.get("search_variants", [params]):
        apply_search_params(index, kind, variant)
        rerank = variant.get("rerank", 0)

        def search(q: np.ndarray, rerank: int = rerank) -> np.ndarray:
            if not rerank:
                return index.search(q, K)[1]
            # Re-score the top candidates exactly from the on-disk vectors (memory-mapped):
            # RAM holds only the PQ codes. The library's IVF-PQ retriever does the same.
            return rescore(vectors, q, index.search(q, rerank)[1], K)[1]

        n1 = single if kind != "flat" else max(10, single // 4)
        t0 = time.perf_counter()
        for q in queries[:n1]:
            search(q[None, :])
        qps1 = n1 / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        ids = np.concatenate([search(queries[i : i + 256]) for i in range(0, len(queries), 256)])
        qps256 = len(queries) / (time.perf_counter() - t0)
        label = ",".join(f"{k}={variant[k]}" for k in ("efSearch", "nprobe", "rerank") if variant.get(k))
        results[label] = {"qps1": qps1, "qps256": qps256, "ids": ids.tolist(), "rerank": rerank}
    return {"kind": kind, "build_s": build_s, "bytes": size, "n": index.ntotal, "peak_rss_mb": peak_rss_mb(),
            "anon_rss_mb": _anon_rss_mb(), "base_rss_mb": base_rss, "search": results}


def run_child(kind: str, vectors_path: Path, queries: np.ndarray, params: dict, single: int) -> dict:
    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(measure, (kind, str(vectors_path), queries, params, single))


def recall_at_k(ids: list[list[int]], exact: list[list[int]]) -> float:
    return float(np.mean([len(set(a) & set(b)) / K for a, b in zip(ids, exact)]))


def print_header() -> None:
    print("RAM = serialized index (what must stay resident); disk = float vectors that re-scoring reads (mmap);")
    print("peak RSS counts the memory-mapped vectors' page cache too, anon MB is the process's own memory")
    print(f"{'index':46s} {'build s':>8s} {'RAM B/psg':>10s} {'RAM/Flat':>9s} {'disk B/psg':>10s} {'peak RSS MB':>12s} "
          f"{'anon MB':>8s} {'QPS b=1':>9s} {'QPS b=256':>10s} {'recall@5':>9s}", flush=True)


def print_row(tag: str, r: dict) -> None:
    print(f"{tag:46s} {r['build_s']:8.1f} {r['bytes_per_passage']:10.1f} {r['mem_ratio']:9.3f} "
          f"{r['disk_bytes_per_passage']:10d} {r['peak_rss_mb']:12.0f} {r['anon_rss_mb']:8.0f} {r['qps1']:9.3g} "
          f"{r['qps256']:10.3g} {r['recall']:9.3f}", flush=True)


def reprint(path: Path) -> None:
    """The tables, projection and recommendation of a saved ``--json`` run, measuring nothing."""
    saved = json.loads(path.read_text())
    for key, fig in saved.get("realism", {}).items():
        print(f"{key}: mean query-top1 score {fig['top1']:.3f}, top5 {fig['top5']:.3f}; random passage pair "
              f"{fig['random_pair']:.3f} +- {fig['random_pair_std']:.3f}; median gap 5th-6th {fig['gap_5_6']:.4f}")
    for key in ("stand-in", "minilm", "stand-in-slice"):
        if key not in saved:
            continue
        print(f"\n== {key} vectors ({saved.get('embedder', '?')} stand-in): {saved[key]['n']:,} passages ==")
        print_header()
        for tag, r in saved[key]["rows"].items():
            print_row(tag, r)
        if key == "stand-in":
            project(saved[key])
        recommend(saved[key])


def compare(vectors_path: Path, queries: np.ndarray, configs: dict[str, dict], single: int, label: str,
            on_row=None) -> dict:  # noqa: ANN001
    """Measure every index on one set of vectors, printing each row as its child finishes."""
    vectors = np.load(vectors_path, mmap_mode="r")
    n, dim = vectors.shape
    disk_per_passage = dim * vectors.dtype.itemsize
    print(f"\n== {label}: {n:,} passages, {len(queries)} queries (batch-1 QPS over {single}) ==")
    print_header()
    summary: dict = {}
    exact = flat_bytes = None
    for name, cfg in configs.items():
        row = run_child(cfg["kind"], vectors_path, queries, cfg, single)
        if exact is None:  # configs start with Flat: its top 5 is the ground truth
            exact = next(iter(row["search"].values()))["ids"]
            flat_bytes = row["bytes"]
        for variant, s in row["search"].items():
            rec = recall_at_k(s["ids"], exact)
            tag = name + (f" ({variant})" if variant else "")
            disk = disk_per_passage if s["rerank"] else 0
            summary[tag] = {"kind": row["kind"], "bytes_per_passage": row["bytes"] / n, "recall": rec,
                            "disk_bytes_per_passage": disk, "qps1": s["qps1"], "qps256": s["qps256"],
                            "build_s": row["build_s"], "peak_rss_mb": row["peak_rss_mb"],
                            "anon_rss_mb": row["anon_rss_mb"], "mem_ratio": row["bytes"] / flat_bytes}
            print_row(tag, summary[tag])
        if on_row is not None:
            on_row({"n": n, "rows": summary})
    return {"n": n, "rows": summary}


def project(result: dict) -> None:
    """Scale measured figures to 21M passages; every number printed here is a projection."""
    n = result["n"]
    f = TARGET_PASSAGES / n
    print(f"\n== PROJECTED to {TARGET_PASSAGES:,} passages (x{f:.1f}; not measured) ==")
    print(f"RAM and disk: bytes/passage x 21M; build: x{f:.0f} (adding dominates; HNSW grows a little faster).")
    print(f"QPS: Flat scans all n, so / {f:.0f}. IVF-PQ with nlist ~ sqrt(n): the same nprobe scans / {f**0.5:.1f}")
    print(f"as many codes (optimistic), the same fraction of lists (what keeps recall) scans x{f:.0f} more")
    print("(pessimistic); the truth lies between, since the fraction needed shrinks slowly with n.")
    print("HNSW ~log(n) hops (optimistic: its recall at a fixed efSearch falls with n).")
    for tag, r in result["rows"].items():
        mem_gb = r["bytes_per_passage"] * TARGET_PASSAGES / 1e9
        disk_gb = r["disk_bytes_per_passage"] * TARGET_PASSAGES / 1e9
        disk = f" + {disk_gb:.0f} GB disk" if disk_gb else ""
        build_h = r["build_s"] * f / 3600
        if r["kind"] == "ivfpq":
            qps1 = f"{r['qps1'] / f:7.3g} - {r['qps1'] / f**0.5:<7.3g}"
            qps256 = f"{r['qps256'] / f:7.3g} - {r['qps256'] / f**0.5:<7.3g}"
        else:
            scale = f if r["kind"] == "flat" else np.log(TARGET_PASSAGES) / np.log(n)
            qps1, qps256 = f"{r['qps1'] / scale:17.3g}", f"{r['qps256'] / scale:17.3g}"
        print(f"{tag:46s} RAM ~{mem_gb:5.1f} GB{disk:14s} build ~{build_h:5.1f} h  QPS b=1 {qps1}  b=256 {qps256}")


def recommend(result: dict, target_recall: float = 0.95, max_ratio: float = 1 / 8) -> str | None:
    """The fastest (batch-1 QPS) IVF-PQ row that meets the issue's target, printed with why."""
    rows = result["rows"]
    ok = {t: r for t, r in rows.items()
          if r["kind"] == "ivfpq" and r["recall"] >= target_recall and r["mem_ratio"] < max_ratio}
    print(f"\n== recommendation (target: recall@5 >= {target_recall} of Flat, RAM < 1/{round(1 / max_ratio)} of Flat) ==")
    if not ok:
        best = max((r["recall"], t) for t, r in rows.items() if r["kind"] == "ivfpq")
        print(f"no IVF-PQ row met it; the best recall was {best[0]:.3f} ({best[1]})")
        return None
    tag = max(ok, key=lambda t: ok[t]["qps1"])
    r = rows[tag]
    print(f"{tag}: recall@5 {r['recall']:.3f}, RAM {r['mem_ratio']:.3f} of Flat ({r['bytes_per_passage']:.0f} B/passage"
          f"{', plus the float vectors on disk' if r['disk_bytes_per_passage'] else ''}), "
          f"{r['qps1']:.0f} QPS at batch 1 and {r['qps256']:.0f} at batch 256")
    return tag


def configs_for(n: int, hnsw: bool, threads: int, build_threads: int, pq_bytes: tuple[int, ...] = (48, 96),
                nprobes: tuple[int, ...] = (16, 64, 256), rerank: int = 200) -> dict[str, dict]:
    nlist = max(16, int(np.sqrt(n)))  # ~sqrt(n) lists: 1,000 at 1M
    big = n >= 500_000
    train = min(n, max(64 * nlist, 40 * 256))  # k-means wants ~40 points per centroid, PQ's 256 included
    base = {"threads": threads, "build_threads": build_threads}
    configs: dict[str, dict] = {"flat": {"kind": "flat", **base}}
    if hnsw:
        configs["hnsw M=32"] = {"kind": "hnsw", "M": 32, "efConstruction": 80, **base,
                                "search_variants": [{"efSearch": 64}, {"efSearch": 128}, {"efSearch": 256}]}
    probes = [p for p in nprobes if p <= nlist] or [nlist]
    for m in pq_bytes:
        configs[f"ivfpq nlist={nlist} m={m}"] = {
            "kind": "ivfpq", "nlist": nlist, "m": m, "train": train, **base, "niter": 10 if big else 20,
            "search_variants": [{"nprobe": p} for p in probes] + [{"nprobe": p, "rerank": rerank} for p in probes],
        }
    return configs


def cached_vectors(cache: Path, key: str, make) -> Path:  # noqa: ANN001
    """Embeddings are the slow part of a run: keep them under ``cache`` so a rerun (or a run
    interrupted after embedding) starts at the index builds. Written whole, then renamed."""
    path = cache / f"{key}.npy"
    if path.exists():
        print(f"reusing vectors {path}")
        return path
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f"{key}.partial.npy"
    t0 = time.perf_counter()
    vectors = make(tmp)
    seconds = time.perf_counter() - t0
    print(f"embedded {len(vectors):,} passages in {seconds:.0f} s ({len(vectors) / seconds:.0f}/s); "
          f"parent peak RSS {peak_rss_mb():.0f} MB")
    del vectors
    tmp.replace(path)
    return path


def main() -> int:
    from treegym.paths import cache_dir

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=Path, help="a folder written by `treegym data synth` (else one is generated)")
    parser.add_argument("--passages", type=int, default=1_000_000, help="passages to index (default 1M)")
    parser.add_argument("--queries", type=int, default=1024, help="queries (synthetic questions) to search")
    parser.add_argument("--single", type=int, default=200, help="queries timed one at a time")
    parser.add_argument("--no-hnsw", action="store_true", help="skip HNSW (its 1M build is the slowest step)")
    parser.add_argument("--check-minilm", type=int, default=0, metavar="N",
                        help="also measure N passages embedded with real MiniLM, and the same N with the stand-in")
    parser.add_argument("--embedder", choices=("sif", "mean"), default="sif",
                        help="stand-in embedder: weighted, centred word-piece mean (sif, default) or the plain mean")
    parser.add_argument("--pq-m", type=int, nargs="+", default=[48, 96],
                        help="PQ sub-quantizers (= bytes per passage) to try (default: 48 96)")
    parser.add_argument("--nprobe", type=int, nargs="+", default=[16, 64, 256],
                        help="IVF lists probed; each is measured without and with re-scoring (default: 16 64 256)")
    parser.add_argument("--rerank", type=int, default=200, help="candidates re-scored exactly from disk (default 200)")
    parser.add_argument("--cache", type=Path, default=None,
                        help="where embedded vectors are kept between runs (default: TREEGYM_HOME/bench/synthetic-scale)")
    parser.add_argument("--threads", type=int, default=1,
                        help="FAISS search threads per index (default 1: QPS per core, stable on a shared box)")
    parser.add_argument("--build-threads", type=int, default=os.cpu_count() or 1,
                        help="FAISS threads while building (default: all cores)")
    parser.add_argument("--json", type=Path, help="write the measured tables here (rewritten after every index)")
    parser.add_argument("--from-json", type=Path, metavar="FILE",
                        help="print the tables, projection and recommendation of a saved --json run; measure nothing")
    args = parser.parse_args()
    if args.from_json:
        if not args.from_json.is_file():
            parser.error(f"--from-json {args.from_json}: no such file")
        reprint(args.from_json)
        return 0
    if args.passages < 1000 or args.queries < 1 or args.single < 1 or args.rerank < K:
        parser.error(f"need --passages >= 1000, --queries >= 1, --single >= 1 and --rerank >= {K}")
    # Busy-waiting OpenMP/OpenBLAS threads crawl on an oversubscribed machine, so the children
    # (which inherit this environment) run threads that sleep when idle.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    for var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)

    from treegym.retrieval_index.corpus import read_jsonl
    from treegym.retrieval_index.synthetic.writer import read_questions, write_world

    world = args.world
    if world is None or not (world / "manifest.json").exists():
        world = world or Path(tempfile.mkdtemp(prefix="synth-scale-"))
        t0 = time.perf_counter()
        write_world(world, args.passages, seed=0, validate="none")
        print(f"generated {args.passages:,} passages in {time.perf_counter() - t0:.0f} s into {world}")
    manifest = json.loads((world / "manifest.json").read_text())
    total = manifest["passages"]
    if args.passages > total:
        parser.error(f"--passages {args.passages} is more than the world's {total}")
    questions = [q.question for q in read_questions(world / "questions.jsonl")][: args.queries]
    cache = args.cache or cache_dir("bench") / "synthetic-scale"
    world_key = manifest["corpus_sha256"][:12]
    corpus = world / "corpus.jsonl"
    out: dict = {"world": str(world), "embedder": args.embedder}

    def save(key: str):  # noqa: ANN202
        def write(result: dict) -> None:
            out[key] = result
            if args.json:
                args.json.write_text(json.dumps(out, indent=2))
        return write

    from itertools import islice

    t0 = time.perf_counter()
    static = StaticMiniLM(args.embedder)
    static.fit([d.contents for d in islice(read_jsonl(corpus), 0, total, max(1, total // 50_000))])
    print(f"stand-in embedder '{args.embedder}' fitted in {time.perf_counter() - t0:.0f} s")
    queries = static.encode(questions)

    stride = total // args.passages
    if stride > 1:
        print(f"indexing every {stride}th passage of the {total:,}-passage world")
    path = cached_vectors(cache, f"{world_key}-{args.embedder}-{args.passages}-s{stride}",
                          lambda tmp: embed_corpus(corpus, args.passages, static.encode, tmp, stride=stride))
    out["realism"] = {"stand-in": realism(np.load(path, mmap_mode="r"), queries, f"static-{args.embedder} vectors")}
    configs = configs_for(args.passages, not args.no_hnsw, args.threads, args.build_threads, tuple(args.pq_m),
                          tuple(args.nprobe), args.rerank)
    result = compare(path, queries, configs, args.single, f"static-{args.embedder} vectors", save("stand-in"))
    project(result)
    recommend(result)

    if args.check_minilm:
        from treegym.retrieval_index.embedders import load_embedder

        minilm = load_embedder("minilm")
        n = args.check_minilm
        small_stride = max(1, total // n)
        print(f"\nreal-MiniLM check: every {small_stride}th passage, {n:,} in all")
        real = cached_vectors(cache, f"{world_key}-minilm-{n}-s{small_stride}", lambda tmp: embed_corpus(
            corpus, n, lambda b: minilm.encode(b, "passage", batch_size=64), tmp, chunk=1024, stride=small_stride))
        same = cached_vectors(cache, f"{world_key}-{args.embedder}-{n}-s{small_stride}",
                              lambda tmp: embed_corpus(corpus, n, static.encode, tmp, stride=small_stride))
        real_q = minilm.encode(questions, "query")
        out["realism"]["minilm"] = realism(np.load(real, mmap_mode="r"), real_q, "real MiniLM vectors")
        out["realism"]["stand-in-slice"] = realism(np.load(same, mmap_mode="r"), queries,
                                                   f"static-{args.embedder}, same slice")
        small = configs_for(n, not args.no_hnsw, args.threads, args.build_threads, tuple(args.pq_m),
                            tuple(args.nprobe), args.rerank)
        recommend(compare(real, real_q, small, args.single, "real MiniLM vectors", save("minilm")))
        recommend(compare(same, queries, small, args.single, f"static-{args.embedder}, same slice",
                          save("stand-in-slice")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
