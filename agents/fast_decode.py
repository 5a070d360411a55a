"""A lean forward pass for sampling on a CPU: the decoder of a Llama-family model with its weights
fused and cast to bf16 in oneDNN's packed layout, over the same KV cache ``HFPolicy`` keeps.

Why it exists: on a CPU a decode step of SmolLM2-135M for a handful of rows is bound by reading the
weights and by per-op overhead, not by arithmetic (``benchmarks/bench_rl_step.py``). transformers'
forward reads 420 MB of fp32 layer weights per token through seven matmuls a layer, and bf16
*autocast* cannot help there: under ``inference_mode`` it keeps no cast weights and re-casts every
weight at every step (half the speed). ``FastDecoder`` casts once, per weights version:

- q, k and v are one ``[q + 2 kv, hidden]`` product and gate and up one ``[2 ffn, hidden]``
  product (four matmuls a layer, not seven), on weights reordered once for oneDNN
  (``mkldnn._linear_pointwise``; plain ``F.linear`` where that op is missing);
- in bf16 (``dtype``): half the bytes to read, on the bf16 units of CPUs that have them;
- the KV cache in the decoder's dtype: a decode step reads every cached key and value once, so in
  bf16 it reads half the bytes, through SDPA (which accumulates in fp32); in fp32 a decode step's
  attention (one query a row) is two small products, faster there than SDPA's masked kernel.

As under autocast, the SiLU gating takes the bf16 outputs of its matmul and a prefill's attention
runs SDPA in bf16; everything else stays fp32: the residual stream, RMSNorm, RoPE (the model's own
rotary module, so its scaling variants hold) and the softmax. ``HFPolicy``'s prefix store and
``ReservedLayer`` keep the cache in whatever dtype it is given; the policy drops its stored
prefixes whenever it changes between this decoder and the model's own forward. With
``dtype=torch.float32`` it computes the model's own forward to float rounding, which is how the
tests check it; in bf16 it is the model under bf16 matmuls and a bf16 cache, close to the trainer's
bf16 update (``trainers.parallel.train_bf16``). The log-probs a sampler records are those of the
logits it sampled from.

``FastDecoder.for_model`` returns None for any model it does not know exactly (it checks the
architecture, not just the names), and the caller runs the model's own forward.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F

SUPPORTED_TYPES = ("llama", "qwen2")  # RMSNorm, RoPE, GQA attention, SiLU-gated MLP; qwen2 adds q/k/v bias


def cpu_has_bf16() -> bool:
    """True where this CPU multiplies bf16 in hardware (AMX tiles or AVX512-BF16). There a bf16
    matmul runs several times the fp32 rate; elsewhere bf16 is emulated and slower than fp32.

    ``TREEGYM_CPU_BF16=off`` (or ``on``) overrides the probe for every process that inherits it: the
    test suite pins fp32 with it, because its exactness checks are written for fp32.
    """
    forced = os.environ.get("TREEGYM_CPU_BF16", "").strip().lower()
    if forced in ("on", "off"):
        return forced == "on"
    probes = (getattr(torch.cpu, "_is_amx_tile_supported", None), getattr(torch.cpu, "_is_avx512_bf16_supported", None))
    return any(bool(probe()) for probe in probes if probe is not None)


def _packed_ops() -> bool:
    mkldnn = getattr(torch.ops, "mkldnn", None)
    return (torch.backends.mkldnn.is_available() and mkldnn is not None
            and hasattr(mkldnn, "_reorder_linear_weight") and hasattr(mkldnn, "_linear_pointwise"))


class _Linear:
    """``x @ W.T (+ b)`` with ``W`` cast to ``dtype`` (and packed for oneDNN where it can be); in fp32 or
    ``dtype``, out in fp32 (``out_float``, the bias added in fp32) or in ``dtype`` as autocast leaves a
    matmul's output (one cast fewer where the next op takes it as it is)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype, packed: bool,
                 out_float: bool = True) -> None:
        self.dtype, self.out_float = dtype, out_float or bias is not None
        w = weight.detach().to(dtype).contiguous()
        self.packed = packed and dtype == torch.bfloat16
        self.weight = torch.ops.mkldnn._reorder_linear_weight(w, 1) if self.packed else w
        self.bias = None if bias is None else bias.detach().float()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.dtype)
        if self.packed:
            y = torch.ops.mkldnn._linear_pointwise(x, self.weight, None, "none", [], "")
        else:
            y = F.linear(x, self.weight)
        if not self.out_float:
            return y
        y = y.float()
        return y if self.bias is None else y + self.bias


