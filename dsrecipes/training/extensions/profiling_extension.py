"""The profilers a recipe turns on, as Trainer extensions (dsrecipes.training.extensions.base): the flops profiler
(`flops_profiler` group), torch.profiler traces (`profiler` group) and the comms logger (`comms_logger` group).
The wall-clock breakdown (trainer.wall_clock_breakdown) is the Trainer's own, since its numbers join every log line."""

from __future__ import annotations

from dsrecipes.training.extensions.base import Extensions


def profiling_extension(cfg) -> Extensions:
    extensions = Extensions()
    if cfg.flops_profiler.enabled:
        from dsrecipes.training.extensions.flops_callback import FlopsProfilerCallback

        extensions.callbacks.append(FlopsProfilerCallback(cfg.flops_profiler))
    if cfg.profiler.enabled:
        from dsrecipes.training.extensions.trace_callback import TorchTraceCallback

        extensions.callbacks.append(TorchTraceCallback(cfg.profiler))
    if cfg.comms_logger.enabled:
        from dsrecipes.training.extensions.comms_callback import CommsLoggerCallback

        extensions.callbacks.append(CommsLoggerCallback(cfg.comms_logger))
    return extensions
