"""Tensor-parallel inference: shard a GPT's attention heads and MLP across the ranks of a group.

    shard_for_inference(model, tp_group)     # in place, on every rank, with the full weights loaded

Megatron layout, as DeepSpeed-Inference's kernel-injection/AutoTP path does it: q_proj and kv_proj
are split by heads (column parallel: each rank keeps its heads' rows; kv_proj's rows are laid out
[kv_head, k|v, head_dim], so a contiguous chunk holds whole kv heads with their keys and values),
fc_in / gate / up by rows of the hidden layer; out_proj and fc_out are split by input columns (row
parallel) and their partial outputs are summed with one all-reduce each, after which the bias is
added once. Two all-reduces per block, none in the attention itself. The LM head is split by
vocabulary rows (each rank computes ceil(V/tp) logits; the last shard is zero-padded so gloo and
NCCL gather equal sizes) and one all-gather assembles the full, identical logits on every rank; at
batch-1 decode the LM head is a large share of the weight bytes read per token (gpt2's 38.6M of
124M), so each rank reads 1/tp of it. Embeddings and norms stay replicated (a tied embedding keeps
its full table for lookups; the head's shard is a separate 1/tp copy). MoE layers: the router stays
whole (every rank routes the same tokens alike) and each expert's hidden width is sliced as the dense
MLP's (`Experts.keep_hidden_slice`: partial outputs summed with one all-reduce, b_out added once); a
residual MoE's dense MLP is sharded as any MLP.

The sharding slices plain tensors (no DTensor): inference keeps no optimizer state or checkpoints,
and plain modules let the quantized and kernel-injected paths run unchanged on every rank.

Requires n_head and the kv head count divisible by the group size (clear ValueError otherwise, raised
by `check_tp_size` before anything is built). Quantization runs after sharding (each rank quantizes its
shard); with a quant.group_size dividing the shard widths the result equals single-device quantization
exactly, while per-channel scales of row-parallel shards cover only that rank's columns.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from dsrecipes.models.config import ModelConfig
from dsrecipes.models.layers import CausalSelfAttention, GeluMLP, SwiGLUMLP
from dsrecipes.models.moe import Experts


def check_tp_size(cfg: ModelConfig, tp_size: int, world_size: int | None = None, key: str = "tensor_parallel.tp_size") -> None:
    """ValueError naming the key when tp_size cannot shard this model (or this launch)."""
    if tp_size < 1:
        raise ValueError(f"{key}={tp_size} must be >= 1")
    if cfg.n_head % tp_size:
        valid = [d for d in range(1, cfg.n_head + 1) if cfg.n_head % d == 0 and cfg.kv_heads % d == 0]
        raise ValueError(f"{key}={tp_size} does not divide model.n_head={cfg.n_head}; valid sizes: {valid}")
    if cfg.kv_heads % tp_size:
        valid = [d for d in range(1, cfg.n_head + 1) if cfg.n_head % d == 0 and cfg.kv_heads % d == 0]
        raise ValueError(f"{key}={tp_size} does not divide the kv heads (model.n_kv_head={cfg.kv_heads}); "
                         f"valid sizes: {valid}")
    if world_size is not None and tp_size > 1 and world_size != tp_size:
        raise ValueError(f"{key}={tp_size} needs exactly {tp_size} processes, but the world size is {world_size}; "
                         f"launch with torchrun --nproc-per-node {tp_size}")


class RowParallelLinear(nn.Module):
    """A rank's input-column shard of a linear; partial outputs are all-reduced, then the bias added once."""

    def __init__(self, shard: nn.Module, bias: torch.Tensor | None, group):
        super().__init__()
        self.shard = shard  # nn.Linear without bias (or a quantized linear built from it)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None
        self.group = group

    @property
    def out_features(self) -> int:
        return self.shard.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.shard(x)
        dist.all_reduce(y, group=self.group)
        return y + self.bias if self.bias is not None else y


class VocabParallelLMHead(nn.Module):
    """A rank's rows of the LM head (ceil(V/tp) vocabulary entries, zero-padded at the end); the
    logits shards are all-gathered along the vocabulary and trimmed to V."""

    def __init__(self, weight: torch.Tensor, rank: int, size: int, group):
        super().__init__()
        self.out_features = weight.shape[0]
        width = -(-self.out_features // size)
        shard = weight.detach()[rank * width:(rank + 1) * width]
        if shard.shape[0] < width:
            shard = torch.cat([shard, shard.new_zeros(width - shard.shape[0], shard.shape[1])])
        self.shard = _linear_from(shard, None)
        self.group, self.size = group, size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = self.shard(x).contiguous()
        parts = [torch.empty_like(local) for _ in range(self.size)]
        dist.all_gather(parts, local, group=self.group)
        return torch.cat(parts, dim=-1)[..., : self.out_features]


def _linear_from(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    out_f, in_f = weight.shape
    linear = nn.Linear(in_f, out_f, bias=bias is not None, device="meta")
    linear.weight = nn.Parameter(weight.clone(), requires_grad=False)
    if bias is not None:
        linear.bias = nn.Parameter(bias.clone(), requires_grad=False)
    return linear


def _rows(linear: nn.Linear, index: torch.Tensor) -> nn.Linear:
    return _linear_from(linear.weight.detach()[index], linear.bias.detach()[index] if linear.bias is not None else None)


def _column_chunk(linear: nn.Linear, rank: int, size: int, group) -> RowParallelLinear:
    width = linear.in_features // size
    weight = linear.weight.detach()[:, rank * width:(rank + 1) * width]
    return RowParallelLinear(_linear_from(weight, None), linear.bias.detach() if linear.bias is not None else None, group)


def _chunk_index(total: int, rank: int, size: int, device) -> torch.Tensor:
    width = total // size
    return torch.arange(rank * width, (rank + 1) * width, device=device)


@torch.no_grad()
def shard_for_inference(model: nn.Module, group=None) -> int:
    """Shard `model` (a dsrecipes GPT with full weights) over `group`; returns the tp size. In place."""
    size = dist.get_world_size(group)
    rank = dist.get_rank(group)
    check_tp_size(model.cfg, size)
    if size == 1:
        return 1
    for module in list(model.modules()):
        if isinstance(module, Experts):  # every rank routes alike; each keeps a slice of each expert's hidden width
            module.keep_hidden_slice(rank, size, group)
        elif isinstance(module, CausalSelfAttention):
            dev = module.q_proj.weight.device
            hd, n_kv = module.head_dim, module.n_kv_head
            module.q_proj = _rows(module.q_proj, _chunk_index(module.n_head * hd, rank, size, dev))
            # kv_proj rows are [kv_head, k|v, head_dim]: a contiguous chunk holds whole kv heads
            module.kv_proj = _rows(module.kv_proj, _chunk_index(2 * n_kv * hd, rank, size, dev))
            module.out_proj = _column_chunk(module.out_proj, rank, size, group)
            module.n_head //= size
            module.n_kv_head //= size
        elif isinstance(module, GeluMLP):
            dev = module.fc_in.weight.device
            module.fc_in = _rows(module.fc_in, _chunk_index(module.fc_in.out_features, rank, size, dev))
            module.fc_out = _column_chunk(module.fc_out, rank, size, group)
        elif isinstance(module, SwiGLUMLP):
            dev = module.gate.weight.device
            index = _chunk_index(module.gate.out_features, rank, size, dev)
            module.gate, module.up = _rows(module.gate, index), _rows(module.up, index)
            module.fc_out = _column_chunk(module.fc_out, rank, size, group)
    model.lm_head = VocabParallelLMHead(model.lm_head.weight, rank, size, group)
    return size
