"""Building blocks of the GPT family: norms, MLPs, rotary embeddings and causal self-attention.

Attention goes through torch's scaled_dot_product_attention (flash / memory-efficient kernels where
the device has them). Kernel injection (dsrecipes.kernels) later swaps these modules for fused ones,
so each is a small module with a plain-torch forward.

Kernel hooks: GeluMLP.bias_gelu_fn, SwiGLUMLP.swiglu_fn, CausalSelfAttention.attention_fn and
CausalSelfAttention.rope_fn are None by default (the plain-torch path runs, unchanged); kernel
injection (dsrecipes.models.kernel_injection) sets them on instances to swap in fused functions
without touching parameters, module names or state-dict keys.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from dsrecipes.models.config import ModelConfig


class RMSNorm(nn.Module):
    """Root-mean-square norm (Llama); computed in fp32 for stability, returned in the input dtype."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


def make_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.style == "llama":
        return RMSNorm(cfg.d_model, cfg.norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.bias)


class GeluMLP(nn.Module):
    """GPT-2 MLP: Linear -> GELU(tanh) -> Linear."""

    # Hook: fn(x @ fc_in.weight.T, fc_in.bias) -> gelu_tanh(x + bias); None = F.gelu on fc_in(x).
    bias_gelu_fn = None

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc_in = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=cfg.bias)
        self.fc_out = nn.Linear(cfg.ffn_dim, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias_gelu_fn is not None:
            return self.fc_out(self.bias_gelu_fn(F.linear(x, self.fc_in.weight), self.fc_in.bias))
        return self.fc_out(F.gelu(self.fc_in(x), approximate="tanh"))


class SwiGLUMLP(nn.Module):
    """Llama MLP: down(silu(gate(x)) * up(x))."""

    # Hook: fn(gate, up) -> silu(gate) * up; None = the torch expression.
    swiglu_fn = None

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=cfg.bias)
        self.up = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=cfg.bias)
        self.fc_out = nn.Linear(cfg.ffn_dim, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu_fn is not None:
            return self.fc_out(self.swiglu_fn(self.gate(x), self.up(x)))
        return self.fc_out(F.silu(self.gate(x)) * self.up(x))


def make_mlp(cfg: ModelConfig) -> nn.Module:
    return SwiGLUMLP(cfg) if cfg.style == "llama" else GeluMLP(cfg)


def rope_inv_freq(cfg: ModelConfig, device=None) -> torch.Tensor:
    """The rotary frequencies [head_dim/2] (fp32): theta^(-2i/d), scaled as cfg.rope_type says.

    linear: every frequency / rope_factor (position interpolation). llama3 (Llama 3.1): wavelengths longer than
    rope_original_max_seq_len / rope_low_freq_factor are divided by rope_factor, those shorter than
    ... / rope_high_freq_factor are kept, and the band between is interpolated smoothly; the same arithmetic as
    transformers' rope initialisers, so imported checkpoints rotate exactly as they did there.
    """
    head_dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    rope_type = str(cfg.rope_type)
    if rope_type == "linear":
        return inv_freq / cfg.rope_factor
    if rope_type != "llama3":
        return inv_freq
    factor, low, high = cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
    original = cfg.rope_original_max_seq_len or cfg.max_seq_len
    low_freq_wavelen, high_freq_wavelen = original / low, original / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_tables(head_dim: int, max_seq_len: int, theta: float, device=None,
                inv_freq: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [max_seq_len, head_dim/2] for rotary embeddings (fp32); plain theta^(-2i/d) frequencies
    unless inv_freq is given (model_rope_tables passes the scaled ones)."""
    if inv_freq is None:
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(max_seq_len, device=device, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def model_rope_tables(cfg: ModelConfig, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """A model's rotary tables: rope_tables over cfg.max_seq_len with rope_inv_freq's (scaled) frequencies."""
    return rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta, device, rope_inv_freq(cfg, device))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., :d/2], x[..., d/2:]) of x [B, H, T, D] by the angles for positions 0..T-1 (tables
    [>= T, D/2]), or for each token's own position (tables [B, 1, T, D/2], packed documents)."""
    if cos.dim() == 2:  # [max positions, D/2] tables: the first T rows; [B, 1, T, D/2] rows are each token's own
        seq_len = x.shape[-2]
        cos, sin = cos[:seq_len], sin[:seq_len]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class CausalSelfAttention(nn.Module):
    """Multi-head (or grouped-query) causal self-attention via torch SDPA.

    kv_proj fuses keys and values head by head: its output rows are laid out [kv_head, (k|v), head_dim],
    so any contiguous slice of whole kv heads holds both their keys and values (tensor parallelism
    shards it column-wise like q_proj). Head counts are read from the projections' outputs, so the
    same forward runs on a tensor-parallel rank that holds n_head/tp heads. With cfg.qk_norm, q_norm and
    k_norm (RMSNorm over head_dim, shared by the heads) normalise each query and key head before the
    rotary embedding (Qwen3).
    """

    # Hooks. attention_fn(q [B,H,T,D], k, v [B,Hkv,T,D]) -> causal attention [B,H,T,D] (handles GQA
    # itself, no dropout); None = SDPA. rope_fn(x, cos, sin) -> rotated x; None = apply_rope.
    attention_fn = None
    rope_fn = None

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.kv_heads, cfg.head_dim
        self.use_rope = cfg.style == "llama"
        self.dropout = cfg.dropout
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_head * cfg.head_dim, bias=cfg.attn_qkv_bias)
        self.kv_proj = nn.Linear(cfg.d_model, 2 * cfg.kv_heads * cfg.head_dim, bias=cfg.attn_qkv_bias)
        self.out_proj = nn.Linear(cfg.n_head * cfg.head_dim, cfg.d_model, bias=cfg.bias)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """attn_mask: None (causal), or a [B, 1, T, T] boolean mask that already holds causality (packed documents,
        dsrecipes.models.document_attention)."""
        bsz, seq_len, _ = x.shape
        q = self.q_proj(x).view(bsz, seq_len, -1, self.head_dim)
        k, v = self.kv_proj(x).view(bsz, seq_len, -1, 2, self.head_dim).unbind(3)
        if self.q_norm is not None:  # [B, T, heads, head_dim]: tensor parallelism shards dim 2 (the heads)
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.use_rope:  # per-token tables (packed documents) go through torch's rotation: the kernel takes [T, D/2]
            rope_fn = self.rope_fn if self.rope_fn is not None and rope[0].dim() == 2 else apply_rope
            q, k = rope_fn(q, *rope), rope_fn(k, *rope)
        if self.attention_fn is not None and attn_mask is None:
            y = self.attention_fn(q, k, v)
            return self.out_proj(y.transpose(1, 2).reshape(bsz, seq_len, -1))
        if k.shape[1] != q.shape[1]:
            repeat = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=attn_mask is None, dropout_p=self.dropout if self.training else 0.0
        )
        return self.out_proj(y.transpose(1, 2).reshape(bsz, seq_len, -1))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig, mlp: nn.Module | None = None):
        super().__init__()
        self.attn_norm = make_norm(cfg)
        self.attn = CausalSelfAttention(cfg)
        self.mlp_norm = make_norm(cfg)
        self.mlp = mlp if mlp is not None else make_mlp(cfg)  # an MoE layer replaces it in MoE blocks
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, rope=None, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        # the mask only as a keyword, and only when there is one: tensor parallelism's PrepareModuleInput maps the
        # positional inputs (x, rope) one to one
        extra = {"attn_mask": attn_mask} if attn_mask is not None else {}
        x = x + self.resid_dropout(self.attn(self.attn_norm(x), rope, **extra))
        return x + self.resid_dropout(self.mlp(self.mlp_norm(x)))
