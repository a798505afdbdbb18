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
* `sbatch SCRIPT` starts the script at once, here, in the background, as a job of the --nodes x
  --ntasks-per-node its #SBATCH lines ask for (one job per index of --array), and prints
  "Submitted batch job N"; `sacct -j N` reports its state and `scancel` does nothing: enough for
  submitit's SLURM executor (Hydra's hydra/launcher=slurm) to submit and follow its jobs.
* `python` and `torchrun` run this interpreter, so the templates start the dsrecipes under test.

`job_environment(...)` is what sbatch puts in the batch script's environment for such an allocation.
Every "node" is this machine: the node names must resolve here (localhost, 127.0.0.1).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

from tests.helpers.environment import subprocess_env

_SRUN = r'''
import os, signal, subprocess, sys, time

SHORT = {"-N": "--nodes", "-n": "--ntasks", "-c": "--cpus-per-task", "-o": "--output", "-e": "--error"}
VALUED = {"--nodes", "--ntasks", "--ntasks-per-node", "--cpus-per-task", "--output", "--error"}
args, opts = sys.argv[1:], {}
while args and args[0].startswith("-"):
    flag = args.pop(0)
    flag, value = flag.split("=", 1) if "=" in flag else (flag, None)
    flag = SHORT.get(flag, flag)
    opts[flag] = value if value is not None else (args.pop(0) if flag in VALUED else "1")
env = os.environ
nodes = int(opts.get("--nodes", env["SLURM_NNODES"]))
per_node = int(opts.get("--ntasks-per-node", env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0]))
ntasks = int(opts.get("--ntasks", nodes * per_node))
hosts = env["SLURM_JOB_NODELIST"].split(",")


def task_file(flag, rank):  # --output/--error: %j job id, %A/%a array job id/index, %t task rank
    pattern = opts.get(flag)
    if pattern is None:
        return None
    for key, value in (("%A", env.get("SLURM_ARRAY_JOB_ID", "")), ("%a", env.get("SLURM_ARRAY_TASK_ID", "")),
                       ("%j", env["SLURM_JOB_ID"]), ("%t", str(rank))):
        pattern = pattern.replace(key, value)
    # the job starts at once here, maybe before submitit has made the array job's folder (a queue leaves it time)
    os.makedirs(os.path.dirname(pattern) or ".", exist_ok=True)
    return open(pattern, "a")


tasks = []
for rank in range(ntasks):
    node = rank // per_node
    tasks.append(subprocess.Popen(args, stdout=task_file("--output", rank), stderr=task_file("--error", rank), env=dict(
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


_SBATCH = r'''
import os, re, subprocess, sys
from pathlib import Path

script = Path(sys.argv[-1])
options = dict(re.findall(r"^#SBATCH --([\w-]+)=?(.*)$", script.read_text(), re.M))
nodes, per_node = int(options.get("nodes", "1")), int(options.get("ntasks-per-node", "1"))
hosts = ["localhost", "127.0.0.1"][:nodes]
jobs = Path(__file__).parent / "jobs"
jobs.mkdir(exist_ok=True)
# job ids differ between test runs (submitit derives the rendezvous port from the id: two runs at once must not meet)
base = 1_000_000 + 1000 * (os.getpid() % 9000) + 100 * len(list(jobs.glob("*.submitted")))
(jobs / f"{base}.submitted").write_text(str(script))
indices = [None]
if "array" in options:  # --array=0-3%2, --array=0,2: one job per index
    indices = [i for part in options["array"].split("%")[0].split(",")
               for i in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)]
