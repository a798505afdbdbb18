"""The autotuner's keys: DeepSpeed's `autotuning` block (reference: DeepSpeed's autotuning/constants.py),
plus the memory cap and the ZeRO stages to try.

They are the `hydra/sweeper=autotune` config (hydra_plugins/dsrecipes_autotune adds Hydra's `_target_`),
set as `hydra.sweeper.KEY=VALUE`. metric and tuner_type are Enums, so a value outside their choices fails
at composition naming the key (`hydra.sweeper.metric`) and the valid values, before any trial runs;
validate_autotune_config checks the numbers and the cross-field rules.

Differences from DeepSpeed, on purpose:
* no `enabled`, `results_dir`, `exps_dir`, `overwrite`: choosing the sweeper enables it, and everything goes to
  the sweep directory (Hydra's hydra.sweep.dir), one job directory per trial;
* `fast=true` tunes zero.stage x micro-batch (as DeepSpeed); `fast=false` adds activation checkpointing
  (none / full) and, where the trials run on CUDA, optimizer offload to the CPU (stages 2 and 3) instead of
  DeepSpeed's bucket-size grid;
* `max_train_batch_size` / `min_train_batch_size` / `mp_size` are not taken: the global batch follows the
  micro-batch (gradient accumulation stays what the recipe sets), model parallelism is the recipe's `parallel` group;
  where launcher.nproc_per_node=auto would keep the recipe's global batch over several CPU workers by shrinking
  the micro-batch or the accumulation, a trial pins the worker count instead (launcher.nproc_per_node=N), so it
  trains the per-rank micro-batch the candidate names and the estimate counts;
* the micro-batch sizes tried are `num_tuning_micro_batch_sizes` values spread geometrically from
  min_train_micro_batch_size_per_gpu up to the largest that the memory estimator says fits (DeepSpeed finds
  that largest size with a profiling run instead).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dsrecipes.utils.config_enum import ConfigEnum


class Metric(ConfigEnum):
    """What a trial is judged by: tokens/s (higher is better), seconds per step (lower), achieved FLOP/s (higher)."""

    throughput = "throughput"
    latency = "latency"
    flops = "flops"


class TunerType(ConfigEnum):
    """In which order candidates are tried: all in grid order, a seeded random order, or Optuna's TPE."""

    gridsearch = "gridsearch"
    random = "random"
    model_based = "model_based"


METRICS = tuple(m.value for m in Metric)
TUNER_TYPES = tuple(t.value for t in TunerType)
HIGHER_IS_BETTER = {"throughput": True, "latency": False, "flops": True}
METRIC_UNITS = {"throughput": "tokens/s", "latency": "s/step", "flops": "FLOP/s"}


@dataclass
class AutotuneConfig:
    """hydra/sweeper=autotune's keys (DeepSpeed's names and defaults where DeepSpeed has the key)."""

    fast: bool = True  # true: zero.stage x micro-batch; false: x activation checkpointing (x CPU offload on CUDA)
    metric: Metric = Metric.throughput  # throughput | latency | flops
    start_profile_step: int = 3  # steps 1..start are warm-up; the metric is measured over steps start+1..end
    end_profile_step: int = 5  # each trial trains this many steps (trainer.max_steps)
    tuner_type: TunerType = TunerType.gridsearch  # gridsearch | random | model_based (Optuna TPE when installed)
    tuner_early_stopping: int = 5  # stop after this many trials without improvement; 0 = never
    tuner_num_trials: int = 50  # at most this many trials run
    tuner_seed: int = 1234  # random / model_based order
    min_train_micro_batch_size_per_gpu: int = 1
    max_train_micro_batch_size_per_gpu: int = 1024
    num_tuning_micro_batch_sizes: int = 3  # micro-batch sizes tried per (stage, checkpointing, offload)
    zero_stages: list[int] = field(default_factory=lambda: [0, 1, 2, 3])
    # per-rank memory cap in GiB; null = 90% of the device's: CUDA's total memory, or the machine's RAM
    # divided by the ranks a candidate starts on this node (the rest is for the CUDA context, buffers, fragmentation)
    max_memory_gib: float | None = None
    best_experiment: str = "autotune_best"  # <sweep dir>/conf/experiment/<this>.yaml


def validate_autotune_config(cfg: AutotuneConfig, prefix: str = "hydra.sweeper") -> None:
    """Raise ValueError naming the key, its value and what would be valid (before any trial runs)."""
    if str(cfg.metric) not in METRICS:
        raise ValueError(f"{prefix}.metric={cfg.metric!r} is not valid; choose one of: {', '.join(METRICS)}")
    if str(cfg.tuner_type) not in TUNER_TYPES:
        raise ValueError(f"{prefix}.tuner_type={cfg.tuner_type!r} is not valid; choose one of: {', '.join(TUNER_TYPES)}")
    if cfg.start_profile_step < 1:
        raise ValueError(f"{prefix}.start_profile_step={cfg.start_profile_step} must be >= 1 (the first step is warm-up)")
    if cfg.end_profile_step <= cfg.start_profile_step:
        raise ValueError(f"{prefix}.end_profile_step={cfg.end_profile_step} must be > "
                         f"{prefix}.start_profile_step={cfg.start_profile_step} (the measured steps lie between them)")
    for key in ("tuner_early_stopping",):
        if getattr(cfg, key) < 0:
            raise ValueError(f"{prefix}.{key}={getattr(cfg, key)} must be >= 0 (0 = no early stopping)")
    for key in ("tuner_num_trials", "min_train_micro_batch_size_per_gpu", "num_tuning_micro_batch_sizes"):
        if getattr(cfg, key) < 1:
            raise ValueError(f"{prefix}.{key}={getattr(cfg, key)} must be >= 1")
    if cfg.max_train_micro_batch_size_per_gpu < cfg.min_train_micro_batch_size_per_gpu:
        raise ValueError(f"{prefix}.max_train_micro_batch_size_per_gpu={cfg.max_train_micro_batch_size_per_gpu} must be "
                         f">= {prefix}.min_train_micro_batch_size_per_gpu={cfg.min_train_micro_batch_size_per_gpu}")
    stages = list(cfg.zero_stages)
    if not stages or any(s not in (0, 1, 2, 3) for s in stages) or len(set(stages)) != len(stages):
        raise ValueError(f"{prefix}.zero_stages={stages} is not valid; give distinct stages from 0, 1, 2, 3, e.g. [0,1,2,3]")
    if cfg.max_memory_gib is not None and not cfg.max_memory_gib > 0:
        raise ValueError(f"{prefix}.max_memory_gib={cfg.max_memory_gib} must be > 0 GiB (or null: the device's memory)")
    name = str(cfg.best_experiment)
    if not name.strip() or "/" in name or name in (".", "..") or name.endswith(".yaml"):
        raise ValueError(f"{prefix}.best_experiment={name!r} is not valid; give a file stem such as autotune_best "
                         "(it becomes conf/experiment/<name>.yaml in the sweep directory)")
