"""Model-state memory per rank for each ZeRO stage: what dsrecipes' engine holds, and DeepSpeed's formula.

Counted at rest after an optimizer step with gradients present: parameters, gradients and optimizer
states (activations, communication buffers and FSDP2's transient unsharded parameters are not
model states). Ψ = parameter count, N = data-parallel ranks, b = bytes of the model dtype.

Each data-parallel strategy states what it holds (`model_state_bytes` of the classes in
dsrecipes.distributed.data_parallel); the estimate asks the strategy the run would use, chosen by
the same table the engine uses:

| stage | strategy (mechanism)                              | parameters | gradients | optimizer states |
|-------|---------------------------------------------------|------------|-----------|------------------|
| 0     | ddp: DDP                                          | bΨ (+4Ψ masters) | bΨ  | sΨ               |
| 1     | zero1: DDP + ZeroRedundancyOptimizer              | bΨ (+4Ψ/N)  | bΨ        | sΨ/N             |
| 2     | zero2: replicated parameters, sharded fp32 grads and optimizer | bΨ (+4Ψ/N masters) | 4Ψ/N | sΨ/N |
| 3     | fsdp2: fp32 shards are the masters                | 4Ψ/N       | 4Ψ/N      | sΨ/N             |

b = 4 unless precision.master_weights keeps the model in bf16/fp16 (b = 2; its gradients then move
to the fp32 masters: 4Ψ). Stage 2 combined with tensor/sequence/expert parallelism, hybrid sharding
or CPU offload runs on FSDP2 and holds the stage-3 figures at rest. ZeRO++ hpZ (stage 3,
zero.zero_hpz_partition_size = G > 1) adds its secondary parameter partition, bΨ/G (b of the
all-gather dtype), held between forward and backward.
s = optimizer state bytes per parameter (8 for Adam-family and LAMB, 4 for Lion, Adagrad and SGD
with momentum, 0 for plain SGD). DeepSpeed's mixed-precision formula (ZeRO paper, K=12):
16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N.

Layouts with tensor, pipeline, sequence or expert parallelism are estimated per rank from the
parameter shapes by dsrecipes.profiling.layout_memory, which asks the same strategies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dsrecipes.distributed.config import ZeroConfig
from dsrecipes.distributed.data_parallel import STRATEGIES, choose_strategy
from dsrecipes.distributed.parallel_dims import ParallelDims

_STATE_BYTES = {"adamw": 8, "adam": 8, "lamb": 8, "lion": 4, "adagrad": 4}
_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class MemoryEstimate:
    stage: int
    world_size: int
    parameters: float
    gradients: float
    optimizer_states: float
    deepspeed_total: float

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer_states


def optimizer_state_bytes(name: str, momentum: float = 0.0) -> int:
    if name == "sgd":
        return 4 if momentum else 0
    return _STATE_BYTES.get(name, 8)


def deepspeed_model_state_bytes(num_params: int, world_size: int, stage: int) -> float:
    """DeepSpeed's published per-rank model-state bytes (mixed precision, Adam: 2 + 2 + 12 bytes)."""
    n, w = num_params, world_size
    return {0: 16 * n, 1: 4 * n + 12 * n / w, 2: 2 * n + 14 * n / w, 3: 16 * n / w}[stage]


def estimate_model_states(
    num_params: int,
    world_size: int,
    stage: int,
    precision: str = "fp32",
    master_weights: bool = False,
    optimizer: str = "adamw",
    momentum: float = 0.0,
    hpz_partition_size: int = 1,
) -> MemoryEstimate:
    """Per-rank bytes of parameters, gradients and optimizer states held by dsrecipes' engine
    (plain data parallelism over world_size ranks). hpz_partition_size > 1 (ZeRO++ hpZ, stage 3)
    adds the secondary partition, Ψ / hpz_partition_size per rank in the all-gather dtype."""
    dims = ParallelDims.from_degrees(world_size, zero_stage=stage)
    strategy = STRATEGIES[choose_strategy(ZeroConfig(stage=stage), dims)]
    model_bytes = _DTYPE_BYTES[precision] if master_weights else 4
    hpz = {"hpz_partition_size": hpz_partition_size, "param_bytes": _DTYPE_BYTES[precision]} \
        if stage == 3 and hpz_partition_size > 1 else {}
    held = strategy.model_state_bytes(num_params, world_size, model_bytes,
                                      optimizer_state_bytes(optimizer, momentum), master_weights, **hpz)
    return MemoryEstimate(stage, world_size, held.parameters, held.gradients, held.optimizer_states,
                          deepspeed_model_state_bytes(num_params, world_size, stage))


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _local_bytes(tensor: torch.Tensor) -> int:
    local = _local(tensor)
    return local.numel() * local.element_size()


