"""A pretend SLURM allocation on this machine, to run the shipped sbatch templates as sbatch would.

`fake_slurm_bin(folder)` writes executables a template calls into `folder`:

* `srun` starts its command once per task, here, with the variables real srun gives each task
  (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS, SLURM_NNODES, SLURM_NTASKS_PER_NODE,
  SLURMD_NODENAME; SLURM_JOB_ID and SLURM_JOB_NODELIST come from the job). Its task count comes from
  --nodes / --ntasks-per-node / --ntasks, else from the allocation (SLURM_NNODES, SLURM_NTASKS_PER_NODE),
  as srun inside sbatch takes it. It waits for every task and exits with the first failure's status;
  with --kill-on-bad-exit=1 the other tasks are stopped then (SIGTERM).
* `scontrol show hostnames [LIST]` prints the names of a comma-separated node list, one a line
  (real nodelists are compressed, node[01-02]; the fake job uses plain names).
* `python` and `torchrun` run this interpreter, so the templates start the dsrecipes under test.

`job_environment(...)` is what sbatch puts in the batch script's environment for such an allocation.
Every "node" is this machine: the node names must resolve here (localhost, 127.0.0.1).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

_SRUN = r'''
import os, signal, subprocess, sys, time

VALUED = {"--nodes", "-N", "--ntasks", "-n", "--ntasks-per-node", "--cpus-per-task", "-c"}
args, opts = sys.argv[1:], {}
while args and args[0].startswith("-"):
    flag = args.pop(0)
    if "=" in flag:
        flag, value = flag.split("=", 1)
    else:
        value = args.pop(0) if flag in VALUED else "1"
    opts[flag] = value
env = os.environ
nodes = int(opts.get("--nodes", opts.get("-N", env["SLURM_NNODES"])))
per_node = int(opts.get("--ntasks-per-node", env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0]))
ntasks = int(opts.get("--ntasks", opts.get("-n", nodes * per_node)))
hosts = env["SLURM_JOB_NODELIST"].split(",")
tasks = []
for rank in range(ntasks):
    node = rank // per_node
    tasks.append(subprocess.Popen(args, env=dict(
        env, SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank % per_node), SLURM_NODEID=str(node),
        SLURM_NTASKS=str(ntasks), SLURM_NPROCS=str(ntasks), SLURM_NNODES=str(nodes),
        SLURM_NTASKS_PER_NODE=str(per_node), SLURMD_NODENAME=hosts[node], SLURM_STEP_ID="0")))
failure = 0
while any(task.poll() is None for task in tasks):
    codes = [task.poll() for task in tasks]
    if not failure and any(code for code in codes if code is not None):
        failure = next(code for code in codes if code)
        if opts.get("--kill-on-bad-exit", "0") != "0":
            for task in tasks:
                if task.poll() is None:
                    task.send_signal(signal.SIGTERM)
    time.sleep(0.1)
codes = [task.returncode for task in tasks]
failure = failure or next((code for code in codes if code), 0)
sys.exit(failure if failure > 0 else (128 - failure if failure else 0))
'''

_SCONTROL = r'''
import os, sys

if sys.argv[1:2] != ["show"] or sys.argv[2:3] != ["hostnames"]:
    sys.exit(f"fake scontrol: only 'scontrol show hostnames [LIST]', not {sys.argv[1:]}")
nodelist = sys.argv[3] if len(sys.argv) > 3 else os.environ["SLURM_JOB_NODELIST"]
print("\n".join(nodelist.split(",")))
'''


def fake_slurm_bin(folder: Path) -> Path:
    """Write srun, scontrol, python and torchrun into `folder` (see the module docstring); returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    scripts = {
        "srun": f"#!{sys.executable}\n{_SRUN}",
        "scontrol": f"#!{sys.executable}\n{_SCONTROL}",
        "python": f'#!/bin/sh\nexec "{sys.executable}" "$@"\n',
        "torchrun": f'#!/bin/sh\nexec "{sys.executable}" -m torch.distributed.run "$@"\n',
    }
    for name, text in scripts.items():
        path = folder / name
        path.write_text(text)
        path.chmod(0o755)
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_environment(bin_dir: Path, nodes: int, tasks_per_node: int, extra: dict | None = None) -> dict:
    """The batch script's environment in an allocation of `nodes` x `tasks_per_node` tasks, all of them here:
    the fake executables first on PATH, no launcher variables of the test process's own, offline."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("SLURM_", "SUBMITIT_", "TORCHELASTIC_"))
           and key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    hosts = ["localhost", "127.0.0.1"][:nodes]
    assert len(hosts) == nodes, "the fake allocation has at most two node names"
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        SLURM_JOB_ID="4242", SLURM_JOB_NAME="dsrecipes", SLURM_JOB_NODELIST=",".join(hosts),
        SLURM_NNODES=str(nodes), SLURM_JOB_NUM_NODES=str(nodes), SLURM_NTASKS=str(nodes * tasks_per_node),
        SLURM_NTASKS_PER_NODE=str(tasks_per_node), SLURM_CPUS_PER_TASK="1", SLURM_NODEID="0", SLURM_PROCID="0", SLURM_LOCALID="0",
        MASTER_PORT=str(free_port()),  # the templates' default 29500 might be taken by another test here
        OMP_NUM_THREADS="1", WANDB_MODE="offline", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
    )
    env.pop("WANDB_API_KEY", None)
    env.update(extra or {})
    return env
