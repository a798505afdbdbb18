"""Whether a launcher (torchrun, srun) started this process, read from its environment variables."""

from __future__ import annotations

import os


def adopt_slurm_environment() -> None:
    """Under srun (e.g. Hydra's submitit launcher) map SLURM's task variables to torch's RANK names."""
    env = os.environ
    if "RANK" in env or int(env.get("SLURM_NTASKS", "1")) <= 1 or "SLURM_PROCID" not in env:
        return
    env["RANK"], env["WORLD_SIZE"] = env["SLURM_PROCID"], env["SLURM_NTASKS"]
    env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
    env.setdefault("LOCAL_WORLD_SIZE", env.get("SLURM_NTASKS_PER_NODE", env["SLURM_NTASKS"]).split("(")[0])


def under_launcher() -> bool:
    """True when torchrun, srun (SLURM) or another launcher already started this process."""
    adopt_slurm_environment()
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ
