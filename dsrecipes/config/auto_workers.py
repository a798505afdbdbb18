"""Sweeps compare like with like: auto-chosen worker counts keep the recipe's global batch, and a
multirun whose jobs would train different global batches says so before the first job starts.

On a machine without GPUs, launcher.nproc_per_node=auto starts 2 workers for a recipe that shards
(zero.stage > 0, there is nothing to shard on one rank) and 1 otherwise. With the batch keys
resolved by DeepSpeed's rule, a recipe that gives only the micro-batch would then train twice the
global batch at zero.stage=2 as at zero.stage=0, so `-m zero.stage=0,2` would compare different
batches. `keep_recipe_batch` instead keeps the global batch the recipe has on one data-parallel
rank and splits it over the workers: the micro-batch shrinks (or, when it does not divide, the
accumulation steps), and the run warns saying which key changed. Where neither divides, the
batch changes and the warning says so. An explicit launcher.nproc_per_node, GPUs (auto = one
worker per GPU: the batch is the recipe's per-GPU batch, as in DeepSpeed) or a launcher (torchrun)
leave the batch to DeepSpeed's rule. The one launcher that stands in for auto is submitit's local executor
(hydra/launcher=slurm_local, whose preset starts 2 tasks on this CPU machine so a SLURM recipe can be tried
before it is queued): its tasks keep the recipe's batch as auto's workers do, so the two launchers train the same
global batch for the same recipe.

`unequal_batches_warning` is what the Preflight callback shows when the jobs of a sweep end up
with different global batches.
"""

from __future__ import annotations

from omegaconf import DictConfig, read_write

from dsrecipes.distributed.parallel_dims import ParallelDims
from dsrecipes.training.batch import resolve_batch_sizes

_MICRO = "trainer.train_micro_batch_size_per_gpu"
_ACCUMULATION = "trainer.gradient_accumulation_steps"


def keep_recipe_batch(cfg: DictConfig, nproc: int, gpus: int, started_by: str | None = None) -> str | None:
    """Set cfg.trainer's batch triple so that `nproc` auto-chosen CPU workers train the global batch the
    recipe has on one data-parallel rank. Returns the warning to show (None when nothing changed).
    started_by: what started the workers where it is not launcher.nproc_per_node=auto (a submitit local job)."""
    if str(cfg.launcher.nproc_per_node) != "auto" or gpus > 0 or nproc <= 1:
        return None
    try:
        par = cfg.parallel  # cfg is the composed DictConfig: from_config wants the typed RootConfig
        dp = ParallelDims.from_degrees(nproc, zero_stage=cfg.zero.stage, tp=par.tp, sp=par.sp, pp=par.pp).dp
    except ValueError:
        return None  # a layout error: validation reports it
    if dp <= 1:
        return None  # one data-parallel rank: the batch is the recipe's
    t = cfg.trainer
    given = (t.train_batch_size, t.train_micro_batch_size_per_gpu, t.gradient_accumulation_steps)
    try:
        one = resolve_batch_sizes(*given, dp_world_size=1)
    except ValueError:
        return None  # validation reports the keys
    try:
        if resolve_batch_sizes(*given, dp_world_size=dp).train_batch_size == one.train_batch_size:
            return None  # DeepSpeed's rule already keeps it (train_batch_size given)
    except ValueError:
        pass
    why = (f"{started_by} runs {nproc} CPU workers" if started_by else
           f"launcher.nproc_per_node=auto starts {nproc} CPU workers for zero.stage={cfg.zero.stage} (sharding needs "
           "more than one rank)")
    if one.micro_batch_size % dp == 0:
        micro, accumulation = one.micro_batch_size // dp, one.gradient_accumulation_steps
        change = f"{_MICRO} {one.micro_batch_size} -> {micro} per worker"
    elif one.gradient_accumulation_steps % dp == 0:
        micro, accumulation = one.micro_batch_size, one.gradient_accumulation_steps // dp
        change = f"{_ACCUMULATION} {one.gradient_accumulation_steps} -> {accumulation}"
    else:
        return (f"{why}: the global batch changes from {one.train_batch_size} (one rank) to "
                f"{one.train_batch_size * dp}, since neither the micro-batch ({one.micro_batch_size}) nor the "
                f"accumulation steps ({one.gradient_accumulation_steps}) divide by {dp}. Set trainer.train_batch_size "
                "and launcher.nproc_per_node to choose")
    with read_write(t):
        t.train_batch_size = one.train_batch_size
        t.train_micro_batch_size_per_gpu = micro
        t.gradient_accumulation_steps = accumulation
    return (f"{why}: the global batch stays the recipe's {one.train_batch_size} ({change}). Set "
            "launcher.nproc_per_node=N to choose the worker count and keep the per-worker batch instead")


def workers_the_batch_allows(cfg: DictConfig, nproc: int, gpus: int) -> tuple[int, str | None]:
    """The CPU workers launcher.nproc_per_node=auto may start: `nproc`, or 1 where the recipe's global batch can be
    neither kept nor split over them (train_batch_size=1 from a DeepSpeed file on a sharding recipe: DeepSpeed's rule
    would assert 1 != 1 x 1 x 2). Returns (workers, the warning to show or None)."""
    if str(cfg.launcher.nproc_per_node) != "auto" or gpus > 0 or nproc <= 1:
        return nproc, None
    try:
        par = cfg.parallel
        dp = ParallelDims.from_degrees(nproc, zero_stage=cfg.zero.stage, tp=par.tp, sp=par.sp, pp=par.pp).dp
    except ValueError:
        return nproc, None
    t = cfg.trainer
    given = (t.train_batch_size, t.train_micro_batch_size_per_gpu, t.gradient_accumulation_steps)
    try:
        resolve_batch_sizes(*given, dp_world_size=dp)
        return nproc, None
    except ValueError:
        pass
    try:
        one = resolve_batch_sizes(*given, dp_world_size=1)
    except ValueError:
        return nproc, None  # not even one rank: validation names the keys
    if one.micro_batch_size % dp == 0 or one.gradient_accumulation_steps % dp == 0:
        return nproc, None  # keep_recipe_batch splits it
    return 1, (f"launcher.nproc_per_node=auto starts 1 CPU worker, not {nproc}: the global batch "
               f"train_batch_size={one.train_batch_size} (micro-batch {one.micro_batch_size} x accumulation "
               f"{one.gradient_accumulation_steps}) cannot be split over {dp} data-parallel ranks, so zero.stage="
               f"{cfg.zero.stage} has nothing to shard. Set launcher.nproc_per_node=N and a train_batch_size that N "
               "divides to shard")


def unequal_batches_warning(batches: list[tuple[str, int]]) -> str | None:
    """batches: (a job's overrides, its global batch) for every job of a sweep; a warning when they differ."""
    if len({size for _, size in batches}) <= 1:
        return None
    jobs = "; ".join(f"#{i} ({shown}): {size}" for i, (shown, size) in enumerate(batches))
    return (f"the jobs of this multirun train different global batches (train_batch_size), so their losses and "
            f"throughput are not comparable: {jobs}. Set trainer.train_batch_size (and launcher.nproc_per_node) to "
            "compare like with like")
