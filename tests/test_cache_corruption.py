"""A corrupt cache under ``TREEGYM_HOME`` is never used silently: each cached artefact is sealed
(sizes and SHA-256, written last: ``treegym.paths.seal``), and one that fails its seal is rebuilt
with a one-line warning. The QA dataset and the local web's BM25 index, each corrupted the ways
the round-three probes did (cut, emptied, garbled, replaced), against a private cache root."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from treegym.envs.web.site import SEAL, Site
from treegym.paths import seal_problem
from treegym.retrieval_index import qa
from treegym.retrieval_index.corpus import wiki_documents


@pytest.fixture()
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TREEGYM_HOME", str(tmp_path))
    qa.wiki_questions.cache_clear()
    yield tmp_path
    qa.wiki_questions.cache_clear()


def _cut(path: Path, lines: int) -> None:
    path.write_text("".join(path.read_text(encoding="utf-8").splitlines(keepends=True)[:lines]), encoding="utf-8")


def _garble(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for i in range(0, len(data), max(1, len(data) // 50)):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


QA_DAMAGE = {
    "cut to 1,000 lines": lambda p: _cut(p, 1000),
    "emptied": lambda p: p.write_text(""),
    "garbled": _garble,
    "its seal deleted": lambda p: p.with_name(p.name + ".seal.json").unlink(),
}


def test_a_corrupt_cached_qa_dataset_is_rebuilt_never_used(home):
    fresh = qa.wiki_questions()
    (path,) = (home / "datasets").glob("wiki-qa-*.jsonl")
    assert seal_problem(path.with_name(path.name + ".seal.json")) is None
    for how, damage in QA_DAMAGE.items():
        damage(path)
        qa.wiki_questions.cache_clear()
        with pytest.warns(UserWarning, match=f"rebuilding the cached QA dataset {path.name}: "):
            again = qa.wiki_questions()
        assert again == fresh, how  # before: 1,000 lines (or none) were used as the whole dataset


WEB_DAMAGE = {
    "data.csc.index.npy cut": lambda f: (f / "data.csc.index.npy").write_bytes((f / "data.csc.index.npy").read_bytes()[:-4096]),
    "data.csc.index.npy garbled": lambda f: _garble(f / "data.csc.index.npy"),
    "vocab.index.json garbage": lambda f: (f / "vocab.index.json").write_text("{\"x\": 1, garbage"),
    "vocab.index.json a list": lambda f: (f / "vocab.index.json").write_text(json.dumps(["a", "b"])),
}  # fmt: skip


def test_a_corrupt_cached_web_index_is_rebuilt_never_used(home):
    docs = list(wiki_documents())
    fresh = Site(docs)
    (folder,) = (home / "web" / "bm25").iterdir()
    assert seal_problem(folder / SEAL) is None
    queries = ["Ibsen play", "inventor of the telephone", "capital of Norway"]
    want = [[d.id for d, _ in fresh.search(q, 5)] for q in queries]
    for how, damage in WEB_DAMAGE.items():
        damage(folder)
        with pytest.warns(UserWarning, match="rebuilding the local web's cached index .*: "):
            site = Site(docs)
        assert [[d.id for d, _ in site.search(q, 5)] for q in queries] == want, how
        assert seal_problem(folder / SEAL) is None  # rebuilt and sealed again
