"""DeepSpeed-Ulysses sequence parallelism: all-to-alls that swap sequence and head sharding around attention.

Why: a sequence too long for one device is split into P equal chunks, one per rank of the sequence-
parallel (sp) group. Everything except attention is per-token, so it runs on the local chunk as is.
Attention needs the whole sequence: Ulysses re-shards q, k, v with one all-to-all each, from
[B, H, T/P, D] (all heads, my chunk) to [B, H/P, T, D] (my heads, whole sequence), runs any local
attention on that, and one all-to-all brings the output back to [B, H, T/P, D]. Communication per
layer is 4·B·T·H·D/P elements per rank (falls with P), against Megatron-SP's constant volume.

    sp = SequenceParallel(group)                   # group: the sp ProcessGroup (e.g. mesh["sp"].get_group())
    sp.install(model)                              # wraps every CausalSelfAttention.attention_fn
    batch = sp.shard(batch)                        # input_ids/labels -> this rank's chunk, + "position_offset"
    out = model(batch["input_ids"], labels=batch["labels"], position_offset=batch["position_offset"])

Semantics (DeepSpeed `DistributedAttention`): requires model.n_head % parallel.sp == 0 and
data.block_size % parallel.sp == 0. Grouped-query kv heads that do not divide by sp are repeated
(`repeat_interleave`, the convention of CausalSelfAttention) up to lcm(n_kv_head, sp) heads first,
which is exact and costs only extra all-to-all volume.

Positions: chunk r holds positions r·T/P .. (r+1)·T/P-1, passed to GPT.forward as position_offset,
so learned position embeddings (gpt2) and rotary tables (llama) see the true positions.

With tensor parallelism the hook receives this tp rank's n_head/tp heads (the column-parallel
projections' local outputs), and the sp group is the ranks holding the same tp shard: Ulysses splits
those heads over sp (model.n_head % (tp*sp) == 0). Under pipeline parallelism every stage's attention
runs on the chunk; dsrecipes.distributed.pipeline_parallel passes the positions and reweights the loss.

Loss and gradients: each rank's loss is the mean over its chunk. With equal chunks and every label
counted, the mean of the sp ranks' losses is the full-sequence mean, and the mean of their local
parameter gradients (DDP's all-reduce over a world that includes the sp group) is its gradient: the
all-to-alls' backward carries each rank's loss gradient to the ranks whose tokens it attended to.
With ignored labels (-100) the chunks' counts differ; `sequence_parallel_loss` reweights each
rank's mean by count·P/total so the same averaging stays exact.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


# --------------------------------------------------------------------------------------------------
# Validation (before any worker starts)
# --------------------------------------------------------------------------------------------------


def validate_sequence_parallel(
    sp: int, n_head: int, n_kv_head: int | None = None, block_size: int | None = None
) -> None:
    """ValueError naming the keys when sp does not fit the heads or the sequence length."""
    if sp < 1:
        raise ValueError(f"parallel.sp={sp} must be >= 1")
    if sp == 1:
        return
    if n_head % sp:
        valid = [d for d in range(1, n_head + 1) if n_head % d == 0]
        raise ValueError(
            f"parallel.sp={sp} does not divide model.n_head={n_head}: Ulysses gives each sp rank "
            f"n_head/sp whole heads; valid parallel.sp values: {', '.join(map(str, valid))}"
        )
    if n_kv_head is not None and (n_kv_head < 1 or n_head % n_kv_head):
        raise ValueError(f"model.n_kv_head={n_kv_head} must divide model.n_head={n_head}")
    if block_size is not None and block_size % sp:
        raise ValueError(
            f"data.block_size={block_size} is not divisible by parallel.sp={sp}: every sp rank holds "
            f"block_size/sp tokens; use a multiple of {sp} (e.g. {block_size - block_size % sp or sp})"
        )


def validate_sequence_parallel_recipe(cfg) -> None:
    """Recipe-level checks for parallel.sp > 1 (call from validate_recipe, before workers start):
    heads and block size divisible, heads (and, with sequence-parallel tp activations, the block size)
    divisible by tp*sp with TP, no attention dropout. What
    sequence parallelism does not compose with is dsrecipes.config.compatibility's."""
    sp = cfg.parallel.sp
    model = cfg.model
    validate_sequence_parallel(sp, model.n_head, model.n_kv_head, cfg.data.block_size)
    if sp == 1:
        return
    tp = getattr(cfg.parallel, "tp", 1)
    if tp > 1 and model.n_head % (tp * sp):
        raise ValueError(
            f"model.n_head={model.n_head} is not divisible by parallel.tp={tp} x parallel.sp={sp}: tensor "
            "parallelism splits the heads over tp ranks, then Ulysses splits each rank's heads over sp"
        )
    if tp > 1 and getattr(cfg.parallel, "tp_sequence_parallel", False) and cfg.data.block_size % (tp * sp):
        raise ValueError(
            f"data.block_size={cfg.data.block_size} is not divisible by parallel.sp={sp} x parallel.tp={tp}: each sp "
            "rank's chunk is split again over the tp ranks (parallel.tp_sequence_parallel=true); use a multiple of "
            f"{tp * sp} or set parallel.tp_sequence_parallel=false"
        )
    if model.dropout > 0:
        raise ValueError(
            f"model.dropout={model.dropout} with parallel.sp={sp}: Ulysses runs attention through the "
            "attention_fn hook, which has no attention dropout; set model.dropout=0"
        )


