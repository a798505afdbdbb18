"""Run the dsrecipes CLI for a test, offline (W&B offline, no Hugging Face network).

`run_cli(args, cwd)` is `python -m dsrecipes ARGS` run in `cwd`, with the result of subprocess.run. By
default the command is forked from a slim parent, this test process's fork server (tests/helpers/fork_server.py:
an interpreter that imported torch, Hydra and dsrecipes and does nothing but fork), and so are the workers a
multi-worker recipe starts (tests/conftest.py sets launcher.start_method's default to forkserver, and the
command's launcher asks the same server). The child runs the same entry (`dsrecipes.__main__.main` with
sys.argv, as `-m` runs it) in its working directory and environment, its stdout and stderr in files of its own.
Imports are paid once per test process instead of once per command and worker (about 5 s of CPU per process,
most of what a short CLI test costs), while nothing of the test process reaches the command: not pytest's
threads, locks, warning filters or log handlers, not what earlier tests imported, initialised or left running.

A command still running at `timeout` is not just killed: every process of its group (the launcher and the
workers it forked) first prints the Python stacks of all its threads to its stderr (faulthandler, on SIGUSR2),
and the TimeoutExpired raised carries that stderr, so a hang in CI names the line each process waited on.

fresh_interpreter=True (or DSRECIPES_TEST_FRESH_CLI=1 for the whole suite) runs a real `python -m
dsrecipes` subprocess instead (its workers then come from a fork server of its own launch); so does an
`env_extra` naming a variable read when a library is imported (HF_*, a cached constant there), which the fork
server imported before.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.helpers.environment import subprocess_env
from tests.helpers.fork_server import (
    STACKS_SIGNAL,
    forget_inheritance,
    fork_server,
    print_stacks_on_signal,
    serve_workers,
)
from tests.helpers.forking import forking_turned_off


def run_cli(args: list[str], cwd, timeout: int = 240, env_extra: dict | None = None,
            fresh_interpreter: bool = False) -> subprocess.CompletedProcess:
    """Run `python -m dsrecipes ARGS` in `cwd`; W&B forced offline, no network."""
    env = subprocess_env(**(env_extra or {}))
    if fresh_interpreter or not can_fork(env_extra or {}):
        return subprocess.run([sys.executable, "-m", "dsrecipes", *args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="dsrecipes-cli-") as folder:
        out, err = Path(folder) / "stdout", Path(folder) / "stderr"
        process = ForkedCLI(list(args), str(cwd), env, out, err)
        try:
            returncode = process.wait(timeout)
        except subprocess.TimeoutExpired as timed_out:
            process.dump_stacks()
            process.kill()
            timed_out.stderr = err.read_text(errors="replace")
            raise
        stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
    return subprocess.CompletedProcess(["python", "-m", "dsrecipes", *args], returncode, stdout, stderr)


def can_fork(env_extra: dict) -> bool:
    """Whether the command may come from the fork server (see the module docstring)."""
    return not forking_turned_off() and not any(key.startswith("HF_") for key in env_extra)


class ForkedCLI:
    """`python -m dsrecipes ARGS` forked from the fork server, with subprocess.Popen's pid, poll, wait and
    returncode; its stdout and stderr go to the files `out` and `err`. The child leads a process group of its own:
    kill() takes down every worker it started."""

    def __init__(self, args: list[str], cwd: str, env: dict, out, err):
        self.args, self.returncode = ["python", "-m", "dsrecipes", *args], None
        self._process = fork_server().Process(target=_child, args=(list(args), str(cwd), env, str(out), str(err)),
                                               name="dsrecipes-cli")
        self._process.start()
        self.pid = self._process.pid

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def dump_stacks(self, wait_s: float = 3.0) -> None:
        """Every process of the command's group prints its threads' Python stacks to its stderr (a hang's diagnosis)."""
        try:
            os.killpg(self.pid, STACKS_SIGNAL)
        except ProcessLookupError:
            return
        time.sleep(wait_s)

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:  # not yet the leader of its group, or gone
            self._process.kill()
        self._process.join()
        self.poll()


def _child(args: list[str], cwd: str, env: dict, out: str, err: str) -> None:
    """The command, in the fork server's child: its own process group, files, directory and environment."""
    code = 1
    try:
        os.setpgid(0, 0)  # its own process group: a timeout kills it with every worker it started
        for fd, path in ((1, out), (2, err)):  # appending: the workers write to the same files (fork_server.py)
            opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
            os.dup2(opened, fd)
            os.close(opened)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        print_stacks_on_signal()  # its workers do the same as they start (fork_server._adopt_launcher)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        serve_workers()
        import dsrecipes.__main__ as cli

        sys.argv = ["dsrecipes", *args]
        try:
            cli.main()
            code = 0
        except SystemExit as error:
            code = error.code if isinstance(error.code, int) else (0 if error.code is None else 1)
        except BaseException:  # noqa: BLE001 - the traceback is what a subprocess would print
            import traceback

            traceback.print_exc()
            code = 1
    finally:
        try:
            forget_inheritance()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
