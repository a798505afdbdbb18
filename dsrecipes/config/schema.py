"""RootConfig: the whole recipe as one typed tree, the schema every YAML file and override merges into.

The primary config (conf/config.yaml) starts from this schema, so every group option, experiment
and command-line override is type-checked at composition: a misspelled key or a wrong type fails
naming the full key (e.g. `model.n_layr`). `dsrecipes.initialize(config=dict)` merges user dicts into
the same schema. Each group's dataclass lives beside the code that consumes it. `deepspeed_config`
names a DeepSpeed JSON config read onto these groups (dsrecipes.config.ds_import).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dsrecipes.compression.config import CompressionConfig
from dsrecipes.data.config import DataConfig
from dsrecipes.data_efficiency.config import DataEfficiencyConfig
from dsrecipes.distributed.activation_checkpoint import ActivationCheckpointConfig
from dsrecipes.distributed.comms_config import CommsLoggerConfig
from dsrecipes.distributed.config import LauncherConfig, ParallelConfig, ZeroConfig
from dsrecipes.distributed.float8 import Float8Config
from dsrecipes.distributed.torch_compile import CompileConfig
from dsrecipes.inference.config import GenerateConfig, RecipeMode
from dsrecipes.models.config import ModelConfig
from dsrecipes.models.kernels_config import KernelsConfig, validate_kernels_config
from dsrecipes.models.moe_config import MoEConfig
from dsrecipes.models.sparse_attention import SparseAttentionConfig
from dsrecipes.peft.config import PeftConfig
from dsrecipes.profiling.config import FlopsProfilerConfig, ProfilerConfig
from dsrecipes.training.config import CheckpointConfig, LoggerConfig, PrecisionConfig, TrainerConfig
from dsrecipes.training.optim.lr_scheduler_config import LRSchedulerConfig, WarmupCosineConfig
from dsrecipes.training.optim.optimizer_config import AdamWConfig, OptimizerConfig
from dsrecipes.training.preference.config import DPOConfig

# Config groups, in the order docs/recipes.md's table documents them.
CONFIG_GROUPS = (
    "model", "data", "peft", "dpo", "optimizer", "lr_scheduler", "precision", "fp8", "trainer", "checkpoint", "logger", "zero",
    "parallel", "launcher", "kernels", "compile", "activation_checkpointing", "moe", "data_efficiency", "compression",
    "sparse_attention", "generate",
    "flops_profiler", "profiler", "comms_logger",
)


@dataclass
class RootConfig:
    name: str = "gpt"  # run name: appended to the run directory and used by loggers
    mode: RecipeMode = RecipeMode.train  # train | generate | serve-bench (dsrecipes.inference_cli)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    # typed by the groups' base schemas: the chosen option's schema (a subclass) fills them in
    optimizer: OptimizerConfig = field(default_factory=AdamWConfig)
    lr_scheduler: LRSchedulerConfig = field(default_factory=WarmupCosineConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    zero: ZeroConfig = field(default_factory=ZeroConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    kernels: KernelsConfig = field(default_factory=KernelsConfig)
    compile: CompileConfig = field(default_factory=CompileConfig)  # dsrecipes.distributed.torch_compile
    activation_checkpointing: ActivationCheckpointConfig = field(default_factory=ActivationCheckpointConfig)
    moe: MoEConfig = field(default_factory=MoEConfig)
    data_efficiency: DataEfficiencyConfig = field(default_factory=DataEfficiencyConfig)
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    sparse_attention: SparseAttentionConfig = field(default_factory=SparseAttentionConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    flops_profiler: FlopsProfilerConfig = field(default_factory=FlopsProfilerConfig)  # dsrecipes.profiling
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)  # torch.profiler traces
    comms_logger: CommsLoggerConfig = field(default_factory=CommsLoggerConfig)  # dsrecipes.distributed.comms_logger
    fp8: Float8Config = field(default_factory=Float8Config)  # dsrecipes.distributed.float8 (torchao, CUDA only)
    peft: PeftConfig = field(default_factory=PeftConfig)  # LoRA adapters on a frozen model (dsrecipes.peft)
    dpo: DPOConfig = field(default_factory=DPOConfig)  # preference optimisation (dsrecipes.training.preference)
    # a DeepSpeed config (JSON) translated onto the groups above, under the command line's overrides
    # (dsrecipes.config.ds_import); kept as the record of which file the recipe came from
    deepspeed_config: str | None = None
    # the run-summary metric (e.g. val/loss) a job returns to the sweeper, for hydra/sweeper=optuna and other
    # optimising sweepers (Lightning-Hydra-Template's key; dsrecipes.config.optimized_metric); null: the summary dict
    optimized_metric: str | None = None


__all__ = ["CONFIG_GROUPS", "RootConfig", "KernelsConfig", "validate_kernels_config"]
