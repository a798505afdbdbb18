"""Stopping a run on SIGINT / SIGTERM: every process ends within seconds, loggers closed, no traceback.

Ctrl-C reaches every process of the job (the launching process and its workers share the
terminal's process group); a scheduler's SIGTERM (SLURM, Kubernetes) reaches the launching
process, whose elastic agent passes it on to the workers. `stop_on_signals()` turns SIGTERM into
the same KeyboardInterrupt Ctrl-C raises and records which signal came, so the Trainer's loop ends
where it is, its `finally` closes the loggers, and the entry points (dsrecipes.__main__, the
workers in dsrecipes.launch.workers) exit with 128 + the signal's number and one line instead of a
traceback. A rank blocked in a collective whose peer already stopped raises a RuntimeError instead;
`received_signal()` tells the entry point that the run was being stopped all the same.

A checkpoint save holds the signal back (`signals_held()`): stopping half-way through the writes would leave
no new checkpoint, and the save is seconds. The first signal during a save is kept and raised the moment the
save is done (so the run stops with that checkpoint complete and named in its log); a second one, from a user
who will not wait, stops it at once.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

_RECEIVED: list[int] = []
_HELD = {"depth": 0, "pending": False}  # signals_held() nesting, and whether it holds a signal back


def _on_signal(signum, frame) -> None:
    """The first signal stops the run; later ones (the agent passes Ctrl-C on to workers that got it from the
    terminal too) are ignored, so they cannot raise again while the process is already shutting down."""
    if _RECEIVED:
        if _HELD["pending"]:  # a second signal while a save holds the first: stop now
            _HELD["pending"] = False
            raise KeyboardInterrupt(signal.Signals(signum).name)
        return
    _RECEIVED.append(signum)
    if _HELD["depth"]:
        _HELD["pending"] = True
        return
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold a SIGINT/SIGTERM (stop_on_signals' KeyboardInterrupt) back until the block is done, then raise it.

    For a checkpoint save: its writes finish, then the run stops as it would have. Nested blocks raise at the
    outermost exit; a block that raises itself propagates its own error (the signal stays recorded)."""
    _HELD["depth"] += 1
    try:
        yield
    finally:
        _HELD["depth"] -= 1
    if not _HELD["depth"] and _HELD["pending"]:
        _HELD["pending"] = False
        raise KeyboardInterrupt(signal_name(received_signal()))


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
