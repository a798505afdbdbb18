"""Simulated nodes on one machine: several launchers (torchrun, or `python -m dsrecipes launcher.nnodes=N`) that
meet at a c10d rendezvous on 127.0.0.1, each starting its own local ranks, as separate machines would.

    port = free_port()
    nodes = [start_node(cwd, launcher_node_args(2, rank, port) + overrides) for rank in (0, 1)]
    results = wait_all(nodes, timeout=300)

Every node runs in the same working directory (a shared filesystem, as on a cluster) and in a session of its
own, so `kill_node` takes down its launcher and every worker it started, as losing the machine would.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers.cli import ForkedCLI, can_fork
from tests.helpers.environment import subprocess_env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def torchrun_node_args(nnodes: int, node_rank: int, port: int, nproc: int = 2) -> list[str]:
    """torchrun's arguments for one of `nnodes` simulated nodes (the command's `-m dsrecipes` follows)."""
    return ["-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--node-rank={node_rank}",
            f"--nproc-per-node={nproc}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
            "--rdzv-id=dsrecipes-test", "-m", "dsrecipes"]


def launcher_node_args(nnodes: int, node_rank: int, port: int, nproc: int = 2) -> list[str]:
    """`python -m dsrecipes` with the launcher.* multi-node keys for one of `nnodes` simulated nodes."""
    return ["-m", "dsrecipes", f"launcher.nnodes={nnodes}", f"launcher.node_rank={node_rank}",
            f"launcher.rdzv_endpoint=127.0.0.1:{port}", f"launcher.nproc_per_node={nproc}"]


def start_node(cwd: Path, args: list[str], name: str, env_extra: dict | None = None):
    """`python ARGS` in cwd, in a process group of its own; its output goes to cwd/<name>.out and .err.

    A `-m dsrecipes` node is forked from the test process's fork server (tests/helpers/cli.py's ForkedCLI, the path
    run_cli takes), and so are the workers it starts: they begin with torch and dsrecipes imported, instead of
    importing them afresh, about 5 s of CPU per process. A torchrun node is a real subprocess (its workers are interpreters of
    their own, as torchrun starts them). Either way the handle has Popen's pid, poll and wait."""
    env = subprocess_env(OMP_NUM_THREADS="1", **(env_extra or {}))
    out, err = cwd / f"{name}.out", cwd / f"{name}.err"
    if args[:2] == ["-m", "dsrecipes"] and can_fork(env_extra or {}):
        return ForkedCLI(args[2:], str(cwd), env, out, err)
    with open(out, "w") as out_file, open(err, "w") as err_file:
        return subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdout=out_file, stderr=err_file,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def kill_node(node) -> None:
    """SIGKILL the node's launcher and every process it started (its session's process group)."""
    try:
        os.killpg(node.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    node.wait()


def wait_all(nodes: list, timeout: float) -> list[int]:
    """Every node's exit status; past the timeout the remaining ones are killed (status -9)."""
    deadline = time.monotonic() + timeout
    codes = []
    for node in nodes:
        try:
            codes.append(node.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for other in nodes:
                kill_node(other)
            codes.append(node.wait())
    return codes


def output(cwd: Path, name: str) -> str:
    return (cwd / f"{name}.out").read_text() + (cwd / f"{name}.err").read_text()
