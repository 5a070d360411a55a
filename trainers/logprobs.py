"""Token log-probs of rollouts under a causal LM: padding, one forward per chunk, entropy.

The loss needs log π(token | prefix) for the action tokens of each rollout. ``TokenScorer``
runs the decoder once over a right-padded chunk of rollouts and applies the LM head only at
the positions that predict action tokens, so the full ``[batch, time, vocab]`` logits tensor
is never built (it dominates memory for 50k-token vocabularies). Log-probs are at
temperature 1: the model's own distribution.

``TokenScorer`` is an ``nn.Module`` so that it can be wrapped in DDP as a whole: the forward
that DDP sees is the forward whose gradients it reduces.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from treegym.agents.models import plain_head
from treegym.agents.rollout.types import Rollout
from treegym.trainers.model import base_model
from treegym.trainers.packing import Packed, packed_attention, runs_supported


@dataclass(frozen=True)
class PaddedBatch:
    """Rollouts as right-padded tensors, shifted so that position t predicts token t + 1."""

    input_ids: Tensor  # [B, T]
    attention_mask: Tensor  # [B, T]
    targets: Tensor  # [B, T-1]: input_ids[:, 1:]
    mask: Tensor  # [B, T-1]: 1 where targets[:, t] is an action token
    behaviour_logprobs: Tensor  # [B, T-1], aligned with targets
    extras: dict[str, Tensor]  # per-token tensors aligned with targets (advantages, weights ...)


def pad_right(rows: Sequence[Sequence[float] | Tensor], width: int, fill: float = 0, dtype: torch.dtype = torch.float32) -> Tensor:
    """``[len(rows), width]``: each row, then ``fill``."""
    out = torch.full((len(rows), width), fill, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(row, dtype=dtype)
    return out


def pad_rollouts(rollouts: Sequence[Rollout], pad_id: int, extras: dict[str, Sequence[Tensor]] | None = None) -> PaddedBatch:
    """Right-pad ``rollouts``; per-token ``extras`` (one tensor per rollout) are padded with 0."""
    width = max(len(r.token_ids) for r in rollouts)
    ids = pad_right([r.token_ids for r in rollouts], width, pad_id, torch.long)
    attn = pad_right([[1] * len(r.token_ids) for r in rollouts], width, 0, torch.long)
    mask = pad_right([r.loss_mask for r in rollouts], width)
    blp = pad_right([r.behaviour_logprobs for r in rollouts], width)
    ext = {k: pad_right(values, width) for k, values in (extras or {}).items()}
    # Token t is predicted at position t - 1: drop the first column of per-token data.
    return PaddedBatch(ids, attn, ids[:, 1:], mask[:, 1:], blp[:, 1:], {k: v[:, 1:] for k, v in ext.items()})


class TokenScorer(nn.Module):
    """log π(target) and the policy's entropy at every position of a padded batch.

    Positions outside ``mask`` get log-prob 0 and entropy 0; the LM head runs only where
    ``mask`` is set. The RL loss and SFT's loss both score with it.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor, targets: Tensor, mask: Tensor,
                with_entropy: bool = True, packed: Packed | None = None,
                entropy_grad: bool = True) -> tuple[Tensor, Tensor]:
        """Per-position log-probs and entropies ``[B, T-1]``. Given ``packed`` (the same rows as
        ``pack_rows`` packs them), the decoder runs once over the packed sequence instead. Without
        ``entropy_grad`` the entropy is a metric, computed outside the graph: the backward skips its
        three vocabulary-wide products (the loss has no entropy bonus)."""
        base = base_model(self.model)
        where = mask > 0
        if packed is not None:
            logits = self._packed_logits(base, packed)
        elif plain_head(base):
            hidden = base.get_decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            logits = base.get_output_embeddings()(hidden[:, :-1][where]).float()
        else:  # a transform after the head (logit softcapping or scaling): the model's own logits
            logits = base(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1][where].float()
        logp_all = torch.log_softmax(logits, dim=-1)
        tgt = packed.tgt if packed is not None else targets[where]
        picked = logp_all.gather(-1, tgt[:, None]).squeeze(-1)
        ent = None
        if with_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                ent = -(logp_all.exp() * logp_all).sum(-1)
        if packed is not None:  # one value per distinct scored token: each row reads its own
            picked = picked[packed.index[where]]
            ent = None if ent is None else ent[packed.index[where]]
        logp = torch.zeros(targets.shape, dtype=torch.float32, device=logits.device)
        logp = logp.masked_scatter(where, picked)
        entropy = torch.zeros_like(logp)
        if ent is not None:
            entropy = entropy.masked_scatter(where, ent)
        return logp, entropy

    def _packed_logits(self, base: nn.Module, packed: Packed) -> Tensor:
        return packed_logits(base, packed, runs_supported(base.config))


def packed_logits(base: nn.Module, packed: Packed, runs: bool) -> Tensor:
    """Logits at the packed positions that predict a scored token, ``[S, vocab]``.

    With ``runs`` (plain attention), attention runs run by run (``packing.run_attention``: each
    run's queries over its row's keys); otherwise (a sliding window, soft-capping) the model's own
    attention gets the ``[P, P]`` ancestor mask."""
    kwargs: dict[str, Any] = {"input_ids": packed.input_ids, "position_ids": packed.position_ids}
    scope: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if runs:
        scope = packed_attention(base.config)
        kwargs["tree_runs"] = packed.runs
    else:
        eager = getattr(base.config, "_attn_implementation", "sdpa") == "eager"
        allowed = packed.ancestors()[None, None]
        # transformers uses a 4D mask as given: SDPA reads bool, eager adds it to the scores
        kwargs["attention_mask"] = (torch.zeros(allowed.shape, dtype=base.dtype, device=allowed.device)
                                    .masked_fill(~allowed, torch.finfo(base.dtype).min) if eager else allowed)
    with scope:
        if plain_head(base):
            hidden = base.get_decoder()(**kwargs).last_hidden_state[0]
            return base.get_output_embeddings()(hidden[packed.src]).float()
        return base(**kwargs).logits[0, packed.src].float()
