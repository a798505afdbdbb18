"""One training run of a verify: `python -m dsrecipes OVERRIDES hydra.run.dir=DIR` in a subprocess, its console in
DIR.log. The candidate may instead run under torchrun (verify.launcher=torchrun: `python -m torch.distributed.run
--standalone --nproc-per-node N -m dsrecipes ...`), the way users launch on a cluster; by default dsrecipes spawns
its own workers. A Runner is any callable (overrides, run_dir, log_file, nproc, launcher, timeout_s) -> exit code:
the tests pass one that forks the command from their fork server."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

Runner = Callable[[list[str], Path, Path, int, str, int], int]


def command(overrides: list[str], run_dir: Path, nproc: int, launcher: str) -> list[str]:
    entry = ["-m", "dsrecipes", *overrides, f"hydra.run.dir={run_dir}"]
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *entry]
    return [sys.executable, *entry]


def run_subprocess(overrides: list[str], run_dir: Path, log_file: Path, nproc: int, launcher: str,
                   timeout_s: int) -> int:
    """The run in a child process; stdout and stderr into log_file. A run past timeout_s is killed (exit 124)."""
    with open(log_file, "w") as log:
        try:
            return subprocess.run(command(overrides, run_dir, nproc, launcher), stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout_s, check=False).returncode
        except subprocess.TimeoutExpired:
            log.write(f"\ndsrecipes.verify: killed after {timeout_s} s\n")
            return 124