def _weight(module: Any) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """A linear layer's effective weight and bias: a plain ``nn.Linear``, or a peft LoRA layer with its
    active adapters' deltas added (unless they are merged in already); None for anything else."""
    if isinstance(module, torch.nn.Linear) and not hasattr(module, "base_layer"):
        return module.weight, module.bias
    base = getattr(module, "base_layer", None)
    if not isinstance(base, torch.nn.Linear) or not hasattr(module, "get_delta_weight"):
        return None
    weight = base.weight
    if not getattr(module, "merged", False) and not getattr(module, "disable_adapters", False):
        for name in getattr(module, "active_adapters", ()):
            if name in getattr(module, "lora_A", {}):
                weight = weight + module.get_delta_weight(name)
    return weight, base.bias


def _fused(modules: list[Any], dtype: torch.dtype, packed: bool, out_float: bool = True) -> _Linear | None:
    parts = [_weight(m) for m in modules]
    if any(p is None for p in parts):
        return None
    weights = [p[0] for p in parts]  # type: ignore[index]
    biases = [p[1] for p in parts]  # type: ignore[index]
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b in zip(weights, biases)])
    return _Linear(torch.cat(weights, dim=0), bias, dtype, packed, out_float)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class _Layer:
    def __init__(self, layer: Any, dtype: torch.dtype, packed: bool) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv = _fused([attn.q_proj, attn.k_proj, attn.v_proj], dtype, packed)
        # o, gate/up and down hand on their matmul's own dtype, as under autocast: the residual add
        # promotes to fp32 and SiLU-gating runs in bf16 (qkv stays fp32: RoPE and the fp32 KV cache take it)
        self.o = _fused([attn.o_proj], dtype, packed, out_float=False)
        self.gate_up = _fused([mlp.gate_proj, mlp.up_proj], dtype, packed, out_float=False)
        self.down = _fused([mlp.down_proj], dtype, packed, out_float=False)
        self.norm_in = layer.input_layernorm.weight.detach().float()
        self.norm_post = layer.post_attention_layernorm.weight.detach().float()
        self.eps_in = layer.input_layernorm.variance_epsilon
        self.eps_post = layer.post_attention_layernorm.variance_epsilon

    @property
    def complete(self) -> bool:
        return None not in (self.qkv, self.o, self.gate_up, self.down)