for k, index in enumerate(indices):
    job_id = str(base + k)
    env = dict(os.environ, SLURM_JOB_ID=job_id, SLURM_JOB_NODELIST=",".join(hosts), SLURM_NNODES=str(nodes),
               SLURM_JOB_NUM_NODES=str(nodes), SLURM_NTASKS=str(nodes * per_node), SLURM_NTASKS_PER_NODE=str(per_node),
               SLURM_CPUS_PER_TASK=options.get("cpus-per-task", "1"), SLURM_NODEID="0", SLURM_PROCID="0",
               SLURM_LOCALID="0")
    name = str(base)
    if index is not None:
        env.update(SLURM_ARRAY_JOB_ID=str(base), SLURM_ARRAY_TASK_ID=str(index))
        name = f"{base}_{index}"
    state = jobs / f"{name}.state"
    state.write_text("RUNNING")
    with open(jobs / f"{name}.out", "w") as out:  # the job outlives sbatch, in a process group of its own
        job = subprocess.Popen(["bash", "-c", 'if bash "$0"; then s=COMPLETED; else s=FAILED; fi; echo $s > "$1"',
                                str(script), str(state)], env=env, stdout=out, stderr=subprocess.STDOUT,
                               start_new_session=True)
    (jobs / f"{name}.pid").write_text(str(job.pid))
print(f"Submitted batch job {base}")
'''

_SACCT = r'''
import sys
from pathlib import Path

ids = [sys.argv[i + 1] for i, arg in enumerate(sys.argv) if arg == "-j"]
print("JobID|State|NodeList")
for state in sorted((Path(__file__).parent / "jobs").glob("*.state")):
    if state.stem.split("_")[0] in ids:
        print(f"{state.stem}|{state.read_text().strip()}|localhost")
'''


def fake_slurm_bin(folder: Path) -> Path:
    """Write srun, scontrol, python and torchrun into `folder` (see the module docstring); returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    scripts = {
        "srun": f"#!{sys.executable}\n{_SRUN}",
        "scontrol": f"#!{sys.executable}\n{_SCONTROL}",
        "sbatch": f"#!{sys.executable}\n{_SBATCH}",
        "sacct": f"#!{sys.executable}\n{_SACCT}",
        "scancel": "#!/bin/sh\nexit 0\n",
        "python": f'#!/bin/sh\nexec "{sys.executable}" "$@"\n',
        "torchrun": f'#!/bin/sh\nexec "{sys.executable}" -m torch.distributed.run "$@"\n',
    }
    for name, text in scripts.items():
        path = folder / name
        path.write_text(text)
        path.chmod(0o755)
    return folder


def stop_fake_jobs(folder: Path) -> None:
    """Kill whatever the fake sbatch in `folder` started that still runs (a test that failed or timed out)."""
    for pid_file in (folder / "jobs").glob("*.pid"):
        try:
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_environment(bin_dir: Path, nodes: int, tasks_per_node: int, extra: dict | None = None) -> dict:
    """The batch script's environment in an allocation of `nodes` x `tasks_per_node` tasks, all of them here:
    the fake executables first on PATH, no launcher variables of the test process's own, offline."""
    env = subprocess_env({key: value for key, value in os.environ.items()
                          if not key.startswith(("SLURM_", "SUBMITIT_", "TORCHELASTIC_"))
                          and key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                          "MASTER_PORT")})
    hosts = ["localhost", "127.0.0.1"][:nodes]
    assert len(hosts) == nodes, "the fake allocation has at most two node names"
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        SLURM_JOB_ID="4242", SLURM_JOB_NAME="dsrecipes", SLURM_JOB_NODELIST=",".join(hosts),
        SLURM_NNODES=str(nodes), SLURM_JOB_NUM_NODES=str(nodes), SLURM_NTASKS=str(nodes * tasks_per_node),
        SLURM_NTASKS_PER_NODE=str(tasks_per_node), SLURM_CPUS_PER_TASK="1", SLURM_NODEID="0", SLURM_PROCID="0", SLURM_LOCALID="0",
        MASTER_PORT=str(free_port()),  # the templates' default 29500 might be taken by another test here
        OMP_NUM_THREADS="1",
    )
    env.update(extra or {})
    return env
