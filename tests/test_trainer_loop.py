"""The shared training loop, for real: a tiny random transformer learns a task it starts out failing.

The task (tests/tiny_task.py) rewards saying "A" then "B"; a random policy scores about 0.09.
Every test trains a real (tiny) HF model through the same path as SmolLM2: loaded from a
local folder, sampled by HFPolicy with the tree/chain samplers, scored and updated here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_task import build_tiny_model

from treegym.errors import ConfigError
from treegym.paths import cache_dir
from treegym.trainers import advantages, algorithms
from treegym.trainers.advantages import TokenAdvantages
from treegym.trainers.checkpoint import list_checkpoints
from treegym.trainers.config import TrainConfig, load_config
from treegym.trainers.loop import TrainingError, train
from treegym.trainers.parallel import weights_digest

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def tiny_model() -> Path:
    return build_tiny_model(cache_dir("test-models") / "tiny-keys-v1")


def tiny_config(model: Path, out: Path, **overrides: Any) -> TrainConfig:
    base: dict[str, Any] = {
        "env": "tiny_task:TinyKeysEnv", "model": str(model), "sampler.max_new_tokens": 1, "sampler.max_turns": 2,
        "prompts_per_step": 4, "sampler.group_size": 6, "optim.lr": 1e-2, "optim.mini_batch_size": 24,
        "optim.micro_batch_size": 24, "run.out_dir": str(out), "run.eval_n": 4, "run.tensorboard": False,
        "run.save_every": 0,
    }  # fmt: skip
    base.update({k.replace("__", "."): v for k, v in overrides.items()})
    return load_config(overrides=list(base.items()))


def rewards(history: list[dict[str, Any]]) -> list[float]:
    return [h["reward"] for h in history if "reward" in h]


@pytest.mark.parametrize("algo", ["grpo", "tree-grpo", "treeopsd"])
def test_reward_rises_on_a_task_a_random_policy_fails(algo: str, tiny_model: Path, tmp_path: Path) -> None:
    cfg = tiny_config(tiny_model, tmp_path, algo=algo, steps=20, run__name=algo, run__tensorboard=algo == "tree-grpo")
    result = train(cfg, progress=False)
    r = rewards(result.history)
    first, last = sum(r[:3]) / 3, sum(r[-3:]) / 3
    assert first < 0.25, r  # a random policy fails the task ...
    assert last > 0.5 and last > first + 0.3, r  # ... and training fixes it
    assert result.success_after is not None and result.success_before is not None and result.success_after > result.success_before
    folder = result.folder
    assert (folder / "config.yaml").exists() and (folder / "summary.json").exists() and (folder / "trees.html").exists()
    assert list_checkpoints(folder / "checkpoints")[-1].name == "step_20.pt"
    assert sorted(p.name for p in (folder / "plots").iterdir()) == ["reward_success_vs_step.png", "reward_success_vs_tokens_total.png"]
    line = json.loads((folder / "metrics.jsonl").read_text().splitlines()[1])
    own = ("opsd_loss", "opsd_past_target") if algo == "treeopsd" else ("pg_loss", "clipfrac")
    for key in ("reward", "success", "approx_kl", "entropy", "generated_tokens", "tool_calls", "tokens_total", *own):
        assert key in line, key
    if algo == "treeopsd":  # TreeOPSD logs its own quantities, not PPO's
        assert "clipfrac" not in line and "pg_loss" not in line
    if algo == "tree-grpo":
        assert any((folder / "tb").iterdir())


def test_interrupted_and_resumed_run_equals_an_uninterrupted_one(tiny_model: Path, tmp_path: Path) -> None:
    full = train(tiny_config(tiny_model, tmp_path, algo="tree-grpo", steps=4, run__name="full"), progress=False)
    part = train(tiny_config(tiny_model, tmp_path, algo="tree-grpo", steps=2, run__name="cut"), progress=False)
    assert part.steps == 2
    resumed = train(tiny_config(tiny_model, tmp_path, algo="tree-grpo", steps=4, run__name="cut"), progress=False)
    assert resumed.steps == 4
    assert resumed.replica_digests == full.replica_digests
    assert rewards(resumed.history) == rewards(full.history)
    assert resumed.tokens_total == full.tokens_total
    w_full = torch.load(list_checkpoints(full.folder / "checkpoints")[-1], weights_only=False)["model"]
    w_cut = torch.load(list_checkpoints(resumed.folder / "checkpoints")[-1], weights_only=False)["model"]
    assert all(torch.equal(w_full[k], w_cut[k]) for k in w_full)


def test_nonfinite_loss_skips_steps_and_three_in_a_row_stop_the_run(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def nan_advantages(rollouts: Any, **_: Any) -> TokenAdvantages:
        out = advantages.grpo(rollouts)
        return TokenAdvantages([a * float("nan") for a in out.advantages], out.weights, out.per_rollout)

    monkeypatch.setitem(algorithms.ALGORITHMS, "grpo", dataclasses.replace(algorithms.ALGORITHMS["grpo"], advantage=nan_advantages))
    cfg = tiny_config(tiny_model, tmp_path, algo="grpo", steps=5, run__name="nan", run__save_every=1, run__eval_n=0)
    with pytest.warns(UserWarning, match="non-finite loss, update skipped"), pytest.raises(TrainingError, match="3 consecutive steps"):
        train(cfg, progress=False)
    # The two skipped steps that were checkpointed left the weights untouched.
    from transformers import AutoModelForCausalLM

    initial = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    saved = torch.load(list_checkpoints(tmp_path / "nan" / "checkpoints")[-1], weights_only=False)
    assert saved["state"]["step"] == 2
    assert all(torch.equal(initial[k], v) for k, v in saved["model"].items())


def torchrun_train(model: Path, out: Path, name: str, *extra: str) -> subprocess.CompletedProcess:
    """``treegym train`` in two gloo processes on the tiny task (GRPO, 3 steps by default)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}",
           "-m", "treegym.cli", "train", "--algo", "grpo", "--env", "tiny_task:TinyKeysEnv", "--model", str(model),
           "--steps", "3", "--out", str(out), "--name", name, "--no-progress", "--max_new_tokens=1",
           "--prompts_per_step=2", "--group_size=4", "--optim.lr=1e-2", "--mini_batch_size=4", "--micro_batch_size=2",
           "--run.eval_n=2", "--run.tensorboard=false", *extra]  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)


