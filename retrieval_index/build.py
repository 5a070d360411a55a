"""Build, cache and open indexes: the one place that knows how a corpus becomes a retriever.

Passage embeddings are cached once per (corpus, embedder) and shared by the Flat, HNSW and
IVF-PQ builds. Every artefact is a folder under ``cache_dir("indexes")`` written through
:mod:`treegym.retrieval_index.store`, so builds are atomic and reopening checks the manifest.
"""

from __future__ import annotations

import math
import os
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from treegym.errors import ConfigError, IndexFormatError
from treegym.retrieval_index.corpus import Document, corpus_hash, read_jsonl, wiki_documents
from treegym.retrieval_index.embedders import DEFAULT_EMBEDDER, Embedder, load_embedder, parse_embedder_spec
from treegym.retrieval_index.retrievers import BM25Retriever, DenseRetriever, HybridRetriever, bm25_tokenize
from treegym.retrieval_index.store import Manifest, check_index, index_folder, write_index
from treegym.retrieval_index.types import Retriever

INDEX_TYPES = ("flat", "hnsw", "ivfpq", "bm25", "hybrid")
DENSE_TYPES = ("flat", "hnsw", "ivfpq")
EMBED_CHUNK = 512  # passages per encode() call: bounds memory and paces the progress bar
RERANK_DEPTH = 200  # IVF-PQ candidates per query re-scored exactly from the embeddings on disk


@dataclass(frozen=True)
class Corpus:
    """A corpus slice as indexes see it: a label for folder names, its documents and hash."""

    label: str
    docs: tuple[Document, ...]
    hash: str
    source: str  # "wiki" or the JSONL path, as the user gave it
    limit: int | None


_CORPORA: dict[tuple, Corpus] = {}
_CORPORA_LOCK = threading.Lock()


def load_corpus(corpus: str = "wiki", limit: int | None = None) -> Corpus:
    """The built-in corpus (``"wiki"``) or a FlashRAG JSONL file, first ``limit`` documents."""
    if limit is not None and limit < 1:
        raise ConfigError(f"limit must be a positive number of documents, not {limit}")
    if corpus == "wiki":
        key: tuple = ("wiki", limit)
    else:
        path = Path(corpus).expanduser()
        if not path.is_file():
            raise ConfigError(f"corpus {corpus!r}: not 'wiki' and not a JSONL file")
        stat = path.stat()
        key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size, limit)
    with _CORPORA_LOCK:
        if key not in _CORPORA:
            if corpus == "wiki":
                docs, label = wiki_documents()[:limit], "wiki"
            else:
                docs, label = tuple(read_jsonl(path, limit)), path.stem
            if not docs:
                raise ConfigError(f"corpus {corpus!r} holds no documents")
            if limit is not None:
                label = f"{label}-n{limit}"
            _CORPORA[key] = Corpus(label, docs, corpus_hash(docs), corpus, limit)
        return _CORPORA[key]


def load_corpus_docs(corpus: str = "wiki", limit: int | None = None) -> tuple[Document, ...]:
    """The documents an index over (corpus, limit) holds, in row order (cached per process)."""
    return load_corpus(corpus, limit).docs


def build_command(corpus: Corpus, kind: str, embedder: str | None) -> str:
    """The CLI line that rebuilds one index; error messages quote it."""
    parts = ["treegym index build", f"--corpus {corpus.source}", f"--type {kind}"]
    if embedder is not None:
        parts.append(f"--embedder {embedder}")
    if corpus.limit is not None:
        parts.append(f"--limit {corpus.limit}")
    return " ".join(parts + ["--force"])


def _embedder_name(embedder: str | Embedder) -> str:
    return embedder.name if not isinstance(embedder, str) else parse_embedder_spec(embedder).name


def _embedder_arg(embedder: str | Embedder) -> str:
    return embedder if isinstance(embedder, str) else embedder.name


def _resolve(embedder: str | Embedder) -> Embedder:
    return load_embedder(embedder) if isinstance(embedder, str) else embedder


def _embedding_params(model: Embedder) -> dict[str, Any]:
    """The embedder's settings for a manifest; a stand-in without ``settings`` records none."""
    settings = getattr(model, "settings", None)
    return {"embedding": dict(settings)} if settings else {}


