"""Tensor parallelism for training with torch.distributed.tensor.parallel (Megatron's layout).

    apply_tensor_parallel(model, mesh["tp"])      # in place, before FSDP2 wraps the dp axis

Per block: q_proj and kv_proj column-parallel (each rank computes n_head/tp query heads and
n_kv_head/tp key/value heads; kv_proj's rows are [kv_head, k|v, head_dim], so a contiguous shard holds
whole heads), out_proj row-parallel (partial outputs all-reduced); the MLP's fc_in (gate, up)
column-parallel and fc_out row-parallel. The token embedding is vocab-parallel (row-wise: each rank
holds a slice of the vocabulary, lookups all-reduced) and the LM head column-parallel over the
vocabulary; with tied embeddings the two share one vocab-sharded weight. The logits stay
vocab-sharded (a DTensor) and the loss is vocab-parallel (torch's loss_parallel, set as the model's
loss_fn): the [tokens, vocab] logits are never gathered in training. `full_logits` gathers them
where a caller needs them whole (text sampling). Activations between the sharded layers are
replicated, so norms, residuals and position embeddings run unchanged (plain tensors). Two all-reduces per block forward (and two backward), as Megatron-LM without
sequence parallelism.

Parameters become DTensors sharded over the tp mesh: DCP checkpoints store their global shapes (a
TP=2 checkpoint resumes at TP=1 or any other layout) and full state dicts gather them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from dsrecipes.models.layers import CausalSelfAttention, GeluMLP, SwiGLUMLP


def block_plan(block: nn.Module) -> dict:
    plan = {"attn.q_proj": ColwiseParallel(), "attn.kv_proj": ColwiseParallel(), "attn.out_proj": RowwiseParallel()}
    if isinstance(block.mlp, GeluMLP):
        plan.update({"mlp.fc_in": ColwiseParallel(), "mlp.fc_out": RowwiseParallel()})
    elif isinstance(block.mlp, SwiGLUMLP):
        plan.update({"mlp.gate": ColwiseParallel(), "mlp.up": ColwiseParallel(), "mlp.fc_out": RowwiseParallel()})
    else:
        raise ValueError(f"tensor parallelism has no plan for a {type(block.mlp).__name__} MLP (MoE layers: use moe.ep_size)")
    return plan


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh) -> nn.Module:
    """Shard a dsrecipes GPT over `tp_mesh` in place; returns it."""
    tied = model.lm_head.weight is model.tok_emb.weight
    for block in model.blocks:
        if not isinstance(block.attn, CausalSelfAttention):
            raise ValueError(f"tensor parallelism expects CausalSelfAttention blocks, got {type(block.attn).__name__}")
        parallelize_module(block, tp_mesh, block_plan(block))
    parallelize_module(model, tp_mesh, {
        "tok_emb": RowwiseParallel(input_layouts=Replicate()),
        "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
    })
    if tied:  # both are vocab-sharded Shard(0): share the one DTensor parameter again
        model.lm_head.weight = model.tok_emb.weight
    model.loss_fn = vocab_parallel_cross_entropy
    return model


def vocab_parallel_cross_entropy(logits: DTensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over labels != -100 of vocab-sharded logits [N, V/tp per rank], without
    gathering them: torch's loss_parallel computes the log-softmax with all-reduced max and sum.

    Forward and backward must run inside `loss_parallel()`; the Engine enters it around both for
    tensor-parallel models (`Engine(loss_parallel=True)`).
    """
    loss = F.cross_entropy(logits.float(), labels, ignore_index=-100)
    return loss.full_tensor() if isinstance(loss, DTensor) else loss


def full_logits(logits: torch.Tensor) -> torch.Tensor:
    """Vocab-sharded DTensor logits gathered into a plain tensor (plain tensors pass through)."""
    return logits.full_tensor() if isinstance(logits, DTensor) else logits
