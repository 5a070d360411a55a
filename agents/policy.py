"""The interface of a trainable policy: token ids in, token ids and log-probs out, batched.

Backends (transformers on CPU/GPU, vLLM on GPU) implement ``Policy``. Prefix reuse is the
backend's job: when several contexts share a prefix (branches of one tree), the backend
computes that prefix once (KV cache reuse in transformers, prefix caching in vLLM) and
reports what it actually computed in ``PolicyStats.prefill_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one turn."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    # Text that ends a turn besides EOS. The samplers add the env's own (``ForkableEnv.action_stops``,
    # its family record's), so a turn in an env stops at that env's closing tags.
    stop: tuple[str, ...] = ()
    seed: int | None = None
    # EOS does not end the turn: every turn is exactly max_new_tokens long (stop strings still
    # apply). For fixed-length workloads: probe tasks and throughput checks.
    ignore_eos: bool = False
    # Token ids the first sampled token may not be (drawn from the policy renormalised over the
    # rest; its log-prob stays the policy's own). Sibling branches that must begin differently.
    exclude_first: tuple[int, ...] = ()

    def with_stops(self, stops: Sequence[str]) -> SamplingParams:
        """These params with an env's own turn delimiters (``action_stops``) added to the stops:
        what ends a turn in that env. The samplers and the SFT labels both read it."""
        extra = tuple(s for s in stops if s not in self.stop)
        return replace(self, stop=(*self.stop, *extra)) if extra else self


@dataclass(frozen=True)
class Generation:
    """One sampled turn: its tokens, their behaviour log-probs, and why it ended."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    finish_reason: str  # "stop" (stop string or EOS) or "length" (hit max_new_tokens)


@dataclass
class PolicyStats:
    """Budget counters, cumulative over the policy's life."""

    generated_tokens: int = 0
    prefill_tokens: int = 0  # context tokens actually run through the model (cache misses)
    reused_tokens: int = 0  # context tokens served from a cached prefix
    calls: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Policy(Protocol):
    """A batched token-level sampler over a tokenizer shared with the trainer."""

    tokenizer: Any
    stats: PolicyStats

    def generate(self, contexts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Sample one continuation per context (contexts may share prefixes)."""
        ...
