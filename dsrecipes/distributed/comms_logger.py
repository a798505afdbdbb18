"""The comms logger: counts every collective issued through torch.distributed's Python API while it records.

    from dsrecipes.distributed.comms_logger import CommsLogger
    with CommsLogger(CommsLoggerConfig(enabled=True)) as comms:   # or comms.start() ... comms.stop()
        comms.attach(ddp_model)           # DDP's buckets: all-reduced through dist.all_reduce from now on
        loss.backward(); optimizer.step()
        comms.step_boundary()             # {"bytes": ..., "seconds": ..., "ops": ...} of this step
    rows = comms.summary()                # per op and message size: count, bytes, latency, algbw, busbw

(In a recipe: comms_logger=enabled, see dsrecipes.training.extensions.comms_callback.) How: start() replaces the
collectives in OP_TABLE on the torch.distributed module by timing wrappers, and stop() puts the
originals back (also when the body of `with` raises); nothing is wrapped while it does not record.
Code that calls `dist.<op>(...)` through the module at call time is seen: dsrecipes' strategies and
MoE layers, FSDP2 (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py: dist.all_gather_single,
dist.reduce_scatter_single, dist.all_reduce for HSDP), ZeroRedundancyOptimizer (dist.broadcast),
DDP communication hooks (DDP's default_hooks and dsrecipes' fp32_allreduce_hook). DDP's own bucket
all-reduce runs in its C++ reducer, unseen: attach(module) gives every DDP module without a hook
torch's allreduce_hook (divide by the group size, then all-reduce: what the reducer does, so the
gradients are the same) so that its buckets go through dist.all_reduce.

Not counted: torch.distributed._functional_collectives / torch.ops._c10d_functional (DTensor's
redistributions, so tensor / sequence parallelism's collectives and the grad-norm reduction of
FSDP2's DTensor gradients; counting them would need a dispatch mode in every op's path), point-to-point
send/recv/isend/irecv and batch_isend_irecv (pipeline parallelism; P2POp checks the op's identity,
so it cannot be wrapped), the *_object collectives (pickled, of unknown size), collectives issued
from C++ (DDP's initial broadcast), and names bound before start() (`from torch.distributed import
all_reduce`).

Under trainer.compile a collective inside the compiled model (MoE's all-to-all) meets the wrapper
instead of torch's function while logging, so Dynamo traces or breaks the graph there: slower, same result.

A message is DeepSpeed's (deepspeed/comm/utils.py get_msg_size_from_args): the bytes of the tensor
(or tensors) this rank puts in: all_reduce's tensor, all_gather's input shard, reduce_scatter's whole
input, all_to_all's input, broadcast / reduce / gather / scatter's tensor, barrier 0; uint8 / int8
tensors count their real byte size. Latency: every logged op is made blocking as DeepSpeed does
(an async op's Work is waited on, a CUDA device synchronised before and after), so it is the op's
own time from call to completion; the returned Work is the original one, already complete.
algbw / busbw: dsrecipes.distributed.comms_stats.

Per process group: every op also counts into its group's traffic (`groups()`: the group's global ranks, and
whether they share one node, ranks_per_node = LOCAL_WORLD_SIZE to a node, or cross nodes), so ZeRO++ hpZ's
secondary all-gathers inside a node and the full-world collectives that cross nodes are told apart.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dsrecipes.distributed.comms_config import CommsLoggerConfig, profiled_ops
from dsrecipes.distributed.comms_stats import GroupTraffic, OpSummary, bandwidth_gbps, convert_size, link_of, summarize
from dsrecipes.utils.logging import get_logger


@dataclass(frozen=True)
class OpSpec:
    op: str  # DeepSpeed's name, as logged
    size_arg: str | None  # the argument whose bytes are the message (None: no data, barrier)


# torch.distributed attribute -> what it logs as. torch's deprecated aliases call the new function
# inside distributed_c10d (not through this module), so nothing is counted twice.
OP_TABLE: dict[str, OpSpec] = {
    "all_reduce": OpSpec("all_reduce", "tensor"),
    "all_reduce_coalesced": OpSpec("all_reduce_coalesced", "tensors"),
    "all_gather": OpSpec("all_gather", "tensor"),
    "all_gather_single": OpSpec("all_gather_into_tensor", "input_tensor"),
    "all_gather_into_tensor": OpSpec("all_gather_into_tensor", "input_tensor"),
    "_all_gather_base": OpSpec("all_gather_into_tensor", "input_tensor"),
    "reduce_scatter": OpSpec("reduce_scatter", "input_list"),
    "reduce_scatter_single": OpSpec("reduce_scatter_tensor", "input"),
    "reduce_scatter_tensor": OpSpec("reduce_scatter_tensor", "input"),
    "_reduce_scatter_base": OpSpec("reduce_scatter_tensor", "input"),
    "all_to_all": OpSpec("all_to_all", "input_tensor_list"),
    "all_to_all_single": OpSpec("all_to_all_single", "input"),
    "broadcast": OpSpec("broadcast", "tensor"),
    "reduce": OpSpec("reduce", "tensor"),
    "gather": OpSpec("gather", "tensor"),
    "scatter": OpSpec("scatter", "tensor"),
    "barrier": OpSpec("barrier", None),
}

RecordKey = tuple[str, str, int, int]  # (record name, op, message bytes, group size)


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.element_size() * value.nelement()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


def _device_of(value: Any) -> torch.device | None:
    if isinstance(value, torch.Tensor):
        return value.device
    if isinstance(value, (list, tuple)) and value:
        return _device_of(value[0])
    return None


def _synchronize(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def _group_ranks(group: Any) -> tuple[int, ...]:
    """The global ranks of a collective's group (None: the default group), its size their count; this rank alone
    where it is not a member or there is no process group (the op itself says so)."""
    try:
        return tuple(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))
    except (RuntimeError, ValueError, AttributeError):
        return (dist.get_rank() if dist.is_available() and dist.is_initialized() else 0,)


class CommsLogger:
    """Records collectives while started. Thread-safe (autograd runs DDP/FSDP2 hooks on its own threads).

    step_phases: when set, only ops issued inside those phases (see `in_phase`; the Trainer marks a step's
    data / forward / backward / grad_reduce / optimizer phases) count into step_boundary()'s per-step
    figures; the summary counts every op. None: every op counts into the step.
    """

    def __init__(self, cfg: CommsLoggerConfig | None = None, step_phases: frozenset[str] | None = None):
        self.cfg = cfg if cfg is not None else CommsLoggerConfig(enabled=True)
        self.ops = profiled_ops(self.cfg)
        self.step_phases = step_phases
        self.records: dict[RecordKey, list[float]] = defaultdict(list)
        self.bytes_by_phase: dict[str, int] = defaultdict(int)
        self.steps: list[dict[str, float]] = []  # step_boundary()'s figures, one per step
        self.phase: str | None = None
        self.rank = 0
        self.ranks_per_node = 1
        self._groups: dict[tuple[int, ...], GroupTraffic] = {}
        self._step = {"bytes": 0, "seconds": 0.0, "ops": 0}
        self._originals: dict[str, Callable] = {}
        self._wrappers: dict[str, Callable] = {}
        self._lock = threading.Lock()
        self._local = threading.local()

    # ------------------------------------------------------------------ on / off
    @property
    def active(self) -> bool:
        return bool(self._originals)

    def start(self) -> CommsLogger:
        """Wrap the profiled ops on torch.distributed (one recorder at a time)."""
        if self.active:
            return self
        for name, spec in OP_TABLE.items():
            current = getattr(dist, name, None)
            if current is None or spec.op not in self.ops:
                continue
            if getattr(current, "_dsrecipes_comms_logger", None) is not None:
                self.stop()
                raise RuntimeError(f"torch.distributed.{name} is already wrapped by another CommsLogger; "
                                   "stop that one first")
            self._originals[name] = current
            self._wrappers[name] = self._wrap(name, current, spec)
            setattr(dist, name, self._wrappers[name])
        joined = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if joined else 0
        world = dist.get_world_size() if joined else 1
        self.ranks_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        return self

    def stop(self) -> None:
        """Put the original functions back (those someone else re-wrapped since start() are left, with a warning)."""
        for name, original in self._originals.items():
            if getattr(dist, name, None) is self._wrappers[name]:
                setattr(dist, name, original)
            else:
                get_logger().warning("comms_logger: torch.distributed.%s was replaced while logging; left as it is",
                                     name)
        self._originals.clear()
        self._wrappers.clear()

    def __enter__(self) -> CommsLogger:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ what runs
    @contextmanager
    def in_phase(self, name: str) -> Iterator[None]:
        """Ops issued inside are tagged with phase `name` (for step_phases and bytes_by_phase)."""
        previous, self.phase = self.phase, name
        try:
            yield
        finally:
            self.phase = previous

    def attach(self, module: nn.Module) -> int:
        """Give each DDP module in `module` that has no communication hook torch's allreduce_hook, so its
        bucket all-reduces go through dist.all_reduce (call before its first backward); returns how many."""
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        from torch.nn.parallel import DistributedDataParallel

        attached = 0
        for sub in module.modules():
            if isinstance(sub, DistributedDataParallel) and not getattr(sub, "_comm_hooks", None):
                sub.register_comm_hook(sub.process_group, allreduce_hook)
                attached += 1
        return attached

    def step_boundary(self) -> dict[str, float]:
        """End of an optimizer step: {"bytes", "seconds", "ops"} counted since the last boundary."""
        with self._lock:
            figures, self._step = dict(self._step), {"bytes": 0, "seconds": 0.0, "ops": 0}
        self.steps.append(figures)
        return figures

    # ------------------------------------------------------------------ results
    def summary(self) -> list[OpSummary]:
        with self._lock:
            records = {key: list(values) for key, values in self.records.items()}
        return summarize(records)

    def groups(self) -> list[GroupTraffic]:
        """This rank's traffic per process group, the most bytes first."""
        with self._lock:
            groups = [GroupTraffic(g.ranks, g.link, g.ops, g.bytes) for g in self._groups.values()]
        return sorted(groups, key=lambda g: (-g.bytes, g.ranks))

    def totals(self) -> dict[str, float]:
        """This rank's totals over the whole recording and the mean per step (over step_boundary() calls)."""
        rows = self.summary()
        steps = self.steps
        return {
            "ops": sum(r.count for r in rows), "bytes": sum(r.total_bytes for r in rows),
            "latency_s": sum(r.total_latency_s for r in rows), "steps": len(steps),
            "bytes_per_step": sum(s["bytes"] for s in steps) / len(steps) if steps else 0.0,
            "time_per_step_s": sum(s["seconds"] for s in steps) / len(steps) if steps else 0.0,
            "ops_per_step": sum(s["ops"] for s in steps) / len(steps) if steps else 0.0,
        }

    def world_bytes(self, device: torch.device) -> int | None:
        """Every rank's total bytes summed (one all-reduce, not logged); call on every rank, after stop()."""
        if not (dist.is_available() and dist.is_initialized()) or self.active:
            return None
        total = torch.tensor([float(self.totals()["bytes"])], dtype=torch.float64, device=device)
        dist.all_reduce(total)
        return int(total.item())

    # ------------------------------------------------------------------ how
    def _wrap(self, name: str, original: Callable, spec: OpSpec) -> Callable:
        signature = inspect.signature(original)
        local, debug = self._local, self.cfg.debug

        @functools.wraps(original)
        def logged(*args: Any, **kwargs: Any) -> Any:
            if getattr(local, "inside", False):  # a collective issued by a logged one: counted once, as the outer
                return original(*args, **kwargs)
            try:
                bound = signature.bind(*args, **kwargs).arguments
            except TypeError:  # let torch say what is wrong with the call
                return original(*args, **kwargs)
            payload = bound.get(spec.size_arg) if spec.size_arg else None
            device = _device_of(payload)
            local.inside = True
            try:
                _synchronize(device)
                started = time.perf_counter()
                result = original(*args, **kwargs)
                if result is not None and hasattr(result, "wait"):
                    result.wait()
                _synchronize(device)
                latency = time.perf_counter() - started
            finally:
                local.inside = False
            caller = sys._getframe(1).f_code.co_name if debug else None
            ranks = _group_ranks(bound.get("group"))
            self._record(spec.op, _nbytes(payload), latency, len(ranks), caller, ranks)
            return result

        logged._dsrecipes_comms_logger = self  # type: ignore[attr-defined]
        return logged

    def _record(self, op: str, size: int, latency: float, group_size: int, caller: str | None,
                ranks: tuple[int, ...] = (0,)) -> None:
        name = f"{op} | [Caller Func: {caller}]" if caller else op
        phase = self.phase
        with self._lock:
            self.records[(name, op, size, group_size)].append(latency)
            traffic = self._groups.get(ranks)
            if traffic is None:
                traffic = self._groups[ranks] = GroupTraffic(ranks, link_of(ranks, self.ranks_per_node))
            traffic.ops += 1
            traffic.bytes += size
            self.bytes_by_phase[phase or "other"] += size
            if self.step_phases is None or phase in self.step_phases:
                self._step["bytes"] += size
                self._step["seconds"] += latency
                self._step["ops"] += 1
        if self.cfg.verbose and self.rank == 0:
            algbw, busbw = bandwidth_gbps(op, size, latency, group_size)
            get_logger().info("comm op: %s | time (ms): %.2f | msg size: %s | algbw (Gbps): %.2f | busbw (Gbps): %.2f",
                              name, latency * 1e3, convert_size(size), algbw, busbw)
