"""The inference forward pass of a dsrecipes GPT over a KV cache (prefill and decode).

    decoder = CachedDecoder(model)                       # plain torch ops
    decoder = CachedDecoder(model, kernels=InferenceKernels.triton())   # fused kernels (see below)
    logits = decoder.forward(ids, cache)                 # ids [B, T] -> logits of the last position [B, V]
    logits = decoder.decode(next_ids[:, None], cache)    # one token per row (eager, static or CUDA graph)

Runs the model's own modules (tok_emb, pos_emb, blocks' norms and projections, final_norm, lm_head)
but owns the attention, so it can read and write the preallocated KVCache, respect left padding and
give each row its own positions; the training forward (dsrecipes.models.gpt) stays untouched. The
projections are called as modules, so they may be nn.Linear, tensor-parallel shards
(dsrecipes.inference.tensor_parallel) or weight-only quantized linears (dsrecipes.inference.quantized).

Positions: slot s of row b holds position s - start[b] (start = left padding), so a padded row
computes exactly what it would alone. Attention masks: key slot j is visible from query slot i when
start[b] <= j <= i (a pad query sees itself only, so its junk output is finite and never read).

Decode modes (`decode_mode`): `eager` runs `forward` for every token; `static` runs
`decode_static`, the same step with nothing depending on a host value (the cache slot is a device
tensor, the write an index_copy_, attention spans the whole capacity masked to [start, slot]), which
is what `cuda_graph` captures once per cache and batch and replays (dsrecipes.inference.cuda_graphs).

Kernel choices per op (`InferenceKernels`): prefill attention of unpadded prompts into an empty
cache (causal, T_q == T_k: flash_attention), decode attention of one new token over the cache
(dsrecipes.inference.decode_attention), bias+GELU and SwiGLU of the MLP. Norms are swapped by
dsrecipes.models.kernel_injection (they are called as modules). Anything else uses SDPA with a mask.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dsrecipes.inference.kv_cache import KVCache
from dsrecipes.models.layers import CausalSelfAttention, GeluMLP
from dsrecipes.models.moe import MoELayer


@dataclass
class InferenceKernels:
    """Fused functions the decoder calls; None = the plain-torch expression."""

    prefill_attention: Callable | None = None  # fn(q, k, v [B,H(kv),T,D]) -> causal attention [B,H,T,D]
    decode_attention: Callable | None = None  # fn(q [B,H,1,D], k, v [B,Hkv,S,D], start [B]) -> [B,H,1,D]
    bias_gelu: Callable | None = None  # fn(x @ W.T, bias) -> gelu_tanh(x + bias)
    swiglu: Callable | None = None  # fn(gate, up) -> silu(gate) * up

    @classmethod
    def triton(cls, head_dim: int) -> InferenceKernels:
        """The dsrecipes.kernels set (imported here, after TRITON_INTERPRET is settled)."""
        from dsrecipes.inference.decode_attention import decode_attention
        from dsrecipes.kernels.activations import bias_gelu, swiglu
        from dsrecipes.kernels.flash_attention import SUPPORTED_HEAD_DIMS, flash_attention

        return cls(
            prefill_attention=flash_attention if head_dim in SUPPORTED_HEAD_DIMS else None,
            decode_attention=decode_attention,
            bias_gelu=bias_gelu,
            swiglu=swiglu,
        )

    def describe(self) -> list[str]:
        names = {"prefill_attention": "prefill attention", "decode_attention": "decode attention",
                 "bias_gelu": "MLP bias+GELU", "swiglu": "MLP SwiGLU"}
        return [f"{label}: {getattr(getattr(self, key), '__name__', 'torch')}" for key, label in names.items()]


def matmul_without_bias(linear: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x @ W.T of a linear module without its bias (nn.Linear or any module with `matmul`)."""
    if isinstance(linear, nn.Linear):
        return F.linear(x, linear.weight)
    return linear.matmul(x)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [B, H, T, D] with per-row angle tables cos/sin [B, 1, T, D/2]."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


