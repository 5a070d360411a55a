"""What the training loop stands on: processes, devices, the model, envs, prompts and policy.

Each helper is one edge of the loop (torch.distributed, CUDA, the filesystem, gym, the HF
model), kept here so that ``treegym.trainers.loop`` reads as the algorithm only.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.distributed as torch_dist

from treegym.envs import registry as env_registry
from treegym.errors import ConfigError, MissingPackageError
from treegym.trainers.config import TrainConfig

# ---- processes and devices ----------------------------------------------------------------------


@dataclass(frozen=True)
class Dist:
    """This process's place in a (possibly single-process) data-parallel group."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def on(self) -> bool:
        return self.world > 1


def setup_distributed(device_pref: str) -> tuple[Dist, torch.device]:
    """Join the torchrun group if launched by torchrun (gloo on CPU, NCCL on GPU); pick the device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device_pref == "auto":
        device = torch.device(f"cuda:{local}" if torch.cuda.is_available() else "cpu")
    else:
        try:
            device = torch.device(device_pref)
        except RuntimeError:
            raise ConfigError(f"config field model_opts.device: {device_pref!r} is not cpu, cuda, cuda:N or auto") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError("config field model_opts.device: cuda was asked for, but no GPU is visible")
        if device.type == "cuda" and world > 1:
            device = torch.device(f"cuda:{local}")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1 and not torch_dist.is_initialized():
        torch_dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return Dist(rank, world, local), device


def barrier(dist: Dist) -> None:
    """Wait for every process (a no-op in one process)."""
    if dist.on:
        torch_dist.barrier()


def teardown_distributed() -> None:
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def autocast(device: torch.device, bf16: bool) -> contextlib.AbstractContextManager:
    """bf16 autocast on GPU (weights stay fp32); nothing on CPU."""
    if device.type == "cuda" and bf16:
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def all_sum(values: Sequence[float], dist: Dist, device: torch.device) -> list[float]:
    """Sum a vector of floats over every process."""
    if not dist.on:
        return list(map(float, values))
    t = torch.tensor(list(values), dtype=torch.float64, device=device if device.type == "cuda" else "cpu")
    torch_dist.all_reduce(t)
    return t.tolist()


def all_sum_named(values: dict[str, float], dist: Dist, device: torch.device) -> dict[str, float]:
    """Sum named floats over every process (the same names on every process)."""
    names = sorted(values)
    return dict(zip(names, all_sum([float(values[k]) for k in names], dist, device)))


def any_rank(flag: bool, dist: Dist, device: torch.device) -> bool:
    """True on every process if ``flag`` is true on any (so all take the same branch)."""
    return all_sum([float(flag)], dist, device)[0] > 0


def broadcast_object(obj: Any, dist: Dist) -> Any:
    if not dist.on:
        return obj
    box = [obj]
    torch_dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj: Any, dist: Dist) -> list[Any]:
    if not dist.on:
        return [obj]
    out: list[Any] = [None] * dist.world
    torch_dist.all_gather_object(out, obj)
    return out


def weights_digest(model: torch.nn.Module) -> str:
    """A hash of the trainable weights: equal on every replica of a healthy DDP run."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if p.requires_grad:
            h.update(name.encode())
            h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


# ---- model ------------------------------------------------------------------------------------


def load_trainable_model(cfg: TrainConfig, device: torch.device) -> tuple[torch.nn.Module, Any]:
    """The policy model in fp32 (autocast handles bf16), with LoRA adapters if configured."""
    from treegym.agents.models import load_model

    model, tokenizer = load_model(cfg.model, device=str(device), dtype=torch.float32)
    if cfg.model_opts.lora:
        model = with_lora(model, cfg.model_opts.lora_r, cfg.model_opts.lora_alpha, "LoRA training (model_opts.lora=true)")
    if wants_checkpointing(cfg.model_opts.gradient_checkpointing, model, device):
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    # Eval mode for sampling and scoring alike: no dropout, so log-probs are those of the
    # policy that sampled (SmolLM2 has none anyway).
    model.eval()
    return model, tokenizer


AUTO_CHECKPOINTING_PARAMS = 2_000_000_000  # gradient_checkpointing=auto: on from this size, on a GPU


def wants_checkpointing(setting: str, model: torch.nn.Module, device: torch.device) -> bool:
    """Gradient checkpointing: ``on``/``off``, or ``auto``: on a GPU, for models of 2B+ parameters
    (below that an H200 holds the activations of a Tree-GRPO batch, and recomputing them costs
    about a third more compute)."""
    if setting != "auto":
        return setting == "on"
    return device.type == "cuda" and sum(p.numel() for p in model.parameters()) >= AUTO_CHECKPOINTING_PARAMS


