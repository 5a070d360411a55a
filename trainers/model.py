"""The policy model of a run: loading it (LoRA, gradient checkpointing), its KL reference, and
the sampling policy over the same weights."""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import torch

from treegym.agents.models import load_model
from treegym.errors import MissingPackageError
from treegym.trainers.config import TrainConfig


def load_trainable_model(cfg: TrainConfig, device: torch.device) -> tuple[torch.nn.Module, Any]:
    """The policy model in fp32 (autocast handles bf16), with LoRA adapters if configured."""
    model, tokenizer = load_model(cfg.model, device=str(device), dtype=torch.float32)
    if cfg.model_opts.lora:  # adapters on every linear layer (peft); only they train
        try:
            from peft import LoraConfig, get_peft_model
        except ImportError as exc:
            raise MissingPackageError("peft", "LoRA training (model_opts.lora=true)", "pip install 'treegym[lora]'") from exc
        lora = LoraConfig(r=cfg.model_opts.lora_r, lora_alpha=cfg.model_opts.lora_alpha, target_modules="all-linear",
                          task_type="CAUSAL_LM")
        model = get_peft_model(model, lora)
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


def trainable_names(model: torch.nn.Module) -> set[str]:
    """Names of the parameters that training changes (all of them, or the LoRA adapters only)."""
    return {n for n, p in model.named_parameters() if p.requires_grad}


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside a peft wrapper (LoRA layers are injected in place)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def reference_scope(model: torch.nn.Module, frozen: torch.nn.Module | None) -> tuple[torch.nn.Module, contextlib.AbstractContextManager]:
    """The frozen reference for the KL term: the frozen copy, or without one (LoRA) the base (adapters off)."""
    if frozen is None:
        return model, model.disable_adapter()
    return frozen, contextlib.nullcontext()


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module | None:
    """A frozen copy of the initial weights for the KL reference (None under LoRA: not needed)."""
    if hasattr(model, "disable_adapter"):
        return None
    ref = copy.deepcopy(model)
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref.eval()


def make_policy(model: torch.nn.Module, tokenizer: Any, seed: int, bf16: bool = False) -> Any:
    """The sampling policy over the *same* model object, so it always samples current weights.

    Its prefix KV store must be cleared after every update (``policy.clear_cache()``). ``bf16``: on a
    CPU, sample through the bf16 decoder (``trainers.parallel.decode_bf16`` decides it for a run).
    """
    from treegym.agents.hf_policy import HFPolicy

    return HFPolicy(base_model(model), tokenizer, seed=seed, bf16=bf16)


def policy_generators(policy: Any) -> dict[str, torch.Generator]:
    """The policy's sampling generator (``policy.generator``), so that checkpoints capture its stream."""
    g = getattr(policy, "generator", None)
    return {"policy": g} if isinstance(g, torch.Generator) else {}


