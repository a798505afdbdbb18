"""The `optimizer` group: one schema per option (AdamWConfig, SGDConfig, ..., the 1-bit family, `custom`), their
valid ranges, checks and compatibility rows. Keys keep DeepSpeed's names; each option names the class it builds in
`_target_`, its other keys being the class's arguments (built by dsrecipes.training.optim.optimizers). A key the
chosen option does not take fails at composition; `impl` is an Enum (OptimizerImpl), so a bad value does too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import MISSING

from dsrecipes.training.option_schemas import ExtraArguments, _extra_arguments_field
from dsrecipes.utils.compatibility_rows import Refusal, Supported
from dsrecipes.utils.config_enum import ConfigEnum
from dsrecipes.utils.ranges import (
    COUNT,
    NON_NEGATIVE,
    POSITIVE,
    POSITIVE_INT,
    above,
    between,
    in_range,
    ranged,
)
from dsrecipes.utils.recipe_facts import RecipeFacts


class OptimizerImpl(ConfigEnum):
    """torch's kernels for an optimizer step: auto (fused when every parameter is on CUDA and the
    class has a working fused kernel, else foreach), or one of them forced."""

    auto = "auto"
    fused = "fused"
    foreach = "foreach"
    for_loop = "for_loop"


class StateDtype(ConfigEnum):
    """The dtype of the optimizer's state tensors: fp32, or bf16 (the Adam family's moments, stochastically rounded;
    dsrecipes.training.optim.compact_adam)."""

    fp32 = "fp32"
    bf16 = "bf16"


class MuonNSMethod(ConfigEnum):
    """How optimizer=muon computes the Newton-Schulz polynomial: gram (DeepSpeed's default: on the small Gram matrix)
    or standard (on the matrix itself); the same iteration."""

    gram = "gram"
    standard = "standard"


class MuonNSDtype(ConfigEnum):
    """The dtype of optimizer=muon's Newton-Schulz iteration: auto (DeepSpeed's choice for the method and device) or
    one forced."""

    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class MuonUpdateScale(ConfigEnum):
    """optimizer=muon's scale of the orthogonalised update: match_adamw_rms (rms_target * sqrt(max(rows, cols))) or
    shape_ratio (sqrt(max(1, rows / cols)))."""

    match_adamw_rms = "match_adamw_rms"
    shape_ratio = "shape_ratio"


def _mixed_parameters_foreach(root, dims):
    impl = str(root.optimizer.impl)
    if dims.mixes_parameter_kinds and impl in ("fused", "foreach"):
        return (f"parallel.tp={dims.tp} with optimizer.impl={impl}: tensor-parallel and replicated parameters "
                "cannot share one fused/foreach kernel; use optimizer.impl auto or for_loop")
    return None


_ONEBIT = ("onebitadam", "zerooneadam", "onebitlamb")


def _onebit_zero(root, dims):
    if root.optimizer.name in _ONEBIT and root.zero.stage >= 1:
        return (f"optimizer={root.optimizer.name} with zero.stage={root.zero.stage} is not supported: the 1-bit "
                "optimizers average the whole momentum themselves, which ZeRO's sharded optimizer states and "
                "gradients cannot give them (DeepSpeed refuses it too); use zero.stage=0")
    return None


def _onebit_model_parallel(root, dims):
    if root.optimizer.name not in _ONEBIT:
        return None
    for key, degree in (("parallel.tp", dims.tp), ("parallel.pp", dims.pp), ("parallel.sp", dims.sp),
                        ("moe.ep_size", dims.ep)):
        if degree > 1:
            return (f"optimizer={root.optimizer.name} with {key}={degree} is not supported yet: the onebit strategy "
                    "compresses plain data-parallel momentum only (untested with model-parallel layouts); use "
                    f"{key}=1 or optimizer=adam / lamb")
    return None


def _compact_state_of_bf16_masters(root, dims):
    from dsrecipes.training.precision import steps_bf16_masters

    if not steps_bf16_masters(root.precision):
        return None
    if root.optimizer.name == "adamw8bit" or str(getattr(root.optimizer, "state_dtype", "fp32")) != "fp32":
        what = ("optimizer=adamw8bit" if root.optimizer.name == "adamw8bit"
                else f"optimizer.state_dtype={root.optimizer.state_dtype}")
        return (f"{what} with precision.master_dtype=bf16 is not supported: with bf16 master weights the optimizer's "
                "state is bf16 already (the weights' dtype); use optimizer.state_dtype=fp32 with optimizer=adamw")
    return None


def _quantized_state_nvme(root, dims):
    if root.optimizer.name == "adamw8bit" and str(root.zero.offload_optimizer) == "nvme":
        return ("optimizer=adamw8bit with zero.offload_optimizer=nvme is not supported: the NVMe swapper pages plain "
                "state tensors, and torchao's 8-bit state is a tensor subclass (codes and block scales); use "
                "zero.offload_optimizer=cpu or none, or optimizer=adamw with optimizer.state_dtype=bf16")
    return None


@dataclass
class OptimizerConfig:
    """Keys every optimizer option has; the base of the option schemas below (not an option itself).

    name is the option (conf/optimizer/<name>.yaml on the command line, the `name` key in a dict
    given to dsrecipes.initialize); _target_ is the class (or factory) built, by import path, with
    the option's other keys as its arguments (Hydra's flat convention). The engine itself reads
    name, impl and no_decay_bias_and_norm (never passed to the class) and applies weight_decay per
    parameter group (0 for biases, norm weights and other 1-D parameters when
    no_decay_bias_and_norm), also passing it to the class when the class takes it.
    """

    # how the group composes with the layouts and the other groups (dsrecipes.config.compatibility)
    COMPATIBILITY: ClassVar[tuple[Refusal | Supported, ...]] = (
        Refusal("tp with optimizer.impl fused/foreach", "DTensor and plain parameters cannot share one kernel; tp runs "
                "the optimizer's for-loop implementation", _mixed_parameters_foreach),
        Refusal("1-bit optimizers with zero.stage >= 1", "they average the whole momentum themselves (DeepSpeed refuses "
                "it too)", _onebit_zero),
        Refusal("1-bit optimizers with tp / pp / sp / ep", "not implemented yet (plain data parallelism only)",
                _onebit_model_parallel),
        Supported("optimizer=muon with ZeRO 0-3 and tp", "supported: each sharded matrix gathered whole for the "
                  "Newton-Schulz iteration, every rank keeping its shard of the result; resumes in one process; "
                  "DeepSpeed's Muon's losses at ZeRO 0-3", ("muon-dp2-zero3", "muon-tp2",
                  "tests/integration/test_deepspeed_parity.py::test_muon_matches_deepspeed")),
        Supported("optimizer.state_dtype=bf16 with ZeRO 0-3", "supported: stochastic rounding by each element's index in "
                  "the whole tensor, so the sharding does not change it", ("adamw_bf16_state-dp2-zero3",)),
        Refusal("compact optimizer state (state_dtype=bf16, adamw8bit) with precision.master_dtype=bf16", "the "
                "state of bf16 master weights is bf16 already", _compact_state_of_bf16_masters),
        Refusal("optimizer=adamw8bit with NVMe optimizer offload", "the NVMe swapper pages plain tensors; torchao's "
                "8-bit state is a tensor subclass", _quantized_state_nvme),
    )

    name: str = MISSING
    _target_: str = MISSING
    lr: float = ranged(1e-3, POSITIVE)
    weight_decay: float = ranged(0.1, NON_NEGATIVE)
    impl: OptimizerImpl = OptimizerImpl.auto
    no_decay_bias_and_norm: bool = True
    state_dtype: StateDtype = StateDtype.fp32

    CHECKED_BY_ENGINE: ClassVar[bool] = True  # dsrecipes.initialize checks it too (validate_engine_config)
    # keys the engine reads to form the parameter groups (regroup), never passed to the class
    GROUPING_KEYS: ClassVar[tuple[str, ...]] = ()

    def regroup(self, module: Any, groups: list[dict]) -> list[dict]:
        """The parameter groups the class is built over, from the decay groups (the option's own split; none)."""
        return groups

    def check(self, facts: RecipeFacts) -> None:
        """The option's own checks (an unknown `name`, a key the option does not take, `custom`'s arguments)."""
        from dsrecipes.training.optim.optimizers import validate_optimizer_config

        validate_optimizer_config(self)


@dataclass
class AdamWConfig(OptimizerConfig):
    """optimizer=adamw (the default): torch.optim.AdamW, decoupled weight decay."""

    name: str = "adamw"
    _target_: str = "torch.optim.AdamW"
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95], metadata=in_range(between(0, 1, high_open=True)))
    eps: float = ranged(1e-8, NON_NEGATIVE)
    amsgrad: bool = False