def check_embedding(manifest: Manifest, model: Embedder, folder: Path, rebuild: str) -> None:
    """Refuse an index whose passages were embedded otherwise than ``model`` embeds queries."""
    built, now = manifest.params.get("embedding"), _embedding_params(model).get("embedding")
    if built is not None and now is not None and built != now:
        changed = ", ".join(f"{key}={built.get(key)!r}, not {now.get(key)!r}" for key in sorted(set(built) | set(now))
                            if built.get(key) != now.get(key))
        raise IndexFormatError(f"index {folder} was embedded with {changed}; rebuild it with `{rebuild}`")


def ensure_embeddings(corpus: Corpus, embedder: str | Embedder, progress: bool = True, force: bool = False) -> Path:
    """The folder holding ``vectors.npy``: every passage embedded, in corpus order."""
    name = _embedder_name(embedder)
    folder = index_folder(corpus.label, corpus.hash, "embeddings", name)
    if folder.exists() and not force:
        return folder

    model = _resolve(embedder)

    def write(tmp: Path) -> None:
        texts = [doc.contents for doc in corpus.docs]
        # Embed shortest first so each batch pads little; rows land back in corpus order.
        order = np.argsort([len(t) for t in texts], kind="stable")
        vectors = np.lib.format.open_memmap(tmp / "vectors.npy", mode="w+", dtype=np.float32, shape=(len(texts), model.dim))
        from tqdm.auto import tqdm

        with tqdm(total=len(texts), desc=f"embed {corpus.label}", unit="doc", disable=not progress) as bar:
            for start in range(0, len(order), EMBED_CHUNK):
                rows = order[start : start + EMBED_CHUNK]
                vectors[rows] = model.encode([texts[i] for i in rows], kind="passage")
                bar.update(len(rows))
        vectors.flush()
        del vectors

    manifest = Manifest(
        type="embeddings", corpus_hash=corpus.hash, count=len(corpus.docs), embedder=name, dim=model.dim,
        params=_embedding_params(model),
    )
    write_index(folder, manifest, write, force=force)
    return folder


