"""The transformers policy backend: batched sampling that never re-prefills a shared prefix.

``HFPolicy.generate(contexts, params)`` takes token-id contexts (raw Search-R1 text or chat
template, already tokenised) and samples one turn per context. Before running anything it
looks for KV it already has:

1. the prefix store (``PrefixCache``): after every turn each sequence's KV (context plus the
   turn) is kept, so the next turn of a branch, or a fork of it, only runs its new tokens;
2. branch points inside the batch: contexts that share a prefix nobody has computed yet (the
   first turn of m trees of one prompt, or the n branches of a new node) get that prefix run
   once, stored, and then reused by each of them.

Rows with different amounts of reused KV and different suffix lengths share one batch: past
keys are right-aligned, suffixes are left-padded, and each call gets an explicit 4D attention
mask plus true position ids, so padding can sit anywhere without changing any result.
``reuse_prefix=False`` turns all reuse off (each context is prefilled in full), which is the
baseline of ``benchmarks/bench_prefix_reuse.py``.

Log-probs follow ``treegym.agents.sampling``: ``log_softmax(logits / T)`` over the full
vocabulary (T = 1 when greedy), before top-p.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from treegym.agents.decode_state import PackedHead, ReservedLayer
from treegym.agents.fast_decode import FastDecoder, cpu_has_bf16
from treegym.agents.kv_cache import LayerKV, PrefixCache, branch_prefixes, kv_bytes_per_token
from treegym.agents.policy import Generation, PolicyStats, SamplingParams
from treegym.agents.sampling import find_stop, sample_tokens
from treegym.errors import ConfigError, TreegymError

CANCEL_EVERY = 4  # tokens between two cancel() checks: a socket poll costs microseconds, a token milliseconds


class GenerationCancelled(TreegymError):
    """``generate(..., cancel=...)`` stopped because ``cancel()`` said so."""


@dataclass
class _Batch:
    """The model state of a batch of rows after a forward pass."""

    cache: Any  # a transformers DynamicCache, [B, kv_heads, L, head_dim] per layer
    key_valid: torch.Tensor  # [B, L] bool: which cache columns hold real tokens
    next_pos: torch.Tensor  # [B] position id of each row's next token
    logits: torch.Tensor  # [B, V] next-token logits


class HFPolicy:
    """A ``Policy`` over a transformers causal LM, with KV reuse across shared prefixes.

    Args:
        model, tokenizer: a causal LM in eval mode and its tokenizer (see ``load_model``).
        reuse_prefix: reuse KV of shared prefixes (within a batch and across calls).
        cache_bytes: byte budget of the prefix store (LRU). A call whose rows need more, to keep one
            entry per row for their next turn, raises it up to ``max_cache_bytes``.
        max_batch_size: rows per forward pass; larger calls are split.
        min_shared_prefix: shortest in-batch shared prefix worth a separate prefill.
        seed: seed of the sampling generator (``SamplingParams.seed`` overrides it per call).
        packed_head: on CPU in fp32, run the LM head on a oneDNN-reordered copy of its weight
            (``decode_state.PackedHead``: the same logits to float rounding, 2-3x faster at a few rows).
        bf16: on CPU, sample through ``fast_decode.FastDecoder`` in bf16 (fused, packed bf16 weights,
            rebuilt when the weights change; fp32 residual stream and KV). None: where the CPU has
            bf16 units (``cpu_has_bf16``). Models it does not know, and GPUs, run their own forward.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        reuse_prefix: bool = True,
        cache_bytes: int = 1 << 30,
        max_cache_bytes: int = 8 << 30,
        max_batch_size: int = 32,
        min_shared_prefix: int = 8,
        seed: int = 0,
        packed_head: bool = True,
        bf16: bool | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.reuse_prefix = reuse_prefix
        self.max_batch_size = max_batch_size
        self.min_shared_prefix = min_shared_prefix
        self.stats = PolicyStats()
        self.prefix_cache = PrefixCache(cache_bytes)
        self.max_cache_bytes = max_cache_bytes
        self.device = next(model.parameters()).device
        self._kv_bytes = kv_bytes_per_token(model.config, next(model.parameters()).element_size())
        self.eos_ids = _eos_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)
        # Public: a trainer's checkpoint saves and restores this stream for exact resume.
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self._lock = threading.Lock()
        # transformers 5.x names the argument `cache` (`past_key_values` is a deprecated alias).
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._bool_mask = getattr(model.config, "_attn_implementation", "sdpa") != "eager"
        self._weights_version = self._current_weights_version()
        self.packed_head = packed_head
        self._head: PackedHead | None = None
        self._built_version = -1  # the weights version self._head and self._fast were built from
        self.bf16 = cpu_has_bf16() if bf16 is None else bool(bf16)
        self._fast: FastDecoder | None = None
        self.fast_dtype = torch.bfloat16  # the decoder's matmul dtype; the tests set fp32 to check it exactly

    @classmethod
    def from_pretrained(cls, spec: str = "smollm2", device: str | None = None, **kwargs: Any) -> HFPolicy:
        """Load ``spec`` (``smollm2`` or a local model folder) and wrap it."""
        from treegym.agents.models import load_model

        model, tokenizer = load_model(spec, device=device)
        return cls(model, tokenizer, **kwargs)

    def clear_cache(self) -> None:
        """Forget every stored prefix. ``generate`` does it by itself when the weights change."""
        self.prefix_cache.clear()

    def _current_weights_version(self) -> int:
        # Every in-place update (optimizer step, load_state_dict) bumps a tensor's version
        # counter, so their sum tells cheaply whether stored KV came from other weights.
        return sum(p._version for p in self.model.parameters())

    # -- public API -------------------------------------------------------------------------

    def generate(self, contexts: Sequence[Sequence[int]], params: SamplingParams,
                 cancel: Callable[[], bool] | None = None) -> list[Generation]:
        """Sample one continuation per context; contexts may share prefixes (reused, not rerun).
        ``cancel`` is asked every few tokens; when it says True, generation stops with
        ``GenerationCancelled`` (a server's client has gone)."""
        rows = [list(map(int, c)) for c in contexts]
        if any(len(r) == 0 for r in rows):
            raise ConfigError("every context needs at least one token")
        if params.max_new_tokens < 1:
            raise ConfigError("max_new_tokens must be at least 1")
        limit = getattr(self.model.config, "max_position_embeddings", None)
        longest = max((len(r) for r in rows), default=0)
        if limit and longest + params.max_new_tokens > limit:
            raise ConfigError(
                f"a context of {longest} tokens plus max_new_tokens={params.max_new_tokens} passes the "
                f"model's {limit} positions; shorten the episode (max_turns, topk) or max_new_tokens"
            )
        if not 0.0 < params.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {params.top_p}")
        generator = self.generator
        if params.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(params.seed)
        out: list[Generation] = []
        with self._lock, torch.inference_mode():
            version = self._current_weights_version()
            if version != self._weights_version:
                self.prefix_cache.clear()
                self._weights_version = version
            if self._built_version != version:
                self._fast = FastDecoder.for_model(self.model, self.fast_dtype) if self.bf16 else None
                self._head = PackedHead.for_model(self.model) if self.packed_head and self._fast is None else None
                self._built_version = version
                self.prefix_cache.clear()  # the bf16 decoder stores bf16 KV: no prefix crosses a change of path
            if self.reuse_prefix:
                # One entry per row must fit, or the LRU evicts rows of this very call and every
                # next turn prefills its whole context again (household: 32 rows x 1,500 tokens
                # of SmolLM2 KV is 2.2 GB against the 1 GiB default).
                need = self._kv_bytes * sum(len(r) + params.max_new_tokens for r in rows)
                self.prefix_cache.reserve(min(need, self.max_cache_bytes))
            for start in range(0, len(rows), self.max_batch_size):
                chunk = rows[start : start + self.max_batch_size]
                if self.reuse_prefix:
                    self._prefill_branch_points(chunk)
                out.extend(self._sample(chunk, params, generator, cancel))
            self.stats.calls += 1
        return out

    # -- prefill ----------------------------------------------------------------------------

    def _prefill_branch_points(self, contexts: list[list[int]]) -> None:
        """Run each not-yet-computed shared prefix of the batch once and store it."""
        pending = [
            p
            for p in branch_prefixes(contexts, self.min_shared_prefix)
            if self.prefix_cache.lookup(p)[0] < len(p) - self.min_shared_prefix
        ]
        while pending:
            # One level at a time, so that a longer branch point reuses the shorter one below it.
            level = [p for p in pending if not any(q != p and p[: len(q)] == q for q in pending)]
            batch = self._prefill([list(p) for p in level], [len(p) for p in level], count_reuse=False)
            for row, p in enumerate(level):
                self.prefix_cache.insert(p, self._row_kv(batch, row))
            pending = [p for p in pending if p not in level]

    def _prefill(self, seqs: list[list[int]], reuse_limits: list[int], count_reuse: bool = True,
                 spare: int = 0) -> _Batch:
        """Run each sequence's uncached suffix, batched; reuse at most ``reuse_limits[i]`` tokens,
        and leave room in the cache for ``spare`` tokens to be decoded after.

        ``stats.reused_tokens`` counts context tokens only (``count_reuse``), so that for the
        contexts of a call, prefill + reused = context tokens + branch-point tokens computed.
        """
        found: list[tuple[int, LayerKV | None]] = [
            self.prefix_cache.lookup(s, limit) if self.reuse_prefix else (0, None)
            for s, limit in zip(seqs, reuse_limits)
        ]
        reused = [n for n, _ in found]
        past_len = max(reused)
        suffix_len = max(len(s) - n for s, n in zip(seqs, reused))
        size = len(seqs)
        ids = torch.full((size, suffix_len), self.pad_id, dtype=torch.long)
        positions = torch.zeros((size, suffix_len), dtype=torch.long)
        new_valid = torch.zeros((size, suffix_len), dtype=torch.bool)
        past_valid = torch.zeros((size, past_len), dtype=torch.bool)
        for i, (seq, n) in enumerate(zip(seqs, reused)):
            suffix = seq[n:]
            ids[i, suffix_len - len(suffix) :] = torch.tensor(suffix)
            positions[i, suffix_len - len(suffix) :] = torch.arange(n, len(seq))
            new_valid[i, suffix_len - len(suffix) :] = True
            past_valid[i, past_len - n :] = True
        cache = self._stack_past(found, past_len, room=suffix_len + spare)
        key_valid = torch.cat([past_valid, new_valid], dim=1).to(self.device)
        logits = self._forward(ids.to(self.device), positions.to(self.device), key_valid, cache, past_len)
        self.stats.prefill_tokens += sum(len(s) - n for s, n in zip(seqs, reused))
        if count_reuse:
            self.stats.reused_tokens += sum(reused)
        next_pos = torch.tensor([len(s) for s in seqs], device=self.device)
        return _Batch(cache, key_valid, next_pos, logits)

    def _stack_past(self, found: list[tuple[int, LayerKV | None]], past_len: int, room: int) -> Any:
        """A batched cache holding each row's reused KV, right-aligned in ``past_len`` columns, with
        ``room`` more columns for the tokens to come (written in place: ``ReservedLayer``)."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        if past_len == 0:
            cache.layers = [ReservedLayer(room) for _ in cache.layers]
            return cache
        template = next(kv for _, kv in found if kv is not None)
        layers = []
        for layer, (k0, v0) in enumerate(template):
            keys = k0.new_empty((len(found), k0.shape[0], past_len + room, k0.shape[2]))
            values = v0.new_empty((len(found), v0.shape[0], past_len + room, v0.shape[2]))
            for i, (n, kv) in enumerate(found):
                # Columns a row does not fill are masked, but must be finite: 0 x NaN is NaN.
                keys[i, :, : past_len - n] = 0
                values[i, :, : past_len - n] = 0
                if n:
                    keys[i, :, past_len - n : past_len] = kv[layer][0]
                    values[i, :, past_len - n : past_len] = kv[layer][1]
            layers.append(ReservedLayer.holding(keys, values, past_len))
        cache.layers = layers
        return cache

    def _forward(
        self, ids: torch.Tensor, positions: torch.Tensor, key_valid: torch.Tensor, cache: Any, past_len: int
    ) -> torch.Tensor:
        """One forward pass over ``ids`` [B, S] after ``past_len`` cached columns; last logits [B, V]."""
        size, width = ids.shape
        total = past_len + width
        cols = torch.arange(total, device=self.device)
        query_cols = past_len + torch.arange(width, device=self.device)
        causal = cols[None, :] <= query_cols[:, None]  # [S, L]
        allowed = causal[None] & key_valid[:, None, :]
        # Padding rows attend to themselves, so that no row is fully masked (NaN in SDPA);
        # their outputs are never read and their keys stay masked for every real row.
        allowed[:, torch.arange(width), query_cols] = True
        mask = allowed[:, None]
        if self._fast is not None:
            return self._fast(ids, positions, mask, cache)
        if not self._bool_mask:
            mask = torch.zeros(mask.shape, dtype=self.model.dtype, device=self.device).masked_fill(
                ~mask, torch.finfo(self.model.dtype).min
            )
        kwargs = {"input_ids": ids, "attention_mask": mask, "position_ids": positions, "use_cache": True,
                  self._cache_arg: cache}
        if self._head is not None:
            return self._head(self.model.get_decoder()(**kwargs).last_hidden_state[:, -1, :])
        return self.model(logits_to_keep=1, **kwargs).logits[:, -1, :]

    def _row_kv(self, batch: _Batch, row: int) -> LayerKV:
        """The KV of one row's real tokens, in order."""
        valid = batch.key_valid[row]
        return [(layer.keys[row][:, valid], layer.values[row][:, valid]) for layer in batch.cache.layers]

    # -- decoding ---------------------------------------------------------------------------

    def _sample(
        self, contexts: list[list[int]], params: SamplingParams, generator: torch.Generator,
        cancel: Callable[[], bool] | None = None,
    ) -> list[Generation]:
        batch = self._prefill(contexts, [len(c) - 1 for c in contexts], spare=params.max_new_tokens)
        size = len(contexts)
        tokens: list[list[int]] = [[] for _ in range(size)]
        logprobs: list[list[float]] = [[] for _ in range(size)]
        texts = [""] * size
        results: list[Generation | None] = [None] * size
        active = list(range(size))  # original row of each batch row
        exclude = params.exclude_first  # the first token only
        while True:
            next_ids, next_lp = sample_tokens(batch.logits, params.temperature, params.top_p, generator, exclude)
            exclude = ()
            keep: list[int] = []
            for b, row in enumerate(active):
                token, lp = int(next_ids[b]), float(next_lp[b])
                tokens[row].append(token)
                logprobs[row].append(lp)
                done = self._finish(row, token, tokens, logprobs, texts, params)
                if done is None:
                    keep.append(b)
                    continue
                results[row] = done
                if self.reuse_prefix:  # the KV of context + all fed tokens (the last is not fed)
                    self.prefix_cache.insert(contexts[row] + tokens[row][:-1], self._row_kv(batch, b))
            self.stats.generated_tokens += len(active)
            if not keep:
                break
            if cancel is not None and len(tokens[active[0]]) % CANCEL_EVERY == 0 and cancel():
                raise GenerationCancelled(f"generation cancelled after {len(tokens[active[0]])} tokens")
            if len(keep) < len(active):
                index = torch.tensor(keep, device=self.device)
                batch.cache.batch_select_indices(index)
                batch.key_valid = batch.key_valid[index]
                batch.next_pos = batch.next_pos[index]
                next_ids = next_ids[index]
                active = [active[b] for b in keep]
            past_len = batch.key_valid.shape[1]
            batch.key_valid = torch.cat(
                [batch.key_valid, torch.ones((len(active), 1), dtype=torch.bool, device=self.device)], dim=1
            )
            batch.logits = self._forward(
                next_ids[:, None], batch.next_pos[:, None], batch.key_valid, batch.cache, past_len
            )
            batch.next_pos = batch.next_pos + 1
        return [r for r in results if r is not None]

    def _finish(
        self,
        row: int,
        token: int,
        tokens: list[list[int]],
        logprobs: list[list[float]],
        texts: list[str],
        params: SamplingParams,
    ) -> Generation | None:
        """The row's Generation if this token ends it (EOS, stop string, length), else None."""
        ids = tokens[row]
        if token in self.eos_ids and not params.ignore_eos:
            text = self.tokenizer.decode(ids[:-1], skip_special_tokens=False)
            return Generation(tuple(ids), tuple(logprobs[row]), text, "stop")
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        end = find_stop(text, params.stop, start=len(texts[row]))
        texts[row] = text
        if end >= 0:
            # The token that completes a stop string is kept whole, even if it runs past it.
            return Generation(tuple(ids), tuple(logprobs[row]), text[:end], "stop")
        if len(ids) >= params.max_new_tokens:
            return Generation(tuple(ids), tuple(logprobs[row]), text, "length")
        return None


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """Every id that ends a turn: the tokenizer's EOS and the generation config's."""
    ids: set[int] = set()
    for value in (tokenizer.eos_token_id, getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    if not ids:
        raise ConfigError("the tokenizer has no EOS token; set tokenizer.eos_token")
    return ids
