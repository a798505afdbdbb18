"""Profiling: the flops profiler (get_model_profile, FlopsProfiler), the wall-clock breakdown, torch.profiler
traces, the memory estimator (and later the comms logger and the autotuner)."""

from dsrecipes.utils.lazy_exports import lazy_exports

_EXPORTS = {
    "FlopsProfiler": "dsrecipes.profiling.flops_profiler",
    "get_model_profile": "dsrecipes.profiling.model_profile",
}

__all__ = ["FlopsProfiler", "get_model_profile"]


# Lazy, so that importing the schemas (profiling.config, profiling.autotuning.config) does not import torch:
# `python -m dsrecipes --help` composes the recipe only.
__getattr__ = lazy_exports(__name__, _EXPORTS)