@dataclass
class AdamConfig(OptimizerConfig):
    """optimizer=adam, as DeepSpeed reads "Adam": adam_w_mode true (its default) builds AdamW
    (decoupled weight decay), false builds torch.optim.Adam (L2 weight decay in the gradient)."""

    name: str = "adam"
    _target_: str = "dsrecipes.training.optim.optimizers.adam"
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95], metadata=in_range(between(0, 1, high_open=True)))
    eps: float = ranged(1e-8, NON_NEGATIVE)
    adam_w_mode: bool = True
    amsgrad: bool = False


@dataclass
class SGDConfig(OptimizerConfig):
    """optimizer=sgd: torch.optim.SGD; nesterov needs momentum > 0; weight decay is L2."""

    name: str = "sgd"
    _target_: str = "torch.optim.SGD"
    momentum: float = ranged(0.0, NON_NEGATIVE)
    nesterov: bool = False


@dataclass
class AdagradConfig(OptimizerConfig):
    """optimizer=adagrad: torch.optim.Adagrad; weight decay is L2."""

    name: str = "adagrad"
    _target_: str = "torch.optim.Adagrad"
    lr_decay: float = ranged(0.0, NON_NEGATIVE)
    eps: float = ranged(1e-8, NON_NEGATIVE)


@dataclass
class LambConfig(OptimizerConfig):
    """optimizer=lamb: DeepSpeed FusedLamb's update, the trust ratio ||p||/||u|| clamped to [min_coeff, max_coeff]."""

    name: str = "lamb"
    _target_: str = "dsrecipes.training.optim.lamb.Lamb"
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95], metadata=in_range(between(0, 1, high_open=True)))
    eps: float = ranged(1e-8, NON_NEGATIVE)
    max_coeff: float = ranged(10.0, NON_NEGATIVE)
    min_coeff: float = ranged(0.01, NON_NEGATIVE)
    bias_correction: bool = True


