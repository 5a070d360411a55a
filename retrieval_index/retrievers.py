"""The in-process retrievers: dense (any FAISS index), BM25 (bm25s), and their hybrid by RRF.

Each serves a whole batch of queries per call: one embedding pass and one FAISS search, or one
bm25s scoring pass. All are read-only after construction, hence safe to search from many
threads at once and to share between forked environments; ``copy.deepcopy`` returns the
same object, and pickling one that ``open_retriever`` made reopens it from the cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from treegym.errors import ConfigError
from treegym.retrieval_index.corpus import Document
from treegym.retrieval_index.embedders import Embedder
from treegym.retrieval_index.types import Hit

RRF_CONSTANT = 60  # the usual k of reciprocal rank fusion (Cormack et al., 2009)
BM25_TOKEN_PATTERN = r"(?u)\b\w\w+\b"


def _reopen(options: dict[str, Any]) -> Any:
    from treegym.retrieval_index.build import open_retriever

    return open_retriever(**options)


class SharedBackend:
    """A read-only search backend over ``docs``: forks share it, pickles carry only how to reopen it."""

    docs: tuple[Document, ...] = ()
    reopen: dict[str, Any] | None = None  # open_retriever(**reopen) gives an equal retriever

    def __len__(self) -> int:
        return len(self.docs)

    def __deepcopy__(self, memo: dict) -> SharedBackend:
        return self

    def __copy__(self) -> SharedBackend:
        return self

    def __reduce__(self) -> tuple:
        if self.reopen is None:
            raise TypeError(f"{type(self).__name__} built by hand cannot be pickled; use open_retriever()")
        return (_reopen, ({**self.reopen, "progress": False},))


MAX_K = 10_000  # hits per query at most: past it a search only allocates (10**12 ran out of memory)


def check_k(k: int) -> int:
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or not 1 <= k <= MAX_K:
        raise ConfigError(f"k must be a positive integer, at most {MAX_K}, not {k!r}")
    return int(k)


def _hit(doc: Document, score: float) -> Hit:
    return Hit(doc_id=doc.id, title=doc.title, text=doc.text, score=float(score))


def _hits(docs: Sequence[Document], rows: np.ndarray, scores: np.ndarray, keep: np.ndarray) -> list[list[Hit]]:
    """Per query, the hits of a (n, k) block of document rows and scores where ``keep`` is true
    (FAISS pads with row -1; BM25 returns zero-score rows too)."""
    return [
        [_hit(docs[row], score) for row, score, kept in zip(row_list, score_list, keep_list) if kept]
        for row_list, score_list, keep_list in zip(rows.tolist(), scores.tolist(), keep.tolist())
    ]


def rescore(vectors: np.ndarray, queries: np.ndarray, candidates: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner products for each query's candidate rows, best ``k`` first.

    ``vectors`` may be a memory-mapped ``.npy``: only the candidates' rows are read, each once
    per batch and in file order. ``candidates`` is (n, depth) with -1 for "no candidate", as
    FAISS returns it; the result is (scores, rows), padded with -inf and -1 the same way.
    """
    valid = candidates >= 0
    rows = np.unique(candidates[valid])
    scores = np.full(candidates.shape, -np.inf, dtype=np.float32)
    if len(rows):
        block = np.asarray(vectors[rows], dtype=np.float32)
        positions = np.searchsorted(rows, np.where(valid, candidates, rows[0]))
        for i, query in enumerate(np.asarray(queries, dtype=np.float32)):
            scores[i] = np.where(valid[i], block[positions[i]] @ query, -np.inf)
    top = np.argsort(-scores, axis=1, kind="stable")[:, : min(k, candidates.shape[1])]
    best = np.take_along_axis(scores, top, axis=1)
    ids = np.where(np.isfinite(best), np.take_along_axis(candidates, top, axis=1), -1)
    return best, ids


BLAS_BATCH_THRESHOLD = 20  # queries per batch from which exact distances go through BLAS


def use_blas_for_batches() -> None:
    """FAISS 1.15 computes a Flat index's exact distances with BLAS only from 128,000 queries
    per batch up; below that, query by query. A rollout batch is tens to hundreds of queries,
    and through BLAS a batch of 256 over 100k passages runs 12x faster on one core (62 -> 762
    QPS, same ids). The setting is process-wide and only changes speed, never results."""
    import faiss

    if getattr(faiss.cvar, "distance_compute_blas_threshold", 0) > BLAS_BATCH_THRESHOLD:
        faiss.cvar.distance_compute_blas_threshold = BLAS_BATCH_THRESHOLD


