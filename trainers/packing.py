"""Tree packing: the rows of a micro-batch as one sequence in which each distinct prefix is a
single token, so that a tree's shared tokens (the prompt, observations, shared turns) are
forwarded once instead of once per leaf.

Rows that agree on their first t tokens (and on which of them are actions) share the hidden
states of those tokens exactly, because a causal LM's state at a token depends only on its
prefix. ``pack_rows`` merges the rows into a token trie, laid out parent-first; each packed token
attends to its ancestors only, at its depth as its position. A token's log-prob is computed once,
from its parent's hidden state, and read back by every row that contains it, so the loss and its
gradient are the per-row computation's, summed in another order.

Attention is where a naive packing gives back what it saves: one ``[P, P]`` ancestor mask costs
P² per layer however few of its entries are ancestors, which for a micro-batch of long rows is
more than the per-row attention it replaces. The rows' new tokens lie in *runs*: row r adds one
contiguous stretch of packed positions (from where it leaves every earlier row to its end), and a
query of that run sees exactly row r's own tokens. So ``run_attention`` attends each run to its
row's keys (gathered) under a causal mask, and the attention costs Σ run × row instead of P²: the
per-row attention of the distinct queries only. It is the model's own attention (SDPA) on the
same keys and values, so the result is the ancestor mask's to rounding.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

ATTENTION = "treegym_packed"  # the attention implementation name run_attention is registered under


@dataclass(frozen=True)
class Run:
    """Row r's new packed tokens ``[start, end)`` and the packed positions of all of row r's tokens
    up to ``end`` (``keys``, in row order), with the causal mask of the run over them."""

    start: int
    end: int
    keys: Tensor  # [L] long
    mask: Tensor  # [end - start, L] bool: query i sees keys 0 .. L - (end - start) + i
    # ``keys`` as contiguous packed ranges [a, b): a row's keys are a few stretches of the packed
    # sequence (its shared prefix, then its own tokens), so slicing them beats a gather, whose
    # backward is a scatter-add
    segments: tuple[tuple[int, int], ...] = ()

    @property
    def causal(self) -> bool:
        """The run's keys are exactly its own queries: its mask is plain causal attention."""
        return self.segments == ((self.start, self.end),)

    def to(self, device: torch.device) -> Run:
        return Run(self.start, self.end, self.keys.to(device), self.mask.to(device), self.segments)


@dataclass(frozen=True)
class Packed:
    """A micro-batch as one packed sequence of ``total`` distinct tokens.

    ``src[s]`` is the packed position whose hidden state predicts scored token ``s``, whose id is
    ``tgt[s]``; ``index[r, t]`` is the scored token that row ``r``'s target ``t`` reads (0 where
    the row's mask is 0: the caller zeroes those positions).
    """

    input_ids: Tensor  # [1, P]
    position_ids: Tensor  # [1, P]: the token's depth in its row
    parent: Tensor  # [P] long: the packed position of each token's parent (-1 at a row's first token)
    runs: tuple[Run, ...]  # in packed order, covering [0, P)
    src: Tensor  # [S]
    tgt: Tensor  # [S]
    index: Tensor  # [R, T-1]

    @property
    def total(self) -> int:
        return int(self.input_ids.shape[1])

    def ancestors(self) -> Tensor:
        """``[P, P]`` bool: query i may attend to key j (j is i or an ancestor of i)."""
        return ancestor_mask(self.parent.tolist()).to(self.input_ids.device)

    def to(self, device: torch.device) -> Packed:
        return Packed(self.input_ids.to(device), self.position_ids.to(device), self.parent.to(device),
                      tuple(r.to(device) for r in self.runs), self.src.to(device), self.tgt.to(device),
                      self.index.to(device))


def pack_rows(input_ids: Tensor, attention_mask: Tensor, mask: Tensor) -> Packed:
    """Pack right-padded rows (``input_ids``/``attention_mask`` ``[R, T]``, target ``mask``
    ``[R, T-1]``, where target t is token t + 1) into one sequence.

    A token's trie key is (its parent, its id, whether it is scored), so a packed token is scored
    in every row that holds it or in none.
    """
    lengths = attention_mask.sum(-1).tolist()
    ids = input_ids.tolist()
    scored = (mask > 0).tolist()
    node_of: dict[tuple[int, int, bool], int] = {}
    tokens: list[int] = []
    depth: list[int] = []
    parent: list[int] = []
    scored_node: dict[int, int] = {}  # packed position -> its index among scored tokens
    src: list[int] = []
    tgt: list[int] = []
    runs: list[Run] = []
    index = torch.zeros(mask.shape, dtype=torch.long)
    for r, length in enumerate(lengths):
        prev = -1
        path: list[int] = []
        start = len(tokens)
        for t in range(int(length)):
            is_scored = t > 0 and scored[r][t - 1]
            key = (prev, ids[r][t], is_scored)
            node = node_of.get(key)
            if node is None:
                node = node_of[key] = len(tokens)
                tokens.append(ids[r][t])
                depth.append(t)
                parent.append(prev)
                if is_scored:
                    scored_node[node] = len(src)
                    src.append(prev)
                    tgt.append(ids[r][t])
            if is_scored:
                index[r, t - 1] = scored_node[node]
            path.append(node)
            prev = node
        if len(tokens) > start:  # a row equal to an earlier one (or its prefix) adds no run
            runs.append(_run(start, len(tokens), path))
    return Packed(torch.tensor([tokens]), torch.tensor([depth]), torch.tensor(parent, dtype=torch.long),
                  tuple(runs), torch.tensor(src, dtype=torch.long), torch.tensor(tgt, dtype=torch.long), index)


