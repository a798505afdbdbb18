"""The one parallel-layout object: validates degrees against the world size and builds every DeviceMesh.

world = pp x dp x sp x tp, tensor parallelism innermost (consecutive ranks form a TP group, so its
collectives stay inside a node), then sequence parallelism, then data parallelism (split into
dp_replicate x dp_shard by the ZeRO stage and zero.hybrid_shard_size). Expert parallelism builds
its own (edp, ep) view of the world in dsrecipes.distributed.expert_parallel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


@dataclass(frozen=True)
class ParallelDims:
    world_size: int
    dp_replicate: int
    dp_shard: int
    tp: int = 1
    sp: int = 1
    pp: int = 1

    @classmethod
    def from_zero(
        cls, world_size: int, zero_stage: int, hybrid_shard_size: int = 0, tp: int = 1, sp: int = 1, pp: int = 1
    ) -> "ParallelDims":
        """dp = world / (tp*sp*pp); stage 0-1 replicate across dp, stage 2-3 shard (within hybrid_shard_size groups if set)."""
        if world_size < 1:
            raise ValueError(f"world size must be >= 1, got {world_size}")
        for key, value in (("tp", tp), ("sp", sp), ("pp", pp)):
            if value < 1:
                raise ValueError(f"parallel.{key}={value} must be >= 1")
        model_parallel = tp * sp * pp
        if world_size % model_parallel:
            raise ValueError(
                f"parallel.tp={tp} x parallel.sp={sp} x parallel.pp={pp} = {model_parallel} does not divide the "
                f"world size {world_size}; the product must be one of: {_divisors(world_size)}"
            )
        dp = world_size // model_parallel
        if zero_stage < 2:
            return cls(world_size, dp, 1, tp, sp, pp)
        shard = hybrid_shard_size or dp
        if dp % shard:
            what = "world size" if dp == world_size else "data-parallel size"
            raise ValueError(
                f"zero.hybrid_shard_size={hybrid_shard_size} does not divide the {what} {dp}; valid sizes: {_divisors(dp)}"
            )
        return cls(world_size, dp // shard, shard, tp, sp, pp)

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def model_parallel(self) -> bool:
        return self.tp * self.sp * self.pp > 1

    def dp_rank(self, rank: int) -> int:
        """This global rank's index along the data-parallel axis (which data shard it reads)."""
        return (rank % (self.world_size // self.pp)) // (self.sp * self.tp)

    def build_mesh(self, device_type: str) -> DeviceMesh:
        """("dp_replicate", "dp_shard") over all ranks; with model parallelism also "sp" and "tp" (and "pp" first)."""
        if not self.model_parallel:
            return init_device_mesh(
                device_type, (self.dp_replicate, self.dp_shard), mesh_dim_names=("dp_replicate", "dp_shard")
            )
        return init_device_mesh(
            device_type,
            (self.pp, self.dp_replicate, self.dp_shard, self.sp, self.tp),
            mesh_dim_names=("pp", "dp_replicate", "dp_shard", "sp", "tp"),
        )


def device_type_of(device: torch.device) -> str:
    return "cuda" if device.type == "cuda" else "cpu"