def checkpointing_on(model: torch.nn.Module) -> bool:
    """Whether ``model`` recomputes activations (transformers 5.x renamed the flag)."""
    base = base_model(model)
    name = "is_activation_checkpointing" if hasattr(type(base), "is_activation_checkpointing") else "is_gradient_checkpointing"
    return bool(getattr(base, name, False))


def with_lora(model: torch.nn.Module, r: int, alpha: int, purpose: str) -> torch.nn.Module:
    """``model`` with LoRA adapters on every linear layer (peft); only the adapters train."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise MissingPackageError("peft", purpose, "pip install 'treegym[lora]'") from exc
    lora = LoraConfig(r=r, lora_alpha=alpha, target_modules="all-linear", task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside a peft wrapper (LoRA layers are injected in place)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def reference_scope(model: torch.nn.Module, frozen: torch.nn.Module | None) -> tuple[torch.nn.Module, contextlib.AbstractContextManager]:
    """The frozen reference for the KL term: LoRA's base (adapters off), or a frozen copy."""
    if frozen is None and hasattr(model, "disable_adapter"):
        return model, model.disable_adapter()
    assert frozen is not None
    return frozen, contextlib.nullcontext()


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module | None:
    """A frozen copy of the initial weights for the KL reference (None under LoRA: not needed)."""
    if hasattr(model, "disable_adapter"):
        return None
    ref = copy.deepcopy(model)
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref.eval()


def make_policy(model: torch.nn.Module, tokenizer: Any, seed: int) -> Any:
    """The sampling policy over the *same* model object, so it always samples current weights.

    Its prefix KV store must be cleared after every update (``policy.clear_cache()``).
    """
    from treegym.agents.hf_policy import HFPolicy

    return HFPolicy(base_model(model), tokenizer, seed=seed)


def policy_generators(policy: Any) -> dict[str, torch.Generator]:
    """The policy's sampling generator (``policy.generator``), so that checkpoints capture its stream."""
    g = getattr(policy, "generator", None)
    return {"policy": g} if isinstance(g, torch.Generator) else {}


# ---- envs and prompts ---------------------------------------------------------------------------


def sampling_params(cfg: TrainConfig, temperature: float | None = None, top_p: float | None = None) -> Any:
    """The sampler section as ``SamplingParams`` (``temperature``/``top_p`` override it: evals)."""
    from treegym.agents.policy import SamplingParams

    s = cfg.sampler
    return SamplingParams(temperature=s.temperature if temperature is None else temperature,
                          top_p=s.top_p if top_p is None else top_p, max_new_tokens=s.max_new_tokens,
                          ignore_eos=s.ignore_eos)


def train_env_id(cfg: TrainConfig) -> str:
    """The id the run trains on: the env's registered training variant, if it has one."""
    return env_registry.training_id(cfg.env)


def train_env_kwargs(cfg: TrainConfig) -> dict[str, Any]:
    """The env kwargs of a training run: the variant's, under the user's ``env_kwargs``."""
    return {**env_registry.env_kwargs(train_env_id(cfg)), **cfg.env_kwargs}


def make_env(cfg: TrainConfig, split: str) -> gym.Env:
    """One env of the run's training variant on ``split``, with the sampler's turn budget."""
    return env_registry.make(train_env_id(cfg), split, max_turns=cfg.sampler.max_turns, **cfg.env_kwargs)


def preflight(cfg: TrainConfig) -> None:
    """Fail in a second, before any model load or run folder: the env id, its splits, the model."""
    from treegym.agents.models import resolve_model_folder

    env_registry.resolve_split(cfg.env, cfg.run.train_split)
    if cfg.run.eval_n:
        env_registry.resolve_split(cfg.env, cfg.run.eval_split)
    resolve_model_folder(cfg.model)


def train_prompts(ids: list[Any] | None, seed: int, start: int, count: int) -> list[Any]:
    """Prompts ``start .. start+count`` of the training stream: a reshuffled pass per epoch."""
    out = []
    for pos in range(start, start + count):
        if ids is None:
            out.append(1_000_003 * (seed + 1) + pos)
            continue
        epoch, i = divmod(pos, len(ids))
        order = list(range(len(ids)))
        random.Random(seed * 7919 + epoch).shuffle(order)
        out.append({"task_id": ids[order[i]]})
    return out


def eval_prompts(ids: list[Any] | None, n: int) -> list[Any]:
    """The first ``n`` tasks of the eval split (or ``n`` fixed seeds): the same set every time."""
    if ids is None:
        return [10**9 + i for i in range(n)]
    return [{"task_id": t} for t in ids[:n]]
