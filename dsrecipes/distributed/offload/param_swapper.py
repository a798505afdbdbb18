"""ZeRO-Infinity's parameter offload to NVMe under FSDP2: parameter shards live in a swap file and are in
host memory only around their use.

FSDP2 keeps each parameter's (padded) shard in one flat tensor per parameter (`FSDPParam.
_sharded_param_data`; the DTensor parameter and, at world size 1, the unsharded parameter are views
of its storage). This swapper frees that storage (resize to 0 bytes: every view stays valid) when
FSDP2 reshards a unit after its forward or backward, and refills it from the swap file before the
unit's next all-gather, which FSDP2 issues from `FSDPParamGroup.unshard` (in forward, in backward
and for its own prefetches): the two methods are wrapped on each unit's parameter group. While a unit
is being gathered, the next unit's shards are read in the background (forward: the next block;
backward: the previous one), so reads overlap compute. The optimizer step (optimizer_swapper.py)
brings each shard in for its update and writes it back.

Reads and writes go through a pool of buffer_count aligned host buffers of buffer_size elements
(DeepSpeed's offload_param.buffer_count / buffer_size): the file is opened with O_DIRECT, whose
transfers must start at aligned addresses, which the shards' own storage need not be. Host memory
for parameters is then the pool plus the shards of the units being computed (and prefetched),
instead of every shard of the model.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable

import torch
from torch import nn

from dsrecipes.distributed.offload.aio import ALIGNMENT, AsyncIO, Request, align_up, aligned_buffer
from dsrecipes.distributed.offload.swap_file import SwapFile


def fsdp_param_groups(model: nn.Module) -> list:
    """FSDP2's parameter groups (one per fully_shard unit that owns parameters), in module order."""
    groups = []
    for module in model.modules():
        get_state = getattr(module, "_get_fsdp_state", None)
        if get_state is None:
            continue
        group = get_state()._fsdp_param_group
        if group is not None:
            groups.append(group)
    return groups


class _Entry:
    """One FSDPParam's place in the swap file and its state."""

    __slots__ = ("fsdp_param", "offset", "nbytes", "resident", "dirty", "reading")

    def __init__(self, fsdp_param, offset: int):
        self.fsdp_param = fsdp_param
        self.offset = offset
        data = fsdp_param._sharded_param_data
        self.nbytes = data.numel() * data.element_size()
        self.resident = True  # the shard starts in memory (FSDP2's lazy init reads it at the first forward)
        self.dirty = True  # the file does not hold it yet
        self.reading: tuple[Request, torch.Tensor] | None = None  # read in flight into this pool buffer

    @property
    def data(self) -> torch.Tensor:
        return self.fsdp_param._sharded_param_data


