"""Stopping a run on SIGINT / SIGTERM: every process ends within seconds, loggers closed, no traceback.

Ctrl-C reaches every process of the job (the launching process and its workers share the
terminal's process group); a scheduler's SIGTERM (SLURM, Kubernetes) reaches the launching
process, whose elastic agent passes it on to the workers. `stop_on_signals()` turns SIGTERM into
the same KeyboardInterrupt Ctrl-C raises and records which signal came, so the Trainer's loop ends
where it is, its `finally` closes the loggers, and the entry points (dsrecipes.__main__, the
workers in dsrecipes.launch.workers) exit with 128 + the signal's number and one line instead of a
traceback. A rank blocked in a collective whose peer already stopped raises a RuntimeError instead;
`received_signal()` tells the entry point that the run was being stopped all the same.
"""

from __future__ import annotations

import signal
import threading

_RECEIVED: list[int] = []


def _on_signal(signum, frame) -> None:
    """The first signal stops the run; later ones (the agent passes Ctrl-C on to workers that got it from the
    terminal too) are ignored, so they cannot raise again while the process is already shutting down."""
    if _RECEIVED:
        return
    _RECEIVED.append(signum)
    raise KeyboardInterrupt(signal.Signals(signum).name)


def stop_on_signals() -> None:
    """Raise KeyboardInterrupt on SIGINT and SIGTERM from now on (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _on_signal)


def received_signal() -> int | None:
    """The first SIGINT/SIGTERM this process received since stop_on_signals(), else None."""
    return _RECEIVED[0] if _RECEIVED else None


def exit_code(signum: int | None) -> int:
    """The shell's convention for a process ended by a signal: 128 + its number (130 for Ctrl-C)."""
    return 128 + (signum or signal.SIGINT)


def signal_name(signum: int | None) -> str:
    return signal.Signals(signum or signal.SIGINT).name
