"""Policy losses: pure functions over per-token log-probs, advantages and masks.

All tensors are ``[batch, time]``. ``mask`` is 1 on action tokens (the only tokens any loss
sees) and 0 on prompt, observation and padding tokens; ``weights`` (optional) scales each
token's contribution, e.g. to count a tree turn shared by several trajectories once. Each
loss returns a ``LossOutput``: the scalar and the named quantities the loop logs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from treegym.errors import ConfigError
from treegym.trainers.config import AGGREGATIONS, LossConfig

_DEFAULT = LossConfig()  # the keyword defaults, written once there


@dataclass(frozen=True)
class LossOutput:
    """The scalar to minimise, and the named quantities behind it (detached), logged under
    their names. Every loss reports ``approx_kl``, ``ratio_mean`` and ``pg_weight``: the mean
    |d loss / d log pi| per action token at ratio 1, the step size the advantages ask for (PPO:
    |A|·w; TreeOPSD: |r* - 1|·w), comparable across losses. The rest are the loss's own."""

    loss: Tensor
    metrics: dict[str, Tensor]


def aggregate(values: Tensor, mask: Tensor, mode: str = "token-mean", constant: float | None = None) -> Tensor:
    """Reduce per-token ``values`` over the masked tokens.

    - ``token-mean``: sum over all masked tokens / their count (long answers weigh more);
    - ``seq-mean``: mean over sequences of each sequence's token mean;
    - ``constant``: sum / ``constant`` (Dr. GRPO's fixed normaliser, e.g. the max length).
    An all-zero mask gives 0, never NaN.
    """
    if mode == "token-mean":
        return masked_mean(values, mask)
    mask = mask.to(values.dtype)
    if mode == "seq-mean":
        per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        has = (mask.sum(-1) > 0).to(values.dtype)
        return (per_seq * has).sum() / has.sum().clamp(min=1.0)
    if mode == "constant":
        if not constant or constant <= 0:
            raise ConfigError("aggregation 'constant' needs a positive loss.constant_normalizer")
        return (values * mask).sum() / constant
    raise ConfigError(f"aggregation {mode!r} is not one of: {', '.join(AGGREGATIONS)}")


def aggregation_size(mask: Tensor, mode: str) -> float:
    """How many units ``aggregate`` averages over: masked tokens (``token-mean``), sequences
    with a masked token (``seq-mean``), or 1 (``constant`` divides by a fixed number). A batch
    split into parts weighs each part's mean by its share of this size."""
    if mode == "token-mean":
        return float(mask.sum())
    if mode == "seq-mean":
        return float((mask.sum(-1) > 0).sum())
    return 1.0


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def _shared_metrics(log_ratio: Tensor, ratio: Tensor, pg_weight: Tensor, weights: Tensor | None,
                    mask: Tensor) -> dict[str, Tensor]:
    """What every loss reports (see ``LossOutput``)."""
    return {
        # k3 estimate of KL(old || new) on the behaviour samples, as CleanRL logs it
        "approx_kl": masked_mean(torch.exp(log_ratio) - 1 - log_ratio, mask).detach(),
        "ratio_mean": masked_mean(ratio, mask).detach(),
        "pg_weight": masked_mean(pg_weight if weights is None else pg_weight * weights, mask).detach(),
    }


def ppo_clip_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip: float = _DEFAULT.clip,
    dual_clip: float | None = _DEFAULT.dual_clip,
    weights: Tensor | None = None,
    agg: str = _DEFAULT.agg,
    constant: float | None = _DEFAULT.constant_normalizer,
) -> LossOutput:
    """PPO's clipped surrogate, with dual clip for negative advantages.

    pg_loss1 = -A·r, pg_loss2 = -A·clip(r, 1-ε, 1+ε), loss = max(pg_loss1, pg_loss2); for
    A < 0 the loss is further capped at -A·c (dual clip), so one token whose ratio exploded
    cannot dominate the batch.
    """
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1.0 - clip, 1.0 + clip)
    clipped = torch.maximum(pg_loss1, pg_loss2)
    if dual_clip is not None:
        capped = torch.minimum(clipped, -advantages * dual_clip)
        clipped = torch.where(advantages < 0, capped, clipped)
    loss = aggregate(clipped if weights is None else clipped * weights, mask, agg, constant)
    clipfrac = masked_mean((pg_loss2 > pg_loss1).to(logp.dtype), mask).detach()
    return LossOutput(loss, {
        "pg_loss": loss.detach(),
        "pg_loss1": masked_mean(pg_loss1, mask).detach(),
        "pg_loss2": masked_mean(pg_loss2, mask).detach(),
        "clipfrac": clipfrac,
        **_shared_metrics(log_ratio, ratio, advantages.abs(), weights, mask),
    })


