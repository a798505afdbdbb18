"""ZeRO-Infinity's optimizer offload to NVMe: per-parameter optimizer state lives in a swap file and is
streamed through a fixed pool of host buffers, one swap unit at a time.

What is swapped: every tensor of a parameter's optimizer state with the parameter's shape (Adam's
exp_avg and exp_avg_sq, amsgrad's max_exp_avg_sq, a momentum buffer, Adagrad's sum); the `step`
counters and other scalars stay in memory (bytes). Under FSDP2 the sharded fp32 parameter is the
master weight: it stays in host memory with zero.offload_optimizer=nvme, and is swapped too (by
param_swapper.py) with zero.offload_param=nvme.

How a step runs. The parameters are packed, in optimizer order, into swap units of at most
buffer_size elements (a parameter shard larger than that is refused at start-up). A unit's k state
tensors (k = 2 for Adam) occupy k of the pool's buffer_count buffers, so buffer_count // k units are
in flight: while one unit's states are stepped by the configured optimizer itself (its own `step`,
on that unit's parameters only: every supported optimizer updates each parameter independently, so
the result is bitwise the one of a whole-model step), the next unit's states are being read and the
previous one's written. Host memory for optimizer state is therefore buffer_count x buffer_size
elements, whatever the model's size.

The first step creates the states (the optimizer allocates them for one unit at a time); the swap
file is created then, at its final size. Checkpoints see ordinary optimizer state: `resident()`
brings every state back into memory for a save or load and streams it out again afterwards, so a
checkpoint written with NVMe offload resumes with CPU offload and the other way round.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.distributed.tensor import DTensor

from dsrecipes.distributed.offload.aio import ALIGNMENT, AsyncIO, Request, aligned_buffer
from dsrecipes.distributed.offload.plan import pack_units, unit_numel
from dsrecipes.distributed.offload.swap_file import SwapFile


def release_free_memory() -> None:
    """Hand freed heap pages back to the OS (glibc's malloc_trim; a no-op elsewhere).

    A unit's first-step states are allocated by the optimizer and freed once written; glibc keeps freed
    multi-MiB chunks in its heap (its mmap threshold grows after the first frees), and small allocations
    made in between fragment it, so without this the resident set would grow by a unit per unit over the
    first step, i.e. with the model, although nothing is held.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def local(tensor: torch.Tensor) -> torch.Tensor:
    """The rank-local tensor of a DTensor (FSDP2 shard), the tensor itself otherwise."""
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


def _like(param: torch.Tensor, local_view: torch.Tensor) -> torch.Tensor:
    """local_view as the parameter's kind of tensor (a DTensor with the parameter's layout under FSDP2)."""
    if isinstance(param, DTensor):
        return DTensor.from_local(local_view, param.device_mesh, param.placements, run_check=False,
                                  shape=param.shape, stride=param.stride())
    return local_view


@dataclass
class SwapUnit:
    """Consecutive parameters whose states are read and written together (one region per state kind)."""

    params: list[torch.Tensor] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)  # element offset of each parameter in the unit's region
    numel: int = 0  # elements of one state kind's region (padded)
    index: int = 0


def plan_units(params: list[torch.Tensor], buffer_size: int) -> list[SwapUnit]:
    """Pack `params` in order into units of at most buffer_size (padded) elements each (plan.pack_units)."""
    numels = [local(p).numel() for p in params]
    return [SwapUnit([params[i] for i, _ in unit], [start for _, start in unit], unit_numel(unit, numels), index)
            for index, unit in enumerate(pack_units(numels, buffer_size))]


