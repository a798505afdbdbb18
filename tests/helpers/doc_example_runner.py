"""Run a list of documentation example steps (README.md and docs/) in order, in one interpreter where faithful.

    python tests/helpers/doc_example_runner.py PLAN.json RESULTS.json

tests/docs/test_doc_examples.py writes the plan.

PLAN.json: [{"id", "kind", "argv", "log", "cwd"}, ...] with kind
  * "dsrecipes": `python -m dsrecipes ARGV`, run here as `sys.argv = ["dsrecipes", *ARGV]; main()` (what the
    module does after its imports: Hydra parses sys.argv, a multirun or multi-worker recipe spawns its own
    processes as usual), so torch, Hydra and the data stack are imported once for every command;
  * "module": `python -m MODULE ARGV` (argv[0] is the module), run here with runpy as `-m` would;
  * "dsrecipes-validate": the same, up to the point where the CLI would start its worker processes:
    composition, recipe validation at the workers' world size and the run directory happen, then
    `dsrecipes.launch.workers.spawn_workers` is replaced by a stub that logs "spawn_workers: N workers not
    started" (for recipes whose worker count the test machine cannot afford);
  * "process": any other command line (torchrun, a Python script), run as a subprocess; "{free_port}" in
    a value of its "env" becomes a port that is free at launch.
Each step's stdout and stderr (its child processes' too) go to its log file; RESULTS.json maps each id to
{"rc", "seconds", "cpu_s"} (wall and CPU time, children included). Steps run in plan order, so a step
may read what an earlier one wrote.
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
import time
from contextlib import contextmanager


@contextmanager
def _output_to(path: str):
    """Point file descriptors 1 and 2 (and so sys.stdout/err and every child process) at `path`."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab", buffering=0) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def _exit_code(error: SystemExit) -> int:
    code = error.code
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _in_process(call) -> int:
    import traceback

    try:
        call()
        return 0
    except SystemExit as error:
        return _exit_code(error)
    except BaseException:  # noqa: BLE001 - reported in the step's log, the next step still runs
        traceback.print_exc()
        return 1


def _cpu_seconds() -> float:
    """User + system CPU of this process and of its finished children (workers, subprocesses)."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_step(step: dict) -> int:
    argv = step["argv"]
    os.chdir(step["cwd"])
    if step["kind"] in ("dsrecipes", "dsrecipes-validate"):
        import dsrecipes.__main__ as cli
        import dsrecipes.launch.workers as launch

        sys.argv = ["dsrecipes", *argv]
        if step["kind"] == "dsrecipes":
            return _in_process(cli.main)
        spawn = launch.spawn_workers

        def not_spawned(nproc, *args, **kwargs):
            print(f"spawn_workers: {nproc} workers not started", flush=True)
            return {}

        launch.spawn_workers = not_spawned
        try:
            return _in_process(cli.main)
        finally:
            launch.spawn_workers = spawn
    if step["kind"] == "module":
        sys.argv = [argv[0], *argv[1:]]
        return _in_process(lambda: runpy.run_module(argv[0], run_name="__main__", alter_sys=True))
    env = {key: value.format(free_port=_free_port()) for key, value in step.get("env", {}).items()}
    return subprocess.run(argv, cwd=step["cwd"], env={**os.environ, **env}).returncode


def _free_port() -> int:
    """A port free now (picked right before the launch that binds it, so parallel test workers do not collide)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    plan_path, results_path = sys.argv[1:3]
    with open(plan_path) as f:
        plan = json.load(f)
    results: dict[str, dict] = {}
    saved_argv = list(sys.argv)
    for step in plan:
        started, cpu = time.perf_counter(), _cpu_seconds()
        with _output_to(step["log"]):
            print(f"$ {step['display']}", flush=True)
            rc = run_step(step)
        sys.argv = saved_argv
        results[step["id"]] = {"rc": rc, "seconds": round(time.perf_counter() - started, 2),
                               "cpu_s": round(_cpu_seconds() - cpu, 2)}
        with open(results_path, "w") as f:  # written after every step: a timeout still reports the finished ones
            json.dump(results, f, indent=1)
        print(f"{step['id']}: rc {rc}, {results[step['id']]['seconds']} s", flush=True)


if __name__ == "__main__":
    main()