def measure_model_states(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this rank actually holds: local parameter shards, their gradients, local optimizer state.

    Master weights held by the optimizer (when the module runs in bf16/fp16) count as parameters;
    optimizer tensors that are views of the module's parameters (ZeRO-2's fp32 shards) do not count twice.
    """
    module_params = {id(p): p for p in module.parameters()}
    module_storages = {_local(p).untyped_storage().data_ptr() for p in module_params.values()}
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer keeps its shard's optimizer here
    optimizer_params = {id(p): p for g in optimizer.param_groups for p in g["params"]}
    params = sum(_local_bytes(p) for p in module_params.values())
    params += sum(_local_bytes(p) for k, p in optimizer_params.items()
                  if k not in module_params and _local(p).untyped_storage().data_ptr() not in module_storages)
    grads = sum(_local_bytes(p.grad) for p in {**module_params, **optimizer_params}.values() if p.grad is not None)
    states = sum(
        _local_bytes(value)
        for state in inner.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor) and value.numel() > 1
    )
    return {"parameters": params, "gradients": grads, "optimizer_states": states}


# --------------------------------------------------------------------------------------------
# activations: what a micro-batch adds on top of the model states (the autotuner prunes with it)
# --------------------------------------------------------------------------------------------

# Saved activation elements per token of one block, as c_d * d_model + c_f * ffn_dim: counted from the
# blocks (dsrecipes.models.layers) and checked with saved_tensors_hooks in tests/unit/test_autotune.py.
# gpt2: the inputs of ln1, qkv, q/k/v, out_proj, ln2, fc_in (8d) and of GELU and fc_out (2f);
# llama: the same plus the rotary products (~11d) and SwiGLU's gate, up, silu and down inputs (4f).
# SDPA's flash / memory-efficient kernels (CUDA, and torch's CPU flash kernel) keep no attention scores.
_BLOCK_ELEMENTS = {"gpt2": (8, 2), "llama": (11, 4)}
# The final norm's saved elements per token, in units of d_model: LayerNorm keeps its input and output,
# the RMSNorm (written in torch ops) also its normalised product.
_FINAL_NORM_ELEMENTS = {"gpt2": 2, "llama": 3}


@dataclass(frozen=True)
class ActivationEstimate:
    """Per-rank bytes of one micro-batch's activations: what autograd keeps and the backward's transient peak."""

    micro_batch: int
    saved: float
    transient: float

    @property
    def total(self) -> float:
        return self.saved + self.transient


def estimate_activations(
    micro_batch: int,
    seq_len: int,
    n_layer: int,
    d_model: int,
    ffn_dim: int,
    vocab_size: int,
    style: str = "gpt2",
    activation_bytes: int = 4,
    checkpointing: bool = False,
) -> ActivationEstimate:
    """Activation bytes of one micro-batch of `micro_batch` x `seq_len` tokens on one rank.

    Per token (a = activation_bytes: 4 in fp32, 2 under bf16/fp16; logits are fp32 for the loss):

        saved     = L * (c_d * d + c_f * f) * a  + c_n * d * a  + 4 * V      (no checkpointing)
        saved     = L * d * a + (c_d * d + c_f * f) * a + c_n * d * a + 4 * V   (every block checkpointed:
                    each block keeps its input; one block is recomputed at a time)
        transient = 8 * V   (the fp32 logits' gradient and the log-softmax's, alive together in the backward)

    c_d, c_f = 8, 2 for GPT-2 blocks and 11, 4 for Llama blocks (see _BLOCK_ELEMENTS); c_n = 2 (LayerNorm)
    or 3 (RMSNorm) is the final norm's; 4V is the log-softmax the cross-entropy keeps. Linear in the micro-batch,
    so the largest micro-batch that fits a memory cap is one division. Not counted: attention scores of
    kernels that materialise them (sparse attention), MoE routing buffers, communication buckets.
    """
    c_d, c_f = _BLOCK_ELEMENTS.get(str(style), _BLOCK_ELEMENTS["llama"])
    block = (c_d * d_model + c_f * ffn_dim) * activation_bytes
    head = _FINAL_NORM_ELEMENTS.get(str(style), 3) * d_model * activation_bytes + 4 * vocab_size
    kept_blocks = n_layer * d_model * activation_bytes + block if checkpointing else n_layer * block
    tokens = micro_batch * seq_len
    return ActivationEstimate(micro_batch, tokens * (kept_blocks + head), tokens * 8 * vocab_size)
