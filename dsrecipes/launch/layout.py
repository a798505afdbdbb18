"""The recipe checked at the hostfile's world size before any node starts, and what launcher.* means there.

world = nodes x processes per node. The recipe is composed with the user's overrides, as each worker will
compose it, and validated with validate_recipe at that world size, so a layout that does not fit
(parallel.tp x sp x pp not dividing the world, zero.hybrid_shard_size, the batch triple, ...) stops here
with the recipe's own message behind `hostfile PATH gives W slots (host: n, ...)`. The checks that depend on
the machine (launcher.backend=nccl needs CUDA, precision=auto, nvme paths) are this machine's: run the
command from one of the nodes (DeepSpeed's users run `deepspeed --hostfile` from node 0).

The launcher group configures `python -m dsrecipes` spawning its own workers; under torchrun the workers join
instead, so its keys are sorted here:

* launcher.nproc_per_node: refused; the hostfile's slots (and --num_gpus / --include / --exclude) set the
  processes per node, which is torchrun's --nproc-per-node;
* launcher.nnodes / node_rank / rdzv_endpoint / rdzv_id / rdzv_timeout_s: refused; the hosts are the nodes;
* launcher.max_restarts=N, launcher.start_method=M: the agent's settings, so they become torchrun's
  --max-restarts N / --start-method M (restarted workers resume from the newest checkpoint, as they do
  under dsrecipes' own agent) and are not passed to the workers, which would only warn they have no effect;
* launcher.backend, launcher.collective_timeout_s: the workers' own settings, passed through.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the hostfile module imports this one: the type only, for annotations
    from dsrecipes.launch.hostfile import Node


_NODES_FROM_HOSTFILE = ("the hostfile's hosts are the nodes, and the commands set torchrun's --nnodes, --node-rank "
                        "and --rdzv-endpoint (--master_addr/--master_port, --rdzv_id); drop it")
REFUSED = {
    "launcher.nproc_per_node": "the hostfile's slots set the processes per node (torchrun's --nproc-per-node); "
                               "drop it, or pick fewer slots with --num_gpus N or --include/--exclude",
    **{f"launcher.{key}": _NODES_FROM_HOSTFILE for key in ("nnodes", "node_rank", "rdzv_endpoint", "rdzv_id",
                                                          "rdzv_timeout_s")},
}
TORCHRUN_FLAGS = {"launcher.max_restarts": "--max-restarts", "launcher.start_method": "--start-method"}


@dataclass(frozen=True)
class Layout:
    """What the nodes run: the overrides the workers get and the extra torchrun flags."""

    overrides: tuple[str, ...]
    torchrun_args: tuple[str, ...]
    world: int


def override_key(override: str) -> str:
    """The config key an override sets: `++zero.stage=2` -> zero.stage, `~trainer.resume` -> trainer.resume."""
    return override.lstrip("+~").split("=", 1)[0].strip()


def split_overrides(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """(overrides for the workers, the keys of TORCHRUN_FLAGS set on the command line); a refused key is a ValueError."""
    kept, mapped = [], []
    for override in overrides:
        key = override_key(override)
        if key in REFUSED:
            raise ValueError(f"{override}: not used under dsrecipes.launch.hostfile: {REFUSED[key]}")
        if key in TORCHRUN_FLAGS and "=" in override and not override.startswith("~"):
            mapped.append(key)
        else:
            kept.append(override)
    return kept, mapped


def describe_slots(nodes: Sequence[Node], source: str) -> str:
    world = sum(len(node.slot_ids) for node in nodes)
    listed = ", ".join(f"{node.host}: {len(node.slot_ids)}" for node in nodes)
    return f"hostfile {source} gives {world} slot{'s' if world != 1 else ''} ({listed})"


def compose_recipe(overrides: Sequence[str]):
    """compose() with Hydra's and OmegaConf's errors about the overrides as ValueErrors."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from dsrecipes.config.store import compose

    try:
        return compose(list(overrides))
    except (HydraException, OmegaConfBaseException) as error:
        shown = " ".join(overrides) or "(no overrides)"
        raise ValueError(f"the overrides {shown} do not compose: {error}".replace("\n", " ")) from None


def check_layout(overrides: Sequence[str], nodes: Sequence[Node], source: str) -> Layout:
    """Compose and validate the recipe at the nodes' world size; the overrides and torchrun flags of the nodes."""
    kept, mapped = split_overrides(overrides)  # first: a refused key needs no composing (seconds of imports)
    world = sum(len(node.slot_ids) for node in nodes)
    cfg = compose_recipe(overrides)
    if str(cfg.mode) != "train":
        raise ValueError(f"mode={cfg.mode}: dsrecipes.launch.hostfile launches training (mode=train); start inference "
                         f"with torchrun on the nodes directly")
    from dsrecipes.config.validate import validate_recipe

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # every worker runs the same checks and shows their warnings
            validate_recipe(cfg, dp_world_size=world, node_size=len(nodes[0].slot_ids))  # slots are equal
    except ValueError as error:
        raise ValueError(f"{describe_slots(nodes, source)}: {error}") from None
    flags: list[str] = []
    for key in dict.fromkeys(mapped):  # a key given twice: Hydra took the last value, once
        value = cfg.launcher[key.split(".", 1)[1]]
        if not (key == "launcher.max_restarts" and int(value) == 0):  # 0 is torchrun's default
            flags += [TORCHRUN_FLAGS[key], str(value)]
    return Layout(tuple(kept), tuple(flags), world)
