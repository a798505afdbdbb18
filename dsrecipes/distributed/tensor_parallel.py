"""Tensor parallelism for training with torch.distributed.tensor.parallel (Megatron's layout).

    apply_tensor_parallel(model, mesh["tp"])      # in place, before FSDP2 wraps the dp axis

Per block: q_proj and kv_proj column-parallel (each rank computes n_head/tp query heads and
n_kv_head/tp key/value heads; kv_proj's rows are [kv_head, k|v, head_dim], so a contiguous shard holds
whole heads), out_proj row-parallel (partial outputs all-reduced), per-head q/k norms (Qwen3) on the
rank's heads with their shared weight's gradient summed over tp; the MLP's fc_in (gate, up)
column-parallel and fc_out row-parallel. The token embedding is vocab-parallel (row-wise: each rank
holds a slice of the vocabulary, lookups all-reduced) and the LM head column-parallel over the
vocabulary; with tied embeddings the two share one vocab-sharded weight. The logits stay
vocab-sharded (a DTensor) and the loss is vocab-parallel (torch's loss_parallel, set as the model's
loss_fn): the [tokens, vocab] logits are never gathered in training. `full_logits` gathers them
where a caller needs them whole (text sampling).

Between the sharded layers, the activations are either
* sequence-parallel (`sequence_parallel=True`, the default; Megatron-LM's --sequence-parallel,
  torchtitan's layout): the residual stream is split along the sequence, each rank holding
  [batch, seq/tp, d_model]; norms, dropout and residual adds run on that shard (norm weights become
  replicated DTensors whose gradients are summed over tp); before attention and the MLP the normed
  shard is all-gathered, and out_proj / fc_out reduce-scatter their partial outputs back to shards.
  The communicated bytes equal an all-reduce's, and activation memory outside attention and the MLP
  drops by tp. Learned position embeddings are sliced to the rank's positions (no communication).
* or replicated (`sequence_parallel=False`): norms, residuals and position embeddings run
  unchanged on plain [batch, seq, d_model] tensors, with two all-reduces per block forward (and two
  backward), as Megatron-LM without sequence parallelism.

MoE layers (moe.num_experts > 0) are not sharded here: they take the whole tokens on every tp rank
(gathered as for the dense MLP; with sequence-parallel activations the output is sliced back to
this rank's sequence shard), so the tp ranks route identically and the router is replicated, with
identical gradients. The experts' hidden width is sliced over tp by
dsrecipes.distributed.expert_parallel (expert-tensor parallelism, DeepSpeed-MoE's
enable_expert_tensor_parallelism).

Parameters become DTensors sharded over the tp mesh: DCP checkpoints store their global shapes (a
TP=2 checkpoint resumes at TP=1 or any other layout) and full state dicts gather them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from dsrecipes.distributed.lora_adapters import lora_tensor_parallel_plan
from dsrecipes.models.layers import CausalSelfAttention, GeluMLP, SwiGLUMLP
from dsrecipes.models.moe import MoELayer


def block_plan(block: nn.Module, sequence_parallel: bool = False) -> dict:
    # sequence-parallel: the row-parallel layers reduce-scatter into sequence shards instead of all-reducing
    row = RowwiseParallel(output_layouts=Shard(1)) if sequence_parallel else RowwiseParallel()
    plan = {"attn.q_proj": ColwiseParallel(), "attn.kv_proj": ColwiseParallel(), "attn.out_proj": row}
    if getattr(block.attn, "q_norm", None) is not None:
        plan.update({"attn.q_norm": head_sharded_norm(), "attn.k_norm": head_sharded_norm()})
    if isinstance(block.mlp, GeluMLP):
        plan.update({"mlp.fc_in": ColwiseParallel(), "mlp.fc_out": row})
    elif isinstance(block.mlp, SwiGLUMLP):
        plan.update({"mlp.gate": ColwiseParallel(), "mlp.up": ColwiseParallel(), "mlp.fc_out": row})
    elif not isinstance(block.mlp, MoELayer):
        raise ValueError(f"tensor parallelism has no plan for a {type(block.mlp).__name__} MLP")
    if sequence_parallel:  # norms on sequence shards; attention and the MLP gather the whole sequence first
        plan.update({
            "attn_norm": SequenceParallel(),
            "mlp_norm": SequenceParallel(),
            "attn": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        })
        if isinstance(block.mlp, MoELayer):  # whole tokens in (plain tensors), this rank's sequence shard out
            plan["mlp"] = PrepareModuleInputOutput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_input=True,
                output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),), use_local_output=True)
    return plan


def head_sharded_norm() -> SequenceParallel:
    """The style of a norm over each attention head (Qwen3's q_norm / k_norm on [batch, seq, heads, head_dim]):
    its input holds this rank's heads, its weight is shared by all heads, so the weight is a replicated DTensor
    whose gradient is summed over the tp ranks (each computes the part of its own heads). torch's
    SequenceParallel style does exactly that for any sharded dim: here dim 2, the heads."""
    return SequenceParallel(sequence_dim=2, use_local_output=True)


def model_plan(model: nn.Module, sequence_parallel: bool = False) -> dict:
    """The plan of the GPT's own modules outside the blocks: vocab-parallel embedding and LM head
    (and, with sequence-parallel activations, the final norm and the position slice)."""
    shard = Shard(1) if sequence_parallel else Replicate()
    plan = {
        "tok_emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=shard),
        "lm_head": ColwiseParallel(input_layouts=shard, output_layouts=Shard(-1), use_local_output=False),
    }
    if sequence_parallel:
        plan["final_norm"] = SequenceParallel()
        if model.pos_emb is not None:  # [seq, d_model] rows sliced to this rank's positions: no communication
            plan["pos_emb"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(0))
    return plan


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, sequence_parallel: bool = True) -> nn.Module:
    """Shard a dsrecipes GPT over `tp_mesh` in place; returns it. sequence_parallel: split the
    residual stream (and the norms) along the sequence between the sharded layers (module docstring)."""
    tied = model.lm_head.weight is model.tok_emb.weight
    for block in model.blocks:
        if not isinstance(block.attn, CausalSelfAttention):
            raise ValueError(f"tensor parallelism expects CausalSelfAttention blocks, got {type(block.attn).__name__}")
        plan = lora_tensor_parallel_plan(block, block_plan(block, sequence_parallel), sequence_parallel)
        parallelize_module(block, tp_mesh, plan)
    parallelize_module(model, tp_mesh, model_plan(model, sequence_parallel))
    model.activation_seq_shards = tp_mesh.size() if sequence_parallel else 1
    if sequence_parallel:
        model.register_forward_pre_hook(_require_divisible_sequence, with_kwargs=True)
    if tied:  # both are vocab-sharded Shard(0): share the one DTensor parameter again
        model.lm_head.weight = model.tok_emb.weight
    model.loss_fn = vocab_parallel_cross_entropy
    return model


def _require_divisible_sequence(model: nn.Module, args: tuple, kwargs: dict) -> None:
    """Sequence shards must be equal (the reduce-scatters and all-gathers move equal chunks)."""
    ids = args[0] if args else kwargs["input_ids"]
    shards = model.activation_seq_shards
    if ids.shape[1] % shards:
        raise ValueError(
            f"sequence length {ids.shape[1]} is not divisible by parallel.tp={shards} with "
            "parallel.tp_sequence_parallel=true; pad the batch, choose data.block_size accordingly, "
            "or set parallel.tp_sequence_parallel=false"
        )


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
