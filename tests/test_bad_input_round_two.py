"""Bad input left over from round one: lone surrogates from a remote retriever, a forged
snapshot, a corrupt bm25 index. Each is a clear message or clean text, never a traceback.
The remote retriever is a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import gymnasium as gym
import pytest

import treegym  # noqa: F401  (registers the ids)
from treegym.cli import main
from treegym.envs import Snapshot
from treegym.errors import IndexFormatError, SnapshotError
from treegym.retrieval_index.build import ensure_index, load_bm25, load_corpus
from treegym.retrieval_index.store import MANIFEST, file_digest

# A Search-R1 /retrieve answer whose JSON escapes decode to lone surrogates (valid JSON, not text).
ODD = (b'{"result": [[{"document": {"id": "doc-\\udcff", "contents": "\\"Odd \\ud800 title\\"\\nsome \\udfff text"},'
       b' "score": 2.5}]]}')


@pytest.fixture(scope="module")
def odd_retriever():
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(ODD)))
            self.end_headers()
            self.wfile.write(ODD)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/retrieve"
    httpd.shutdown()
    httpd.server_close()


def test_lone_surrogates_from_a_remote_retriever_never_reach_an_observation(odd_retriever):
    env = gym.make("TreeSearchQA-v0", retriever_url=odd_retriever)
    env.reset(seed=0)
    obs, _, _, _, info = env.step("<think>x</think><search>anything</search>")
    assert "Odd" in obs and "some" in obs and "tool_error" not in info
    obs.encode("utf-8")  # raised UnicodeEncodeError (and a tokenizer TypeError) before


def test_index_query_against_a_remote_server_prints_valid_utf8(odd_retriever, capsys):
    assert main(["index", "query", "--url", odd_retriever, "anything"]) == 0
    out = capsys.readouterr().out
    out.encode("utf-8")
    assert "Odd" in out and "doc-" in out


@pytest.mark.parametrize("env_id", ["TreeSearchQA-v0", "WebSearchQA-v0"])
def test_a_forged_snapshot_is_refused_before_it_can_break_a_step(env_id):
    kwargs = {"index": "bm25"} if env_id == "TreeSearchQA-v0" else {}
    env = gym.make(env_id, **kwargs).unwrapped
    env.reset(seed=0)
    with pytest.raises(SnapshotError, match="snapshot state must be a .*State .*got str"):
        env.restore(Snapshot(type(env).__qualname__, "junk"))
    obs, *_ = env.step("<think>x</think><answer>still fine</answer>")  # the episode was left as it was


def _corrupt(src: Path, dst: Path, name: str, edit) -> Path:
    """A copy of the bm25 index ``src`` with file ``name`` edited and its checksum made to match."""
    folder = Path(shutil.copytree(src, dst))
    path = folder / name
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"][name] = {"bytes": path.stat().st_size, "sha256": file_digest(path)}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return folder


@pytest.mark.parametrize(("name", "edit", "why"), [
    ("params.index.json", lambda d: {**d, "k1": "abc"}, "parameter k1 is 'abc', not a number"),
    ("vocab.index.json", lambda d: list(d), "AttributeError"),
], ids=["k1-not-a-number", "vocab-a-list"])  # fmt: skip
def test_a_bm25_index_corrupted_past_its_checksums_is_the_clear_index_error(name, edit, why, tmp_path):
    corpus = load_corpus("wiki", 200)
    folder = _corrupt(ensure_index(corpus, "bm25", progress=False), tmp_path / "bm25", name, edit)
    with pytest.raises(IndexFormatError, match=f"bm25s cannot read .*{why}.*rebuild it with"):
        load_bm25(folder, corpus)