class ParameterSwapper:
    """Swaps the parameter shards of a fully_shard-ed model to one file in `directory`."""

    def __init__(self, model: nn.Module, aio: AsyncIO, directory: str, buffer_count: int, buffer_size: int,
                 pin_memory: bool = False):
        self.aio = aio
        self.groups = fsdp_param_groups(model)
        self.entries: dict[int, _Entry] = {}  # id(FSDPParam) -> entry
        self._by_param: dict[int, _Entry] = {}  # id(sharded DTensor parameter) -> entry
        offset = 0
        largest = 0
        for group in self.groups:
            for fsdp_param in group.fsdp_params:
                entry = _Entry(fsdp_param, offset)
                if entry.data.numel() > buffer_size:
                    raise ValueError(f"the parameter shard {fsdp_param._param_fqn or ''} has {entry.data.numel()} "
                                     f"elements, more than zero.buffer_size={buffer_size}; raise zero.buffer_size")
                self.entries[id(fsdp_param)] = entry
                self._by_param[id(fsdp_param.sharded_param)] = entry
                offset += align_up(max(entry.nbytes, 1), ALIGNMENT)
                largest = max(largest, entry.nbytes)
        self.file = SwapFile(directory, "params.swp", offset)
        self._free = [aligned_buffer(largest, pin_memory) for _ in range(buffer_count)]
        self._pool_bytes = sum(b.numel() for b in self._free)
        self._writes: deque[tuple[Request, torch.Tensor]] = deque()
        self._order = {id(group): i for i, group in enumerate(self.groups)}
        for group in self.groups:
            self._wrap(group)

    # ------------------------------------------------------------------ FSDP2 hooks
    def _wrap(self, group) -> None:
        unshard, reshard = group.unshard, group.reshard

        def swapped_unshard(async_op: bool = False):
            self.acquire_group(group)
            unshard(async_op)
            self._prefetch_neighbour(group)

        def swapped_reshard():
            reshard()
            self.release_fsdp_params(group.fsdp_params, dirty=False)

        group.unshard, group.reshard = swapped_unshard, swapped_reshard

    def _prefetch_neighbour(self, group) -> None:
        from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

        if not self.aio.overlap:
            return
        step = -1 if group._training_state == TrainingState.PRE_BACKWARD else 1
        index = self._order[id(group)] + step
        if 0 <= index < len(self.groups):
            for fsdp_param in self.groups[index].fsdp_params:
                self._start_read(self.entries[id(fsdp_param)], wait_for_buffer=False)

    def acquire_group(self, group) -> None:
        self._acquire([self.entries[id(fp)] for fp in group.fsdp_params])

    # ------------------------------------------------------------------ for the optimizer step
    def acquire(self, params: list[torch.Tensor]) -> None:
        """Bring the shards of these (sharded DTensor) parameters into memory, waiting for them."""
        self._acquire([self._by_param[id(p)] for p in params if id(p) in self._by_param])

    def prefetch(self, params: list[torch.Tensor]) -> None:
        for p in params:
            entry = self._by_param.get(id(p))
            if entry is not None:
                self._start_read(entry, wait_for_buffer=False)

    def release(self, params: list[torch.Tensor], dirty: bool) -> None:
        self._release([self._by_param[id(p)] for p in params if id(p) in self._by_param], dirty)

    def release_fsdp_params(self, fsdp_params, dirty: bool) -> None:
        self._release([self.entries[id(fp)] for fp in fsdp_params], dirty)

    # ------------------------------------------------------------------ residency
    def _acquire(self, entries: list[_Entry]) -> None:
        for entry in entries:
            self._start_read(entry, wait_for_buffer=True)
        for entry in entries:
            self._finish_read(entry)

    def _start_read(self, entry: _Entry, wait_for_buffer: bool) -> None:
        if entry.resident or entry.reading is not None or entry.nbytes == 0:
            return
        buffer = self._take_buffer(wait_for_buffer)
        if buffer is None:
            return  # a prefetch with no buffer free: the unshard will read it
        region = buffer[:align_up(entry.nbytes)]
        entry.reading = (self.aio.read(self.file.fd, region, entry.offset), buffer)

    def _finish_read(self, entry: _Entry) -> None:
        if entry.resident:
            return
        if entry.nbytes == 0:
            entry.data.untyped_storage().resize_(0)
            entry.resident = True
            return
        if entry.reading is None:
            self._start_read(entry, wait_for_buffer=True)
        request, buffer = entry.reading
        request.wait()
        entry.reading = None
        entry.data.untyped_storage().resize_(entry.nbytes)
        entry.data.copy_(buffer[:entry.nbytes].view(entry.data.dtype))
        self._free.append(buffer)
        entry.resident = True

    def _release(self, entries: list[_Entry], dirty: bool) -> None:
        for entry in entries:
            if not entry.resident:
                continue
            if (dirty or entry.dirty) and entry.nbytes:
                buffer = self._take_buffer(wait=True)
                buffer[:entry.nbytes].view(entry.data.dtype).copy_(entry.data)
                request = self.aio.write(self.file.fd, buffer[:align_up(entry.nbytes)], entry.offset)
                self._writes.append((request, buffer))
                if not self.aio.overlap:
                    self._retire_writes(all_of_them=True)
            entry.dirty = False
            entry.data.untyped_storage().resize_(0)
            entry.resident = False

    def _take_buffer(self, wait: bool) -> torch.Tensor | None:
        self._retire_writes(all_of_them=False)
        while not self._free and wait:
            if self._writes:
                request, buffer = self._writes.popleft()
                request.wait()
                self._free.append(buffer)
            else:  # every buffer holds a prefetch in flight: finish the oldest one
                pending = [e for e in self.entries.values() if e.reading is not None]
                if not pending:
                    raise RuntimeError("NVMe parameter swapper: no pool buffer can be freed")
                self._finish_read(pending[0])
        return self._free.pop() if self._free else None

    def _retire_writes(self, all_of_them: bool) -> None:
        while self._writes and (all_of_them or self._writes[0][0].done()):
            request, buffer = self._writes.popleft()
            request.wait()
            self._free.append(buffer)

    # ------------------------------------------------------------------ checkpoints, teardown
    @contextlib.contextmanager
    def resident(self, dirty: Callable[[], bool]):
        """Every shard in memory for the duration (a checkpoint save or load, a full state dict); released
        afterwards, written back if dirty() says so then (a load changed them)."""
        entries = list(self.entries.values())
        self._acquire(entries)
        try:
            yield
        finally:
            self._release(entries, dirty())
            self._retire_writes(all_of_them=True)

    def resident_bytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values() if e.resident)

    def pool_bytes(self) -> int:
        return self._pool_bytes

    def close(self) -> None:
        for entry in self.entries.values():
            if entry.reading is not None:
                entry.reading[0].wait()
        self._retire_writes(all_of_them=True)
        self.file.close()
