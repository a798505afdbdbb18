"""The one parallel-layout object: validates degrees against the world size and builds every DeviceMesh.

Data parallelism now (dp_replicate x dp_shard = world size); tensor / pipeline / sequence / expert
axes join here, so no other module builds a mesh of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


@dataclass(frozen=True)
class ParallelDims:
    world_size: int
    dp_replicate: int
    dp_shard: int

    @classmethod
    def from_zero(cls, world_size: int, zero_stage: int, hybrid_shard_size: int = 0) -> "ParallelDims":
        """Stage 0-1 replicate across all ranks; stage 2-3 shard (within hybrid_shard_size groups if set)."""
        if world_size < 1:
            raise ValueError(f"world size must be >= 1, got {world_size}")
        if zero_stage < 2:
            return cls(world_size, world_size, 1)
        shard = hybrid_shard_size or world_size
        if world_size % shard:
            raise ValueError(
                f"zero.hybrid_shard_size={hybrid_shard_size} does not divide the world size {world_size}; "
                f"valid sizes: {', '.join(str(d) for d in range(1, world_size + 1) if world_size % d == 0)}"
            )
        return cls(world_size, world_size // shard, shard)

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    def build_mesh(self, device_type: str) -> DeviceMesh:
        """A 2-D ("dp_replicate", "dp_shard") mesh over all ranks."""
        return init_device_mesh(
            device_type, (self.dp_replicate, self.dp_shard), mesh_dim_names=("dp_replicate", "dp_shard")
        )


def device_type_of(device: torch.device) -> str:
    return "cuda" if device.type == "cuda" else "cpu"
