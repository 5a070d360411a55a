"""One policy update on a scored batch: the pure loss of a micro-batch (``loss_step``), and the
``ppo_epochs`` x mini-batches x micro-batches schedule around it (``update``).

Log-probs: the loss scores rollout tokens with the HF model itself at temperature 1. The "old"
log-probs of the ratio are recomputed with the same code path on the pre-update weights (one
no-grad forward per chunk), rather than taken from the sampler, so that the ratio is exactly 1
before the first update whatever the sampling temperature, top-p or kernel differences between
generation and scoring. The sampler's behaviour log-probs are kept for a diagnostic
(``logprob_gap``: how far the scorer is from what the sampler saw).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from treegym.agents.rollout.types import Rollout
from treegym.trainers import parallel
from treegym.trainers.config import LossConfig
from treegym.trainers.logprobs import PaddedBatch, TokenScorer
from treegym.trainers.losses import LossOutput, aggregate, aggregation_size, kl_k3, masked_mean
from treegym.trainers.packing import Packed, pack_rows


def loss_step(loss_fn: Callable[..., LossOutput], loss_options: dict[str, Any], lc: LossConfig, logp: Tensor,
              entropy: Tensor, old_logp: Tensor, advantages: Tensor, weights: Tensor, mask: Tensor,
              ref_logp: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
    """A micro-batch's loss and its named quantities. Pure: tensors in, tensors out.

    The policy loss, minus the entropy bonus, plus the k3 KL to the reference when there is one.
    """
    out = loss_fn(logp, old_logp, advantages, mask, weights=weights, **loss_options)
    loss = out.loss
    if lc.entropy_coef:
        loss = loss - lc.entropy_coef * aggregate(entropy, mask, lc.agg, lc.constant_normalizer)
    metrics = dict(out.metrics)
    if ref_logp is not None:
        kl = aggregate(kl_k3(logp, ref_logp), mask, lc.agg, lc.constant_normalizer)
        loss = loss + lc.kl_coef * kl
        metrics["kl_ref"] = kl.detach()
    metrics["entropy"] = masked_mean(entropy, mask).detach()
    return loss, metrics


@dataclass
class Update:
    """What an update needs besides the batch: the run's model pieces and its options."""

    trainer: Any  # the scorer, DDP- or FSDP-wrapped under torchrun (``treegym.trainers.parallel.wrap``)
    optimizer: torch.optim.Optimizer
    params: list[torch.nn.Parameter]
    loss_fn: Callable[..., LossOutput]
    loss_options: dict[str, Any]
    cfg: Any  # TrainConfig
    dist: parallel.Dist
    device: torch.device


def update(u: Update, data: PaddedBatch, old_logp: Tensor, ref_logp: Tensor | None, first_order: list[int],
           n_mini: int, trees: list[int] | None = None) -> tuple[dict[str, list[float]], bool]:
    """``ppo_epochs`` x ``n_mini`` mini-batches x micro-batches over ``data``: per-name lists of the
    logged quantities, and whether a non-finite input, loss or gradient stopped it.

    Non-finite inputs skip the whole step before any update; a non-finite loss or gradient met
    later skips the rest of it (weights already stepped came from finite losses). The first
    mini-batch of the first epoch runs before any update, so its forward fills its own old
    log-probs (``old_logp`` rows of it are written in place).

    With ``optim.pack``, each micro-batch is forwarded tree-packed, and a mini-batch's rows are
    ordered by ``trees`` (a tree id per row) first, so that a tree's leaves share micro-batches
    and their common tokens are forwarded once. The mini-batch's loss is a sum over its rows,
    so the order changes nothing but summation order.
    """
    cfg, dist, device = u.cfg, u.dist, u.device
    stats: dict[str, list[float]] = {}
    bad_inputs = not (torch.isfinite(old_logp).all() and torch.isfinite(data.extras["advantages"]).all())
    nonfinite = parallel.any_rank(bool(bad_inputs), dist, device)
    fresh = True  # no update yet in this step: the current forward is the old policy
    mb_size, micro_size = cfg.optim.mini_batch_size, cfg.optim.micro_batch_size
    n_micro = math.ceil(mb_size / micro_size)
    for epoch in range(0 if nonfinite else cfg.optim.ppo_epochs):
        order = first_order if epoch == 0 else torch.randperm(len(data.input_ids)).tolist()
        for m in range(n_mini):
            mb = order[m * mb_size : (m + 1) * mb_size]
            if cfg.optim.pack and trees is not None:
                mb = sorted(mb, key=lambda row: trees[row])
            norm = max(aggregation_size(data.mask[mb], cfg.loss.agg), 1.0) if mb else 1.0
            u.optimizer.zero_grad(set_to_none=True)
            for k in range(n_micro):
                micro = mb[k * micro_size : (k + 1) * micro_size]
                # Every process runs the same number of forward/backward passes (DDP reduces
                # gradients in lock-step); an empty micro-batch scores row 0 x 0.
                rows, scale = (micro, 1.0) if micro else ([0], 0.0)
                sync = k == n_micro - 1
                # FSDP2 reads the sync switch in the backward, so the backward runs inside it too
                with parallel.grad_sync(u.trainer, sync or not dist.on):
                    with parallel.autocast(device, parallel.train_bf16(device, cfg.model_opts)):
                        ids, attn, tgt, mask, n, packed = take(data, rows, device, cfg.optim.pack)
                        logp, entropy = u.trainer(ids, attn, tgt, mask, with_entropy=True, packed=packed,
                                                  entropy_grad=cfg.loss.entropy_coef != 0)
                        if fresh and micro:
                            old_logp[micro, :n] = logp.detach().float().cpu()
                        loss, metrics = loss_step(
                            u.loss_fn, u.loss_options, cfg.loss, logp, entropy, old_logp[rows, :n].to(device),
                            data.extras["advantages"][rows, :n].to(device),
                            data.extras["weights"][rows, :n].to(device), mask,
                            None if ref_logp is None else ref_logp[rows, :n].to(device))
                        # the micro-batch's mean, scaled so that the accumulated sum is the mini-batch's mean
                        loss = loss * scale * (aggregation_size(data.mask[micro], cfg.loss.agg) / norm if micro else 1.0)
                    if parallel.any_rank(not torch.isfinite(loss).item(), dist, device):
                        return stats, True
                    loss.backward()
                if micro:
                    for key, value in metrics.items():
                        stats.setdefault(key, []).append(float(value))
                    _count_tokens(stats, attn, packed)
            grad_norm = torch.nn.utils.clip_grad_norm_(u.params, cfg.optim.max_grad_norm)
            if parallel.any_rank(not math.isfinite(float(grad_norm)), dist, device):
                return stats, True
            stats.setdefault("grad_norm", []).append(float(grad_norm))
            # A mini-batch whose advantages are all 0 has an exactly-zero gradient (on every
            # rank: it is reduced). AdamW would still move every weight by about lr on its stale
            # momentum, and with a sparse reward most steps are such steps.
            empty = cfg.optim.skip_empty_steps and float(grad_norm) == 0.0
            stats.setdefault("empty_steps", []).append(float(empty))
            if not empty:
                u.optimizer.step()
                fresh = False
    return stats, nonfinite


