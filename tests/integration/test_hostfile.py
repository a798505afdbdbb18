"""The multi-process, CLI and launcher tests (marked slow) whose in-process twins are tests/unit/test_hostfile.py;
that module's docstring describes both halves.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsrecipes.launch.ssh_launch import run_parallel
from tests.helpers.environment import subprocess_env
from tests.unit.test_hostfile import TWO_BY_FOUR, write


def test_parallel_ssh_prefixes_lines_and_stops_the_others_on_a_failure(tmp_path):
    import io

    out = io.StringIO()
    started = time.monotonic()
    status = run_parallel([("slow", ["bash", "-c", "echo started; sleep 60; echo never"]),
                           ("bad", ["bash", "-c", "sleep 0.5; echo one; echo two >&2; exit 3"])], out=out, grace_s=5)
    assert status == 3 and time.monotonic() - started < 30  # the sleeper was stopped
    lines = out.getvalue().splitlines()
    assert sorted(lines) == ["bad: one", "bad: two", "slow: started"]
    assert run_parallel([("a", ["true"]), ("b", ["true"])], out=io.StringIO()) == 0


# (c) bad input ------------------------------------------------------------------------------------------------

@pytest.fixture
def fake_ssh(tmp_path) -> Path:
    """A directory with an `ssh` that drops the host and runs the remote command here, recording each call."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write(bin_dir / "ssh", f'#!/bin/bash\necho "$@" >> {tmp_path}/ssh_calls\nshift\nexec bash -c "$*"\n').chmod(0o755)
    return bin_dir


def run_hostfile_cli(args: list[str], cwd: Path, bin_dir: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    env = subprocess_env({k: v for k, v in os.environ.items() if k not in ("DSRECIPES_DEBUG", "HYDRA_FULL_ERROR")})
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "dsrecipes.launch.hostfile", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


BAD_INPUTS = {
    "bad_line": ("worker-0 slots=4\nworker-1 slot=4\n", [], ["hosts line 2: 'worker-1 slot=4' is not a hostfile entry",
                                                             "`hostname slots=N`"]),
    "duplicate_host": ("worker-0 slots=2\nworker-1 slots=2\nworker-0 slots=2\n", [],
                       ["hosts line 3", "host worker-0 is listed again (first on line 1)"]),
    "zero_slots": ("worker-0 slots=0\n", [], ["hosts line 1: 'worker-0 slots=0': slots=0 is not valid", "whole number >= 1"]),
    "non_integer_slots": ("worker-0 slots=four\n", [], ["hosts line 1", "slots=four is not valid"]),
    "empty": ("# nothing\n\n", [], ["hosts lists no hosts"]),
    "unknown_include_host": (TWO_BY_FOUR, ["--include", "worker-0@worker-9:0"],
                             ["--include 'worker-0@worker-9:0': host worker-9 is not in hosts (its hosts: worker-0, worker-1)"]),
    "unknown_slot": (TWO_BY_FOUR, ["--exclude", "worker-1:4"], ["worker-1 has no slot 4 in hosts (its slots: 0-3)"]),
    "include_and_exclude": (TWO_BY_FOUR, ["-i", "worker-0", "-e", "worker-1"], ["give one of them, not both"]),
    "num_nodes_beyond_hostfile": (TWO_BY_FOUR, ["--num_nodes", "3"], ["--num_nodes 3 but hosts lists 2 host(s)"]),
    "unequal_slots": ("worker-0 slots=4\nworker-1 slots=2\n", [], ["the same number of processes on every node",
                                                                   "(worker-0: 4, worker-1: 2)"]),
    "loopback_endpoint": ("localhost slots=1\nworker-1 slots=1\n", [],
                          ["the rendezvous address localhost is this machine's loopback, which worker-1 cannot reach"]),
    "launcher_nproc": (TWO_BY_FOUR, ["launcher.nproc_per_node=4"], ["launcher.nproc_per_node=4: not used"]),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_and_status_2_before_anything_runs(case, tmp_path, fake_ssh):
    text, args, fragments = BAD_INPUTS[case]
    write(tmp_path / "hosts", text)
    result = run_hostfile_cli(["hosts", "--launch", "ssh", *args, "model=gpt_debug"], tmp_path, fake_ssh)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dsrecipes.launch.hostfile: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]
    assert not (tmp_path / "ssh_calls").exists()


def test_launch_pdsh_without_pdsh_says_so(tmp_path, fake_ssh):
    write(tmp_path / "hosts", TWO_BY_FOUR)
    env = {"PATH": str(fake_ssh), "HOME": str(tmp_path)}  # no pdsh on this PATH
    result = subprocess.run([sys.executable, "-m", "dsrecipes.launch.hostfile", "hosts", "--launch", "pdsh"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == ("dsrecipes.launch.hostfile: error: --launch pdsh but pdsh is not installed here "
                                     "(not on PATH); install it, or use --launch ssh")


def test_a_layout_that_does_not_fit_the_slots_stops_before_ssh(tmp_path, fake_ssh):
    write(tmp_path / "hosts", "worker-0 slots=1\nworker-1 slots=1\n")
    result = run_hostfile_cli(["hosts", "--launch", "ssh", "model=gpt_debug", "parallel.tp=4"], tmp_path, fake_ssh)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "dsrecipes.launch.hostfile: error: hostfile hosts gives 2 slots (worker-0: 1, worker-1: 1): parallel.tp=4 x "
        "parallel.sp=1 x parallel.pp=1 = 4 does not divide the world size 2; the product must be one of: 1, 2"]
    assert not (tmp_path / "ssh_calls").exists() and not (tmp_path / "outputs").exists()


# (d) end to end -----------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.matrix
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_hosts_over_ssh_train_as_world_2(tmp_path, fake_ssh, datasets_cache):
    """Both "hosts" are this machine, so both torchrun agents take the endpoint 127.0.0.1 for their own and try to
    host the c10d store: the one that loses the bind (EADDRINUSE) joins as a client, torch's c10d backend's own
    fallback for agents of one rendezvous on one machine. Rank 0 claims the one run directory for both."""
    write(tmp_path / "hosts", "localhost slots=1\n127.0.0.1 slots=1\n")
    result = run_hostfile_cli(
        ["hosts", "--launch", "ssh", "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
         "model=gpt_debug", "model.max_seq_len=64", "trainer.max_steps=3", "trainer.eval_batches=1", "trainer.sample_tokens=0",
         "data.max_bytes=300000", f"data.cache_dir={datasets_cache}", "logger=jsonl", "zero.stage=3"],
        tmp_path, fake_ssh, timeout=540)
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    calls = (tmp_path / "ssh_calls").read_text().splitlines()
    assert sorted(call.split()[0] for call in calls) == ["127.0.0.1", "localhost"]
    assert "--nnodes 2" in calls[0] and "--nproc-per-node 1" in calls[0]
    runs = list(tmp_path.glob("outputs/*/*_gpt"))
    assert len(runs) == 1, runs
    assert sorted(p.name for p in (runs[0] / "logs").iterdir()) == ["rank0.log", "rank1.log"]
    assert "world 2 = pp 1 x dp 2" in (runs[0] / "logs" / "rank0.log").read_text()
    prefixes = {line.split(": ", 1)[0] for line in result.stdout.splitlines() if ": " in line}
    assert {"localhost", "127.0.0.1"} <= prefixes  # every line of the nodes' output carries its host