# --------------------------------------------------------------------------------------------------
# Differentiable all-to-all
# --------------------------------------------------------------------------------------------------


def _all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group) -> torch.Tensor:
    """Split x into P pieces along scatter_dim, send piece j to rank j, concatenate the pieces received
    (ordered by source rank) along gather_dim. Shape: scatter_dim / P, gather_dim * P."""
    world = dist.get_world_size(group)
    if world == 1:
        return x
    shape = list(x.shape)
    if shape[scatter_dim] % world:
        raise ValueError(f"all-to-all: dim {scatter_dim} of size {shape[scatter_dim]} does not split into {world}")
    # [..., P, n/P, ...] with the P axis moved to the front: all_to_all_single exchanges dim 0.
    split = x.reshape(shape[:scatter_dim] + [world, shape[scatter_dim] // world] + shape[scatter_dim + 1:])
    send = split.movedim(scatter_dim, 0).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    # recv[j] came from rank j: put the source axis just before gather_dim and merge it into gather_dim.
    pieces = recv.movedim(0, gather_dim)  # source axis now at gather_dim, the original gather_dim after it
    out_shape = list(x.shape)
    out_shape[scatter_dim] //= world
    out_shape[gather_dim] *= world
    return pieces.reshape(out_shape)


class _AllToAll(torch.autograd.Function):
    """all-to-all whose backward is the inverse all-to-all (gather and scatter dims swapped)."""

    @staticmethod
    def forward(ctx, x, scatter_dim: int, gather_dim: int, group):
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return _all_to_all(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad.contiguous(), gather_dim, scatter_dim, ctx.group), None, None, None


def seq_to_heads(x: torch.Tensor, group) -> torch.Tensor:
    """[B, H, T/P, D] (all heads, my sequence chunk) -> [B, H/P, T, D] (my heads, whole sequence)."""
    return _AllToAll.apply(x, 1, 2, group)


def heads_to_seq(x: torch.Tensor, group) -> torch.Tensor:
    """[B, H/P, T, D] (my heads, whole sequence) -> [B, H, T/P, D] (all heads, my sequence chunk)."""
    return _AllToAll.apply(x, 2, 1, group)


# --------------------------------------------------------------------------------------------------
# Ulysses attention
# --------------------------------------------------------------------------------------------------


def causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Default local attention: causal SDPA, kv heads repeated (`repeat_interleave`) for GQA."""
    if k.shape[1] != q.shape[1]:
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class UlyssesAttention:
    """An `attention_fn(q [B,H,T/P,D], k, v [B,Hkv,T/P,D]) -> [B,H,T/P,D]` that runs `local_attention`
    on the whole sequence for H/P heads (the hook signature of CausalSelfAttention.attention_fn).

    local_attention: any fn(q, k, v) -> out in [B, h, T, D] layout with causal masking and GQA
    handled by it (causal SDPA by default; dsrecipes.kernels.flash_attention; block-sparse ...).
    """

    def __init__(self, local_attention: AttentionFn | None, group):
        self.wrapped = local_attention  # what the hook held before (None = the module's own SDPA path)
        self.local_attention = local_attention if local_attention is not None else causal_sdpa
        self.group = group
        self.size = dist.get_world_size(group)

    def _kv_repeat(self, n_head: int, n_kv_head: int) -> int:
        """How often to repeat each kv head so the kv heads split evenly over the sp ranks."""
        if n_head % self.size:
            raise ValueError(f"parallel.sp={self.size} does not divide the attention's {n_head} heads (model.n_head)")
        if n_kv_head % self.size == 0:
            return 1
        return math.lcm(n_kv_head, self.size) // n_kv_head  # lcm divides n_head: n_kv_head | n_head, sp | n_head

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.attend(q, k, v, self.local_attention)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, local_attention: AttentionFn) -> torch.Tensor:
        """The all-to-alls around `local_attention` (what __call__ runs with this wrapper's own)."""
        repeat = self._kv_repeat(q.shape[1], k.shape[1])
        if repeat > 1:
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        q, k, v = (seq_to_heads(t, self.group) for t in (q, k, v))
        return heads_to_seq(local_attention(q, k, v), self.group)

    def __repr__(self) -> str:
        name = getattr(self.local_attention, "__name__", type(self.local_attention).__name__)
        return f"UlyssesAttention(local_attention={name}, sp={self.size})"


def apply_sequence_parallel(model: nn.Module, group) -> int:
    """Install Ulysses on every CausalSelfAttention under `model`, wrapping any attention_fn already
    set (kernel injection's flash_attention). Returns how many were wrapped; idempotent."""
    from dsrecipes.models.layers import CausalSelfAttention

    size = dist.get_world_size(group)
    count = 0
    for module in model.modules():
        if not isinstance(module, CausalSelfAttention):
            continue
        if module.n_head % size:
            raise ValueError(f"parallel.sp={size} does not divide model.n_head={module.n_head}")
        if module.dropout > 0:
            # attention dropout is not applied by the attention_fn hook (kernels have none either)
            raise ValueError(
                f"model.dropout={module.dropout}: Ulysses sequence parallelism runs attention through the "
                "attention_fn hook, which has no attention dropout; set model.dropout=0"
            )
        current = module.attention_fn
        if isinstance(current, UlyssesAttention):
            continue
        module.attention_fn = UlyssesAttention(current, group)
        count += 1
    return count


@contextlib.contextmanager
def sequence_parallel_disabled(model: nn.Module):
    """Temporarily restore the attention each Ulysses wrapper wraps, so `model` runs whole sequences on
    one rank with no collectives (text sampling on any rank, single-process evaluation)."""
    from dsrecipes.distributed.hf_sequence_parallel import hf_ulysses_disabled
    from dsrecipes.models.layers import CausalSelfAttention

    swapped = [
        m for m in model.modules() if isinstance(m, CausalSelfAttention) and isinstance(m.attention_fn, UlyssesAttention)
    ]
    wrappers = [m.attention_fn for m in swapped]
    try:
        for module, wrapper in zip(swapped, wrappers):
            module.attention_fn = wrapper.wrapped
        with hf_ulysses_disabled(model):  # a Hugging Face module's attention function (hf_sequence_parallel)
            yield model
    finally:
        for module, wrapper in zip(swapped, wrappers):
            module.attention_fn = wrapper


# --------------------------------------------------------------------------------------------------
# Data: sequence sharding and the loss
# --------------------------------------------------------------------------------------------------

SEQUENCE_KEYS = ("input_ids", "labels")


def shard_sequence(batch: dict, rank: int, size: int) -> tuple[dict, int]:
    """This sp rank's chunk of every [B, T] entry in SEQUENCE_KEYS, and its position offset r*T/P.
    Other entries pass through unchanged."""
    seq_len = batch["input_ids"].shape[1]
    if seq_len % size:
        raise ValueError(
            f"sequence length {seq_len} (data.block_size) is not divisible by parallel.sp={size}"
        )
    chunk = seq_len // size
    start = rank * chunk
    out = dict(batch)
    for key in SEQUENCE_KEYS:
        if key in batch and batch[key] is not None:
            out[key] = batch[key][:, start:start + chunk].contiguous()
    return out, start


def sequence_parallel_loss(loss: torch.Tensor, labels: torch.Tensor, group, ignore_index: int = -100) -> torch.Tensor:
    """Rescale this rank's chunk-mean `loss` by count·P/total (counts of labels != ignore_index over the
    sp group), so that the mean over the group (what DDP and the loss logging do) is the mean over
    every counted label of the full sequence. Identity when every rank counts the same labels."""
    size = dist.get_world_size(group)
    count = (labels != ignore_index).sum().to(torch.float32)
    total = count.detach().clone()
    dist.all_reduce(total, group=group)
    if count == 0:  # F.cross_entropy's mean over nothing is nan; this rank contributes nothing, but its
        return torch.nan_to_num(loss, nan=0.0) * 0.0  # backward still runs (the all-to-alls are collectives)
    return loss * (count * size / total)


@dataclass
class SequenceParallel:
    """What a training loop needs for Ulysses on one sp group: install on the model, shard micro-batches."""

    group: object
    rank: int = -1
    size: int = -1

    def __post_init__(self):
        if self.size < 0:
            self.size = dist.get_world_size(self.group)
        if self.rank < 0:
            self.rank = dist.get_rank(self.group)

    def install(self, model: nn.Module) -> nn.Module:
        apply_sequence_parallel(model, self.group)
        return model

    def shard(self, batch: dict) -> dict:
        """batch with input_ids/labels cut to this rank's chunk and "position_offset" set."""
        out, offset = shard_sequence(batch, self.rank, self.size)
        out["position_offset"] = offset
        return out

    def loss(self, loss: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return sequence_parallel_loss(loss, labels, self.group)
