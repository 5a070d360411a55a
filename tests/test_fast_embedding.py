"""The default embedder reads each text's first tokens only; its settings key every index."""

from __future__ import annotations

import json

import numpy as np
import pytest

from treegym.errors import ConfigError, IndexFormatError
from treegym.retrieval_index.build import ensure_index, load_corpus, load_dense
from treegym.retrieval_index.embedders import (
    MINILM_MAX_LENGTH,
    MINILM_NAME,
    load_embedder,
    parse_embedder_spec,
)
from treegym.retrieval_index.store import MANIFEST, read_manifest

LIMIT = 40  # real passages: the built-in corpus' first 40 lead paragraphs


@pytest.fixture(scope="module")
def passages() -> list[str]:
    return [doc.contents for doc in load_corpus("wiki", LIMIT).docs]


def test_minilm_reads_its_default_length_and_the_length_is_part_of_its_name():
    assert parse_embedder_spec("minilm").max_length == MINILM_MAX_LENGTH
    assert parse_embedder_spec("minilm").name == f"{MINILM_NAME}@{MINILM_MAX_LENGTH}"
    assert parse_embedder_spec("minilm@256").name == f"{MINILM_NAME}@256"
    assert parse_embedder_spec("e5:minilm@64").name == f"e5:{MINILM_NAME}@64"
    folder = parse_embedder_spec("minilm").folder
    assert parse_embedder_spec(str(folder)).name == str(folder)  # a folder alone: its own config's length
    assert parse_embedder_spec(f"{folder}@100").max_length == 100


@pytest.mark.parametrize("spec", ["minilm@0", "minilm@", "minilm@many", "minilm@-3"])
def test_a_length_that_is_no_positive_integer_is_a_config_error(spec):
    with pytest.raises(ConfigError, match="positive integer"):
        parse_embedder_spec(spec)


def test_a_length_beyond_the_model_positions_is_a_config_error():
    with pytest.raises(ConfigError, match="at most 512 tokens"):
        load_embedder("minilm@600")


def test_default_and_reference_paths_agree_on_real_passages(passages):
    fast = load_embedder("minilm").encode(passages)
    reference = load_embedder("minilm@256").encode(passages)
    cosine = np.sum(fast * reference, axis=1)
    # Measured on these 40 passages at 24 tokens: min 0.61, mean 0.84. A lead's first tokens
    # say what it is about; the rest adds detail. A broken fast path (other weights, pooling
    # or tokens) falls far below these bounds.
    assert cosine.min() > 0.5 and cosine.mean() > 0.75, cosine
    # Each passage's fast vector is closest to its own reference vector among the 40 (39 of 40).
    assert (np.argmax(fast @ reference.T, axis=1) == np.arange(len(passages))).mean() >= 0.9


def test_a_text_within_the_length_embeds_exactly_as_the_reference_path_does():
    text = '"Lisbon"\nCapital of Portugal.'
    assert len(load_embedder("minilm")._tokenizer(text)["input_ids"]) <= MINILM_MAX_LENGTH
    fast = load_embedder("minilm").encode([text])
    np.testing.assert_allclose(fast, load_embedder("minilm@256").encode([text]), atol=1e-5)


def test_queries_are_cut_to_the_same_length_as_passages(passages):
    long_texts = passages[:4]
    embedder = load_embedder("minilm")
    assert all(len(ids) > MINILM_MAX_LENGTH for ids in embedder._tokenizer(long_texts)["input_ids"])
    np.testing.assert_allclose(embedder.encode(long_texts, "query"), embedder.encode(long_texts, "passage"), atol=1e-6)
    cut = load_embedder("minilm@8")
    assert not np.allclose(cut.encode(long_texts, "query"), embedder.encode(long_texts, "query"), atol=1e-3)


def test_manifest_records_the_embedding_settings_and_changes_with_them(tmp_path, monkeypatch):
    monkeypatch.setenv("TREEGYM_HOME", str(tmp_path))
    corpus = load_corpus("wiki", 12)
    default, longer = ensure_index(corpus, "flat", "minilm", progress=False), ensure_index(corpus, "flat", "minilm@64", progress=False)
    assert default != longer  # other settings, another folder: never reused for the other
    a, b = read_manifest(default), read_manifest(longer)
    assert (a.embedder, b.embedder) == (f"{MINILM_NAME}@{MINILM_MAX_LENGTH}", f"{MINILM_NAME}@64")
    assert a.params["embedding"]["max_length"] == MINILM_MAX_LENGTH and b.params["embedding"]["max_length"] == 64
    assert {k: v for k, v in a.params["embedding"].items() if k != "max_length"} == {
        k: v for k, v in b.params["embedding"].items() if k != "max_length"
    }
    embeddings = read_manifest(default.parent / default.name.replace("flat-", "embeddings-", 1))
    assert embeddings.params["embedding"] == a.params["embedding"]


def test_an_index_embedded_with_other_settings_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TREEGYM_HOME", str(tmp_path))
    corpus = load_corpus("wiki", 12)
    folder = ensure_index(corpus, "flat", "minilm", progress=False)
    path = folder / MANIFEST
    raw = json.loads(path.read_text())
    raw["params"]["embedding"]["max_length"] = 256
    path.write_text(json.dumps(raw))
    with pytest.raises(IndexFormatError, match=rf"max_length=256, not {MINILM_MAX_LENGTH}.*--embedder minilm"):
        load_dense(folder, corpus, "flat", "minilm")