def default_params(kind: str, count: int, dim: int) -> dict[str, Any]:
    """Index parameters that suit both a 300-passage test slice and the full corpus."""
    if kind == "hnsw":
        return {"M": 32, "efConstruction": 200, "efSearch": 128}
    if kind == "ivfpq":
        # ~sqrt(n) lists, at least ~10 training points each; PQ codebooks of up to 256
        # centroids, fewer on a tiny slice so k-means has points to train on.
        nlist = max(1, min(round(math.sqrt(count)), count // 10))
        m = max(d for d in range(1, dim + 1) if dim % d == 0 and d <= max(1, dim // 8))
        nbits = max(1, min(8, int(math.log2(max(2, count // 4)))))
        # PQ codes alone reorder close neighbours (recall@5 against Flat 0.5-0.6 in
        # benchmarks/bench_synthetic_scale.py); re-scoring RERANK_DEPTH candidates exactly from
        # the cached embeddings on disk restores Flat's order at no cost in RAM. Probing 1/16
        # of the lists (at least 16) then gave recall@5 0.955 at 1M passages (stand-in vectors)
        # and 0.979 at 20k (real MiniLM).
        nprobe = min(nlist, max(16, nlist // 16))
        return {"nlist": nlist, "m": m, "nbits": nbits, "nprobe": nprobe, "rerank": RERANK_DEPTH}
    return {}


def make_faiss_index(vectors: np.ndarray, kind: str, params: dict[str, Any]) -> Any:
    """A trained, filled FAISS index (inner product = cosine on unit vectors)."""
    import faiss

    dim = vectors.shape[1]
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, params["M"], faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = params["efConstruction"]
    elif kind == "ivfpq":
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFPQ(quantizer, dim, params["nlist"], params["m"], params["nbits"], faiss.METRIC_INNER_PRODUCT)
        # Small slices train on few points per centroid by design; silence FAISS's warning.
        index.cp.min_points_per_centroid = 1
        index.pq.cp.min_points_per_centroid = 1
        index.train(vectors)
    else:
        raise ConfigError(f"unknown dense index type {kind!r} (choose from {', '.join(DENSE_TYPES)})")
    index.add(vectors)
    return index


def apply_search_params(index: Any, kind: str, params: dict[str, Any]) -> None:
    """Search-time knobs of a built index: HNSW efSearch, IVF nprobe (defaults when absent)."""
    import faiss

    if kind == "hnsw":
        index.hnsw.efSearch = params.get("efSearch", 128)
    elif kind == "ivfpq":
        faiss.extract_index_ivf(index).nprobe = params.get("nprobe", 16)


def ensure_index(
    corpus: Corpus,
    kind: str,
    embedder: str | Embedder = DEFAULT_EMBEDDER,
    progress: bool = True,
    force: bool = False,
    reembed: bool | None = None,
) -> Path:
    """The folder of one built index (flat, hnsw, ivfpq or bm25), built now if missing.

    ``force`` rebuilds it even if cached, and by default re-embeds the passages too;
    ``reembed=False`` reuses the cached embeddings.
    """
    if kind == "bm25":
        folder = index_folder(corpus.label, corpus.hash, "bm25")
        if folder.exists() and not force:
            return folder

        def write_bm25(tmp: Path) -> dict[str, Any]:
            import bm25s

            model = bm25s.BM25()
            model.index(bm25_tokenize([doc.contents for doc in corpus.docs]), show_progress=progress)
            model.save(str(tmp), show_progress=False)
            return {"k1": model.k1, "b": model.b, "method": model.method}

        write_index(folder, Manifest(type="bm25", corpus_hash=corpus.hash, count=len(corpus.docs)), write_bm25, force)
        return folder
    if kind not in DENSE_TYPES:
        raise ConfigError(f"unknown index type {kind!r} (choose from {', '.join(INDEX_TYPES)})")
    name = _embedder_name(embedder)
    folder = index_folder(corpus.label, corpus.hash, kind, name)
    if folder.exists() and not force:
        return folder
    vectors_folder = ensure_embeddings(corpus, embedder, progress=progress, force=force if reembed is None else reembed)
    vectors_manifest = check_index(
        vectors_folder,
        {"type": "embeddings", "corpus_hash": corpus.hash, "count": len(corpus.docs), "embedder": name},
        rebuild=build_command(corpus, kind, _embedder_arg(embedder)),
    )
    vectors = np.load(vectors_folder / "vectors.npy")
    embedding = {k: v for k, v in vectors_manifest.params.items() if k == "embedding"}
    params = {**default_params(kind, len(corpus.docs), vectors.shape[1]), **embedding}

    def write_faiss(tmp: Path) -> None:
        import faiss

        faiss.write_index(make_faiss_index(vectors, kind, params), str(tmp / "index.faiss"))

    manifest = Manifest(
        type=kind, corpus_hash=corpus.hash, count=len(corpus.docs), embedder=name, dim=int(vectors.shape[1]), params=params
    )
    write_index(folder, manifest, write_faiss, force)
    return folder


def load_dense(folder: Path, corpus: Corpus, kind: str, embedder: str | Embedder) -> DenseRetriever:
    import faiss

    model = _resolve(embedder)
    rebuild = build_command(corpus, kind, _embedder_arg(embedder))
    expected = {"type": kind, "corpus_hash": corpus.hash, "count": len(corpus.docs), "embedder": model.name, "dim": model.dim}
    manifest = check_index(folder, expected, rebuild)
    check_embedding(manifest, model, folder, rebuild)
    try:
        index = faiss.read_index(str(folder / "index.faiss"))
    except RuntimeError as exc:
        raise IndexFormatError(f"FAISS cannot read {folder / 'index.faiss'} ({exc}); rebuild it with `{rebuild}`") from exc
    if index.ntotal != manifest.count or index.d != manifest.dim:
        raise IndexFormatError(f"{folder / 'index.faiss'} does not match its manifest; rebuild it with `{rebuild}`")
    apply_search_params(index, kind, manifest.params)
    rerank = int(manifest.params.get("rerank", 0)) if kind == "ivfpq" else 0
    exact = _rescoring_vectors(corpus, model, rebuild) if rerank else None
    return DenseRetriever(index, corpus.docs, model, kind, exact=exact, rerank=rerank)


VERIFY_VECTORS_BYTES = 2 << 30


def _rescoring_vectors(corpus: Corpus, model: Embedder, rebuild: str) -> np.ndarray | None:
    """The cached passage embeddings, memory-mapped (only re-scored rows are ever read).

    Missing embeddings (deleted to save disk) are not fatal: the index still searches, on
    its PQ scores alone, and the warning says how to get the exact order back.
    """
    folder = index_folder(corpus.label, corpus.hash, "embeddings", model.name)
    if not (folder / "vectors.npy").is_file():
        warnings.warn(
            f"IVF-PQ index of {corpus.label}: the embeddings it re-scores from ({folder}) are gone, so results "
            f"follow PQ's approximate scores; `{rebuild}` restores them",
            stacklevel=3,
        )
        return None
    expected = {"type": "embeddings", "corpus_hash": corpus.hash, "count": len(corpus.docs), "embedder": model.name}
    # A same-size garbled file would silently change the hit order, so the vectors are hashed on
    # open, up to VERIFY_VECTORS_BYTES (the built-in corpus's are 15 MB: milliseconds); past that
    # (wiki-18's are 32 GB) only their sizes are checked, and `treegym index build --force` rewrites them.
    verify = (folder / "vectors.npy").stat().st_size <= VERIFY_VECTORS_BYTES
    check_embedding(check_index(folder, expected, rebuild, verify=verify), model, folder, rebuild)
    return np.load(folder / "vectors.npy", mmap_mode="r")


def load_bm25(folder: Path, corpus: Corpus) -> BM25Retriever:
    import bm25s

    rebuild = build_command(corpus, "bm25", None)
    check_index(folder, {"type": "bm25", "corpus_hash": corpus.hash, "count": len(corpus.docs)}, rebuild)
    try:
        model = bm25s.BM25.load(str(folder), show_progress=False)
        _check_bm25(model)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise IndexFormatError(f"bm25s cannot read {folder} ({type(exc).__name__}: {exc}); "
                               f"rebuild it with `{rebuild}`") from exc
    return BM25Retriever(model, corpus.docs)


def _check_bm25(model: Any) -> None:
    """What bm25s loads without a look, checked: numeric parameters, a token -> id vocabulary."""
    for name in ("k1", "b", "delta"):
        value = getattr(model, name, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"its parameter {name} is {value!r}, not a number")
    vocab = model.vocab_dict
    if not isinstance(vocab, dict) or not all(isinstance(k, str) and isinstance(v, int) for k, v in vocab.items()):
        raise TypeError("its vocabulary is not a mapping of tokens to ids")


def build_index(
    corpus: str = "wiki",
    index: str = "flat",
    embedder: str = DEFAULT_EMBEDDER,
    limit: int | None = None,
    force: bool = False,
    progress: bool = True,
) -> list[Path]:
    """Build (or, with ``force``, rebuild) the folders an index type needs; hybrid needs two."""
    if index not in INDEX_TYPES:
        raise ConfigError(f"unknown index type {index!r} (choose from {', '.join(INDEX_TYPES)})")
    data = load_corpus(corpus, limit)
    kinds: Sequence[str] = ("flat", "bm25") if index == "hybrid" else (index,)
    return [ensure_index(data, kind, embedder, progress=progress, force=force) for kind in kinds]


_OPEN: dict[tuple, Retriever] = {}
_OPEN_LOCK = threading.RLock()  # re-entrant: a hybrid opens its flat and bm25 parts


def open_retriever(
    corpus: str = "wiki",
    index: str = "flat",
    embedder: str = DEFAULT_EMBEDDER,
    url: str | None = None,
    limit: int | None = None,
    progress: bool = True,
) -> Retriever:
    """A retriever over a corpus, building and caching its index on first use.

    ``corpus`` is ``"wiki"`` (built-in) or a FlashRAG JSONL path; ``limit`` keeps its first N
    documents; ``index`` is one of flat, hnsw, ivfpq, bm25, hybrid; ``url`` returns a client
    of a ``treegym index serve`` server instead. Retrievers are cached per process and
    options, so every env in a process shares one.
    """
    if url is not None:
        from treegym.retrieval_index.client import RemoteRetriever

        return RemoteRetriever(url)
    if index not in INDEX_TYPES:
        raise ConfigError(f"unknown index type {index!r} (choose from {', '.join(INDEX_TYPES)})")
    source = corpus if corpus == "wiki" else os.fspath(Path(corpus).expanduser().resolve())
    key = (source, index, embedder, limit)
    with _OPEN_LOCK:
        if key in _OPEN:
            return _OPEN[key]
        data = load_corpus(corpus, limit)
        retriever: Any
        if index == "bm25":
            retriever = load_bm25(ensure_index(data, "bm25", progress=progress), data)
        elif index == "hybrid":
            dense = open_retriever(corpus, "flat", embedder, limit=limit, progress=progress)
            lexical = open_retriever(corpus, "bm25", embedder, limit=limit, progress=progress)
            retriever = HybridRetriever(dense, lexical)  # type: ignore[arg-type]
        else:
            retriever = load_dense(ensure_index(data, index, embedder, progress), data, index, embedder)
        retriever.reopen = {"corpus": source, "index": index, "embedder": embedder, "limit": limit}
        _OPEN[key] = retriever
        return retriever
