"""Processes, devices and data parallelism: what the loop stands on below the model.

One process, or a ``torchrun`` group (gloo on CPU, NCCL on GPU): ``setup_distributed`` joins it
and picks the device, and the collectives here (sums, broadcasts, gathers) are no-ops in one
process. ``model_opts.parallel`` picks how the update is parallel (one process: neither, the
scorer runs as it is):

- ``ddp``: every process holds the whole model and its optimiser state; gradients are
  all-reduced. The sampling policy reads the trained model itself.
- ``fsdp``: ``torch.distributed.fsdp.fully_shard`` on every decoder layer and on the scorer
  around them, so that weights, gradients and AdamW state are split across the processes
  (for models whose weights plus optimiser do not fit one device); the policy samples from a
  full copy of the weights (``treegym.trainers.engines``).

Everything here that gathers (``full_weights``, ``checkpoint_state``) is a collective under
FSDP: every process calls it, in the same order.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as torch_dist
from torch import nn
from torch.autograd.graph import increment_version

from treegym.agents.fast_decode import cpu_has_bf16
from treegym.errors import ConfigError
from treegym.trainers.model import base_model, trainable_names

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


def pick_device(device_pref: str) -> torch.device:
    """``model_opts.device`` for this process: ``auto`` is its GPU when there is one; under
    torchrun every process takes the GPU of its local rank."""
    place = launched()
    if device_pref == "auto":
        return torch.device(f"cuda:{place.local_rank}" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device_pref)
    except RuntimeError:
        raise ConfigError(f"config field model_opts.device: {device_pref!r} is not cpu, cuda, cuda:N or auto") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("config field model_opts.device: cuda was asked for, but no GPU is visible")
    if device.type == "cuda" and place.on:
        device = torch.device(f"cuda:{place.local_rank}")
    return device


def launched() -> Dist:
    """This process's place as torchrun's environment gives it (one process without torchrun)."""
    env = os.environ
    return Dist(int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1")), int(env.get("LOCAL_RANK", "0")))


def setup_distributed(device_pref: str) -> tuple[Dist, torch.device]:
    """Join the torchrun group if launched by torchrun (gloo on CPU, NCCL on GPU); pick the device."""
    dist, device = launched(), pick_device(device_pref)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if dist.on and not torch_dist.is_initialized():
        torch_dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return dist, device


def barrier(dist: Dist) -> None:
    """Wait for every process (a no-op in one process)."""
    if dist.on:
        torch_dist.barrier()


def teardown_distributed(dist: Dist) -> None:
    """Leave the torchrun group ``setup_distributed`` joined. In one process the default group, if any,
    is not ours: a vLLM engine in this process made it, and still uses it (as does the next engine)."""
    if dist.on and torch_dist.is_initialized():
        torch_dist.destroy_process_group()


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep the memory a process frees for its next allocation, instead of
    handing large blocks back to the kernel: on a CPU a step allocates and frees the same
    hundred-MB tensors (the tied head's bf16 copy and gradient, activations) every micro-batch, and
    fresh pages cost a fault each on first touch (about 8% of the packed bf16 update here,
    ``benchmarks/bench_rl_step.py``; peak RSS 6.4 -> 5.7 GB on that batch). Not glibc, or ``TREEGYM_MALLOC=default``:
    nothing changes. True where it took effect."""
    if os.environ.get("TREEGYM_MALLOC", "").strip().lower() == "default":
        return False
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_max = -1, -4  # glibc's mallopt parameters (malloc.h)
        return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 2**31 - 1))
    except (OSError, AttributeError):
        return False


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


class _AdamW(torch.optim.AdamW):
    """AdamW whose step bumps each updated weight's version counter, as in-place ops do.

    The fused kernel writes the weights without bumping it, and samplers read the counters to tell
    whether their stored prefix KV and packed weights came from these weights (``HFPolicy``): with
    the plain fused kernel they sampled from stale weights after every update, and nothing learned."""

    def step(self, closure: Any = None) -> Any:
        loss = super().step(closure)
        if self.defaults.get("fused"):
            with torch.no_grad():
                increment_version([p for group in self.param_groups for p in group["params"] if p.grad is not None])
        return loss


