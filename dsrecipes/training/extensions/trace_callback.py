"""The recipe's torch.profiler traces (the `profiler` group) and CUDA memory snapshots.

    python -m dsrecipes model=gpt_debug profiler=trace                 # optimizer steps 3-4 traced
    python -m dsrecipes profiler=trace profiler.wait=10 profiler.active=5 profiler.record_shapes=true
    python -m dsrecipes profiler=memory                                # + a CUDA memory snapshot
    tensorboard --logdir outputs/<date>/<time>_gpt/profiler            # needs torch-tb-profiler

torch.profiler.profile runs from the start of training with torch.profiler.schedule(wait, warmup,
active, repeat) advanced once per optimizer step; each recorded cycle is written by
tensorboard_trace_handler to <run dir>/profiler/rank<R>.<time>.pt.trace.json (Chrome trace format:
TensorBoard's profiler plugin, https://ui.perfetto.dev or chrome://tracing open it). CPU activity is
always recorded, CUDA kernels too on a CUDA device. Each phase of a step (data, forward, backward,
grad_reduce, optimizer) shows as a `dsrecipes/<phase>` range (dsrecipes.profiling.phases).

memory_snapshot (CUDA only): torch.cuda.memory._record_memory_history over the first cycle's
warmup and active steps, dumped with _dump_snapshot to <run dir>/profiler/memory_snapshot_rank<R>.pickle
(drag it onto https://pytorch.org/memory_viz). On a run without CUDA it is skipped with one warning
(decided so that a recipe written for a GPU still runs, and traces, on a laptop).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule, tensorboard_trace_handler

from dsrecipes.profiling.config import ProfilerConfig
from dsrecipes.training.extensions.base import Callback, RunContext
from dsrecipes.utils.logging import get_logger

TRACE_DIR = "profiler"


def _phase_range(name: str):
    return record_function(f"dsrecipes/{name}")


class TorchTraceCallback(Callback):
    def __init__(self, cfg: ProfilerConfig):
        self.cfg = cfg
        self.profiler: profile | None = None
        self.steps = 0
        self._snapshot = False  # recording the CUDA allocation history now
        self._snapshot_wanted = False  # a snapshot is still to be taken (memory_snapshot on a CUDA run)
        self.out_dir: Path | None = None

    @property
    def cycle_steps(self) -> int:
        return self.cfg.wait + self.cfg.warmup + self.cfg.active

    def on_train_start(self, context: RunContext) -> None:
        cfg = self.cfg
        self.out_dir = context.run_dir / TRACE_DIR
        self.out_dir.mkdir(parents=True, exist_ok=True)
        cuda = context.device.type == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        self.profiler = profile(
            activities=activities,
            schedule=schedule(wait=cfg.wait, warmup=cfg.warmup, active=cfg.active, repeat=cfg.repeat),
            on_trace_ready=tensorboard_trace_handler(str(self.out_dir), worker_name=f"rank{context.rank}"),
            record_shapes=cfg.record_shapes, profile_memory=cfg.profile_memory, with_stack=cfg.with_stack,
        )
        self.profiler.start()
        context.engine.phases.add(_phase_range)
        self._snapshot_wanted = cfg.memory_snapshot and cuda
        if cfg.memory_snapshot and not cuda:
            get_logger().warning("profiler.memory_snapshot=true needs CUDA (this run is on %s): no memory snapshot; "
                                 "the trace is still written", context.device)
        if self._snapshot_wanted and cfg.wait == 0:
            self._start_snapshot()
        get_logger().info("profiler: tracing steps %d-%d%s into %s", cfg.wait + cfg.warmup + 1, self.cycle_steps,
                          f" (x{cfg.repeat})" if cfg.repeat != 1 else "", self.out_dir)

    def on_step_end(self, context: RunContext, step: int, metrics: dict) -> None:
        if self.profiler is None:
            return
        self.steps += 1
        if self._snapshot_wanted and self.steps == self.cfg.wait:
            self._start_snapshot()
        if self._snapshot and self.steps == self.cycle_steps:
            self._dump_snapshot(context.rank)
        self.profiler.step()
        if self.cfg.repeat and self.steps >= self.cycle_steps * self.cfg.repeat:
            self._stop(context)  # the schedule is done: stop recording anything

    def on_train_end(self, context: RunContext, summary: dict) -> None:
        if self._snapshot:
            self._dump_snapshot(context.rank)
        if self.profiler is not None:
            self._stop(context)

    def _stop(self, context: RunContext) -> None:
        context.engine.phases.remove(_phase_range)
        profiler, self.profiler = self.profiler, None
        profiler.stop()
        traces = sorted(self.out_dir.glob("*.pt.trace.json*"))
        get_logger().info("profiler: %d trace file(s) in %s", len(traces), self.out_dir)

    def _start_snapshot(self) -> None:
        torch.cuda.memory._record_memory_history(max_entries=self.cfg.memory_snapshot_max_entries)
        self._snapshot = True

    def _dump_snapshot(self, rank: int) -> None:
        path = self.out_dir / f"memory_snapshot_rank{rank}.pickle"
        torch.cuda.memory._dump_snapshot(str(path))
        torch.cuda.memory._record_memory_history(enabled=None)
        self._snapshot = False
        self._snapshot_wanted = False
        get_logger().info("profiler: CUDA memory snapshot %s (open it at https://pytorch.org/memory_viz)", path)
