"""Model-state memory per rank for each ZeRO stage: what dsrecipes' engine holds, and DeepSpeed's estimator.

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
with momentum, 0 for plain SGD; optimizer=muon 4 on its Muon matrices and 8 on its Adam half, weighed over the
model: dsrecipes.training.optim.state_bytes).

Beside it, DeepSpeed's own estimator, re-stated (`deepspeed_zero2_bytes`, `deepspeed_zero3_bytes`):
deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs and
deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs, bytes per GPU and host bytes per
node for 16-bit mixed-precision Adam (whatever the recipe's precision and optimizer), with its offload
variants, additional_buffer_factor (1.5) on the host figure and, at stage 3, the largest layer (the
module with the most parameters of its own) gathered whole. Without offload, per GPU:
ZeRO-2 2Ψ + 18Ψ/N, ZeRO-3 4L + 18Ψ/N. DeepSpeed has no estimator for stages 0 and 1, nor for NVMe offload.

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
from dsrecipes.training.optim.state_bytes import optimizer_state_bytes
from dsrecipes.utils.dtensors import local

_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class MemoryEstimate:
    stage: int
    world_size: int
    parameters: float
    gradients: float
    optimizer_states: float

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer_states


def weight_bytes(dtype: str, master_weights: bool, bf16_masters: bool = False) -> tuple[int, bool]:
    """(bytes of each weight the model holds, whether fp32 master copies sit beside it): fp32 weights 4; a bf16/fp16
    model with master weights 2 and fp32 copies; with bf16_masters (precision.master_dtype=bf16) 2 and no copy."""
    return (_DTYPE_BYTES[dtype] if master_weights or bf16_masters else 4), master_weights and not bf16_masters


def estimate_model_states(
    num_params: int,
    world_size: int,
    stage: int,
    precision: str = "fp32",
    master_weights: bool = False,
    optimizer: str = "adamw",
    momentum: float = 0.0,
    hpz_partition_size: int = 1,
    trainable_params: int | None = None,
    state_bytes: float | None = None,
    bf16_masters: bool = False,
) -> MemoryEstimate:
    """Per-rank bytes of parameters, gradients and optimizer states held by dsrecipes' engine
    (plain data parallelism over world_size ranks). hpz_partition_size > 1 (ZeRO++ hpZ, stage 3)
    adds the secondary partition, Ψ / hpz_partition_size per rank in the all-gather dtype.
    trainable_params: how many of the parameters train (LoRA: the adapters); the frozen rest holds weights only,
    no gradient, no optimizer state, no fp32 master. None: all of them. state_bytes: optimizer-state bytes per trained
    parameter (dsrecipes.training.optim.state_bytes.optimizer_state_of, which weighs optimizer=muon's two halves over
    the model); None: `optimizer`'s figure. bf16_masters (precision.master_dtype=bf16): the bf16 weights are what the
    optimizer steps, no fp32 copy, and its state is bf16 (half the state bytes)."""
    dims = ParallelDims.from_degrees(world_size, zero_stage=stage)
    strategy = STRATEGIES[choose_strategy(ZeroConfig(stage=stage), dims)]
    model_bytes, master_weights = weight_bytes(precision, master_weights, bf16_masters)
    hpz = {"hpz_partition_size": hpz_partition_size, "param_bytes": _DTYPE_BYTES[precision]} \
        if stage == 3 and hpz_partition_size > 1 else {}
    state_bytes = optimizer_state_bytes(optimizer, momentum) if state_bytes is None else state_bytes
    state_bytes = state_bytes / 2 if bf16_masters else state_bytes  # torch keeps a bf16 weight's state in bf16
    if trainable_params is None or trainable_params == num_params:
        held = strategy.model_state_bytes(num_params, world_size, model_bytes, state_bytes, master_weights, **hpz)
        return MemoryEstimate(stage, world_size, held.parameters, held.gradients, held.optimizer_states)
    weights = strategy.model_state_bytes(num_params, world_size, model_bytes, 0, False, **hpz).parameters
    trained = strategy.model_state_bytes(trainable_params, world_size, model_bytes, state_bytes, master_weights)
    masters = trained.parameters - strategy.model_state_bytes(trainable_params, world_size, model_bytes, 0,
                                                              False).parameters
    return MemoryEstimate(stage, world_size, weights + masters, trained.gradients, trained.optimizer_states)


# --------------------------------------------------------------------------------------------
# DeepSpeed's estimator (estimate_zero2/3_model_states_mem_needs), re-stated for the comparison column
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeepSpeedEstimate:
    """What DeepSpeed's estimator gives for one ZeRO stage: bytes per GPU, and host (CPU) bytes per node."""

    gpu: int
    cpu: int


def largest_layer_params(module: nn.Module) -> int:
    """Parameters of the module that holds the most of its own (its children's not counted).

    DeepSpeed's ZeRO-3 estimator (stage3.model_to_params) takes this maximum as the layer gathered whole;
    for a transformer it is the token embedding / LM head (vocab x d_model). Works on the meta device.
    """
    return max((sum(p.numel() for p in m.parameters(recurse=False)) for m in module.modules()), default=0)


def deepspeed_zero2_bytes(total_params: int, gpus_per_node: int, num_nodes: int, *, cpu_offload: bool,
                          additional_buffer_factor: float = 1.5) -> DeepSpeedEstimate:
    """DeepSpeed's ZeRO-2 model-state estimate, following
    deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs (0.19.8).

    The GPU holds the replicated 16-bit parameters (2 bytes each) and, unless the optimizer is offloaded,
    its 1/N shard of 16-bit and fp32 gradients, fp32 masters and Adam's two states (2 + 4 + 4 + 8 = 18 bytes).
    The host figure is per node, times additional_buffer_factor: with offload the masters, gradients and
    states of the whole model (4 bytes per GPU of the job, at least 16), without it each process's fp32
    copy of the model while it loads.
    """
    gpus = num_nodes * gpus_per_node
    if cpu_offload:
        gpu = 2 * total_params
        cpu = total_params * max(4 * gpus, 16) * additional_buffer_factor
    else:
        gpu = 2 * total_params + int(18 * total_params / gpus)
        cpu = total_params * 4 * gpus_per_node * additional_buffer_factor
    return DeepSpeedEstimate(int(gpu), int(cpu))


