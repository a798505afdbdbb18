"""Honest "was this loaded from datasets' cache?" detection around ``Dataset.map``.

datasets names the output of ``map`` after a fingerprint of the input and the
transform, and silently loads that file when it already exists. It does not
report which happened, so ``map_with_reuse`` snapshots the cache directory
before the call and reports a reuse only if every file backing the result
already existed beforehand, unchanged (same size and modification time).
"""

from __future__ import annotations

import os

import datasets


def _stat(path: str) -> tuple[int, int]:
    """(size, mtime in ns) of ``path``."""
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def _snapshot(directories) -> dict[str, tuple[int, int]]:
    """Map every ``*.arrow`` file in ``directories`` to its (size, mtime)."""
    seen: dict[str, tuple[int, int]] = {}
    for directory in directories:
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            if name.endswith(".arrow"):
                path = os.path.join(directory, name)
                try:
                    seen[path] = _stat(path)
                except FileNotFoundError:
                    pass
    return seen


def cache_file_names(ds: datasets.Dataset) -> list:
    """The Arrow files backing ``ds`` (empty for an in-memory dataset)."""
    return [entry["filename"] for entry in ds.cache_files]


def map_with_reuse(ds: datasets.Dataset, function, **map_kwargs) -> tuple[datasets.Dataset, bool]:
    """Run ``ds.map(function, **map_kwargs)``; also return whether its result came from an existing cache.

    The flag is True only when the result is backed by files that all existed,
    unchanged, before the call. In-memory results (caching disabled, in-memory
    input) count as computed.
    """
    directories = {os.path.dirname(name) for name in cache_file_names(ds)}
    before = _snapshot(directories)
    out = ds.map(function, **map_kwargs)
    files = cache_file_names(out)
    reused = bool(files) and all(f in before and before[f] == _stat(f) for f in files)
    return out, reused
