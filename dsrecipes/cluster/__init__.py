"""Launching dsrecipes on clusters: DeepSpeed hostfiles turned into torchrun commands, and SLURM job scripts.

* `python -m dsrecipes.hostfile` is the hostfile entry: hostfile (parsing and --include/--exclude/--num_nodes/
  --num_gpus), torchrun_commands (the per-node, ssh and pdsh commands), remote_env (.deepspeed_env and the
  forwarded variables), layout (the recipe checked at the hostfile's world size) and ssh_launch (running them).
* `python -m dsrecipes.cluster.slurm torchrun|srun` prints an sbatch template (slurm_*.sbatch, package data).
"""
