"""Everything that starts dsrecipes' processes, on one machine or many.

* workers: `python -m dsrecipes` spawns its workers through torch's elastic agent, or joins a launcher
  (torchrun, srun) that started them; environment tells which launcher did; multinode is how the nodes of
  `launcher.nnodes=N` agree and meet; freeze_preloaded ends the preload of launcher.start_method=forkserver's
  server (what it imported, out of the garbage collector's sight).
* `python -m dsrecipes.launch.hostfile` launches on the hosts of a DeepSpeed hostfile: hostfile (parsing,
  --include/--exclude/--num_nodes/--num_gpus, the command), torchrun_commands (the per-node, ssh and pdsh
  commands), remote_env (.deepspeed_env and the forwarded variables), layout (the recipe checked at the
  hostfile's world size) and ssh_launch (running them).
* `python -m dsrecipes.launch.slurm torchrun|srun` prints an sbatch template (slurm_*.sbatch, package data).

The package imports nothing itself: `python -m dsrecipes.launch.hostfile` and the SLURM templates load without torch.
"""
