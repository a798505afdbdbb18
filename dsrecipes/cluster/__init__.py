"""Multi-node launching from a DeepSpeed hostfile: parse it, pick the slots, and turn it into torchrun commands.

`python -m dsrecipes.hostfile` is the entry; hostfile (parsing and --include/--exclude/--num_nodes/--num_gpus),
torchrun_commands (the per-node, ssh and pdsh commands), remote_env (.deepspeed_env and the forwarded
variables), layout (the recipe checked at the hostfile's world size) and ssh_launch (running them) do the work.
"""
