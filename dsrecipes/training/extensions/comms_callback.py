"""The recipe's comms logger (comms_logger=enabled): every collective of the training, counted per step and per op.

    python -m dsrecipes comms_logger=enabled zero.stage=2 launcher.nproc_per_node=2 trainer.max_steps=20
    python -m dsrecipes comms_logger=enabled comms_logger.verbose=true zero.stage=3 launcher.nproc_per_node=2

From the first optimizer step to the last, each rank records its collectives with
dsrecipes.distributed.comms_logger (DDP's buckets through torch's allreduce_hook, attached here). Every
optimizer step logs comm/bytes_per_step (bytes this rank put into collectives during the step's data,
forward, backward, grad_reduce and optimizer phases) and comm/time_per_step (their latency, seconds) to
every metrics sink; the loss all-reduce of a logged step, evaluation and checkpoints are outside those
phases (they are in the summary). At the end rank 0 prints a table per op and message size (count, total
bytes, mean latency, algbw, busbw) and writes <run dir>/comms.json and comms.csv: rank 0's figures, with
its mean bytes_per_step on top and world_total_bytes, every rank's bytes summed; and a table per process group
(its ranks, intra- or inter-node, ops, bytes), also in comms.json (groups, bytes_by_link).
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from dsrecipes.distributed.comms_config import CommsLoggerConfig
from dsrecipes.distributed.comms_logger import CommsLogger
from dsrecipes.distributed.comms_stats import (
    bytes_by_link,
    convert_size,
    group_table,
    summary_table,
    totals_by_op,
    write_comms_files,
)
from dsrecipes.profiling.phases import TRAINING_PHASES
from dsrecipes.training.extensions.base import Callback, RunContext
from dsrecipes.utils.console import make_console, print_table
from dsrecipes.utils.logging import get_logger


class CommsLoggerCallback(Callback):
    def __init__(self, cfg: CommsLoggerConfig):
        self.cfg = cfg
        self.recorder: CommsLogger | None = None
        self._engine = None
        self.result: dict | None = None  # what comms.json holds (every rank has its own)

    def on_train_start(self, context: RunContext) -> None:
        recorder = CommsLogger(self.cfg, step_phases=frozenset(TRAINING_PHASES))
        attached = recorder.attach(context.engine.module)
        if attached:
            get_logger().info("comms_logger: DDP's bucket all-reduce now runs through torch's allreduce_hook "
                              "(the same averaging) so that it is counted")
        self._engine = context.engine
        self._engine.phases.add(self._observe)
        self.recorder = recorder.start()

    def _observe(self, phase: str) -> AbstractContextManager:
        return self.recorder.in_phase(phase)

    def on_step_end(self, context: RunContext, step: int, metrics: dict) -> None:
        if self.recorder is None:
            return
        figures = self.recorder.step_boundary()
        context.loggers.log({"comm/bytes_per_step": figures["bytes"], "comm/time_per_step": figures["seconds"]}, step)

    def on_train_end(self, context: RunContext, summary: dict) -> None:
        recorder = self.recorder
        if recorder is None:
            return
        self.close()
        world_bytes = recorder.world_bytes(context.device)  # every rank gets here: one small all-reduce
        rows, totals, groups = recorder.summary(), recorder.totals(), recorder.groups()
        self.result = {
            "rank": recorder.rank, "bytes_per_step": totals["bytes_per_step"],
            "time_per_step_s": totals["time_per_step_s"], "ops_per_step": totals["ops_per_step"],
            "steps": totals["steps"], "total_ops": totals["ops"], "total_bytes": totals["bytes"],
            "total_latency_s": totals["latency_s"], "world_total_bytes": world_bytes,
            "bytes_by_phase": dict(recorder.bytes_by_phase), "by_op": totals_by_op(rows),
            "ranks_per_node": recorder.ranks_per_node, "bytes_by_link": bytes_by_link(groups),
            "groups": [group.as_dict() for group in groups],
            "prof_all": self.cfg.prof_all, "prof_ops": list(self.cfg.prof_ops),
        }
        summary["comms"] = {"bytes_per_step": totals["bytes_per_step"], "time_per_step_s": totals["time_per_step_s"]}
        if not context.is_logging_rank:
            return
        title = (f"collectives of rank 0 over {totals['steps']} steps: {convert_size(totals['bytes_per_step'])} "
                 f"and {totals['time_per_step_s'] * 1e3:.2f} ms per step")
        console = make_console()
        print_table(console, summary_table(rows, title))
        print_table(console, group_table(groups, f"collectives of rank 0 per process group ({recorder.ranks_per_node} "
                                                 "ranks per node)"))
        json_path, csv_path = write_comms_files(context.run_dir, self.result, rows)
        get_logger().info("comms_logger: %s, %s", json_path, csv_path)

    def close(self) -> None:
        """Unwrap torch.distributed and stop observing the engine (also when the run fails)."""
        if self.recorder is not None:
            self.recorder.stop()
        if self._engine is not None:
            self._engine.phases.remove(self._observe)
            self._engine = None
