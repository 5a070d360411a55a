"""The evaluation before RL of a sealed model folder is remembered across runs (another training
seed from one warm start, a rerun): read back, not played again, and never reused for other
weights, another protocol, a sampled evaluation or a garbled memo. Real training of the tiny model
(tests/tiny_task.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_task import build_tiny_model

from treegym.paths import cache_dir, seal_folder
from treegym.trainers import heldout
from treegym.trainers.config import TrainConfig, load_config
from treegym.trainers.loop import train

SMALL = {
    "env": "tiny_task:TinyKeysEnv", "algo": "grpo", "sampler.max_new_tokens": 1, "sampler.max_turns": 2,
    "prompts_per_step": 2, "sampler.group_size": 4, "optim.lr": 1e-2, "optim.mini_batch_size": 8,
    "optim.micro_batch_size": 8, "run.eval_n": 6, "run.tensorboard": False, "run.plots": False,
    "run.trees_html": False, "steps": 1,
}  # fmt: skip


@pytest.fixture
def sealed_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A sealed copy of the tiny model, and a TREEGYM_HOME of this test's own (so its memo folder)."""
    source = build_tiny_model(cache_dir("test-models") / "tiny-keys-v1")
    monkeypatch.setenv("TREEGYM_HOME", str(tmp_path / "home"))
    folder = tmp_path / "model"
    shutil.copytree(source, folder)
    seal_folder(folder)
    return folder


def config(model: Path, out: Path, **overrides: Any) -> TrainConfig:
    base: dict[str, Any] = {**SMALL, "model": str(model), "run.out_dir": str(out)}
    base.update({k.replace("__", "."): v for k, v in overrides.items()})
    return load_config(overrides=list(base.items()))


def memos() -> list[Path]:
    return sorted(cache_dir("heldout-memo").glob("*.json"))


def test_a_second_seed_reads_the_first_seeds_evaluation_before_rl(sealed_model: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    first = train(config(sealed_model, tmp_path, seed=0, run__name="s0"), progress=False)
    [memo] = memos()
    assert json.loads(memo.read_text())["success"] == list(first.eval_before.values("success"))
    # Mark the memo: a run that reads it reports the mark; one that plays the tasks again cannot.
    marked = {**first.eval_before.to_dict(), "success": [1.0] * 6}
    assert marked != first.eval_before.to_dict()
    memo.write_text(json.dumps(marked))
    second = train(config(sealed_model, tmp_path, seed=1, run__name="s1"), progress=False)
    assert second.eval_before.to_dict() == marked
    assert "before RL: remembered" in capsys.readouterr().out
    assert second.eval_after is not None  # the after-RL evaluation is the run's own


def test_other_weights_or_another_protocol_are_scored_again(sealed_model: Path, tmp_path: Path) -> None:
    train(config(sealed_model, tmp_path, run__name="a"), progress=False)
    assert len(memos()) == 1
    train(config(sealed_model, tmp_path, run__name="b", **{"sampler.max_turns": 1}), progress=False)
    assert len(memos()) == 2  # another turn budget: another protocol
    weights = sealed_model / "model.safetensors"
    from safetensors.torch import load_file, save_file

    tensors = load_file(weights)
    first = next(iter(tensors))
    tensors[first] = tensors[first] + 0.5
    save_file(tensors, weights, metadata={"format": "pt"})
    seal_folder(sealed_model)  # other weights, sealed as a warm start is
    train(config(sealed_model, tmp_path, run__name="c"), progress=False)
    assert len(memos()) == 3


def test_nothing_is_remembered_for_a_sampled_evaluation_an_unsealed_folder_or_with_the_option_off(
        sealed_model: Path, tmp_path: Path) -> None:
    cfg = config(sealed_model, tmp_path)
    cpu = torch.device("cpu")
    assert heldout.before_memo_path(cfg, "auto", heldout.memo_weights(cfg, sealed_model), "hf", cpu) is not None
    sampled = config(sealed_model, tmp_path, run__eval_temperature=1.0)
    assert heldout.before_memo_path(sampled, "auto", heldout.memo_weights(sampled, sealed_model), "hf", cpu) is None
    off = config(sealed_model, tmp_path, run__memo_before=False)
    assert heldout.before_memo_path(off, "auto", heldout.memo_weights(off, sealed_model), "hf", cpu) is None
    (sealed_model / "seal.json").unlink()
    assert heldout.before_memo_path(cfg, "auto", heldout.memo_weights(cfg, sealed_model), "hf", cpu) is None
    train(config(sealed_model, tmp_path, run__name="unsealed"), progress=False)
    assert memos() == []


def test_the_key_moves_with_the_backend_and_the_code(sealed_model: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, cpu = config(sealed_model, tmp_path), torch.device("cpu")
    hf = heldout.before_memo_path(cfg, "auto", heldout.memo_weights(cfg, sealed_model), "hf", cpu)
    assert heldout.before_memo_path(cfg, "auto", heldout.memo_weights(cfg, sealed_model), "vllm", cpu) != hf
    import hashlib

    assert heldout.code_digest() != hashlib.sha256().hexdigest()  # it read the installed source
    monkeypatch.setattr(heldout, "code_digest", lambda: "edited")
    assert heldout.before_memo_path(cfg, "auto", heldout.memo_weights(cfg, sealed_model), "hf", cpu) != hf


def test_a_garbled_memo_is_scored_again_with_a_warning(sealed_model: Path, tmp_path: Path) -> None:
    first = train(config(sealed_model, tmp_path, run__name="a"), progress=False)
    [memo] = memos()
    memo.write_text('{"success": [1.0')  # cut mid-write by hand
    with pytest.warns(UserWarning, match="ignoring the remembered evaluation"):
        second = train(config(sealed_model, tmp_path, run__name="b"), progress=False)
    assert second.eval_before.to_dict() == first.eval_before.to_dict()
    assert json.loads(memo.read_text()) == first.eval_before.to_dict()  # written again, whole
