"""Tree packing: the rows of a micro-batch as one sequence in which each distinct prefix is a
single token, so that a tree's shared tokens (the prompt, observations, shared turns) are
forwarded once instead of once per leaf.

Rows that agree on their first t tokens (and on which of them are actions) share the hidden
states of those tokens exactly, because a causal LM's state at a token depends only on its
prefix. ``pack_rows`` merges the rows into a token trie, laid out parent-first; each packed token
attends to its ancestors only (an ancestor mask), at its depth as its position. A token's
log-prob is computed once, from its parent's hidden state, and read back by every row that
contains it, so the loss and its gradient are the per-row computation's, summed in another
order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Packed:
    """A micro-batch as one packed sequence of ``total`` distinct tokens.

    ``src[s]`` is the packed position whose hidden state predicts scored token ``s``, whose id is
    ``tgt[s]``; ``index[r, t]`` is the scored token that row ``r``'s target ``t`` reads (0 where
    the row's mask is 0: the caller zeroes those positions).
    """

    input_ids: Tensor  # [1, P]
    position_ids: Tensor  # [1, P]: the token's depth in its row
    ancestors: Tensor  # [P, P] bool: query i may attend to key j (j is i or an ancestor of i)
    src: Tensor  # [S]
    tgt: Tensor  # [S]
    index: Tensor  # [R, T-1]

    @property
    def total(self) -> int:
        return int(self.input_ids.shape[1])

    def to(self, device: torch.device) -> Packed:
        return Packed(self.input_ids.to(device), self.position_ids.to(device), self.ancestors.to(device),
                      self.src.to(device), self.tgt.to(device), self.index.to(device))


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
    index = torch.zeros(mask.shape, dtype=torch.long)
    for r, length in enumerate(lengths):
        prev = -1
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
            prev = node
    return Packed(torch.tensor([tokens]), torch.tensor([depth]), ancestor_mask(parent),
                  torch.tensor(src, dtype=torch.long), torch.tensor(tgt, dtype=torch.long), index)


def ancestor_mask(parent: list[int]) -> Tensor:
    """``[P, P]`` bool: row i is True at i and at each of its ancestors (parents come first)."""
    n = len(parent)
    anc = torch.zeros((n, n), dtype=torch.bool)
    for i, p in enumerate(parent):
        if p >= 0:
            anc[i] = anc[p]
        anc[i, i] = True
    return anc
