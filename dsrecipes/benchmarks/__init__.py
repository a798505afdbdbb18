"""Benchmarks: scripts that measure dsrecipes side by side with alternatives and print ratios (not tests)."""
