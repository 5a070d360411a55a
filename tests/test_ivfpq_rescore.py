"""IVF-PQ with exact re-scoring: PQ proposes candidates, the cached float vectors rank them."""

from __future__ import annotations

import numpy as np
import pytest

from treegym.retrieval_index import build, open_retriever
from treegym.retrieval_index.build import (
    ensure_embeddings,
    ensure_index,
    load_corpus,
    load_dense,
    make_faiss_index,
)
from treegym.retrieval_index.embedders import load_embedder
from treegym.retrieval_index.retrievers import DenseRetriever, rescore
from treegym.retrieval_index.store import read_manifest

LIMIT = 300  # the slice the retrieval tests share (its embeddings are cached once)


def test_rescore_ranks_candidates_by_exact_inner_product():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(50, 8)).astype(np.float32)
    queries = rng.normal(size=(3, 8)).astype(np.float32)
    candidates = np.array([[4, 9, 17, 30, 2], [11, 3, -1, -1, -1], [7, 40, 1, 0, 22]])
    scores, rows = rescore(vectors, queries, candidates, 3)
    for i in (0, 2):
        want = sorted(candidates[i].tolist(), key=lambda r: -(vectors[r] @ queries[i]))[:3]
        assert rows[i].tolist() == want
        assert np.allclose(scores[i], vectors[want] @ queries[i], atol=1e-5)
    # Fewer valid candidates than k: the row is padded the way FAISS pads (-1, -inf).
    assert sorted(rows[1][:2].tolist()) == [3, 11] and rows[1][2] == -1
    assert scores[1][2] == -np.inf and scores[1][0] >= scores[1][1]


def test_rescore_reads_from_a_memory_mapped_file(tmp_path):
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(100, 16)).astype(np.float32)
    np.save(tmp_path / "v.npy", vectors)
    mapped = np.load(tmp_path / "v.npy", mmap_mode="r")
    query = rng.normal(size=(1, 16)).astype(np.float32)
    candidates = np.arange(100)[None, :]
    _, rows = rescore(mapped, query, candidates, 5)
    assert rows[0].tolist() == np.argsort(-(vectors @ query[0]))[:5].tolist()


@pytest.fixture(scope="module")
def slice_vectors():
    corpus = load_corpus("wiki", LIMIT)
    folder = ensure_embeddings(corpus, "minilm", progress=False)
    return corpus, np.load(folder / "vectors.npy", mmap_mode="r")


def test_rescored_ivfpq_returns_flats_top_k(slice_vectors):
    corpus, vectors = slice_vectors
    embedder = load_embedder("minilm")
    dense = np.ascontiguousarray(vectors)
    params = build.default_params("ivfpq", LIMIT, dense.shape[1])
    flat = DenseRetriever(make_faiss_index(dense, "flat", {}), corpus.docs, embedder, "flat")
    pq_index = make_faiss_index(dense, "ivfpq", params)
    pq_index.nprobe = params["nlist"]  # every list: the candidates hold the true top k
    exact = DenseRetriever(pq_index, corpus.docs, embedder, "ivfpq", exact=vectors, rerank=params["rerank"])
    queries = [doc.title for doc in corpus.docs[::15]]
    want = [[h.doc_id for h in hits] for hits in flat.search(queries, 5)]
    got = [[h.doc_id for h in hits] for hits in exact.search(queries, 5)]
    assert got == want
    rescored = exact.search(queries[:1], 5)[0]
    assert [h.score for h in rescored] == pytest.approx([h.score for h in flat.search(queries[:1], 5)[0]], abs=1e-5)


def test_an_ivfpq_index_opens_with_rescoring_and_survives_lost_embeddings(monkeypatch, tmp_path):
    monkeypatch.setenv("TREEGYM_HOME", str(tmp_path))
    small = load_corpus("wiki", 40)
    retriever = open_retriever(index="ivfpq", limit=40, progress=False)
    assert read_manifest(ensure_index(small, "ivfpq")).params["rerank"] == build.RERANK_DEPTH
    assert retriever.rerank == build.RERANK_DEPTH and retriever.exact is not None
    flat = open_retriever(index="flat", limit=40, progress=False)
    queries = [doc.title for doc in small.docs[:8]]
    assert [[h.doc_id for h in r] for r in retriever.search(queries, 3)] == [
        [h.doc_id for h in r] for r in flat.search(queries, 3)
    ]

    # Embeddings deleted to save disk: a warning that says how to restore them, then PQ-only search.
    (ensure_embeddings(small, "minilm") / "vectors.npy").unlink()
    with pytest.warns(UserWarning, match="re-scores from"):
        degraded = load_dense(ensure_index(small, "ivfpq"), small, "ivfpq", "minilm")
    assert degraded.rerank == 0
    assert len(degraded.search(queries[:2], 3)[0]) == 3


def test_garbled_rescoring_vectors_of_the_same_size_are_refused_never_used(monkeypatch, tmp_path):
    """A same-size garbled ``vectors.npy`` would reorder hits silently: it fails its checksum on open."""
    from treegym.errors import IndexFormatError

    monkeypatch.setenv("TREEGYM_HOME", str(tmp_path))
    small = load_corpus("wiki", 40)
    open_retriever(index="ivfpq", limit=40, progress=False)
    path = ensure_embeddings(small, "minilm") / "vectors.npy"
    data = bytearray(path.read_bytes())
    data[-64:] = bytes(64)  # the last row's tail zeroed: same size, other numbers
    path.write_bytes(bytes(data))
    with pytest.raises(IndexFormatError, match="checksum mismatch.*rebuild it with `treegym index build") as refused:
        load_dense(ensure_index(small, "ivfpq"), small, "ivfpq", "minilm")
    assert "\n" not in str(refused.value)
