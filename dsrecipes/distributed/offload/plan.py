"""Per-rank bytes of a ZeRO-3 run with CPU / NVMe offload, on the device, in host memory and on NVMe, from
the parameter shapes alone: the memory estimator's model of ZeRO-Infinity and the start-up checks
(buffer_size against the largest shard, free space on zero.nvme_path) that run before any worker.

It follows what the swappers allocate, not a formula of DeepSpeed's: FSDP2 shards dim 0 of every
parameter into ceil(d0 / N)-row chunks (rank 0 holds the largest; the padded chunk is what the
parameter swap file stores), the optimizer packs shards into swap units of at most buffer_size
elements (each shard padded to 16 elements, each unit region to 4096 bytes, one region per state
tensor), and the pools are buffer_count // k units of k buffers (optimizer) and param_buffer_count
buffers of the largest padded shard (parameters). At rest with any offload, FSDP2 keeps the fp32
gradient shards and (unless they are on NVMe) the parameter shards in host memory, and the device
holds no model states (only the transient unsharded blocks, which are not model states).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ALIGNMENT = 4096  # bytes: O_DIRECT's alignment of buffers, file offsets and lengths
UNIT_PAD = 16  # elements each parameter's slice of a unit is padded to


def align_up(nbytes: int, alignment: int = ALIGNMENT) -> int:
    """nbytes rounded up to a multiple of `alignment`."""
    return -(-nbytes // alignment) * alignment


def _align(nbytes: int) -> int:
    return align_up(max(nbytes, 1))


def pack_units(numels: list[int], buffer_size: int) -> list[list[tuple[int, int]]]:
    """Swap units: lists of (index into numels, element offset in the unit), in order, each at most
    buffer_size padded elements. Raises ValueError for a single numel larger than buffer_size."""
    units: list[list[tuple[int, int]]] = [[]]
    used = 0
    for i, numel in enumerate(numels):
        size = -(-numel // UNIT_PAD) * UNIT_PAD
        if size > buffer_size:
            raise ValueError(f"a parameter shard of {numel} elements is larger than the NVMe offload buffer "
                             f"(zero.buffer_size={buffer_size}); raise zero.buffer_size to at least {size}")
        if used + size > buffer_size:
            units.append([])
            used = 0
        units[-1].append((i, used))
        used += size
    return [u for u in units if u]


def unit_numel(unit: list[tuple[int, int]], numels: list[int]) -> int:
    last, start = unit[-1]
    return start + -(-numels[last] // UNIT_PAD) * UNIT_PAD


def shard_numels(shapes: list[tuple[int, ...]], world: int) -> tuple[list[int], list[int]]:
    """(rank 0's local numel, the padded shard numel) of every parameter under FSDP2's dim-0 sharding."""
    local, padded = [], []
    for shape in shapes:
        if not shape:
            local.append(1)
            padded.append(1)
            continue
        rows = math.ceil(shape[0] / world)
        rest = math.prod(shape[1:])
        local.append(min(rows, shape[0]) * rest)
        padded.append(rows * rest)
    return local, padded


@dataclass(frozen=True)
class OffloadPlan:
    """Per-rank bytes (rank 0, which holds the largest shards) of a ZeRO-3 run with offload."""

    device: int  # model states resident on the accelerator at rest
    host: int  # model states and swap pools in host memory at rest
    nvme: int  # swap files
    optimizer_file: int
    param_file: int
    optimizer_pool: int
    param_pool: int
    largest_shard: int  # elements

    def describe(self) -> str:
        gib = 2 ** 30
        return (f"per rank: device {self.device / gib:.3f} GiB, host {self.host / gib:.3f} GiB, "
                f"NVMe {self.nvme / gib:.3f} GiB (optimizer pool {self.optimizer_pool / 2**20:.1f} MiB, "
                f"parameter pool {self.param_pool / 2**20:.1f} MiB)")


def plan_offload(shapes: list[tuple[int, ...]], world: int, state_tensors: int, offload_optimizer: str,
                 offload_param: str, buffer_count: int = 4, param_buffer_count: int = 5,
                 buffer_size: int = 100_000_000, element_bytes: int = 4) -> OffloadPlan:
    """The bytes of `shapes` (the model's parameters, in optimizer order) over `world` FSDP2 ranks.

    state_tensors: optimizer state tensors per parameter (Adam 2, Lion / Adagrad / SGD momentum 1).
    offload_optimizer / offload_param: none | cpu | nvme.
    """
    local, padded = shard_numels(shapes, world)
    shards = sum(local)
    offloaded = "cpu" in (offload_optimizer, offload_param) or "nvme" in (offload_optimizer, offload_param)
    largest = max(padded, default=0)
    optimizer_file = optimizer_pool = param_file = param_pool = 0
    if offload_optimizer == "nvme" and state_tensors:
        units = pack_units(local, buffer_size)
        regions = [_align(unit_numel(u, local) * element_bytes) for u in units]
        optimizer_file = _align(state_tensors * sum(regions))
        slots = max(1, buffer_count // state_tensors)
        optimizer_pool = slots * state_tensors * max(regions)
    if offload_param == "nvme":
        pack_units(padded, buffer_size)  # the same size check as the swapper's
        param_file = _align(sum(_align(n * element_bytes) for n in padded))
        param_pool = param_buffer_count * _align(largest * element_bytes)
    states = state_tensors * element_bytes * shards
    params = element_bytes * shards
    grads = element_bytes * shards
    if not offloaded:
        return OffloadPlan(params + grads + states, 0, 0, 0, 0, 0, 0, largest)
    host = grads + (0 if offload_param == "nvme" else params) + (0 if offload_optimizer == "nvme" else states)
    host += optimizer_pool + param_pool
    return OffloadPlan(0, host, optimizer_file + param_file, optimizer_file, param_file, optimizer_pool,
                       param_pool, largest)
