"""Per-token costs of CPU decoding that are not the model's: a KV cache that grows in place, and
an LM head in oneDNN's packed weight layout.

On a 2-core CPU a decode step of SmolLM2-135M for a handful of rows is memory-bound, and two costs
beside the decoder's own matmuls are large (``benchmarks/bench_rl_step.py`` measures them):

- transformers' ``DynamicLayer`` grows its keys and values by ``torch.cat``, which copies the whole
  cache of every layer at every token (at 6 rows x 450 tokens, 124 MB per step);
- the LM head, ``[rows, hidden] @ [hidden, 49,152]``, goes through a GEMM path that reads its
  113 MB weight at a fraction of the memory bandwidth when there are few rows; oneDNN's
  ``mkldnn_linear`` on a weight reordered once runs it 2-3x faster.

``ReservedLayer`` writes each new token into spare room reserved up front (a batch's reused KV is
stacked straight into that buffer, so nothing is copied twice), and ``PackedHead``
keeps the reordered head weight, rebuilt when the weights change. Both compute what they replace:
the same keys and values, and the same logits up to float summation order.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer


class ReservedLayer(DynamicLayer):
    """A cache layer whose keys and values live in a buffer with room to spare; ``keys``/``values``
    are views of its filled part, and ``update`` writes in place (no copy of what is there).

    ``ReservedLayer(room)`` is empty: its first ``update`` allocates that update's length plus
    ``room``. ``ReservedLayer.holding(k, v, length)`` wraps buffers whose first ``length`` columns
    are filled already (``HFPolicy`` stacks a batch's reused KV straight into them)."""

    def __init__(self, room: int = 0) -> None:
        super().__init__()
        self._room = room
        self._length = 0

    @classmethod
    def holding(cls, keys: torch.Tensor, values: torch.Tensor, length: int) -> ReservedLayer:
        layer = cls()
        layer.device = keys.device
        layer.is_initialized = True
        layer._k, layer._v, layer._length = keys, values, length
        layer._views()
        return layer

    def _views(self) -> None:
        self.keys = self._k[..., : self._length, :]
        self.values = self._v[..., : self._length, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        new = key_states.shape[-2]
        if not self.is_initialized:
            self.device = key_states.device
            self.is_initialized = True
            shape = (*key_states.shape[:-2], new + self._room, key_states.shape[-1])
            self._k, self._v = key_states.new_empty(shape), value_states.new_empty(shape)
        if self._length + new > self._k.shape[-2]:  # out of room: grow by doubling, once in a while
            room = max(2 * self._k.shape[-2], self._length + new)
            self._k = torch.cat([self._k, self._k.new_empty((*self._k.shape[:-2], room - self._k.shape[-2],
                                                             self._k.shape[-1]))], dim=-2)
            self._v = torch.cat([self._v, self._v.new_empty((*self._v.shape[:-2], room - self._v.shape[-2],
                                                             self._v.shape[-1]))], dim=-2)
        self._k[..., self._length : self._length + new, :] = key_states
        self._v[..., self._length : self._length + new, :] = value_states
        self._length += new
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._k = self._k[indices]
        self._v = self._v[indices]
        self._views()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes the number of tokens to remove, as a negative integer")
        self._length = max(0, self._length + tokens_to_remove)
        self._views()


class PackedHead:
    """The LM head ``hidden -> logits`` with its weight reordered for oneDNN, on CPU in fp32.

    ``for_model`` returns None where it does not apply (a GPU, another dtype, a head with a bias or
    a transform after it, a torch without oneDNN): the caller then runs the model's own head."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight.detach().to_mkldnn()

    @classmethod
    def for_model(cls, model: Any) -> PackedHead | None:
        from treegym.agents.models import plain_head

        if not (torch.backends.mkldnn.is_available() and plain_head(model)):
            return None
        head = model.get_output_embeddings()
        weight = getattr(head, "weight", None)
        if (weight is None or getattr(head, "bias", None) is not None or weight.device.type != "cpu"
                or weight.dtype != torch.float32 or not isinstance(head, torch.nn.Linear)):
            return None
        return cls(weight)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[rows, hidden]`` -> ``[rows, vocab]``."""
        return torch._C._nn.mkldnn_linear(hidden.contiguous().to_mkldnn(), self.weight, None).to_dense()