@dataclass
class LionConfig(OptimizerConfig):
    """optimizer=lion: sign momentum (dsrecipes.training.optim.lion.Lion)."""

    name: str = "lion"
    _target_: str = "dsrecipes.training.optim.lion.Lion"
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95], metadata=in_range(between(0, 1, high_open=True)))


@dataclass
class OneBitAdamConfig(OptimizerConfig):
    """optimizer=onebitadam: DeepSpeed's OnebitAdam (DeepSpeed <= 0.19.6; dsrecipes.training.optim.onebit_adam): Adam
    for freeze_step updates, then the variance frozen and the momentum averaged by a 1-bit compressed all-reduce
    (the `onebit` data-parallel strategy). bias_correction false is DeepSpeed's update (its flag is unused)."""

    name: str = "onebitadam"
    _target_: str = "dsrecipes.training.optim.onebit_adam.OneBitAdam"
    weight_decay: float = ranged(0.0, NON_NEGATIVE)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999], metadata=in_range(between(0, 1, high_open=True)))
    eps: float = ranged(1e-8, NON_NEGATIVE)
    freeze_step: int = ranged(100000, POSITIVE_INT)  # at least one uncompressed warm-up update
    bias_correction: bool = False


@dataclass
class ZeroOneAdamConfig(OptimizerConfig):
    """optimizer=zerooneadam: DeepSpeed's ZeroOneAdam (DeepSpeed <= 0.19.6; dsrecipes.training.optim.zero_one_adam):
    variance updated at exponentially spaced steps until var_freeze_step, 1-bit compressed gradients in between,
    then local steps with 1-bit momentum syncs at intervals growing up to local_step_clipper."""

    name: str = "zerooneadam"
    _target_: str = "dsrecipes.training.optim.zero_one_adam.ZeroOneAdam"
    weight_decay: float = ranged(0.0, NON_NEGATIVE)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999], metadata=in_range(between(0, 1, high_open=True)))
    eps: float = ranged(1e-8, NON_NEGATIVE)
    var_freeze_step: int = ranged(100000, COUNT)
    var_update_scaler: int = ranged(16, POSITIVE_INT)
    local_step_scaler: int = ranged(32678, POSITIVE_INT)
    local_step_clipper: int = ranged(16, POSITIVE_INT)
    bias_correction: bool = False