def _run(start: int, end: int, path: list[int]) -> Run:
    # A row's new tokens are its last ones: once it leaves the trie, every later token is new.
    n, length = end - start, len(path)
    mask = torch.arange(length)[None, :] <= (length - n + torch.arange(n))[:, None]
    segments: list[tuple[int, int]] = []
    for node in path:
        if segments and segments[-1][1] == node:
            segments[-1] = (segments[-1][0], node + 1)
        else:
            segments.append((node, node + 1))
    return Run(start, end, torch.tensor(path, dtype=torch.long), mask, tuple(segments))


def _gather(tensor: Tensor, run: Run) -> Tensor:
    """``tensor[:, :, run.keys]`` (on dim 2), as slices where the keys are few contiguous ranges."""
    if not run.segments or len(run.segments) > 8:
        return tensor[:, :, run.keys]
    parts = [tensor[:, :, a:b] for a, b in run.segments]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)


def ancestor_mask(parent: list[int]) -> Tensor:
    """``[P, P]`` bool: row i is True at i and at each of its ancestors (parents come first)."""
    n = len(parent)
    anc = torch.zeros((n, n), dtype=torch.bool)
    for i, p in enumerate(parent):
        if p >= 0:
            anc[i] = anc[p]
        anc[i, i] = True
    return anc


# A masked run at most this big (query heads x queries x keys) is attended by plain products
# (``_math_attention``): on a CPU, SDPA's fused kernel with a mask is about 1.5x slower forward and
# backward at a row's size (150 new tokens over 850 keys), and its scores stay small (6 MB at the bound; from
# about 500 x 700 on, the fused kernel is the faster)
MATH_ATTENTION_MAX = 1_500_000


def _math_attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor, scale: float) -> Tensor:
    """Softmax attention of ``query`` ``[1, H, n, d]`` over ``key``/``value`` ``[1, H_kv, L, d]``
    where ``mask`` ``[n, L]`` allows, as SDPA computes it; the softmax in fp32 whatever the inputs."""
    heads, kv_heads = query.shape[1], key.shape[1]
    n, length = mask.shape
    dtype = torch.promote_types(query.dtype, key.dtype)
    if torch.is_autocast_enabled(query.device.type):
        dtype = torch.get_autocast_dtype(query.device.type)
    q = (query * scale).to(dtype).reshape(1, kv_heads, (heads // kv_heads) * n, query.shape[-1])
    scores = torch.matmul(q, key.to(dtype).transpose(-1, -2)).float()  # [1, KV, G * n, L]
    scores = scores.view(1, kv_heads, heads // kv_heads, n, length).masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(dtype).view(1, kv_heads, (heads // kv_heads) * n, length)
    return torch.matmul(probs, value.to(dtype)).view(1, heads, n, query.shape[-1])


def run_attention(module: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                  dropout: float = 0.0, scaling: float | None = None, tree_runs: tuple[Run, ...] = (),
                  **kwargs: Any) -> tuple[Tensor, None]:
    """A transformers attention function (registered as ``ATTENTION``): each run's queries attend
    to their row's keys. ``query`` ``[1, H, P, d]``, ``key``/``value`` ``[1, H_kv, P, d]``; returns
    ``[1, P, H, d]`` as transformers' SDPA function does."""
    if not tree_runs:
        raise RuntimeError(f"the {ATTENTION!r} attention needs tree_runs: it only runs a packed forward")
    # grouped-query attention (each key/value head serving several query heads) through SDPA's own
    # GQA, not repeated key/value heads; a run whose keys are its own queries (the first row's) as
    # plain causal attention, which skips the masked half of the products
    gqa = query.shape[1] != key.shape[1]
    outs = []
    for run in tree_runs:
        q, k, v = query[:, :, run.start:run.end], _gather(key, run), _gather(value, run)
        if not run.causal and not dropout and q.shape[1] * run.mask.numel() <= MATH_ATTENTION_MAX:
            outs.append(_math_attention(q, k, v, run.mask, q.shape[-1] ** -0.5 if scaling is None else scaling))
        else:
            outs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=None if run.causal else run.mask,
                                                       is_causal=run.causal, dropout_p=dropout, scale=scaling,
                                                       enable_gqa=gqa))
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


def runs_supported(config: Any) -> bool:
    """Whether ``run_attention`` computes this model's attention: plain softmax attention over all
    earlier tokens (no sliding window, no logit soft-capping, no attention sinks)."""
    window = getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None
    full = all(kind == "full_attention" for kind in getattr(config, "layer_types", None) or ())
    return (window is None and full and getattr(config, "attn_logit_softcapping", None) is None
            and hasattr(config, "num_attention_heads"))


@contextlib.contextmanager
def packed_attention(config: Any) -> Iterator[None]:
    """Route the model's attention through ``run_attention`` for the duration of one forward."""
    from transformers import AttentionInterface

    if ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTENTION, run_attention)
    before = config._attn_implementation
    config._attn_implementation = ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = before
