"""A corrupt cache under ``TREEGYM_HOME`` is never used silently: each cached artefact is sealed
(sizes and SHA-256, written last: ``treegym.paths.seal``), and one that fails its seal is rebuilt
with a one-line warning, or refused in one line. Each kind (the QA dataset, the local web's BM25
index, a cached model folder, the SFT warm start, a FAISS index) is corrupted the ways the
round-three probes did (cut, emptied, garbled, replaced by a file, unsealed), against a private
cache root: 0 used silently, 0 tracebacks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from treegym.envs.probe_model import build_probe_model
from treegym.envs.probes import ProbeLockEnv
from treegym.envs.web.site import SEAL, Site
from treegym.errors import ConfigError, IndexFormatError
from treegym.paths import FOLDER_SEAL, discard, folder_problem, seal_problem
from treegym.retrieval_index import build, qa
from treegym.retrieval_index.corpus import wiki_documents

pytest_plugins = ["model_fixtures"]  # the session-scoped `tiny_chat_model` fixture


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


def _replace_by_a_file(folder: Path) -> None:
    shutil.rmtree(folder)
    folder.write_text("not a folder")


MODEL_DAMAGE = {
    "model.safetensors cut": lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:-999]),
    "model.safetensors emptied": lambda f: (f / "model.safetensors").write_bytes(b""),
    "model.safetensors garbled": lambda f: _garble(f / "model.safetensors"),  # loads, then samples inf/nan
    "config.json garbage": lambda f: (f / "config.json").write_text("{garbage"),
    "the folder replaced by a file": _replace_by_a_file,
    "its seal deleted": lambda f: (f / FOLDER_SEAL).unlink(),
}  # fmt: skip


def _same_weights(folder: Path, want: dict[str, torch.Tensor]) -> bool:
    got = load_file(str(folder / "model.safetensors"))
    return got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_a_corrupt_cached_model_folder_is_rebuilt_never_loaded(home):
    # The probe models and SmolLM2's conversion are cached through the same ``sealed_folder``.
    # prior="random": the model as seeded, so a rebuild writes the very same weights.
    env = ProbeLockEnv(horizon=2, choices=2)
    folder = build_probe_model(env, 2, folder=home / "probe-models" / "m", prior="random")
    assert folder_problem(folder) is None
    want = {k: v.clone() for k, v in load_file(str(folder / "model.safetensors")).items()}  # not the mmap
    for how, damage in MODEL_DAMAGE.items():
        damage(folder)
        with pytest.warns(UserWarning, match=r"rebuilding the cached probe model .*: \S") as caught:
            again = build_probe_model(env, 2, folder=folder, prior="random")
        assert len(caught) == 1 and "\n" not in str(caught[0].message), how
        assert folder_problem(again) is None and _same_weights(again, want), how  # the weights written, no others


WARM_START_DAMAGE = {
    **MODEL_DAMAGE,
    "sft.json garbage": lambda f: (f / "sft.json").write_text("{garbage"),
    "sft.json a JSON list": lambda f: (f / "sft.json").write_text("[1, 2]"),
}


def test_a_corrupt_cached_warm_start_is_rebuilt_never_sampled(tiny_chat_model, home, monkeypatch):
    from treegym.trainers.config import load_config
    from treegym.trainers.recipe import cached_warm_start, warm_start

    cfg = load_config(overrides=[("env", "TextHousehold-v0"), ("model", str(tiny_chat_model)),
                                 ("warm_start_episodes", 2), ("run.eval_n", 0)])  # fmt: skip
    built = warm_start(cfg, progress=False, log=lambda *_: None)
    folder = built.folder
    assert not built.cached and folder_problem(folder) is None
    pristine = home / "pristine"
    shutil.copytree(folder, pristine)
    assert cached_warm_start(folder) is not None
    for how, damage in WARM_START_DAMAGE.items():
        damage(folder)
        with pytest.warns(UserWarning, match=r"rebuilding the cached warm start .*: \S") as caught:
            assert cached_warm_start(folder) is None, how
        assert len(caught) == 1 and "\n" not in str(caught[0].message), how
        assert not folder.exists(), how  # removed, so the build that follows starts clean
        shutil.copytree(pristine, folder)
    # End to end: garbled weights are built again before any sampling, and what the run then
    # loads is a whole, sealed warm start.
    _garble(folder / "model.safetensors")
    with pytest.warns(UserWarning, match="rebuilding the cached warm start"):
        again = warm_start(cfg, progress=False, log=lambda *_: None)
    assert not again.cached and again.folder == folder and folder_problem(folder) is None
    # Under torchrun no process builds it for the others: a broken one is refused in one line.
    _garble(folder / "model.safetensors")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="the cached warm start .* is broken") as refused:
        warm_start(cfg, progress=False, log=lambda *_: None)
    assert "\n" not in str(refused.value)


FAISS_DAMAGE = {
    "index.faiss cut": lambda f: (f / "index.faiss").write_bytes((f / "index.faiss").read_bytes()[:-100]),
    "index.faiss emptied": lambda f: (f / "index.faiss").write_bytes(b""),
    "index.faiss garbled": lambda f: _garble(f / "index.faiss"),
    "manifest.json garbage": lambda f: (f / "manifest.json").write_text("{garbage"),
    "manifest.json a JSON list": lambda f: (f / "manifest.json").write_text("[]"),
    "the folder replaced by a file": _replace_by_a_file,
}  # fmt: skip


def test_a_corrupt_faiss_index_is_refused_in_one_line(home, capsys):
    from treegym.cli import main

    build._OPEN.clear()
    fresh = build.open_retriever("wiki", "flat", limit=40, progress=False)
    want = [h.doc_id for h in fresh.search(["capital of Norway"], 3)[0]]
    (folder,) = (home / "indexes").glob("*/flat-*")
    pristine = home / "pristine"
    shutil.copytree(folder, pristine)
    try:
        for how, damage in FAISS_DAMAGE.items():
            damage(folder)
            build._OPEN.clear()
            with pytest.raises(IndexFormatError, match="rebuild it with `treegym index build") as refused:
                build.open_retriever("wiki", "flat", limit=40, progress=False)
            assert "\n" not in str(refused.value), how
            capsys.readouterr()
            assert main(["index", "query", "--limit", "40", "capital", "of", "Norway"]) == 2, how
            err = capsys.readouterr().err
            assert "Traceback" not in err and len(err.strip().splitlines()) == 1, (how, err)
            discard(folder)
            shutil.copytree(pristine, folder)
        build._OPEN.clear()
        assert [h.doc_id for h in build.open_retriever("wiki", "flat", limit=40, progress=False)
                .search(["capital of Norway"], 3)[0]] == want  # fmt: skip
    finally:
        build._OPEN.clear()


WORLD_DAMAGE = {
    "corpus.jsonl cut": lambda f: _cut(f / "corpus.jsonl", 50),
    "corpus.jsonl garbled": lambda f: _garble(f / "corpus.jsonl"),
    "questions.jsonl emptied": lambda f: (f / "questions.jsonl").write_text(""),
    "manifest.json garbage": lambda f: (f / "manifest.json").write_text("{garbage"),
    "manifest.json a JSON list": lambda f: (f / "manifest.json").write_text("[]"),
    "the folder replaced by a file": _replace_by_a_file,
}


def test_a_corrupt_cached_synthetic_world_is_rebuilt_never_used(home):
    from treegym.retrieval_index.synthetic import api

    api._WORLDS.clear()
    try:
        fresh = api.synthetic_world(passages=200)
        folder = fresh.folder
        assert api.world_problem(folder) is None
        corpus, questions = fresh.corpus_path.read_bytes(), fresh.questions("all")
        for how, damage in WORLD_DAMAGE.items():
            damage(folder)
            api._WORLDS.clear()
            with pytest.warns(UserWarning, match=r"rebuilding the cached synthetic world .*: \S"):
                again = api.synthetic_world(passages=200)
            assert again.corpus_path.read_bytes() == corpus and again.questions("all") == questions, how
    finally:
        api._WORLDS.clear()
