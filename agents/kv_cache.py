"""Prefix KV caches for the transformers policy: an LRU of computed contexts, matched by prefix.

The key and value of position ``i`` depend only on tokens ``0..i``, so the KV computed for any
earlier sequence serves every later context for as many leading tokens as the two share. That
makes one store cover both cases that matter in tree search: branches of one node share the
node's context, and the next turn of a branch extends its own previous context. The store keeps
the longest sequences only (an entry that is a prefix of a newer one adds nothing) and evicts
the least recently used ones once it passes its byte budget.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

# Per layer: (keys, values), each [num_kv_heads, seq_len, head_dim], batch dimension dropped.
LayerKV = list[tuple[torch.Tensor, torch.Tensor]]


def common_prefix_length(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens two id arrays share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def branch_prefixes(contexts: Sequence[Sequence[int]], min_length: int) -> list[tuple[int, ...]]:
    """The prefixes where the contexts of one batch branch apart, shortest first.

    Every branching point of the contexts' prefix tree is the common prefix of two neighbours
    in sorted order, so sorting once finds all of them. A prefix is capped one token short of
    either neighbour: each context must still run its last token to get next-token logits.
    """
    ordered = sorted({tuple(c) for c in contexts})
    found: set[tuple[int, ...]] = set()
    for a, b in zip(ordered, ordered[1:]):
        n = common_prefix_length(np.asarray(a), np.asarray(b))
        n = min(n, len(a) - 1, len(b) - 1)
        if n >= min_length:
            found.add(a[:n])
    # Identical contexts are deduplicated above but still share everything but their last token.
    counts: dict[tuple[int, ...], int] = {}
    for c in contexts:
        counts[tuple(c)] = counts.get(tuple(c), 0) + 1
    for c, count in counts.items():
        if count > 1 and len(c) - 1 >= min_length:
            found.add(c[:-1])
    return sorted(found, key=len)


def kv_bytes_per_token(config: object, element_size: int) -> int:
    """Bytes of KV one token takes in every layer of a decoder with ``config`` (0 when the config
    does not say: Llama-style names, ``num_key_value_heads`` falling back to the attention heads)."""
    layers = getattr(config, "num_hidden_layers", 0) or 0
    heads = getattr(config, "num_attention_heads", 0) or 0
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or (getattr(config, "hidden_size", 0) // heads if heads else 0)
    return 2 * layers * kv_heads * head_dim * element_size


@dataclass
class _Entry:
    tokens: np.ndarray
    kv: LayerKV
    nbytes: int


class PrefixCache:
    """An LRU of (token sequence -> per-layer KV), looked up by longest common prefix."""

    def __init__(self, max_bytes: int = 1 << 30) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._next_id = 0
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def reserve(self, nbytes: int) -> None:
        """Raise the byte budget to at least ``nbytes`` (it never shrinks)."""
        self.max_bytes = max(self.max_bytes, int(nbytes))

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0

    def lookup(self, tokens: Sequence[int], max_length: int | None = None) -> tuple[int, LayerKV | None]:
        """The longest cached prefix of ``tokens`` (at most ``max_length``) and its KV, sliced."""
        query = np.asarray(tokens, dtype=np.int64)
        limit = len(query) if max_length is None else min(max_length, len(query))
        best_key, best_len = None, 0
        for key, entry in self._entries.items():
            n = min(common_prefix_length(entry.tokens, query), limit)
            if n > best_len:
                best_key, best_len = key, n
        if best_key is None:
            return 0, None
        self._entries.move_to_end(best_key)
        kv = self._entries[best_key].kv
        return best_len, [(k[:, :best_len], v[:, :best_len]) for k, v in kv]

    def insert(self, tokens: Sequence[int], kv: LayerKV) -> None:
        """Store the KV of ``tokens`` (one tensor pair per layer covering exactly those tokens)."""
        arr = np.asarray(tokens, dtype=np.int64)
        if len(arr) == 0:
            return
        for key in list(self._entries):
            entry = self._entries[key]
            n = len(entry.tokens)
            if n <= len(arr) and common_prefix_length(entry.tokens, arr) == n:
                self._drop(key)  # the new entry covers it
            elif n > len(arr) and common_prefix_length(entry.tokens, arr) == len(arr):
                self._entries.move_to_end(key)  # already covered by a longer entry
                return
        # Own the memory: a slice of a big batched tensor would pin the whole batch.
        owned = [(k.contiguous().clone(), v.contiguous().clone()) for k, v in kv]
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in owned)
        if nbytes > self.max_bytes:
            return
        self._entries[self._next_id] = _Entry(arr, owned, nbytes)
        self._next_id += 1
        self.nbytes += nbytes
        while self.nbytes > self.max_bytes and self._entries:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: int) -> None:
        self.nbytes -= self._entries.pop(key).nbytes