@dataclass
class OneBitLambConfig(OptimizerConfig):
    """optimizer=onebitlamb: DeepSpeed's OnebitLamb (DeepSpeed <= 0.19.6; dsrecipes.training.optim.onebit_lamb): LAMB
    for freeze_step updates, then frozen (averaged) trust coefficients scaled by a bounded factor and the
    momentum averaged by a 1-bit compressed all-reduce."""

    name: str = "onebitlamb"
    _target_: str = "dsrecipes.training.optim.onebit_lamb.OneBitLamb"
    weight_decay: float = ranged(0.0, NON_NEGATIVE)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999], metadata=in_range(between(0, 1, high_open=True)))
    eps: float = ranged(1e-8, NON_NEGATIVE)
    freeze_step: int = ranged(100000, POSITIVE_INT)  # at least one uncompressed warm-up update
    max_coeff: float = ranged(10.0, NON_NEGATIVE)
    min_coeff: float = ranged(0.01, NON_NEGATIVE)
    coeff_beta: float = ranged(0.9, between(0, 1, high_open=True))
    factor_max: float = ranged(4.0, POSITIVE)
    factor_min: float = ranged(0.5, POSITIVE)
    factor_threshold: float = ranged(0.1, between(0, 1, high_open=True))
    bias_correction: bool = False
    refresh_scaling: bool = True  # recompute the momentum scaling coefficients every compressed step (False: DeepSpeed's)


@dataclass
class MuonConfig(OptimizerConfig):
    """optimizer=muon: Newton-Schulz orthogonalised momentum for the hidden matrices, Adam for the rest
    (dsrecipes.training.optim.muon.Muon; the split by name: dsrecipes.training.optim.muon_params).

    lr is Muon's and, unless adam_lr is set, Adam's too (DeepSpeed's rule); weight_decay is decoupled in both
    halves. update_scale=match_adamw_rms (the default: Moonlight's, an update RMS of rms_target) lets AdamW's lr and
    weight decay carry over; shape_ratio (DeepSpeed's and Keller Jordan's) wants lr ~0.02 and usually adam_lr.
    ns_dtype auto runs the iteration in DeepSpeed's dtype for ns_method on the device (fp32 for gram on a CPU).
    """

    GROUPING_KEYS: ClassVar[tuple[str, ...]] = ("muon_params", "adam_params", "adam_lr")

    name: str = "muon"
    _target_: str = "dsrecipes.training.optim.muon.Muon"
    lr: float = ranged(1e-3, POSITIVE)
    adam_lr: float | None = ranged(None, above(0, nullable=True, null_means="optimizer.lr"))
    momentum: float = ranged(0.95, between(0, 1, high_open=True))
    nesterov: bool = True
    ns_steps: int = ranged(5, POSITIVE_INT)
    ns_method: MuonNSMethod = MuonNSMethod.gram
    ns_dtype: MuonNSDtype = MuonNSDtype.auto
    update_scale: MuonUpdateScale = MuonUpdateScale.match_adamw_rms
    rms_target: float = ranged(0.2, POSITIVE)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95], metadata=in_range(between(0, 1, high_open=True)))
    eps: float = ranged(1e-8, NON_NEGATIVE)
    muon_params: list[str] = field(default_factory=lambda: ["all-matrices"])
    adam_params: list[str] = field(default_factory=lambda: ["embed", "lm_head", "tok_emb", "pos_emb", "wte", "wpe"])

    def check(self, facts: RecipeFacts) -> None:
        from dsrecipes.training.optim.muon_params import check_entries

        super().check(facts)
        check_entries(list(self.muon_params), "optimizer.muon_params")
        check_entries(list(self.adam_params), "optimizer.adam_params")
        if not self.muon_params:
            raise ValueError("optimizer.muon_params=[] selects nothing for Muon; give name substrings, 're:<regex>' "
                             "entries or all-matrices (or use optimizer=adamw)")

    def regroup(self, module: Any, groups: list[dict]) -> list[dict]:
        """Each decay group split into its Muon and Adam halves (use_muon true / false)."""
        from dsrecipes.training.optim.muon_params import split_muon_groups

        return split_muon_groups(module, groups, list(self.muon_params), list(self.adam_params), self.adam_lr)