def deepspeed_zero3_bytes(total_params: int, largest_layer: int, gpus_per_node: int, num_nodes: int, *,
                          cpu_offload: bool, cpu_offload_params: bool, zero_init: bool,
                          additional_buffer_factor: float = 1.5) -> DeepSpeedEstimate:
    """DeepSpeed's ZeRO-3 model-state estimate, following
    deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs (0.19.8).

    The GPU always holds the largest layer gathered (4 bytes per parameter), plus its 1/N shard of
    the 18 bytes per parameter of ZeRO-2 without offload, of the 16-bit parameters only (2 bytes) with
    the optimizer offloaded, nothing more with the parameters offloaded too. The host figure is per node,
    times additional_buffer_factor: the node's 1/num_nodes share of what is offloaded (18 or 16 bytes per
    parameter), or without offload the fp32 copy each process loads (of the largest layer only under
    zero_init, whole otherwise; zero_init=False also makes the offloaded figures at least that copy).
    As in DeepSpeed, cpu_offload_params counts only together with cpu_offload.
    """
    gpus = num_nodes * gpus_per_node
    node_share = 1 / num_nodes
    gathered = 4 * largest_layer
    fp32_copies = total_params * 4 * gpus_per_node  # every process of the node loads the fp32 model
    if not cpu_offload:
        gpu = gathered + int(18 * total_params / gpus)
        cpu = (largest_layer * 4 * gpus_per_node if zero_init else fp32_copies) * additional_buffer_factor
        return DeepSpeedEstimate(int(gpu), int(cpu))
    offloaded = 18 if cpu_offload_params else 16  # bytes per parameter the host takes over
    gpu = gathered if cpu_offload_params else gathered + int(2 * total_params / gpus)
    per_param = offloaded * node_share if zero_init else max(4 * gpus_per_node, offloaded * node_share)
    return DeepSpeedEstimate(int(gpu), int(total_params * per_param * additional_buffer_factor))


def deepspeed_gap(stage: int, offload_optimizer: str = "none", offload_param: str = "none") -> str | None:
    """Why DeepSpeed's estimator has no figure for this stage and offload setting; None when it has one.

    Its ZeRO-2 estimate knows only optimizer offload to the CPU (DeepSpeed's stage 2 has no parameter
    offload, so offload_param does not enter it); its ZeRO-3 estimate CPU offload of the optimizer, with or
    without the parameters (its printed table has no parameter offload without optimizer offload).
    """
    if stage < 2:
        return "DeepSpeed has no estimator for ZeRO stages 0 and 1"
    devices = (str(offload_optimizer),) if stage == 2 else (str(offload_optimizer), str(offload_param))
    if "nvme" in devices:
        return "DeepSpeed's estimator has no NVMe offload"
    if stage == 3 and str(offload_param) != "none" and str(offload_optimizer) == "none":
        return "DeepSpeed's estimator has offload_param=cpu only with offload_optimizer=cpu"
    return None


def deepspeed_model_states(stage: int, total_params: int, largest_layer: int, gpus_per_node: int,
                           num_nodes: int, offload_optimizer: str = "none", offload_param: str = "none",
                           zero_init: bool = False, additional_buffer_factor: float = 1.5) -> DeepSpeedEstimate | None:
    """DeepSpeed's estimate for a recipe's stage and zero.offload_optimizer / offload_param (cpu_offload /
    cpu_offload_params), or None where DeepSpeed has none (`deepspeed_gap` says why).

    zero_init defaults to False: dsrecipes builds the whole model in every process, as DeepSpeed
    without deepspeed.zero.Init does.
    """
    if deepspeed_gap(stage, offload_optimizer, offload_param):
        return None
    cpu_offload = str(offload_optimizer) == "cpu"
    if stage == 2:
        return deepspeed_zero2_bytes(total_params, gpus_per_node, num_nodes, cpu_offload=cpu_offload,
                                     additional_buffer_factor=additional_buffer_factor)
    return deepspeed_zero3_bytes(total_params, largest_layer, gpus_per_node, num_nodes, cpu_offload=cpu_offload,
                                 cpu_offload_params=str(offload_param) == "cpu", zero_init=zero_init,
                                 additional_buffer_factor=additional_buffer_factor)


def _local_bytes(tensor: torch.Tensor) -> int:
    piece = local(tensor)
    return piece.numel() * piece.element_size()


def measure_model_states(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this rank actually holds: local parameter shards, their gradients, local optimizer state.

    Master weights held by the optimizer (when the module runs in bf16/fp16) count as parameters;
    optimizer tensors that are views of the module's parameters (ZeRO-2's fp32 shards) do not count twice.
    """
    module_params = {id(p): p for p in module.parameters()}
    module_storages = {local(p).untyped_storage().data_ptr() for p in module_params.values()}
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer keeps its shard's optimizer here
    optimizer_params = {id(p): p for g in optimizer.param_groups for p in g["params"]}
    params = sum(_local_bytes(p) for p in module_params.values())
    params += sum(_local_bytes(p) for k, p in optimizer_params.items()
                  if k not in module_params and local(p).untyped_storage().data_ptr() not in module_storages)
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
