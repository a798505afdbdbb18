"""The unit tier: in-process tests only, so the quick loop (`pytest tests/unit`, `pytest -m "not slow"`) stays quick.

A unit test may not fork, start a subprocess or a multiprocessing process, or join a process group: each of those
fails the test here, naming what it started and where such a test belongs (tests/integration). Library probes
that shell out to find a shared library (ctypes.util.find_library runs ldconfig or the C compiler) are allowed, and
so is matplotlib's font discovery (fc-list), which runs once per machine, the first time a loss curve is drawn.
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess

import pytest

# what ctypes.util.find_library may run (the NVMe offload's libaio probe, Triton's libcuda lookup), and what
# matplotlib's font manager runs when it builds its font cache on a fresh machine (~/.cache/matplotlib absent)
_LIBRARY_PROBES = {"ldconfig", "gcc", "cc", "ld", "objdump", "fc-list"}


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise AssertionError(f"a unit test started {what}: it belongs in tests/integration (tests/unit runs in-process "
                             "only: no fork, subprocess, worker process or process group)")
    return refuse


@pytest.fixture(autouse=True)
def _in_process_only(monkeypatch):
    popen_init = subprocess.Popen.__init__

    def checked_popen(self, args, *rest, **kwargs):
        program = args[0] if isinstance(args, (list, tuple)) else str(args).split()[0]
        if os.path.basename(str(program)) not in _LIBRARY_PROBES:
            _refuse(f"the subprocess {args!r}")()
        return popen_init(self, args, *rest, **kwargs)

    import torch.distributed as dist

    monkeypatch.setattr(os, "fork", _refuse("a forked process"))
    monkeypatch.setattr(subprocess.Popen, "__init__", checked_popen)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", _refuse("a multiprocessing process"))
    monkeypatch.setattr(dist, "init_process_group", _refuse("a process group (init_process_group)"))
    yield