@pytest.fixture(scope="module")
def ddp_run(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path_factory.mktemp("ddp")
    return torchrun_train(tiny_model, out, "ddp"), out / "ddp"


def test_two_process_data_parallel_replicas_stay_identical(tiny_model: Path, ddp_run: Any) -> None:
    proc, folder = ddp_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["world"] == 2
    a, b = summary["replica_digests"]
    assert a == b
    from transformers import AutoModelForCausalLM

    assert a != weights_digest(AutoModelForCausalLM.from_pretrained(tiny_model))  # it did train
    assert "after RL" in proc.stdout and "gain before RL -> after RL" in proc.stdout


def fsdp_skip_reason() -> str | None:
    """Why FSDP2 cannot run here (None: it can). torch >= 2.6 ships fully_shard with gloo support."""
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError as exc:
        return f"torch {torch.__version__} has no torch.distributed.fsdp.fully_shard (FSDP2): {exc}"
    import torch.distributed as torch_dist

    if not torch_dist.is_gloo_available():
        return f"torch {torch.__version__} was built without the gloo backend, which FSDP2 on CPU needs"
    return None


def test_fsdp_shards_train_the_same_model_as_ddp_and_resume(tiny_model: Path, ddp_run: Any, tmp_path: Path) -> None:
    if (reason := fsdp_skip_reason()) is not None:
        pytest.skip(reason)
    # Two steps, stop (keeping the resumable checkpoint), then resume to the DDP run's three.
    cut = torchrun_train(tiny_model, tmp_path, "fsdp", "--steps", "2", "--model_opts.parallel=fsdp",
                         "--run.keep_checkpoints=true")
    assert cut.returncode == 0, cut.stderr[-3000:]
    saved = torch.load(list_checkpoints(tmp_path / "fsdp" / "checkpoints")[-1], weights_only=False)
    from transformers import AutoModelForCausalLM

    initial = AutoModelForCausalLM.from_pretrained(tiny_model)
    trainable = {n: p for n, p in initial.named_parameters()}
    # rank 0 wrote whole (gathered) weights, and AdamW's state keyed by parameter name
    assert {k: v.shape for k, v in saved["model"].items()} == {k: v.shape for k, v in trainable.items()}
    assert set(saved["optimizer"]["state"]) == set(trainable)
    proc = torchrun_train(tiny_model, tmp_path, "fsdp", "--model_opts.parallel=fsdp")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from" in proc.stdout
    summary = json.loads((tmp_path / "fsdp" / "summary.json").read_text())
    assert summary["world"] == 2 and summary["steps"] == 3
    a, b = summary["replica_digests"]  # each process's sampling copy of the weights
    assert a == b and a != weights_digest(initial)
    # Sharded or replicated, the same data gives the same model (up to the reduction order).
    ddp_folder = ddp_run[1]
    assert len(_rewards_of(ddp_folder)) == 3 and _rewards_of(tmp_path / "fsdp") == _rewards_of(ddp_folder)
    w_fsdp = AutoModelForCausalLM.from_pretrained(tmp_path / "fsdp" / "final").state_dict()
    w_ddp = AutoModelForCausalLM.from_pretrained(ddp_folder / "final").state_dict()
    assert all(torch.allclose(w_fsdp[k], w_ddp[k], atol=1e-5) for k in w_ddp)
    assert any(not torch.equal(w_fsdp[k], initial.state_dict()[k]) for k in w_ddp)


def _rewards_of(folder: Path) -> list[float]:
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return rewards(lines)


class SwitchRecordingScorer(torch.nn.Module):
    """A scorer with FSDP2's gradient-sync switch, noting the switch as each backward reaches it."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.requires_sync = True
        self.sync_at_backward: list[bool] = []

    def set_requires_gradient_sync(self, flag: bool) -> None:
        self.requires_sync = flag

    def forward(self, ids: Any, attn: Any, targets: Any, mask: Any, with_entropy: bool = True, packed: Any = None,
                entropy_grad: bool = True) -> Any:
        logp = self.weight * mask.float() - 1.0
        logp.register_hook(lambda grad: self.sync_at_backward.append(self.requires_sync))
        return logp, torch.zeros_like(logp)


def test_fsdp_micro_batches_reduce_gradients_only_in_the_last_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    # FSDP2 reads its sync switch during the backward: a switch turned back on before the backward
    # runs would reduce-scatter the gradient of every micro-batch.
    from treegym.trainers import losses, parallel, update
    from treegym.trainers.logprobs import PaddedBatch

    monkeypatch.setattr(parallel, "any_rank", lambda flag, dist, device: bool(flag))  # no process group
    cfg = TrainConfig()
    cfg.optim.mini_batch_size, cfg.optim.micro_batch_size = 4, 2
    ids = torch.ones((4, 5), dtype=torch.long)
    per_token = torch.ones((4, 4))
    data = PaddedBatch(ids, torch.ones_like(ids), ids[:, 1:], per_token, -per_token,
                       {"advantages": per_token, "weights": per_token})
    scorer = SwitchRecordingScorer()
    optimizer = torch.optim.AdamW(scorer.parameters(), lr=0.1)
    u = update.Update(scorer, optimizer, list(scorer.parameters()), losses.ppo_clip_loss,
                      algorithms.ppo_options(cfg), cfg, parallel.Dist(rank=0, world=2), torch.device("cpu"))
    _, nonfinite = update.update(u, data, -per_token.clone(), None, [0, 1, 2, 3], n_mini=1)
    assert not nonfinite
    assert scorer.sync_at_backward == [False, True]
    assert scorer.requires_sync


def test_cli_reports_a_bad_override_without_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    from treegym.cli import main

    assert main(["train", "--algo", "grpo", "--optim.lr=fast"]) == 2
    err = capsys.readouterr().err
    assert "optim.lr: 'fast' is not a valid float" in err and "Traceback" not in err
    with pytest.raises(ConfigError, match="unknown config field 'lr_rate'"):
        load_config(overrides=[("lr_rate", "1")])


def test_lora_trains_only_the_adapters(tiny_model: Path, tmp_path: Path) -> None:
    cfg = tiny_config(tiny_model, tmp_path, algo="grpo", steps=2, run__name="lora", run__eval_n=0,
                      model_opts__lora=True, model_opts__lora_r=4, optim__ppo_epochs=2, optim__micro_batch_size=8)
    result = train(cfg, progress=False)
    saved = torch.load(list_checkpoints(result.folder / "checkpoints")[-1], weights_only=False)["model"]
    assert saved and all("lora_" in k for k in saved)
    # lora_B starts at zero; training moved it.
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in saved.items())
