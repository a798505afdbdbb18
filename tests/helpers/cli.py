"""Run the dsrecipes CLI for a test, offline (W&B offline, no Hugging Face network).

`run_cli(args, cwd)` is `python -m dsrecipes ARGS` run in `cwd`, with the result of subprocess.run. By
default the command runs in a child forked from the test process: the same entry (`dsrecipes.__main__
.main` with sys.argv, as `-m` runs it), in a fresh working directory and environment, its stdout and
stderr in files of its own; torch, Hydra and dsrecipes are then imported once per test process rather
than once per command, and the workers a multi-worker recipe starts are forked from that child
(tests/conftest.py sets launcher.start_method's default to fork), which saves them their imports too:
about 10 s of CPU per process, most of what a short CLI test costs.

A command still running at `timeout` is not just killed: every process of its group (the launcher and the
workers it forked) first prints the Python stacks of all its threads to its stderr (faulthandler, on SIGUSR2),
and the TimeoutExpired raised carries that stderr, so a hang in CI names the line each process waited on.

fresh_interpreter=True (or DSRECIPES_TEST_FRESH_CLI=1 for the whole suite) runs a real `python -m
dsrecipes` subprocess instead. The fork is not used, and the subprocess taken, where the test process
could not hand a clean state to a child: a process group or CUDA already initialised here, or an
`env_extra` naming a variable read when a library is imported (HF_*, a cached constant there).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

from tests.helpers.environment import subprocess_env
from tests.helpers.forking import fork_is_safe

STACKS_SIGNAL = signal.SIGUSR2  # faulthandler's: a forked command and its workers print their stacks on it


def run_cli(args: list[str], cwd, timeout: int = 240, env_extra: dict | None = None,
            fresh_interpreter: bool = False) -> subprocess.CompletedProcess:
    """Run `python -m dsrecipes ARGS` in `cwd`; W&B forced offline, no network."""
    env = subprocess_env(**(env_extra or {}))
    if fresh_interpreter or not _can_fork(env_extra or {}):
        return subprocess.run([sys.executable, "-m", "dsrecipes", *args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout)
    return _forked_cli(list(args), str(cwd), env, timeout)


def _can_fork(env_extra: dict) -> bool:
    return fork_is_safe() and not any(key.startswith("HF_") for key in env_extra)


def _forked_cli(args: list[str], cwd: str, env: dict, timeout: int) -> subprocess.CompletedProcess:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = ForkedCLI(args, cwd, env, out.fileno(), err.fileno())
        try:
            returncode = process.wait(timeout)
        except subprocess.TimeoutExpired as timed_out:
            process.dump_stacks()
            process.kill()
            err.seek(0)
            timed_out.stderr = err.read().decode(errors="replace")
            raise
        out.seek(0)
        err.seek(0)
        stdout, stderr = (f.read().decode(errors="replace") for f in (out, err))
    return subprocess.CompletedProcess(["python", "-m", "dsrecipes", *args], returncode, stdout, stderr)


class ForkedCLI:
    """`python -m dsrecipes ARGS` in a child forked from this process, with subprocess.Popen's pid, poll, wait and
    returncode. The child leads a process group of its own: kill() takes down every worker it started."""

    def __init__(self, args: list[str], cwd: str, env: dict, out_fd: int, err_fd: int):
        import dsrecipes.__main__  # noqa: F401 - imported here once, before the fork, for every later command
        import dsrecipes.training.trainer  # noqa: F401

        self.args, self.returncode = ["python", "-m", "dsrecipes", *args], None
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns into pytest
            _child(args, str(cwd), env, out_fd, err_fd)

    def poll(self) -> int | None:
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.05)
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
        except ProcessLookupError:
            pass
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)


def _child(args: list[str], cwd: str, env: dict, out_fd: int, err_fd: int) -> None:
    code = 1
    try:
        os.setpgid(0, 0)  # its own process group: a timeout kills it with every worker it started
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM):
            signal.signal(sig, signal.SIG_DFL)
        import faulthandler

        faulthandler.register(STACKS_SIGNAL, file=sys.stderr, all_threads=True)  # inherited by forked workers
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        import logging
        import warnings

        _show_warnings_as_python_does(warnings)

        root = logging.getLogger()
        for handler in list(root.handlers):  # pytest's capture handlers belong to the test process
            root.removeHandler(handler)
        from hydra.core.global_hydra import GlobalHydra

        GlobalHydra.instance().clear()
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
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _show_warnings_as_python_does(warnings) -> None:
    """Warnings printed to stderr with the interpreter's default filters: pytest records them in the test
    process (catch_warnings), which the fork would inherit, so a child's warnings would never be shown."""

    def show(message) -> None:
        sys.stderr.write(warnings.formatwarning(message.message, message.category, message.filename, message.lineno,
                                                message.line))

    warnings._showwarnmsg_impl = show
    warnings.showwarning = warnings._showwarning_orig
    warnings.resetwarnings()
    for category in (ResourceWarning, ImportWarning, PendingDeprecationWarning, DeprecationWarning):
        warnings.simplefilter("ignore", category)
    warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
