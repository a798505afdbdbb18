"""ZeRO stages on PyTorch-native machinery: which wrapper each stage gets and how it is applied.

| stage | mechanism                                                              |
|-------|------------------------------------------------------------------------|
| 0     | DistributedDataParallel (gradients all-reduced at the accumulation boundary) |
| 1     | DDP + torch's ZeroRedundancyOptimizer (each rank steps its shard of the optimizer state, then broadcasts its parameters as one flat bucket) |
| 2     | zero2.ZeroStage2: replicated parameters, gradients reduce-scattered into per-rank shards, the optimizer steps the shards, one all-gather after the step (DeepSpeed's layout); with tp/sp/ep, hybrid sharding or offload: FSDP2 fully_shard(reshard_after_forward=False) |
| 3     | FSDP2 fully_shard (parameters resharded after forward)                 |
| offload=cpu | FSDP2 CPUOffloadPolicy                                            |
| hybrid_shard_size | 2-D mesh: FSDP2 shards within groups, replicates across (HSDP) |

Mixed precision under FSDP2 is its MixedPrecisionPolicy: parameters all-gathered in bf16/fp16,
gradients reduced in fp32, the sharded fp32 parameters being the master weights.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

from dsrecipes.distributed.config import ZeroConfig
from dsrecipes.distributed.parallel_dims import ParallelDims, device_type_of

_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def uses_fsdp(zero: ZeroConfig, dp_size: int) -> bool:
    """FSDP2 shards the parameters: ZeRO-2/3 with more than one data-parallel rank (except plain
    data-parallel ZeRO-2, which build_engine gives to zero2.ZeroStage2 instead)."""
    return dp_size > 1 and zero.stage >= 2


def _repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The members of every nn.ModuleList (transformer blocks): the units FSDP2 shards one by one."""
    blocks = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList):
            blocks.extend(module)
    return blocks


def shard_model(
    model: nn.Module,
    zero: ZeroConfig,
    dims: ParallelDims,
    device: torch.device,
    dtype: str,
    ignored_params: set[nn.Parameter] | None = None,
    mesh: DeviceMesh | None = None,
) -> nn.Module:
    """Wrap `model` for its ZeRO stage (the model must already be on `device`).

    ignored_params (expert-parallel MoE experts) stay outside DDP / FSDP2: they differ across ranks
    and the engine reduces their gradients over the expert-data-parallel group itself.
    """
    if dims.dp == 1:  # nothing to replicate or shard over (model-parallel axes are applied elsewhere)
        return model
    if zero.stage < 2:
        device_ids = [device.index] if device.type == "cuda" else None
        if ignored_params:
            names = [name for name, p in model.named_parameters() if p in ignored_params]
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)
        return DistributedDataParallel(model, device_ids=device_ids)
    mesh = mesh if mesh is not None else dims.build_mesh(device_type_of(device))
    if dims.dp_replicate > 1:  # HSDP: replicate across groups, shard within
        fsdp_mesh = mesh["dp_replicate", "dp_shard"] if dims.model_parallel else mesh
    else:
        fsdp_mesh = mesh["dp_shard"]
    offload = zero.offload_param == "cpu" or zero.offload_optimizer == "cpu"
    kwargs = dict(
        mesh=fsdp_mesh,
        reshard_after_forward=zero.stage == 3,
        mp_policy=MixedPrecisionPolicy(param_dtype=_DTYPES[dtype], reduce_dtype=torch.float32),
        offload_policy=CPUOffloadPolicy(pin_memory=device.type == "cuda") if offload else OffloadPolicy(),
        ignored_params=ignored_params or None,
    )
    for block in _repeated_blocks(model):
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return model


def shard_optimizer(optimizer: torch.optim.Optimizer, zero: ZeroConfig, world_size: int) -> torch.optim.Optimizer:
    """Stage 1: rebuild the optimizer as a ZeroRedundancyOptimizer of the same class, groups and defaults."""
    if world_size == 1 or zero.stage != 1:
        return optimizer
    groups = optimizer.param_groups
    accepted = inspect.signature(type(optimizer).__init__).parameters
    first = {k: v for k, v in {**optimizer.defaults, **groups[0]}.items() if k in accepted and k != "params"}
    # bucket views: each rank's parameters live in one flat buffer, so the post-step parameter sync is
    # one broadcast per rank instead of one per parameter (measured 34-37 -> 11-14 ms per step for
    # gpt_tiny at world size 2 on CPU)
    sharded = ZeroRedundancyOptimizer(groups[0]["params"], optimizer_class=type(optimizer),
                                      parameters_as_bucket_view=True, **first)
    for group in groups[1:]:
        sharded.add_param_group(dict(group))
    return sharded


def unwrap(module: nn.Module) -> nn.Module:
    """The user's module inside a DDP wrapper (FSDP2 modifies the module in place)."""
    return module.module if isinstance(module, DistributedDataParallel) else module
