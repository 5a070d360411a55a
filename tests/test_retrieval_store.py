"""Index folders: manifests, atomic builds, and clear errors for mismatched or corrupt indexes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from treegym.errors import ConfigError, IndexFormatError, TreegymError
from treegym.retrieval_index import build, open_retriever
from treegym.retrieval_index.build import ensure_index, load_bm25, load_corpus, load_dense
from treegym.retrieval_index.corpus import Document, write_jsonl
from treegym.retrieval_index.embedders import MINILM_MAX_LENGTH, load_embedder
from treegym.retrieval_index.store import FORMAT_VERSION, MANIFEST, read_manifest

LIMIT = 300


@pytest.fixture(scope="module")
def corpus():
    return load_corpus("wiki", LIMIT)


@pytest.fixture(scope="module")
def flat_folder(corpus) -> Path:
    open_retriever(index="flat", limit=LIMIT, progress=False)  # builds once, or finds the cache
    return ensure_index(corpus, "flat")


@pytest.fixture
def flat_copy(flat_folder, tmp_path) -> Path:
    return Path(shutil.copytree(flat_folder, tmp_path / "flat"))


def _edit_manifest(folder: Path, **changes) -> None:
    path = folder / MANIFEST
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_manifest_records_what_the_index_was_built_from(flat_folder, corpus):
    manifest = read_manifest(flat_folder)
    assert manifest.type == "flat" and manifest.format_version == FORMAT_VERSION
    assert (manifest.corpus_hash, manifest.count) == (corpus.hash, LIMIT)
    assert (manifest.embedder, manifest.dim) == (f"all-MiniLM-L6-v2@{MINILM_MAX_LENGTH}", 384)
    assert manifest.created and set(manifest.files) == {"index.faiss"}
    assert manifest.files["index.faiss"]["bytes"] == (flat_folder / "index.faiss").stat().st_size


def test_ivfpq_parameters_fit_a_small_slice():
    params = build.default_params("ivfpq", LIMIT, 384)
    assert 1 <= params["nlist"] <= 20 and 384 % params["m"] == 0
    assert 2 ** params["nbits"] <= LIMIT and params["nprobe"] <= params["nlist"]
    full = build.default_params("ivfpq", 10_033, 384)
    assert full["nlist"] == 100 and full["nbits"] == 8


@pytest.mark.parametrize(
    ("field", "value"),
    [("embedder", "intfloat/e5-small-v2"), ("corpus_hash", "0" * 64), ("type", "hnsw"), ("format_version", 99)],
)
def test_a_mismatched_manifest_says_how_to_rebuild(flat_copy, corpus, field, value):
    _edit_manifest(flat_copy, **{field: value})
    with pytest.raises(IndexFormatError) as excinfo:
        load_dense(flat_copy, corpus, "flat", "minilm")
    message = str(excinfo.value)
    assert "treegym index build --corpus wiki --type flat --embedder minilm --limit 300 --force" in message
    assert str(flat_copy) in message


def test_an_index_of_another_corpus_slice_is_refused(flat_copy):
    with pytest.raises(IndexFormatError, match="corpus_hash"):
        load_dense(flat_copy, load_corpus("wiki", LIMIT - 1), "flat", "minilm")


def test_a_truncated_index_file_is_a_format_error(flat_copy, corpus):
    data = (flat_copy / "index.faiss").read_bytes()
    (flat_copy / "index.faiss").write_bytes(data[: len(data) // 2])
    with pytest.raises(IndexFormatError, match="truncated"):
        load_dense(flat_copy, corpus, "flat", "minilm")


def test_a_corrupt_index_file_of_the_right_size_is_a_format_error(flat_copy, corpus):
    path = flat_copy / "index.faiss"
    data = bytearray(path.read_bytes())
    data[100:110] = b"\xff" * 10
    path.write_bytes(bytes(data))
    with pytest.raises(IndexFormatError, match="corrupt.*--force"):
        load_dense(flat_copy, corpus, "flat", "minilm")


def test_a_garbled_or_missing_manifest_is_a_format_error(flat_copy, corpus):
    (flat_copy / MANIFEST).write_text("{not json")
    with pytest.raises(IndexFormatError, match="corrupt"):
        load_dense(flat_copy, corpus, "flat", "minilm")
    (flat_copy / MANIFEST).unlink()
    with pytest.raises(IndexFormatError, match="not an index folder"):
        load_dense(flat_copy, corpus, "flat", "minilm")


def test_a_deleted_bm25_file_is_a_format_error(corpus, tmp_path):
    folder = Path(shutil.copytree(ensure_index(corpus, "bm25", progress=False), tmp_path / "bm25"))
    next(folder.glob("*.npy")).unlink()
    with pytest.raises(IndexFormatError, match="missing its file"):
        load_bm25(folder, corpus)


class FailingEmbedder:
    """The real MiniLM embedder that raises on its second call, as a crash midway would."""

    def __init__(self) -> None:
        self.inner = load_embedder("minilm")
        self.name, self.dim, self.calls = "failing-minilm", self.inner.dim, 0

    def encode(self, texts, kind="passage", batch_size=64, progress=False):
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("simulated crash while embedding")
        return self.inner.encode(texts, kind, batch_size, progress)


def test_an_interrupted_build_leaves_no_index_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("TREEGYM_HOME", str(tmp_path))
    monkeypatch.setattr(build, "EMBED_CHUNK", 4)
    small = load_corpus("wiki", 12)
    embedder = FailingEmbedder()
    with pytest.raises(RuntimeError, match="simulated crash"):
        ensure_index(small, "flat", embedder, progress=False)
    assert embedder.calls == 2
    (corpus_dir,) = (tmp_path / "indexes").iterdir()
    assert [p.name for p in corpus_dir.iterdir() if not p.name.endswith(".lock")] == []  # no index, no temp

    # The next attempt builds a complete index from scratch.
    folder = ensure_index(small, "flat", embedder, progress=False)
    assert read_manifest(folder).count == 12 and (folder / "index.faiss").is_file()


def test_a_build_clears_the_leftovers_of_a_killed_build(monkeypatch, tmp_path):
    monkeypatch.setenv("TREEGYM_HOME", str(tmp_path))
    small = load_corpus("wiki", 30)
    folder = build.index_folder(small.label, small.hash, "bm25")
    stale = folder.parent / f".{folder.name}.tmp-killed"
    stale.mkdir(parents=True)
    (stale / "data.csc.index.npy").write_bytes(b"half")
    ensure_index(small, "bm25", progress=False)
    assert not stale.exists() and read_manifest(folder).count == 30


def test_force_rebuilds_in_place_and_keeps_a_readable_index(monkeypatch, tmp_path):
    monkeypatch.setenv("TREEGYM_HOME", str(tmp_path))
    small = load_corpus("wiki", 30)
    folder = ensure_index(small, "bm25", progress=False)
    first = read_manifest(folder)
    again = ensure_index(small, "bm25", progress=False, force=True)
    assert again == folder and read_manifest(folder).files == first.files
    assert load_bm25(folder, small).search([small.docs[3].title], 1)[0][0].doc_id == small.docs[3].id


def test_a_jsonl_corpus_file_gets_its_own_index(monkeypatch, tmp_path):
    monkeypatch.setenv("TREEGYM_HOME", str(tmp_path / "home"))
    docs = [
        Document("d1", "Okapi", "The okapi is a giraffid mammal native to the Congo."),
        Document("d2", "Fjord", "A fjord is a long, narrow inlet with steep sides, created by a glacier."),
        Document("d3", "Sourdough", "Sourdough bread is made by fermenting dough with wild yeast."),
    ]
    path = write_jsonl(docs, tmp_path / "tiny.jsonl")
    retriever = open_retriever(corpus=str(path), index="bm25", progress=False)
    hits = retriever.search(["glacier inlet", "wild yeast bread"], 1)
    assert [h[0].doc_id for h in hits] == ["d2", "d3"]
    assert hits[0][0].title == "Fjord" and hits[0][0].text.startswith("A fjord")


def test_a_corpus_that_is_neither_wiki_nor_a_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not 'wiki' and not a JSONL file"):
        open_retriever(corpus=str(tmp_path / "nope.jsonl"), index="bm25")


def test_a_malformed_jsonl_corpus_names_the_bad_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a", "contents": "\\"A\\"\\ntext"}\n{"id": "b"}\n')
    with pytest.raises(TreegymError, match=r"bad.jsonl:2"):
        open_retriever(corpus=str(path), index="bm25")


@pytest.mark.parametrize("files", [["index.faiss"], None, "index.faiss", {"index.faiss": 3}])
def test_a_manifest_with_a_wrongly_typed_files_field_is_a_format_error(flat_copy, corpus, files):
    _edit_manifest(flat_copy, files=files)
    with pytest.raises(IndexFormatError, match=r"manifest.json is corrupt \(.*files"):
        load_dense(flat_copy, corpus, "flat", "minilm")


def test_an_index_folder_that_is_a_file_or_a_manifest_that_is_a_folder_is_a_format_error(flat_copy, corpus, tmp_path):
    not_a_folder = tmp_path / "index-file"
    not_a_folder.write_text("x")
    with pytest.raises(IndexFormatError, match="is a file, not an index folder"):
        read_manifest(not_a_folder)
    (flat_copy / MANIFEST).unlink()
    (flat_copy / MANIFEST).mkdir()
    with pytest.raises(IndexFormatError, match="is a folder, not a manifest file"):
        load_dense(flat_copy, corpus, "flat", "minilm")


def test_index_query_with_a_non_utf8_argument_is_a_one_line_error(capsys):
    from treegym.cli import main

    # Python hands a non-UTF-8 argv byte to the program as a lone surrogate (surrogateescape).
    assert main(["index", "query", "caf\udce9", "--type", "flat", "--limit", str(LIMIT)]) == 2
    err = capsys.readouterr().err
    assert "not valid UTF-8" in err and "Traceback" not in err