class NVMeOptimizer(torch.optim.Optimizer):
    """Wraps a torch optimizer (its param_groups and state are shared, so LR schedules and checkpoints see
    it unchanged) and swaps its per-parameter state to `directory` between steps."""

    def __init__(self, inner: torch.optim.Optimizer, aio: AsyncIO, directory: str, buffer_count: int,
                 buffer_size: int, pin_memory: bool = False, param_swapper=None, swap_states: bool = True):
        torch.optim.Optimizer.__init__(self, [{"params": []}], dict(inner.defaults))
        self.inner = inner
        self.param_groups = inner.param_groups
        self.state = inner.state
        self.defaults = inner.defaults
        self.aio = aio
        self.directory = directory
        self.buffer_count = buffer_count
        self.pin_memory = pin_memory
        self.param_swapper = param_swapper  # param_swapper.ParameterSwapper with zero.offload_param=nvme
        params = [p for group in inner.param_groups for p in group["params"]]
        self.units = plan_units(params, buffer_size)
        self._group_of = {id(p): i for i, group in enumerate(inner.param_groups) for p in group["params"]}
        self.kinds: list[tuple[str, torch.dtype]] = []  # swapped state keys (and dtypes), learnt at the first step
        self.file: SwapFile | None = None
        self._unit_offset: list[int] = []  # byte offset of each unit's first region in the file
        self._buffers: list[torch.Tensor] = []
        self._writes: dict[int, list[Request]] = {}  # slot -> writes still reading its buffers
        self._stepped: set[int] = set()  # ids of parameters whose state exists (in the file)
        self._resident = False
        self._learnt = not swap_states  # swap_states=False: only the parameter shards move (offload_param=nvme)

    # ------------------------------------------------------------------ geometry
    @property
    def slots(self) -> int:
        """Units in flight at once (each holds one buffer per state kind)."""
        return max(1, self.buffer_count // max(1, len(self.kinds)))

    def pool_bytes(self) -> int:
        return sum(b.numel() for b in self._buffers)

    def file_bytes(self) -> int:
        return self.file.nbytes if self.file is not None else 0

    def _region_bytes(self, unit: SwapUnit) -> int:
        element = max(dtype.itemsize for _, dtype in self.kinds)
        return -(-unit.numel * element // ALIGNMENT) * ALIGNMENT

    def _learn_kinds(self, unit: SwapUnit) -> None:
        """The swapped state keys, from the first parameter with state; then the file and the pool."""
        param = next((p for p in unit.params if self.state.get(p)), None)
        if param is None:
            return
        self._learnt = True
        state = self.state[param]
        self.kinds = [(key, value.dtype) for key, value in state.items() if self._swappable(param, key, value)]
        if not self.kinds:
            return  # nothing per-element to swap (plain SGD)
        if len(self.kinds) > self.buffer_count:
            raise ValueError(f"the optimizer keeps {len(self.kinds)} state tensors per parameter "
                             f"({', '.join(k for k, _ in self.kinds)}) but zero.buffer_count={self.buffer_count}; "
                             f"set zero.buffer_count >= {2 * len(self.kinds)} (two units in flight)")
        offsets, total = [], 0
        for unit in self.units:
            offsets.append(total)
            total += len(self.kinds) * self._region_bytes(unit)
        self._unit_offset = offsets
        self.file = SwapFile(self.directory, "optimizer.swp", total)
        largest = max(self._region_bytes(u) for u in self.units)
        self._buffers = [aligned_buffer(largest, self.pin_memory) for _ in range(self.slots * len(self.kinds))]

    @staticmethod
    def _swappable(param: torch.Tensor, key: str, value) -> bool:
        return key != "step" and isinstance(value, torch.Tensor) and value.shape == param.shape

    def _views(self, unit: SwapUnit, slot: int) -> list[list[torch.Tensor]]:
        """views[kind][i]: parameter i's slice of the slot's buffer for that state kind (local shape)."""
        views = []
        for k, (_, dtype) in enumerate(self.kinds):
            flat = self._buffers[slot * len(self.kinds) + k].view(dtype)
            views.append([flat[s:s + local(p).numel()].view(local(p).shape) for p, s in zip(unit.params, unit.starts)])
        return views

    # ------------------------------------------------------------------ I/O
    def _free_slot(self, slot: int) -> None:
        for request in self._writes.pop(slot, []):
            request.wait()

    def _read(self, unit: SwapUnit, slot: int) -> list[Request]:
        self._free_slot(slot)
        region = self._region_bytes(unit)
        requests = []
        for k in range(len(self.kinds)):
            buffer = self._buffers[slot * len(self.kinds) + k][:region]
            requests.append(self.aio.read(self.file.fd, buffer, self._unit_offset[unit.index] + k * region))
        if not self.aio.overlap:
            for r in requests:
                r.wait()
        return requests

    def _write(self, unit: SwapUnit, slot: int) -> None:
        region = self._region_bytes(unit)
        requests = []
        for k in range(len(self.kinds)):
            buffer = self._buffers[slot * len(self.kinds) + k][:region]
            requests.append(self.aio.write(self.file.fd, buffer, self._unit_offset[unit.index] + k * region))
        self._writes.setdefault(slot, []).extend(requests)
        if not self.aio.overlap:
            self._free_slot(slot)

    def _drain(self) -> None:
        for slot in list(self._writes):
            self._free_slot(slot)

    # ------------------------------------------------------------------ the step
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._resident:
            self.inner.step()
            return loss
        units = [u for u in self.units if any(p.grad is not None for p in u.params)]
        reads: dict[int, list[Request]] = {}
        for n, unit in enumerate(units):
            slot = n % self.slots
            if n not in reads:
                reads[n] = self._read_states(unit, slot)
            if self.param_swapper is not None:
                self.param_swapper.acquire(unit.params)
            for request in reads.pop(n):
                request.wait()
            installed = self._install(unit, slot)
            if n + 1 < len(units):  # prefetch the next unit while this one steps
                if self.slots > 1:
                    reads[n + 1] = self._read_states(units[n + 1], (n + 1) % self.slots)
                if self.param_swapper is not None:
                    self.param_swapper.prefetch(units[n + 1].params)
            self._step_unit(unit)
            if not self._learnt:
                self._learn_kinds(unit)
            if self.kinds:
                fresh = any(id(p) not in installed for p in unit.params if self.state.get(p))
                self._evict(unit, slot)
                self._write(unit, slot)
                if fresh:  # the optimizer allocated this unit's states itself (their first step): give them back
                    release_free_memory()
            if self.param_swapper is not None:
                self.param_swapper.release(unit.params, dirty=True)
        self._drain()
        return loss

    def _read_states(self, unit: SwapUnit, slot: int) -> list[Request]:
        """Start reading the unit's states into the slot's buffers (nothing to read before its first step)."""
        if not self.kinds or not any(id(p) in self._stepped for p in unit.params):
            return []
        return self._read(unit, slot)

    def _step_unit(self, unit: SwapUnit) -> None:
        """The configured optimizer's own step, on this unit's parameters only."""
        saved = [group["params"] for group in self.param_groups]
        members: list[list[torch.Tensor]] = [[] for _ in saved]
        for p in unit.params:
            members[self._group_of[id(p)]].append(p)
        try:
            for group, params in zip(self.param_groups, members):
                group["params"] = params
            self.inner.step()
        finally:
            for group, params in zip(self.param_groups, saved):
                group["params"] = params
        for p in unit.params:
            if self.state.get(p):
                self._stepped.add(id(p))

    def _install(self, unit: SwapUnit, slot: int) -> set[int]:
        """Put the slot's buffers (just read) into the optimizer state of the unit's stepped parameters;
        returns the ids of those parameters."""
        installed: set[int] = set()
        if not self.kinds:
            return installed
        views = self._views(unit, slot)
        for i, p in enumerate(unit.params):
            if id(p) in self._stepped:
                installed.add(id(p))
                for k, (key, _) in enumerate(self.kinds):
                    self.state[p][key] = _like(p, views[k][i])
        return installed

    def _evict(self, unit: SwapUnit, slot: int, rebind: bool = False) -> None:
        """Copy the unit's states into the slot's buffers (where the step did not update them in place) and
        drop them from memory. rebind: leave the state dicts as they are (a state_dict() taken while resident
        may hold them) and give each parameter a new one without the swapped tensors."""
        self._free_slot(slot)  # at the first step the slot's buffers may still be being written
        views = self._views(unit, slot)
        for i, p in enumerate(unit.params):
            state = self.state.get(p)
            if not state:
                continue
            for k, (key, _) in enumerate(self.kinds):
                value = state.get(key)
                if value is None:
                    continue
                value = local(value)
                if value.data_ptr() != views[k][i].data_ptr():
                    views[k][i].copy_(value)
            self._forget(p, rebind)

    def _forget(self, p: torch.Tensor, rebind: bool) -> None:
        swapped = {key for key, _ in self.kinds}
        if rebind:
            self.state[p] = {k: v for k, v in self.state[p].items() if k not in swapped}
        else:
            for key in swapped:
                self.state[p].pop(key, None)

    # ------------------------------------------------------------------ checkpoints
    @contextlib.contextmanager
    def resident(self, writes: Callable[[], bool] = lambda: True):
        """Every state in memory (ordinary optimizer state) for the duration; afterwards streamed back out if
        writes() says the body changed them (a checkpoint load), else dropped (the files still hold them)."""
        self._swap_all_in()
        self._resident = True
        try:
            yield
        finally:
            self._resident = False
            if writes() or not self._learnt:
                self._swap_all_out()
            else:
                self._drop_all()
            release_free_memory()

    def _drop_all(self) -> None:
        for unit in self.units:
            for p in unit.params:
                if self.state.get(p):
                    self._forget(p, rebind=True)

    def _swap_all_in(self) -> None:
        if not self.kinds:
            return
        for unit in self.units:
            for r in self._read_states(unit, 0):  # one slot, unit after unit: a checkpoint, not a step
                r.wait()
            views = self._views(unit, 0)
            for i, p in enumerate(unit.params):
                if id(p) in self._stepped:
                    for k, (key, _) in enumerate(self.kinds):
                        self.state[p][key] = _like(p, views[k][i].clone())

    def _swap_all_out(self) -> None:
        stepped = [p for unit in self.units for p in unit.params if self.state.get(p)]
        if not stepped:
            return
        for unit in self.units:
            if not self._learnt:
                self._learn_kinds(unit)
            for p in unit.params:
                if self.state.get(p):
                    self._stepped.add(id(p))
            if self.kinds:
                self._evict(unit, 0, rebind=True)
                self._write(unit, 0)
                self._free_slot(0)

    # ------------------------------------------------------------------ delegation
    def state_dict(self):
        return self.inner.state_dict()

    def load_state_dict(self, state_dict):
        self.inner.load_state_dict(state_dict)
        self.state, self.param_groups = self.inner.state, self.inner.param_groups  # torch rebinds both

    def zero_grad(self, set_to_none: bool = True):
        self.inner.zero_grad(set_to_none=set_to_none)

    def close(self) -> None:
        self._drain()
        if self.file is not None:
            self.file.close()