class FastDecoder:
    """The decoder of ``model`` for sampling (see the module docstring); build with ``for_model``."""

    def __init__(self, model: Any, dtype: torch.dtype, packed: bool) -> None:
        cfg = model.config
        decoder = model.get_decoder()
        self.dtype = dtype
        self.kv_dtype = dtype  # the cache in the matmuls' dtype: a decode step reads every cached key once
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.scaling = self.head_dim**-0.5
        self.embed = decoder.embed_tokens.weight.detach()
        self.rotary = decoder.rotary_emb
        self.layers = [_Layer(layer, dtype, packed) for layer in decoder.layers[: cfg.num_hidden_layers]]
        self.norm = decoder.norm.weight.detach().float()
        self.norm_eps = decoder.norm.variance_epsilon
        self.head = _fused([model.get_output_embeddings()], dtype, packed)

    @classmethod
    def for_model(cls, model: Any, dtype: torch.dtype = torch.bfloat16) -> FastDecoder | None:
        """The decoder for ``model`` on a CPU, or None where it does not apply exactly: another
        architecture, a GPU, weights not in fp32, an MLP other than SiLU-gated, biases where Llama
        has none, sliding-window attention, logit scaling or soft-capping."""
        cfg = getattr(model, "config", None)
        if cfg is None or getattr(cfg, "model_type", None) not in SUPPORTED_TYPES:
            return None
        param = next(model.parameters())
        if param.device.type != "cpu" or param.dtype != torch.float32:
            return None
        if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "mlp_bias", False):
            return None
        if getattr(cfg, "use_sliding_window", False) or getattr(cfg, "final_logit_softcapping", None):
            return None
        if cfg.model_type == "llama" and getattr(cfg, "attention_bias", False):
            return None
        if getattr(cfg, "pretraining_tp", 1) not in (None, 1):
            return None
        decoder = model.get_decoder()
        if getattr(decoder, "rotary_emb", None) is None or not hasattr(decoder, "layers"):
            return None
        if not all(hasattr(layer, a) for layer in decoder.layers for a in ("self_attn", "mlp", "input_layernorm",
                                                                           "post_attention_layernorm")):
            return None
        if any(hasattr(layer.self_attn, "q_norm") for layer in decoder.layers):
            return None
        decoder_out = cls(model, dtype, _packed_ops())
        if decoder_out.head is None or not all(layer.complete for layer in decoder_out.layers):
            return None
        return decoder_out

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """q ``[B, H, S, D]``, k and v ``[B, KV, L, D]``, ``allowed`` ``[B, 1, S, L]`` -> ``[B, S, H * D]``."""
        size, _, width, _ = q.shape
        if width == 1 and k.dtype == torch.bfloat16:  # a decode step on the bf16 cache: SDPA, fp32 inside
            out = F.scaled_dot_product_attention(q.to(self.dtype), k, v, attn_mask=allowed, scale=self.scaling,
                                                 enable_gqa=self.kv_heads != self.heads)
            return out.reshape(size, 1, self.heads * self.head_dim)
        if width == 1:  # a decode step in fp32: two small products beat SDPA's masked kernel there
            group = self.heads // self.kv_heads
            qg = q.reshape(size, self.kv_heads, group, self.head_dim)
            scores = torch.matmul(qg, k.transpose(-1, -2)) * self.scaling  # [B, KV, G, L]
            scores = scores.masked_fill(~allowed[:, :, 0, None, :], float("-inf"))
            out = torch.matmul(torch.softmax(scores, dim=-1), v)  # [B, KV, G, D]
            return out.reshape(size, 1, self.heads * self.head_dim)
        # a prefill's attention in the decoder's dtype, as autocast runs SDPA (bf16: about 2x faster here)
        out = F.scaled_dot_product_attention(q.to(self.dtype), k.to(self.dtype), v.to(self.dtype), attn_mask=allowed,
                                             scale=self.scaling, enable_gqa=self.kv_heads != self.heads)
        return out.transpose(1, 2).reshape(size, width, self.heads * self.head_dim)

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor, cache: Any) -> torch.Tensor:
        """Run ``ids`` ``[B, S]`` at ``positions`` after what ``cache`` holds (a transformers cache,
        updated in place), ``allowed`` ``[B, 1, S, L]`` the bool attention mask; the last position's
        logits ``[B, V]`` in fp32."""
        size, width = ids.shape
        h = F.embedding(ids, self.embed)  # [B, S, hidden]
        cos, sin = self.rotary(h, positions)
        cos, sin = cos[:, None].float(), sin[:, None].float()
        q_width, kv_width = self.heads * self.head_dim, self.kv_heads * self.head_dim
        for index, layer in enumerate(self.layers):
            qkv = layer.qkv(_rms(h, layer.norm_in, layer.eps_in))
            q = qkv[..., :q_width].view(size, width, self.heads, self.head_dim).transpose(1, 2)
            k = qkv[..., q_width : q_width + kv_width].view(size, width, self.kv_heads, self.head_dim).transpose(1, 2)
            v = qkv[..., q_width + kv_width :].view(size, width, self.kv_heads, self.head_dim).transpose(1, 2)
            keys, values = cache.update(_rotate(k, cos, sin).to(self.kv_dtype), v.to(self.kv_dtype).contiguous(), index)
            h = h + layer.o(self._attention(_rotate(q, cos, sin), keys, values, allowed))
            gate, up = layer.gate_up(_rms(h, layer.norm_post, layer.eps_post)).chunk(2, dim=-1)
            h = h + layer.down(F.silu(gate) * up)
        return self.head(_rms(h[:, -1, :], self.norm, self.norm_eps))
