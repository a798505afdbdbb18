"""Profiling: memory estimation (and later flops profiler, comms logger, autotuner)."""