class DenseRetriever(SharedBackend):
    """Queries embedded in one batch, then one inner-product search over a FAISS index.

    With ``exact`` (the passage vectors, usually memory-mapped from the embeddings cache) and
    ``rerank > 0``, the index only proposes ``rerank`` candidates per query and their exact
    scores decide the top k: how an IVF-PQ index keeps Flat's ranking while RAM holds only
    its compressed codes.
    """

    def __init__(
        self,
        index: Any,
        docs: Sequence[Document],
        embedder: Embedder,
        kind: str = "flat",
        exact: np.ndarray | None = None,
        rerank: int = 0,
    ) -> None:
        if index.ntotal != len(docs):
            raise ConfigError(f"FAISS index holds {index.ntotal} vectors for {len(docs)} documents")
        if exact is not None and exact.shape != (len(docs), index.d):
            raise ConfigError(f"re-scoring vectors have shape {exact.shape}, the index needs ({len(docs)}, {index.d})")
        self.index = index
        self.docs = tuple(docs)
        self.embedder = embedder
        self.kind = kind
        self.exact = exact
        self.rerank = rerank if exact is not None else 0
        use_blas_for_batches()

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        k = check_k(k)
        if not queries:
            return []
        vectors = self.embedder.encode(list(queries), kind="query")
        return self.search_vectors(vectors, k)

    def search_vectors(self, vectors: np.ndarray, k: int) -> list[list[Hit]]:
        """Top-k for query vectors already embedded (unit length, shape (n, dim))."""
        k = min(check_k(k), len(self.docs))
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if self.rerank:
            _, candidates = self.index.search(vectors, min(max(k, self.rerank), len(self.docs)))
            scores, rows = rescore(self.exact, vectors, candidates, k)  # type: ignore[arg-type]
        else:
            scores, rows = self.index.search(vectors, k)
        return _hits(self.docs, rows, scores, rows >= 0)


def bm25_tokenize(texts: Sequence[str]) -> list[list[str]]:
    """Lower-cased word tokens minus English stop words, the same for passages and queries."""
    import bm25s

    return bm25s.tokenize(
        list(texts), lower=True, token_pattern=BM25_TOKEN_PATTERN, stopwords="en", return_ids=False, show_progress=False
    )


class BM25Retriever(SharedBackend):
    """Lexical top-k with bm25s; passages with no query term in common are not returned."""

    kind = "bm25"

    def __init__(self, model: Any, docs: Sequence[Document]) -> None:
        self.model = model
        self.docs = tuple(docs)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        k = check_k(k)
        if not queries:
            return []
        rows, scores = self.model.retrieve(
            bm25_tokenize(queries), k=min(k, len(self.docs)), show_progress=False, n_threads=0
        )
        return _hits(self.docs, rows, scores, scores > 0)


def reciprocal_rank_fusion(rankings: Sequence[Sequence[str]], k: int, constant: int = RRF_CONSTANT) -> list[tuple[str, float]]:
    """Fuse ranked id lists: score(d) = sum over lists of 1 / (constant + rank), rank from 1.

    Ties keep the order of first appearance (the first list wins), so results are stable.
    """
    scores: dict[str, float] = {}
    for ranking in rankings:
        for rank, doc_id in enumerate(ranking, 1):
            scores[doc_id] = scores.get(doc_id, 0.0) + 1.0 / (constant + rank)
    order = sorted(scores.items(), key=lambda item: -item[1])  # sorted() is stable
    return order[:k]


class HybridRetriever(SharedBackend):
    """Dense and BM25 results fused by reciprocal rank; ``depth`` hits of each feed the fusion."""

    kind = "hybrid"

    def __init__(self, dense: DenseRetriever, lexical: BM25Retriever, depth: int = 50, constant: int = RRF_CONSTANT) -> None:
        self.dense = dense
        self.lexical = lexical
        self.depth = depth
        self.constant = constant
        self.docs = dense.docs
        self._by_id = {doc.id: doc for doc in self.docs}

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        k = check_k(k)
        depth = max(k, self.depth)
        dense_hits = self.dense.search(queries, depth)
        lexical_hits = self.lexical.search(queries, depth)
        results = []
        for dense_list, lexical_list in zip(dense_hits, lexical_hits):
            fused = reciprocal_rank_fusion(
                [[h.doc_id for h in dense_list], [h.doc_id for h in lexical_list]], k, self.constant
            )
            results.append([_hit(self._by_id[doc_id], score) for doc_id, score in fused])
        return results