# ---- scoring helpers (pure, or no-grad forwards) ---------------------------------------------


def score(scorer: TokenScorer, data: PaddedBatch, cfg: Any, device: torch.device, *, rows: list[int] | None = None,
          dist: parallel.Dist | None = None) -> Tensor:
    """Log-probs of ``rows`` (default: every rollout) under the current weights, without grad.

    A sharded (FSDP) scorer's forward is a collective: given ``dist``, every process runs as
    many forwards as the busiest one (the extra ones score row 0 and are dropped).
    """
    every = list(range(len(data.input_ids))) if rows is None else rows
    out = torch.zeros((len(every), data.mask.shape[1]))
    size = cfg.optim.micro_batch_size
    chunks = math.ceil(len(every) / size)
    if dist is not None and dist.on and parallel.is_sharded(scorer):
        chunks = parallel.all_max(chunks, dist, device)
    with torch.no_grad(), parallel.autocast(device, parallel.train_bf16(device, cfg.model_opts)):
        for c in range(chunks):
            chunk = every[c * size : (c + 1) * size]
            ids, attn, tgt, mask, n, packed = take(data, chunk or [0], device, cfg.optim.pack)
            logp, _ = scorer(ids, attn, tgt, mask, with_entropy=False, packed=packed)
            if chunk:
                out[c * size : c * size + len(chunk), :n] = logp.float().cpu()
    return out


def take(data: PaddedBatch, rows: list[int], device: torch.device, pack: bool = False) -> tuple[Any, ...]:
    """The model inputs of ``rows``, trimmed to their own longest rollout; the target width; and
    the rows tree-packed (``None`` unless ``pack``)."""
    width = int(data.attention_mask[rows].sum(-1).max())
    n = width - 1
    ids, attn, mask = data.input_ids[rows, :width], data.attention_mask[rows, :width], data.mask[rows, :n]
    packed = pack_rows(ids, attn, mask).to(device) if pack else None
    return ids.to(device), attn.to(device), data.targets[rows, :n].to(device), mask.to(device), n, packed


PACK_COUNTS = ("packed_tokens", "row_tokens")  # summed over a step's micro-batches, not averaged


def _count_tokens(stats: dict[str, list[float]], attn: Tensor, packed: Packed | None) -> None:
    """Tokens the decoder forwarded for a micro-batch, and what one row per forward would have."""
    rows = float(attn.sum())
    stats.setdefault("row_tokens", []).append(rows)
    stats.setdefault("packed_tokens", []).append(float(packed.total) if packed is not None else rows)


def logprob_gap(data: PaddedBatch, logp: Tensor) -> float:
    """Mean |scorer - sampler| log-prob on action tokens (meaningful at temperature 1, top-p 1)."""
    return float(masked_mean((logp - data.behaviour_logprobs).abs(), data.mask))


def zero_share(advantages: list[Tensor], rollouts: list[Rollout]) -> float:
    """Share of action tokens whose advantage is exactly 0 (they carry no learning signal)."""
    masks = [torch.tensor(r.loss_mask, dtype=torch.bool) for r in rollouts]
    total = sum(int(m.sum()) for m in masks)
    zero = sum(int(((a == 0) & m).sum()) for a, m in zip(advantages, masks))
    return zero / total if total else 0.0
