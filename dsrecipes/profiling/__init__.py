"""Profiling: the flops profiler (get_model_profile, FlopsProfiler), the wall-clock breakdown, torch.profiler
traces, the memory estimator (and later the comms logger and the autotuner)."""

from dsrecipes.profiling.flops_profiler import FlopsProfiler
from dsrecipes.profiling.model_profile import get_model_profile

__all__ = ["FlopsProfiler", "get_model_profile"]