DECODE_MODES = ("eager", "static", "cuda_graph")


class CachedDecoder:
    """Prefill/decode forward of a GPT over a KVCache; see the module docstring."""

    def __init__(self, model: nn.Module, kernels: InferenceKernels | None = None, decode_mode: str = "eager"):
        if decode_mode not in DECODE_MODES:
            raise ValueError(f"decode_mode={decode_mode!r} is not valid; choose one of: {', '.join(DECODE_MODES)}")
        self.model = model
        self.cfg = model.cfg
        self.kernels = kernels or InferenceKernels()
        self.decode_mode = decode_mode
        self._graphs = None
        if decode_mode == "cuda_graph":
            from dsrecipes.inference.cuda_graphs import DecodeGraphs

            self._graphs = DecodeGraphs(self)

    def allocate_cache(self, batch: int, capacity: int) -> KVCache:
        attn = self.model.blocks[0].attn
        param = self.model.tok_emb.weight
        return KVCache.allocate(self.cfg.n_layer, batch, attn.n_kv_head, capacity, attn.head_dim, param.dtype, param.device)

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, cache: KVCache, all_logits: bool = False) -> torch.Tensor:
        """Run ids [B, T] at slots [cache.length, cache.length+T); returns logits [B, V] of the last
        slot (or [B, T, V] with all_logits) in the model's dtype, and advances the cache by T."""
        model = self.model
        bsz, seq_len = ids.shape
        device = ids.device
        first = cache.length
        slots = torch.arange(first, first + seq_len, device=device)
        x, rope = self._embed(ids, (slots[None, :] - cache.start[:, None]).clamp(min=0))  # positions [B, T]
        padded = bool((cache.start > 0).any())
        mask = None
        if padded or (first > 0 and seq_len > 1):
            keys = torch.arange(first + seq_len, device=device)
            visible = (keys[None, None, :] >= cache.start[:, None, None]) & (keys[None, None, :] <= slots[None, :, None])
            visible |= keys[None, None, :] == slots[None, :, None]
            mask = visible[:, None]  # [B, 1, T, S]
        for index, block in enumerate(model.blocks):
            x = x + self._attention(block.attn, block.attn_norm(x), index, cache, rope, mask, padded)
            x = x + self._mlp(block.mlp, block.mlp_norm(x))
        cache.advance(seq_len)
        if not all_logits:
            x = x[:, -1]
        return model.lm_head(model.final_norm(x))

    def drop_graphs(self) -> None:
        """Forget captured decode graphs (call when the caches they were captured over are replaced)."""
        if self._graphs is not None:
            self._graphs.clear()

    @torch.no_grad()
    def decode(self, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits [B, V] of one new token per row (ids [B, 1]); advances the cache by one slot. Under
        `cuda_graph` the returned tensor is the graph's output buffer, overwritten by the next call."""
        if self._graphs is not None and ids.is_cuda:
            return self._graphs.step(ids, cache)
        if self.decode_mode == "eager":
            return self.forward(ids, cache)
        slot = torch.full((1,), cache.length, dtype=torch.long, device=ids.device)
        logits = self.decode_static(ids, cache, slot)
        cache.advance(1)
        return logits

    @torch.no_grad()
    def decode_static(self, ids: torch.Tensor, cache: KVCache, slot: torch.Tensor) -> torch.Tensor:
        """Logits [B, V] of ids [B, 1] written at cache slot `slot` ([1] long, on the device); nothing
        here reads a host value that changes between steps, so a CUDA graph of it replays at any slot.
        Does not advance the cache (the caller does)."""
        from dsrecipes.inference.decode_attention import decode_attention_reference  # lazily: it imports Triton

        model = self.model
        if slot.numel() != 1 or cache.length >= cache.capacity:
            raise ValueError(f"KV cache overflow: slot {cache.length} of capacity {cache.capacity}")
        x, rope = self._embed(ids, (slot - cache.start).clamp(min=0)[:, None])  # positions [B, 1]
        end = slot + 1
        for index, block in enumerate(model.blocks):
            attn = block.attn
            q, k, v = self._project(attn, block.attn_norm(x), rope)
            keys, values = cache.keys[index], cache.values[index]
            keys.index_copy_(2, slot, k)
            values.index_copy_(2, slot, v)
            fn = self.kernels.decode_attention or decode_attention_reference
            y = fn(q, keys, values, cache.start, end)
            x = x + attn.out_proj(y.transpose(1, 2).reshape(ids.shape[0], 1, attn.n_head * attn.head_dim))
            x = x + self._mlp(block.mlp, block.mlp_norm(x))
        return model.lm_head(model.final_norm(x[:, -1]))

    def _embed(self, ids: torch.Tensor, positions: torch.Tensor):
        """Token (+ learned position) embeddings of ids [B, T] at per-row positions [B, T], and the
        rotary tables (cos, sin) [B, 1, T, D/2] for those positions (None for gpt2-style models)."""
        model = self.model
        x = model.tok_emb(ids)
        if model.pos_emb is not None:
            x = x + model.pos_emb(positions)
        rope = None
        if self.cfg.style == "llama":
            rope = (model.rope_cos[positions][:, None].to(x.dtype), model.rope_sin[positions][:, None].to(x.dtype))
        return x, rope

    @staticmethod
    def _project(attn: CausalSelfAttention, h: torch.Tensor, rope):
        """q [B, H, T, D] and k, v [B, Hkv, T, D] of normed h [B, T, C], rotated when rope is given."""
        bsz, seq_len, _ = h.shape
        n_head, n_kv, head_dim = attn.n_head, attn.n_kv_head, attn.head_dim
        q = attn.q_proj(h).view(bsz, seq_len, n_head, head_dim)
        k, v = attn.kv_proj(h).view(bsz, seq_len, n_kv, 2, head_dim).unbind(3)  # rows [kv_head, k|v, head_dim]
        if attn.q_norm is not None:  # Qwen3's per-head norms, before the rotation as in training
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if rope is not None:
            q, k = rotate(q, *rope), rotate(k, *rope)
        return q, k, v

    def _attention(self, attn: CausalSelfAttention, h, layer: int, cache: KVCache, rope, mask, padded: bool):
        bsz, seq_len, _ = h.shape
        n_head, n_kv, head_dim = attn.n_head, attn.n_kv_head, attn.head_dim
        q, k, v = self._project(attn, h, rope)
        empty_before = cache.length == 0
        k_all, v_all = cache.write(layer, k, v)
        kern = self.kernels
        if seq_len == 1 and kern.decode_attention is not None:
            y = kern.decode_attention(q, k_all, v_all, cache.start)
        elif empty_before and not padded and kern.prefill_attention is not None:
            y = kern.prefill_attention(q, k, v)
        elif mask is None:  # no padding: an empty cache is plainly causal, one query sees every key
            y = F.scaled_dot_product_attention(q, k_all, v_all, is_causal=seq_len > 1, enable_gqa=n_kv != n_head)
        else:
            y = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, enable_gqa=n_kv != n_head)
        return attn.out_proj(y.transpose(1, 2).reshape(bsz, seq_len, n_head * head_dim))

    def _mlp(self, mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
        kern = self.kernels
        if isinstance(mlp, MoELayer):  # gating + experts as in training (eval capacity factor)
            return mlp(x)
        if isinstance(mlp, GeluMLP):
            if kern.bias_gelu is not None:
                return mlp.fc_out(kern.bias_gelu(matmul_without_bias(mlp.fc_in, x), mlp.fc_in.bias))
            return mlp.fc_out(F.gelu(mlp.fc_in(x), approximate="tanh"))
        gate, up = mlp.gate(x), mlp.up(x)
        if kern.swiglu is not None:
            return mlp.fc_out(kern.swiglu(gate, up))
        return mlp.fc_out(F.silu(gate) * up)
