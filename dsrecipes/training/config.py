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
from typing import Any, Dict, List, Optional


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
    resume: Optional[str] = None  # null = fresh start | auto = newest complete checkpoint if any | a path
    peak_tflops: Optional[float] = None  # for perf/mfu; null = known GPUs detected, else not logged
    progress_bar: bool = True
    sample_prompt: str = "def "
    sample_tokens: int = 200  # 0 = no text sample at the end
    sample_temperature: float = 0.8
    sample_top_k: int = 40


@dataclass
class OptimizerConfig:
    """Optimizer: name picks a built-in, or _target_ names any torch.optim class (e.g. torch.optim.RMSprop).

    Keys a given optimizer does not take are ignored for it (betas for SGD, momentum for Adam ...).
    adam_w_mode follows DeepSpeed: name=adam also decouples weight decay (AdamW) unless it is false.
    impl picks torch's fused / foreach / for-loop kernels where the class has them (auto = best
    available). kwargs are passed through to the optimizer class.
    """

    name: str = "adamw"  # adamw | adam | sgd | adagrad | lamb | lion
    _target_: Optional[str] = None
    lr: float = 1e-3
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    weight_decay: float = 0.1
    adam_w_mode: bool = True  # adam: decoupled weight decay (DeepSpeed's default) unless false
    momentum: float = 0.0  # sgd
    nesterov: bool = False  # sgd
    lr_decay: float = 0.0  # adagrad
    max_coeff: float = 10.0  # lamb: trust-ratio clamp (DeepSpeed FusedLamb)
    min_coeff: float = 0.01  # lamb
    impl: str = "auto"  # auto | fused | foreach | for_loop
    no_decay_bias_and_norm: bool = True  # biases, norm weights and 1-D params get weight_decay=0
    kwargs: Dict[str, Any] = field(default_factory=dict)


@dataclass
class LRSchedulerConfig:
    """Learning-rate schedule with DeepSpeed's formulas, stepped once per applied optimizer step.

    name: warmup_lr (WarmupLR), warmup_decay_lr (WarmupDecayLR), warmup_cosine (WarmupCosineLR),
    one_cycle (OneCycle, with momentum cycling), lr_range_test (LRRangeTest), constant; or
    _target_ = any torch.optim.lr_scheduler class with kwargs. Keys keep DeepSpeed's names and
    defaults; each option file in conf/lr_scheduler sets the keys its schedule uses. A null
    total_num_steps means trainer.max_steps; a null warmup_max_lr means the optimizer's lr.
    """

    name: str = "warmup_cosine"
    _target_: Optional[str] = None
    kwargs: Dict[str, Any] = field(default_factory=dict)
    # WarmupLR / WarmupDecayLR / WarmupCosineLR
    warmup_num_steps: int = 1000
    warmup_type: str = "log"  # log | linear
    warmup_min_lr: float = 0.0
    warmup_max_lr: Optional[float] = None
    total_num_steps: Optional[int] = None
    warmup_min_ratio: float = 0.0
    cos_min_ratio: float = 0.0001
    # OneCycle
    cycle_min_lr: Optional[float] = None
    cycle_max_lr: Optional[float] = None
    decay_lr_rate: float = 0.0
    cycle_first_step_size: int = 2000
    cycle_second_step_size: Optional[int] = None
    cycle_first_stair_count: int = 0
    cycle_second_stair_count: Optional[int] = None
    decay_step_size: int = 0
    cycle_momentum: bool = True
    cycle_min_mom: float = 0.8
    cycle_max_mom: float = 0.9
    decay_mom_rate: float = 0.0
    # LRRangeTest
    lr_range_test_min_lr: float = 1e-3
    lr_range_test_step_size: int = 2000
    lr_range_test_step_rate: float = 1.0
    lr_range_test_staircase: bool = False


@dataclass
class PrecisionConfig:
    """Numeric precision. Keys of the fp16 part keep DeepSpeed's names and defaults (its `fp16` block).

    dtype fp32; bf16 or fp16 either as autocast over fp32 weights (master_weights=false) or with the
    model itself in bf16/fp16 and fp32 master weights in the optimizer (master_weights=true, what
    DeepSpeed's fp16/bf16 optimizers do). fp16 scales the loss: loss_scale=0 is dynamic
    (initial_scale_power, loss_scale_window, hysteresis, consecutive_hysteresis, min_loss_scale),
    loss_scale>0 is a static scale. An overflowing fp16 step is skipped and the scale adjusted;
    reaching min_loss_scale raises unless raise_error_at_min_scale=false (then warn and keep skipping).
    In fp32/bf16, inf/nan gradients stop the run naming the step (nonfinite_grads=error) or skip the
    step (nonfinite_grads=skip). Skipped steps are counted (train/skipped_steps) on every rank together.
    """

    dtype: str = "fp32"  # fp32 | bf16 | fp16
    master_weights: bool = False
    loss_scale: float = 0.0
    initial_scale_power: int = 16
    loss_scale_window: int = 1000
    hysteresis: int = 2
    consecutive_hysteresis: bool = False
    min_loss_scale: float = 1.0
    raise_error_at_min_scale: bool = True
    nonfinite_grads: str = "error"  # error | skip (fp32/bf16)


@dataclass
class CheckpointConfig:
    """Where and when the engine saves. Checkpoints go to <run dir>/<dirname>/step_N/."""

    dirname: str = "checkpoints"
    interval: int = 0  # save every N optimizer steps; 0 = only the final checkpoint
    keep_last: int = 3  # keep the newest K complete checkpoints; 0 = keep all
    save_final: bool = True
    export_safetensors: bool = True  # also export the final model to <run dir>/export/ (safetensors + config)


@dataclass
class LoggerConfig:
    """Metric sinks, any combination: jsonl -> metrics.jsonl, tensorboard -> tb/, wandb -> wandb/.

    W&B runs offline (never touching the network) unless WANDB_API_KEY is set or wandb_mode=online;
    it logs the resolved config, names the run after the recipe's `name` and groups multirun jobs.
    """

    jsonl: bool = True
    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "dsrecipes"
    wandb_entity: Optional[str] = None
    wandb_mode: str = "auto"  # auto (online iff WANDB_API_KEY is set) | offline | online | disabled
    wandb_tags: List[str] = field(default_factory=list)
    wandb_group: Optional[str] = None  # null = the multirun sweep's name for sweep jobs, else none
    level: str = "INFO"
