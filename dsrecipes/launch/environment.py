"""Whether a launcher (torchrun, srun, a submitit job) started this process, read from its environment variables.

torch.distributed's env:// rendezvous reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT. torchrun sets
them; the others describe their tasks in their own variables, which are mapped here once, before the
process joins a group:

* a task of a submitit job (Hydra's hydra/launcher=slurm or slurm_local): submitit's own
  TorchDistributedEnvironment reads its job environment, SLURM_* on a cluster and SUBMITIT_LOCAL_*
  under the local executor (which sets no SLURM_* variable at all);
* a task that srun started (an sbatch script, dsrecipes/launch/slurm_srun.sbatch): SLURM_PROCID,
  SLURM_NTASKS, SLURM_LOCALID; the script exports MASTER_ADDR and MASTER_PORT.

A process whose RANK is set already (torchrun, also inside a SLURM job) is left alone, and so is a job
of one task, which trains in its own process or spawns its workers (launcher.nproc_per_node).
"""

from __future__ import annotations

import os


def adopt_submitit_environment() -> None:
    """In a task of a submitit job of several tasks: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE from submitit's
    job environment, and MASTER_ADDR (the job's first host) / MASTER_PORT where the job's setup did not export them
    (submitit derives the port from the job id, so every task of a job picks the same one)."""
    env = os.environ
    if "RANK" in env or not env.get("SUBMITIT_EXECUTOR"):
        return
    try:
        from submitit.helpers import TorchDistributedEnvironment
    except ImportError as error:  # an older submitit (TorchDistributedEnvironment came in 1.5)
        raise ValueError(f"this submitit job has several tasks, which needs submitit>=1.5 "
                         f"(submitit.helpers.TorchDistributedEnvironment): {error}") from None
    job = TorchDistributedEnvironment()
    if job.world_size <= 1:
        return
    env.setdefault("MASTER_ADDR", str(job.master_addr))
    env.setdefault("MASTER_PORT", str(job.master_port))
    env["RANK"], env["WORLD_SIZE"] = str(job.rank), str(job.world_size)
    env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"] = str(job.local_rank), str(job.local_world_size)


def adopt_slurm_environment() -> None:
    """Under srun (an sbatch script, or a submitit job) map SLURM's task variables to torch's RANK names."""
    adopt_submitit_environment()
    env = os.environ
    if "RANK" in env or int(env.get("SLURM_NTASKS", "1")) <= 1 or "SLURM_PROCID" not in env:
        return
    env["RANK"], env["WORLD_SIZE"] = env["SLURM_PROCID"], env["SLURM_NTASKS"]
    env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
    env.setdefault("LOCAL_WORLD_SIZE", env.get("SLURM_NTASKS_PER_NODE", env["SLURM_NTASKS"]).split("(")[0])


def under_launcher() -> bool:
    """True when torchrun, srun (SLURM), a submitit job of several tasks or another launcher already started this process."""
    adopt_slurm_environment()
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ
