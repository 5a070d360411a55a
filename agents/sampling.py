"""Pure pieces of token sampling shared by the policy backends: next-token choice and stop strings.

Behaviour log-probs: a sampled token's log-prob is taken under ``log_softmax(logits / T)`` over
the full vocabulary, before top-p truncation (and under ``log_softmax(logits)`` when greedy,
T = 0). At T = 1 this is exactly the policy's own log-prob, which is what the trainer's
importance ratios need; at other temperatures it is the tempered distribution the token was
drawn from (top-p aside), as vLLM reports it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def sample_tokens(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None,
    exclude: Sequence[int] = (),
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row of ``logits`` [B, V]; return (token ids [B], their log-probs [B]).

    ``exclude``: token ids never picked (the rest renormalised, then top-p); a row left with
    nothing to pick ignores it. The log-probs are the unfiltered distribution's, as with top-p."""
    logits = logits.float()
    logprobs = torch.log_softmax(logits / temperature if temperature > 0 else logits, dim=-1)
    allowed = logprobs
    if exclude:
        banned = torch.tensor(sorted(set(exclude)), device=logits.device)
        allowed = logprobs.index_fill(-1, banned, float("-inf"))
        empty = ~torch.isfinite(allowed).any(dim=-1, keepdim=True)
        allowed = torch.where(empty, logprobs, torch.log_softmax(allowed, dim=-1))
    if temperature <= 0:
        tokens = allowed.argmax(dim=-1)
        return tokens, logprobs.gather(-1, tokens[:, None])[:, 0]
    filtered = top_p_filter(allowed, top_p) if top_p < 1.0 else allowed
    tokens = draw(filtered.softmax(dim=-1), generator)
    return tokens, logprobs.gather(-1, tokens[:, None])[:, 0]


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One index per row of ``probs`` [B, V], drawn in proportion to it: the first index whose
    cumulative mass passes a uniform draw (float64, so a token's share is its own to ~1e-16).

    Exact like ``torch.multinomial``, with one uniform per row instead of its per-call setup, which
    costs several milliseconds a token on a 50k vocabulary on CPU. A token of zero mass is never
    drawn: its cumulative mass equals its predecessor's, so it is never the first to pass."""
    cumulative = probs.double().cumsum(dim=-1)
    total = cumulative[:, -1:]
    u = torch.rand(total.shape, dtype=torch.float64, device=probs.device, generator=generator) * total
    tokens = torch.searchsorted(cumulative, u, right=True)[:, 0]
    # u is below the total, but rounding may put it at the total: take the last token with mass then
    last = probs.shape[-1] - 1 - (probs > 0).flip(-1).int().argmax(dim=-1)
    return torch.minimum(tokens, last)


def top_p_filter(logprobs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Set to -inf every token outside the smallest set whose probability reaches ``top_p``."""
    sorted_lp, order = logprobs.sort(dim=-1, descending=True)
    probs = sorted_lp.exp()
    # A token is dropped when the tokens ranked above it already reach top_p; the first never is.
    drop = (probs.cumsum(dim=-1) - probs) >= top_p
    sorted_lp = sorted_lp.masked_fill(drop, float("-inf"))
    return torch.full_like(logprobs, float("-inf")).scatter(-1, order, sorted_lp)


def find_stop(text: str, stops: Sequence[str], start: int = 0) -> int:
    """The end of the earliest stop string that finishes at or after ``start``, or -1."""
    best = -1
    for stop in stops:
        if not stop:
            continue
        at = text.find(stop, max(0, start - len(stop) + 1))
        if at >= 0 and (best < 0 or at + len(stop) < best):
            best = at + len(stop)
    return best
