"""The slim parent of every CLI command a test runs, and of the workers those commands start.

    context = fork_server()            # multiprocessing's forkserver context, this test process's fork server
    context.Process(target=..., args=...).start()

The fork server is an interpreter of its own (multiprocessing's forkserver) that imports torch, Hydra and
dsrecipes once (PRELOADED) and then only forks: it runs no test, holds no lock and starts no thread, so a child
forked from it is as clean as a fresh `python -m dsrecipes`, without paying the imports again.

A command's launcher (tests/helpers/cli.py's child) asks the same server for its workers: `serve_workers()`
points its multiprocessing forkserver at this server instead of starting a server of its own (which would import
everything again, about 5 s of CPU per launch), and each request first records what a worker must inherit from
its launcher, as fork or spawn would give it: the environment at that moment, the process group (a timeout or
`kill_node` kills the launcher's group, and its workers with it) and the launcher's stdout and stderr. A worker
takes them over as it starts (`_adopt_launcher`, an after-fork hook the server registers at import), before
torch's elastic agent sets its RANK, WORLD_SIZE and friends on top.

Workers do not come from the launcher itself (launcher.start_method=fork): a worker forked while one of the
agent's store threads held glibc's resolver lock waited on it forever at its first connect.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.util
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path

from dsrecipes.launch.workers import FORKSERVER_IMPORTS, FREEZE_PRELOADED, HF_PRELOAD
from tests.helpers.environment import subprocess_env
from tests.helpers.paths import REPO

# faulthandler's signal: a command and its workers print their Python stacks on it (cli.py, on a timeout)
STACKS_SIGNAL = signal.SIGUSR2
# what the server imports once, for every command and worker: the CLI, what the product's fork server imports for
# its workers (transformers' model machinery too: the Hugging Face rows), and this module (it registers the
# workers' hook); then, as the product's does, it freezes all of it
# out of the garbage collector's sight (dsrecipes.launch.freeze_preloaded)
PRELOADED = ("dsrecipes.__main__", *FORKSERVER_IMPORTS, HF_PRELOAD, "tests.helpers.fork_server", FREEZE_PRELOADED)

_lock = threading.Lock()
_context = None


def fork_server():
    """This test process's fork server (multiprocessing's forkserver context), started on first use with the
    environment a subprocess gets, so it never imports dsrecipes under the kernel tests' Triton interpreter."""
    global _context
    with _lock:
        if _context is None:
            from multiprocessing import forkserver

            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(list(PRELOADED))
            saved = dict(os.environ)
            os.environ.clear()
            os.environ.update(subprocess_env(PYTHONPATH=str(REPO)))  # the server imports tests.helpers too
            try:
                forkserver.ensure_running()
            finally:
                os.environ.clear()
                os.environ.update(saved)
            _context = context
        return _context


def print_stacks_on_signal() -> None:
    """This process prints its threads' Python stacks to stderr on STACKS_SIGNAL (a hang's diagnosis)."""
    import faulthandler

    faulthandler.register(STACKS_SIGNAL, file=sys.stderr, all_threads=True)


def _inheritance_file(launcher_pid: int) -> Path:
    return Path(tempfile.gettempdir()) / f"dsrecipes-test-launcher-{launcher_pid}.json"


def serve_workers() -> None:
    """In a command forked from the server: its workers (launcher.start_method=forkserver) come from the same
    server, each inheriting this process's environment, process group and stdout/stderr at its start."""
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if getattr(server, "_forkserver_address", None) is None:  # not a child of the server: a server of its own
        return
    connect = forkserver.connect_to_new_process

    def connect_recording_inheritance(fds):
        _inheritance_file(os.getpid()).write_text(json.dumps({"env": dict(os.environ), "pgid": os.getpgid(0)}))
        return connect(fds)

    server.ensure_running = lambda: None  # the server this process was forked from is running
    forkserver.connect_to_new_process = connect_recording_inheritance


def forget_inheritance() -> None:
    """At a command's end: its inheritance file goes."""
    _inheritance_file(os.getpid()).unlink(missing_ok=True)


class _Hook:
    """The key of the after-fork hook (multiprocessing keeps a weak reference to it)."""


_HOOK = _Hook()


def _adopt_launcher(_) -> None:
    """In every child of the server: a launcher's worker takes over its launcher's environment, process group and
    stdout/stderr, and prints its stacks on STACKS_SIGNAL; a command started by the test process is left alone."""
    parent = multiprocessing.parent_process()
    spec = _inheritance_file(parent.pid) if parent is not None else None
    if spec is None or not spec.is_file():
        return
    inherited = json.loads(spec.read_text())
    os.setpgid(0, inherited["pgid"])
    for fd in (1, 2):
        opened = os.open(f"/proc/{parent.pid}/fd/{fd}", os.O_WRONLY | os.O_APPEND)
        os.dup2(opened, fd)
        os.close(opened)
    os.environ.clear()
    os.environ.update(inherited["env"])
    print_stacks_on_signal()


multiprocessing.util.register_after_fork(_HOOK, _adopt_launcher)
