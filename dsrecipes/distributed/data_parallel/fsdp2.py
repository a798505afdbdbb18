"""ZeRO stage 3 (and stage 2 where the replicated layout does not apply) on FSDP2 `fully_shard`.

* stage 3: parameters resharded after forward; stage 2: `reshard_after_forward=False` (used with
  tensor/sequence/expert parallelism, hybrid sharding or CPU offload);
* `zero.hybrid_shard_size`: a 2-D (dp_replicate, dp_shard) mesh: shard within groups, replicate
  across (HSDP);
* `zero.offload_optimizer/offload_param=cpu`: FSDP2's CPUOffloadPolicy (sharded parameters, their
  gradients and the optimizer step on the CPU);
* `=nvme` (ZeRO-Infinity): CPUOffloadPolicy too, and the optimizer states / parameter shards swapped
  to files under zero.nvme_path (dsrecipes.distributed.offload);
* mixed precision is FSDP2's MixedPrecisionPolicy: parameters all-gathered in bf16/fp16, gradients
  reduced in fp32, the sharded fp32 parameters being the master weights;
* ZeRO++ (quantized_collectives.py): qwZ / qgZ as FSDP2 custom all-gather / reduce-scatter on every
  unit, hpZ as reshard_after_forward=<zero.zero_hpz_partition_size>.

Every nn.ModuleList member (the transformer blocks; a Hugging Face model's decoder layers) is one FSDP unit, then
the root.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from dsrecipes.distributed.config import offloads, uses_nvme
from dsrecipes.distributed.data_parallel import quantized_collectives as zeropp
from dsrecipes.distributed.data_parallel.base import DataParallelStrategy, ModelStateBytes
from dsrecipes.models.decoder_layers import decoder_layers


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The units FSDP2 shards one by one: a Hugging Face model's decoder layers (its _no_split_modules classes),
    else the members of every nn.ModuleList (transformer blocks)."""
    layers = decoder_layers(model)
    if layers:
        return layers
    blocks = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList):
            blocks.extend(module)
    return blocks


class FSDP2Strategy(DataParallelStrategy):
    name = "fsdp2"
    description = "FSDP2 fully_shard: gradients and optimizer state sharded (parameters too at zero.stage=3)"
    needs_own_optimizer = True

    @property
    def keeps_module_masters(self) -> bool:
        return False  # the sharded fp32 parameters are the masters

    nvme = None  # dsrecipes.distributed.offload.nvme.NVMeOffload with zero.offload_* = nvme

    @property
    def offload(self) -> bool:
        return offloads(self.zero)

    @property
    def wraps_meta_parameters(self) -> bool:
        return not uses_nvme(self.zero)  # NVMe offload writes the shards to its swap files as it wraps

    @property
    def parameter_device(self) -> torch.device:
        return torch.device("cpu") if self.offload else self.device

    def wrap(self, model: nn.Module, ignored_params: set[nn.Parameter] | None = None) -> nn.Module:
        precision = self.precision
        param_dtype = precision.compute_dtype if precision.compute_dtype != torch.float32 else None
        kwargs = dict(
            mesh=self.dims.get_mesh("fsdp"),
            reshard_after_forward=zeropp.reshard_after_forward(self.zero),
            mp_policy=MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32),
            offload_policy=CPUOffloadPolicy(pin_memory=self.device.type == "cuda") if self.offload else OffloadPolicy(),
            ignored_params=ignored_params or None,
        )
        node_groups = self.dims.shard_node_groups() if self.zero.zero_quantized_gradients else None  # qgZ 2-hop
        for unit in self._units(model):
            fully_shard(unit, **kwargs)
            zeropp.install(unit, self.zero, node_groups)
        if uses_nvme(self.zero):
            from dsrecipes.distributed.offload.nvme import NVMeOffload

            rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
            self.nvme = NVMeOffload(self.zero, rank, pin_memory=self.zero.pin_memory and self.device.type == "cuda")
            self.nvme.attach_model(model)
        self.unwrapped = self.module = model
        return model

    def _units(self, model: nn.Module) -> list[nn.Module]:
        """The FSDP units, blocks first, roots last. Under pipeline parallelism the roots are the stage modules
        the schedule runs (torch.distributed.pipelining defers their gradient reduce-scatter to the last
        micro-batch, torchtitan's PP + FSDP layout); `model`, the rank's view over all its stages that the
        optimizer and checkpoints read, shares their submodules and so their sharded parameters."""
        pipeline = self.layout.pipeline
        if pipeline is None:
            return [*repeated_blocks(model), model]
        stages = pipeline.stage_modules
        return [*(block for stage in stages for block in stage.blocks.values()), *stages]

    def adopt_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        if self.nvme is not None:
            optimizer = self.nvme.wrap_optimizer(optimizer)
        return super().adopt_optimizer(optimizer)

    def states_in_memory(self, writes: bool):
        if self.nvme is None:
            return super().states_in_memory(writes)
        return self.nvme.in_memory(writes)

    def full_state_dict(self) -> dict:
        if self.nvme is None:
            return super().full_state_dict()
        with self.states_in_memory(writes=False):  # at one rank the values are views of the swapped shards
            return {name: value.clone() for name, value in super().full_state_dict().items()}

    def close(self) -> None:
        if self.nvme is not None:
            self.nvme.close()

    def offload_metrics(self) -> dict[str, float]:
        return self.nvme.metrics() if self.nvme is not None else {}

    def load_full_state(self, model_state: dict, optimizer_state_loader) -> None:
        if optimizer_state_loader is not None:
            raise ValueError("this checkpoint holds full-state (ZeRO-1 / master-weight) optimizer state, which "
                             f"zero.stage={self.zero.stage} cannot take; resume it with the zero.stage and precision "
                             "that wrote it")
        super().load_full_state(model_state, None)

    def describe(self) -> str:
        what = "parameters, gradients and optimizer state sharded"
        if self.zero.stage == 2:
            what = "gradients and optimizer state sharded, parameters kept unsharded between forward and backward"
        layout = (f"hybrid: shard over {self.dims.dp_shard * self.dims.sp}, replicate over {self.dims.dp_replicate}"
                  if self.dims.dp_replicate > 1 else f"over {self.dims.dp_shard * self.dims.sp} ranks")
        offload = ", CPU offload" if self.offload else ""
        if self.nvme is not None:
            offload = f", CPU offload, {self.nvme.describe()}"
        zeropp_clause = zeropp.describe(self.zero, self.dims.dp_shard * self.dims.sp, self.dims.shard_node_split())
        return f"FSDP2 (zero.stage={self.zero.stage}): {what} ({layout}){offload}{zeropp_clause}"

    @classmethod
    def shard_ranks(cls, dims) -> int:
        return dims.dp_shard * dims.sp  # FSDP2's shard axis; replicated over dp_replicate (HSDP)

    @classmethod
    def model_state_bytes(cls, num_params, world, model_bytes, state_bytes, master_weights,
                          hpz_partition_size: int = 1, param_bytes: int = 4) -> ModelStateBytes:
        """hpz_partition_size > 1 (hpZ) adds the secondary partition held between forward and backward:
        num_params / hpz_partition_size per rank in the all-gather dtype (param_bytes: 2 for bf16/fp16)."""
        secondary = param_bytes * num_params / hpz_partition_size if hpz_partition_size > 1 else 0
        return ModelStateBytes(4 * num_params / world + secondary, 4 * num_params / world,
                               state_bytes * num_params / world)
