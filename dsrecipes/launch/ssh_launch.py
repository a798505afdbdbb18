"""Running one command per host at once (the ssh commands of --launch ssh), each output line prefixed by its host.

The status is the first failure's: when a command exits non-zero the others are sent SIGTERM (their whole
process group: each runs in a session of its own), then SIGKILL after a grace period, and the launcher
exits with the failed command's status. Killing a local ssh client does not always stop what it started on
the remote host (without a terminal the remote side may see no hang-up); the remote torchrun agents end
anyway once a peer is gone, because their workers' collectives and the rendezvous fail. Ctrl-C (or
SIGTERM) of the launcher stops every command the same way and exits 130 (or 143).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TextIO

GRACE_S = 10.0  # between SIGTERM and SIGKILL
POLL_S = 0.1


def _relay(label: str, stream, out: TextIO, lock: threading.Lock) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        with lock:
            out.write(f"{label}: {line}\n")
            out.flush()
    stream.close()


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def stop_all(processes: Sequence[subprocess.Popen], grace_s: float = GRACE_S) -> None:
    """SIGTERM every running command's process group, SIGKILL those still running after grace_s."""
    running = [p for p in processes if p.poll() is None]
    for process in running:
        _signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in running:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait()


def run_parallel(commands: Sequence[tuple[str, Sequence[str]]], env: Mapping[str, str] | None = None,
                 out: TextIO | None = None, grace_s: float = GRACE_S) -> int:
    """Run (label, argv) commands at once; 0 when all succeed, else the first non-zero status (see the module)."""
    out = out or sys.stdout
    lock = threading.Lock()
    processes, relays = [], []
    interrupted: list[int] = []
    previous = {}

    def on_signal(signum, frame):
        interrupted.append(signum)

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, on_signal)
    try:
        for label, argv in commands:
            process = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, env=None if env is None else dict(env),
                                       start_new_session=True)
            processes.append(process)
            relay = threading.Thread(target=_relay, args=(label, process.stdout, out, lock), daemon=True)
            relay.start()
            relays.append(relay)
        status = 0
        while None in [p.poll() for p in processes]:  # poll every one: any() would stop at the first running
            failed = [p.returncode for p in processes if p.returncode not in (None, 0)]
            if interrupted or failed:
                status = 128 + interrupted[0] if interrupted else failed[0]
                stop_all(processes, grace_s)
                break
            time.sleep(POLL_S)
        else:
            status = next((p.returncode for p in processes if p.returncode != 0), 0)
    finally:
        for process in processes:
            if process.poll() is None:
                _signal_group(process, signal.SIGKILL)
                process.wait()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    for relay in relays:
        relay.join(timeout=5)
    return status
