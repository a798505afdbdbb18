"""Cross-field validation of a composed recipe, run once before any expensive work starts.

Each check raises ValueError naming the key, its value and what would be valid; schema-level
problems (unknown keys, wrong types) were already caught by Hydra/OmegaConf at composition.
Order: every numeric key against the range its field declares (dsrecipes.utils.ranges), the names that become
paths (name, checkpoint.dirname, compression.export_dirname), then each group's own `check` in RootConfig's order
(dsrecipes.utils.recipe_facts: the parallel group's builds the layout), the compatibility matrix, NVMe offload,
and what the Engine checks (validate_engine_config, which dsrecipes.initialize runs on its own).
Keys set in a group that is switched off are warned about (dsrecipes.config.inactive), not refused.
"""

from __future__ import annotations

import logging
import os
import warnings

from omegaconf import DictConfig, OmegaConf

from dsrecipes.config.compatibility import check_compatibility
from dsrecipes.config.inactive import warn_inactive_keys
from dsrecipes.config.never_fires import warn_never_firing
from dsrecipes.config.nvme_checks import validate_nvme_recipe
from dsrecipes.config.schema import RootConfig
from dsrecipes.distributed.config import resolve_node_sized_keys
from dsrecipes.distributed.parallel_dims import ParallelDims, ranks_per_node
from dsrecipes.training.batch import BatchSizes, resolve_batch_sizes
from dsrecipes.training.optim.lr_schedules import non_closed_form_target
from dsrecipes.training.precision import resolve_auto_precision
from dsrecipes.utils.device import resolve_device
from dsrecipes.utils.ranges import check_ranges
from dsrecipes.utils.recipe_facts import RecipeFacts, check_groups

log = logging.getLogger("dsrecipes")

def check_run_name(name: str) -> None:
    """`name` ends the run directory's name and names the run in the loggers: a non-empty single path component."""
    if not str(name).strip():
        raise ValueError(f"name={name!r} is not valid; the run name ends the run directory's name and names the run "
                         "in the loggers, so it must not be empty (e.g. name=gpt)")
    if "/" in name or os.sep in name or name in (".", "..") or "\x00" in name:
        raise ValueError(f"name={name!r} is not valid; it must be a single file name (no '/', not '.' or '..'): it "
                         "becomes part of the run directory's name (set hydra.run.dir to choose the directory)")


def check_subdirectory(key: str, value: str) -> None:
    """A directory the run writes inside its run directory: a non-empty relative path that stays inside it."""
    parts = str(value).replace("\\", "/").split("/")
    if not str(value).strip() or os.path.isabs(value) or ".." in parts or all(p in ("", ".") for p in parts):
        raise ValueError(f"{key}={value!r} is not valid; it must be a relative directory name inside the run directory "
                         "(not empty, not absolute, no '..'), e.g. checkpoints")


def check_run_paths(root: RootConfig) -> None:
    """name, checkpoint.dirname and compression.export_dirname: what the run turns into paths of its run directory."""
    check_run_name(root.name)
    check_subdirectory("checkpoint.dirname", root.checkpoint.dirname)
    check_subdirectory("compression.export_dirname", root.compression.export_dirname)


def to_root(cfg: RootConfig | DictConfig) -> RootConfig:
    """A typed RootConfig object from a composed DictConfig (interpolations resolved)."""
    return OmegaConf.to_object(cfg) if isinstance(cfg, DictConfig) else cfg


def data_parallel_world_size() -> int:
    """World size the batch arithmetic uses: torch.distributed's, else WORLD_SIZE, else 1."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def parallel_dims(cfg: RootConfig, world_size: int, node_size: int | None = None) -> ParallelDims:
    """The run's layout: raises naming parallel.* / zero.* / moe.ep_size when the degrees do not fit the world size."""
    return ParallelDims.from_config(cfg, world_size, node_size=node_size)


def validate_engine_config(cfg: RootConfig, world_size: int) -> BatchSizes:
    """Checks of everything the Engine consumes: the groups marked CHECKED_BY_ENGINE (optimizer, lr_scheduler,
    precision, trainer, checkpoint, zero, fp8), each by its own `check`; returns the resolved batch sizes.

    dsrecipes.initialize runs this alone (the user brings the model and data); validate_recipe runs it last.
    world_size is the number of processes; the batch triple uses the data-parallel part of it,
    world_size / (parallel.tp x parallel.sp x parallel.pp).
    """
    node_size = ranks_per_node(world_size)
    resolve_node_sized_keys(cfg.zero, node_size)  # dsrecipes.initialize: `node` = LOCAL_WORLD_SIZE
    facts = RecipeFacts(cfg, world_size, node_size, resolve_device(cfg.trainer.device),
                        lr_scheduler_target=lambda: non_closed_form_target(cfg.lr_scheduler),
                        layout=lambda: parallel_dims(cfg, world_size), batching=lambda dims: _batch_sizes(cfg, dims))
    check_groups(cfg, facts, engine=True)
    return facts.batch


def _layout(root: RootConfig, world: int, node_size: int) -> ParallelDims:
    """The run's ParallelDims, warning about what the node layout makes of it."""
    dims = parallel_dims(root, world, node_size)
    for message in dims.node_warnings():
        warnings.warn(message, stacklevel=4)
    return dims


def _batch_sizes(root: RootConfig, dims: ParallelDims) -> BatchSizes:
    t = root.trainer
    return resolve_batch_sizes(t.train_batch_size, t.train_micro_batch_size_per_gpu, t.gradient_accumulation_steps, dims.dp)


def validate_recipe(cfg: RootConfig | DictConfig, dp_world_size: int | None = None,
                    node_size: int | None = None) -> tuple[RootConfig, BatchSizes]:
    """Every check a training recipe needs; returns the typed config and the batch sizes.

    dp_world_size: the number of processes the run will have (default: the current process group's
    or WORLD_SIZE); the data-parallel size is derived from it and the `parallel` degrees.
    node_size: processes per node (default: LOCAL_WORLD_SIZE, else the whole world is one node); the
    `node` values of zero.hybrid_shard_size / zero.zero_hpz_partition_size become this number.
    """
    root = to_root(cfg)
    world = dp_world_size or data_parallel_world_size()
    node_size = node_size or ranks_per_node(world)
    for line in resolve_node_sized_keys(root.zero, node_size):
        log.info(line)
    device = resolve_device(root.trainer.device)
    auto_precision = resolve_auto_precision(root.precision, device)
    if auto_precision:
        log.info(auto_precision)
    check_ranges(root)
    check_run_paths(root)
    facts = RecipeFacts(root, world, node_size, device, lr_scheduler_target=lambda: non_closed_form_target(root.lr_scheduler),
                        layout=lambda: _layout(root, world, node_size), batching=lambda dims: _batch_sizes(root, dims))
    check_groups(root, facts, engine=False)  # each group's own `check`, in RootConfig's order
    dims = facts.dims
    check_compatibility(root, dims)
    validate_nvme_recipe(root, dims)
    batch = validate_engine_config(root, world)
    warn_inactive_keys(root)
    warn_never_firing(root)
    return root, batch