def teacher_ratio(advantages: Tensor, beta: float = _DEFAULT.beta, eps: float = _DEFAULT.eps) -> Tensor:
    """TreeOPSD's teacher map: the target ratio q/π_b = r* = clip(exp(A/β), 1-ε, 1+ε).

    This is the one place to change when the paper's exact teacher is known. It is the
    bounded reweighting w(A) = exp(A/β) of the behaviour policy, with w(0) = 1. With ε ≥ 1 the
    lower bound is gone, and below A/β ≈ -104 exp underflows: r* is exactly 0 (a teacher that
    gives the token no mass), which ``treeopsd_loss`` handles.
    """
    return torch.clamp(torch.exp(advantages / beta), 1.0 - eps, 1.0 + eps)


def treeopsd_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    beta: float = _DEFAULT.beta,
    eps: float = _DEFAULT.eps,
    weights: Tensor | None = None,
    agg: str = _DEFAULT.agg,
    constant: float | None = _DEFAULT.constant_normalizer,
) -> LossOutput:
    """TreeOPSD: generalised KL from a credit-reweighted teacher to the student.

    This implements a *reading* of TreeOPSD (arXiv 2610.23181); the paper's full text was not
    available, so the exact teacher and divergence may differ from the authors'. The reading:

    - the teacher is the behaviour policy reweighted by a bounded function of the turn
      credit, q = π_b · w(A) with w(0) = 1, so the target likelihood ratio of each action
      token is r* = ``teacher_ratio(A)`` = clip(exp(A/β), 1-ε, 1+ε);
    - the loss is the generalised (unnormalised) KL between teacher and student, estimated on
      the behaviour samples with r = π_θ/π_b per token:  r*·log(r*/r) - r* + r.

    Its gradient in log π_θ is (r - r*), so at r = 1 it is -(r* - 1)·∇log π_θ: the policy
    gradient direction with weight (r* - 1). That weight equals A/β only to first order
    (exp(A/β) - 1 = A/β + O((A/β)²), before the clip), so the step is the policy gradient's only
    for small A/β; and when ``sampler.distinct`` resamples sibling branches, the samples no longer
    come from π_b, and the estimate is not the policy gradient at all. Unlike PPO's linear
    surrogate, it has a minimum at the finite target r = r*, so repeated epochs on one batch
    stop there instead of running to the clip edge.
    """
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    target = teacher_ratio(advantages, beta, eps).detach()
    # r*·log(r*/r), with 0·log 0 = 0: r* is 0 where exp(A/β) underflows (ε ≥ 1)
    log_term = torch.special.xlogy(target, target) - target * log_ratio
    linear_term = ratio - target  # -r* + r
    per_token = log_term + linear_term
    loss = aggregate(per_token if weights is None else per_token * weights, mask, agg, constant)
    passed = (ratio - target) * (target - 1.0) > 0  # the ratio has already passed its target
    return LossOutput(loss, {
        "opsd_loss": loss.detach(),
        "opsd_log_term": masked_mean(log_term, mask).detach(),
        "opsd_linear_term": masked_mean(linear_term, mask).detach(),
        "opsd_past_target": masked_mean(passed.to(logp.dtype), mask).detach(),
        "opsd_teacher_ratio": masked_mean(target, mask).detach(),
        **_shared_metrics(log_ratio, ratio, (target - 1.0).abs(), weights, mask),
    })


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(π_θ || π_ref) on samples: exp(d) - d - 1, d = ref - logp.

    Non-negative, unbiased, and low-variance (Schulman's k3); its value is clamped so one
    extreme token cannot blow up the step.
    """
    d = torch.clamp(ref_logp - logp, -20.0, 20.0)
    return torch.exp(d) - d - 1.0