@dataclass
class AdamW8bitConfig(OptimizerConfig):
    """optimizer=adamw8bit: torchao's AdamW8bit (torchao.optim), AdamW whose two moments are held in 8 bits (a
    dynamic-tree code per element, one fp32 scale per block_size elements): about 2 bytes of state per parameter
    instead of 8. torchao is an optional extra (pip install 'dsrecipes[torchao]'); without it the recipe is refused
    before any work. bf16_stochastic_round rounds bf16 parameters stochastically (torchao's flag)."""

    name: str = "adamw8bit"
    _target_: str = "torchao.optim.AdamW8bit"
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95], metadata=in_range(between(0, 1, high_open=True)))
    eps: float = ranged(1e-8, NON_NEGATIVE)
    amsgrad: bool = False
    block_size: int = ranged(256, POSITIVE_INT)
    bf16_stochastic_round: bool = False

    def check(self, facts: RecipeFacts) -> None:
        if not torchao_installed():
            raise ValueError("optimizer=adamw8bit needs torchao, which is not installed: pip install "
                             "'dsrecipes[torchao]' (or choose optimizer.state_dtype=bf16 with optimizer=adamw, 4 bytes "
                             "of state per parameter)")
        super().check(facts)


def torchao_installed() -> bool:
    """Whether optimizer=adamw8bit can be built here (torchao importable; not imported by this check)."""
    import importlib.util

    return importlib.util.find_spec("torchao") is not None


@dataclass
class RMSpropConfig(OptimizerConfig):
    """optimizer=rmsprop: a plain torch.optim class as an option (its arguments as keys)."""

    name: str = "rmsprop"
    _target_: str = "torch.optim.RMSprop"
    weight_decay: float = ranged(0.0, NON_NEGATIVE)
    alpha: float = ranged(0.99, NON_NEGATIVE)
    eps: float = ranged(1e-8, NON_NEGATIVE)
    momentum: float = ranged(0.0, NON_NEGATIVE)
    centered: bool = False


@dataclass
class CustomOptimizerConfig(ExtraArguments, OptimizerConfig):
    """optimizer=custom: any optimizer class by import path, with its constructor arguments as flat keys.

    `optimizer=custom optimizer._target_=torch.optim.NAdam optimizer.momentum_decay=0.004`: keys
    beyond the shared ones go to the class; each is checked against its signature before any
    work starts, so a misspelled one fails naming it and the class's arguments.
    """

    name: str = "custom"
    weight_decay: float = ranged(0.0, NON_NEGATIVE)
    extra_arguments: dict[str, Any] = _extra_arguments_field()


# The options of each group (conf/<group>/<name>.yaml extends `<name>_schema`), default first.
OPTIMIZER_SCHEMAS: dict[str, type] = {
    cls.name: cls
    for cls in (AdamWConfig, AdamConfig, SGDConfig, AdagradConfig, LambConfig, LionConfig, MuonConfig, AdamW8bitConfig,
                RMSpropConfig, OneBitAdamConfig, ZeroOneAdamConfig, OneBitLambConfig, CustomOptimizerConfig)
}
