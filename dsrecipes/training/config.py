"""Schemas of the engine's config groups: trainer, optimizer, lr_scheduler, precision, checkpoint, logger.

Plain dataclasses (no Hydra): they are the structured-config schemas of conf/<group>/*.yaml and the
config that `dsrecipes.initialize(config=...)` accepts from Python. Keys keep DeepSpeed's names where
DeepSpeed has one (train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps,
gradient_clipping, warmup_num_steps, cos_min_ratio ...) and DeepSpeed's semantics
(see the README's "Coming from DeepSpeed" section). Choice-valued strings are checked by
`dsrecipes.config.validate`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class TrainerConfig:
    """Run length, batch sizes (DeepSpeed's triple), clipping, intervals, seed and device.

    Any two of train_batch_size, train_micro_batch_size_per_gpu and gradient_accumulation_steps
    determine the third given the data-parallel world size; all three must satisfy
    train = micro x accumulation x dp.
    """

    max_steps: int = 600
    train_batch_size: Optional[int] = None
    train_micro_batch_size_per_gpu: Optional[int] = 16
    gradient_accumulation_steps: Optional[int] = 1
    gradient_clipping: float = 1.0  # global-norm clip; 0 disables (DeepSpeed's default is 1.0)
    log_interval: int = 10
    eval_interval: int = 100  # 0 = only at the end
    eval_batches: int = 16  # validation micro-batches per evaluation; 0 = the whole split
    seed: int = 1234
    device: str = "auto"  # auto (cuda when present, else cpu) | cpu | cuda | cuda:N
    peak_tflops: Optional[float] = None  # for perf/mfu; null = known GPUs detected, else not logged
    progress_bar: bool = True
    sample_prompt: str = "def "
    sample_tokens: int = 200  # 0 = no text sample at the end
    sample_temperature: float = 0.8
    sample_top_k: int = 40


@dataclass
class OptimizerConfig:
    """Optimizer. name: adamw. impl picks torch's fused / foreach / for-loop kernels (auto = best available)."""

    name: str = "adamw"
    lr: float = 1e-3
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    weight_decay: float = 0.1
    impl: str = "auto"  # auto | fused | foreach | for_loop
    no_decay_bias_and_norm: bool = True  # biases, norm weights and 1-D params get weight_decay=0


@dataclass
class LRSchedulerConfig:
    """Learning-rate schedule, stepped once per applied optimizer step (DeepSpeed's formulas).

    warmup_cosine = DeepSpeed's WarmupCosineLR: ratio of the optimizer's lr warms up from
    warmup_min_ratio to 1 over warmup_num_steps (linear or log), then follows a cosine down to
    cos_min_ratio at total_num_steps (null = trainer.max_steps). constant = the optimizer's lr.
    """

    name: str = "warmup_cosine"
    warmup_num_steps: int = 50
    warmup_min_ratio: float = 0.0
    warmup_type: str = "linear"  # linear | log
    cos_min_ratio: float = 0.1
    total_num_steps: Optional[int] = None


@dataclass
class PrecisionConfig:
    """Numeric precision of the forward/backward. fp32, or bf16 autocast (fp32 weights and optimizer)."""

    dtype: str = "fp32"  # fp32 | bf16


@dataclass
class CheckpointConfig:
    """Where and when the engine saves. Checkpoints go to <run dir>/<dirname>/step_N/."""

    dirname: str = "checkpoints"
    interval: int = 0  # save every N optimizer steps; 0 = only the final checkpoint
    keep_last: int = 3  # keep the newest K complete checkpoints; 0 = keep all
    save_final: bool = True


@dataclass
class LoggerConfig:
    """Metric sinks. jsonl -> metrics.jsonl, tensorboard -> tb/, wandb -> wandb/ (offline unless a key is set)."""

    jsonl: bool = True
    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "dsrecipes"
    wandb_entity: Optional[str] = None
    wandb_mode: str = "auto"  # auto (online iff WANDB_API_KEY is set) | offline | online | disabled
    wandb_tags: List[str] = field(default_factory=list)
    level: str = "INFO"