def adamw(params: Sequence[nn.Parameter], lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW, fused where every parameter is a plain CPU or CUDA tensor (not an FSDP shard).

    The fused kernel does AdamW's update in one pass over each tensor. The default (``foreach``)
    makes whole-model temporaries at every step: on a 2-core CPU it took 0.4-0.9 s a step for
    SmolLM2's 135M weights (3.7 s the first), the fused one 0.09 s (``benchmarks/bench_rl_step.py``).
    The update is the same algorithm; only float summation order can differ."""
    plain = all(type(p.data) is torch.Tensor and p.device.type in ("cpu", "cuda") for p in params)
    return _AdamW(params, lr=lr, weight_decay=weight_decay, fused=bool(plain and params) or None)


def train_bf16(device: torch.device, opts: Any) -> bool:
    """Whether the update (the trainer's forward and backward, and its old/reference log-probs) runs
    under bf16 autocast; weights, gradients and AdamW stay fp32. On a GPU with ``model_opts.bf16``;
    on a CPU by ``model_opts.cpu_bf16`` (``auto``: where :func:`cpu_has_bf16`)."""
    if device.type == "cuda":
        return bool(opts.bf16)
    if device.type == "cpu":
        return opts.cpu_bf16 == "on" or (opts.cpu_bf16 == "auto" and cpu_has_bf16())
    return False


def generate_bf16(device: torch.device, opts: Any) -> bool:
    """Whether sampling and held-out evaluation run under bf16 autocast: on a GPU with
    ``model_opts.bf16``, never on a CPU. There generation runs under ``inference_mode``, where
    autocast keeps no cast weights and re-casts every weight at every decode step (HFPolicy made 25
    generated tokens/s under it against 49 in fp32, ``benchmarks/bench_rl_step.py``); a CPU samples
    in bf16 through its own decoder instead (``decode_bf16``)."""
    return device.type == "cuda" and bool(opts.bf16)


def decode_bf16(device: torch.device, opts: Any) -> bool:
    """Whether ``HFPolicy`` samples and evaluates through the bf16 decoder
    (``agents.fast_decode.FastDecoder``: bf16 weights cast once per update, fp32 residual stream and
    KV): on a CPU, under the same rule as the update's bf16 (``train_bf16``), so that a run samples
    with the numerics it trains with. ``treegym eval`` on the same CPU decides it the same way
    (``HFPolicy``'s default), so a run's held-out figures are what it replays."""
    return device.type == "cpu" and train_bf16(device, opts)


def autocast(device: torch.device, bf16: bool) -> contextlib.AbstractContextManager:
    """bf16 autocast on ``device`` (weights stay fp32) when ``bf16``; nothing otherwise."""
    if bf16 and device.type in ("cuda", "cpu"):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _all_reduce(values: Sequence[float], dist: Dist, device: torch.device, op: Any = None) -> list[float]:
    """Reduce a vector of floats over every process (default: sum); itself in one process."""
    if not dist.on:
        return [float(v) for v in values]
    # NCCL reduces on the GPU, gloo on the CPU
    t = torch.tensor(list(values), dtype=torch.float64, device=device if device.type == "cuda" else "cpu")
    torch_dist.all_reduce(t, op=op if op is not None else torch_dist.ReduceOp.SUM)
    return t.tolist()


def all_sum_named(values: dict[str, float], dist: Dist, device: torch.device) -> dict[str, float]:
    """Sum named floats over every process (the same names on every process)."""
    names = sorted(values)
    return dict(zip(names, _all_reduce([values[k] for k in names], dist, device)))


def any_rank(flag: bool, dist: Dist, device: torch.device) -> bool:
    """True on every process if ``flag`` is true on any (so all take the same branch)."""
    return _all_reduce([float(flag)], dist, device)[0] > 0


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


# ---- data parallelism of the update ------------------------------------------------------------


def is_sharded(module: nn.Module) -> bool:
    """Whether ``module``'s parameters are FSDP2 shards (DTensors)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


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

    base = base_model(scorer.model)
    layers = getattr(base.get_decoder(), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ConfigError(f"model_opts.parallel=fsdp: {type(base).__name__} has no decoder .layers to shard")
    for layer in layers:
        fully_shard(layer)
    fully_shard(scorer)
    return scorer


@contextlib.contextmanager
def grad_sync(trainer: nn.Module, sync: bool) -> Iterator[None]:
    """Accumulate the gradient of the forward and backward run inside locally (``sync=False``),
    or reduce it as usual. DDP decides at the forward, FSDP2 during the backward: both run inside."""
    if not sync and hasattr(trainer, "no_sync"):  # DDP
        with trainer.no_sync():
            yield
    elif not sync and hasattr(trainer, "set_requires_gradient_sync"):  # FSDP2
        trainer.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            trainer.set_requires_gradient_sync(True)
    else:
        yield


def all_max(value: int, dist: Dist, device: torch.device) -> int:
    """The largest ``value`` over every process (so that all run as many collective forwards)."""
    return int(_all_reduce([value], dist, device, torch_dist.ReduceOp.MAX)[0])


def full_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, full tensor)`` for every entry of ``model.state_dict()``, one at a time, on the
    model's device: shards are all-gathered (a collective: every process iterates it all)."""
    from torch.distributed.tensor import DTensor

    for name, value in model.state_dict().items():
        yield name, (value.full_tensor() if isinstance(value, DTensor) else value).detach()


def checkpoint_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """Full (unsharded) trainable weights and optimiser state, on the CPU of rank 0 (empty
    elsewhere). A collective under FSDP; the optimiser state is keyed by parameter name."""
    from torch.distributed.checkpoint import state_dict as dcp

    opts = dcp.StateDictOptions(full_state_dict=True, cpu_offload=True)
    names = trainable_names(model)
    weights = {k: v for k, v in dcp.get_model_state_dict(model, options=opts).items() if k in names}
    return weights, dcp.get_optimizer_state_dict(model, optimizer, options=opts)


def load_checkpoint_state(model: nn.Module, optimizer: torch.optim.Optimizer, weights: dict[str, Any],
                          optim_state: dict[str, Any]) -> None:
    """Shard full weights and optimiser state (as ``checkpoint_state`` wrote them) into this
    process's slices. Every process passes the full dicts (each reads the checkpoint file)."""
    from torch.distributed.checkpoint import state_dict as dcp

    dcp.set_model_state_dict(model, weights, options=dcp.StateDictOptions(full_state_dict=True, strict=False))
    dcp.set_optimizer_state_dict(model, optimizer, optim_state, options=dcp.StateDictOptions(full_state_dict=True))
