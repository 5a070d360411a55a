"""Data parallelism for the update: DDP replicas or FSDP2 shards, behind one small interface.

``model_opts.parallel`` picks it (one process: neither, the scorer runs as it is):

- ``ddp``: every process holds the whole model and its optimiser state; gradients are
  all-reduced. The sampling policy reads the trained model itself.
- ``fsdp``: ``torch.distributed.fsdp.fully_shard`` on every decoder layer and on the scorer
  around them, so that weights, gradients and AdamW state are split across the processes
  (for models whose weights plus optimiser do not fit one device). A sharded model cannot
  sample (each process holds a slice, and generation lengths differ between processes, so
  the all-gathers would not line up), so the policy samples from a full copy of the
  weights that is refreshed after every update: the same push a vLLM engine gets.

Everything here that gathers (``full_weights``, ``checkpoint_state``) is a collective under
FSDP: every process calls it, in the same order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from treegym.errors import ConfigError


def is_sharded(module: nn.Module) -> bool:
    """Whether ``module``'s parameters are FSDP2 shards (DTensors)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


def check(parallel: str, lora: bool) -> None:
    """Refuse combinations this module does not support, before any model loads."""
    if parallel == "fsdp" and lora:
        raise ConfigError("config field model_opts.parallel: fsdp does not shard LoRA runs (their optimiser state "
                          "is small); use model_opts.parallel=ddp with model_opts.lora=true")


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The transformer blocks of a HF causal LM (each one FSDP unit)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = getattr(base.get_decoder(), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ConfigError(f"model_opts.parallel=fsdp: {type(base).__name__} has no decoder .layers to shard")
    return layers


def wrap(scorer: nn.Module, parallel: str, world: int, device: torch.device) -> nn.Module:
    """The module the update runs forward/backward through: the scorer, DDP- or FSDP-wrapped.

    Under FSDP the scorer itself becomes the root unit (``fully_shard`` changes it in place),
    so its forward gathers the embeddings, the final norm and the LM head, and each layer
    gathers its own weights.
    """
    if world <= 1:
        return scorer
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(scorer, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.fsdp import fully_shard

    for layer in decoder_layers(scorer.model):
        fully_shard(layer)
    fully_shard(scorer)
    return scorer


def grad_sync(trainer: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Accumulate this micro-batch's gradient locally (``sync=False``) or reduce it now."""
    if sync:
        return contextlib.nullcontext()
    if hasattr(trainer, "no_sync"):  # DDP
        return trainer.no_sync()
    if hasattr(trainer, "set_requires_gradient_sync"):  # FSDP2
        return _fsdp_no_sync(trainer)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _fsdp_no_sync(trainer: Any) -> Iterator[None]:
    trainer.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        trainer.set_requires_gradient_sync(True)


def all_max(value: int, world: int, device: torch.device) -> int:
    """The largest ``value`` over every process (so that all run as many collective forwards)."""
    if world <= 1:
        return value
    import torch.distributed as torch_dist

    t = torch.tensor([value], dtype=torch.long, device=device if device.type == "cuda" else "cpu")
    torch_dist.all_reduce(t, op=torch_dist.ReduceOp.MAX)
    return int(t.item())


def full_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, full tensor)`` for every entry of ``model.state_dict()``, one at a time, on the
    model's device: shards are all-gathered (a collective: every process iterates it all)."""
    from torch.distributed.tensor import DTensor

    for name, value in model.state_dict().items():
        yield name, (value.full_tensor() if isinstance(value, DTensor) else value).detach()


def checkpoint_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """Full (unsharded) trainable weights and optimiser state, on the CPU of rank 0 (empty
    elsewhere). A collective under FSDP; the optimiser state is keyed by parameter name."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    weights = {k: v for k, v in get_model_state_dict(model, options=opts).items() if k in names}
    return weights, get_optimizer_state_dict(model, optimizer, options=opts)


def load_checkpoint_state(model: nn.Module, optimizer: torch.optim.Optimizer, weights: dict[str, Any],
                          optim_state: dict[str, Any]) -> None:
    """Shard full weights and optimiser state (as ``checkpoint_state`` wrote them) into this
    process's slices. Every process passes the full dicts (each reads the checkpoint file)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=False))
    set_optimizer_state_dict(model, optimizer, optim_state, options=StateDictOptions(full_state_dict=True))
