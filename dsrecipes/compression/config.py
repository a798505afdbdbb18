"""CompressionConfig: the `compression` config group (conf/compression/*.yaml), DeepSpeed's
`compression_training` block with one module group per technique and an `enabled` switch each.

Keys keep DeepSpeed's names (see each section); module selection is by name patterns (glob on the
whole name, else regex search), matched against the model's module names (`blocks.0.attn.q_proj`,
`blocks.3.mlp.fc_in`, ...). Deliberate differences from DeepSpeed, documented per field:
  * one `different_groups` entry per technique (from_deepspeed refuses several, naming the key);
  * head_pruning.num_heads may be null: the model's n_head;
  * layer_reduction.teacher_path: the teacher (a dsrecipes export directory: model.safetensors +
    config.json) is loaded from disk, as in DeepSpeed's KD tutorial; distillation keys live here too;
  * export: run redundancy clean at the end of training and write the smaller model.

`from_deepspeed(dict)` maps a DeepSpeed block onto this dataclass; `library_configs(cfg)` turns the
enabled sections into the library's configs (validating them; errors name `compression.<section>`).

Fixed-choice keys (quantization_type, rounding, range_calibration, the pruning `method`s, ramp) are
Enums, so a bad value fails at composition naming the key and the choices. They are dsrecipes' one
ConfigEnum (dsrecipes.utils.config_enum, a standard-library-only module and the one thing of dsrecipes this
library imports): a member is its string in comparisons, dict keys, f-strings and json.
The library configs receive plain strings (`_plain`), so their state dicts hold no Enum objects; Python
users may set plain strings on the sections, which the library configs check.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

from dsrecipes.utils.compatibility_rows import Refusal, Supported
from dsrecipes.utils.config_enum import ConfigEnum, config_enum
from dsrecipes.utils.inactive_rules import Inactive, switched_off
from dsrecipes.utils.ranges import (
    COUNT,
    NON_NEGATIVE,
    POSITIVE,
    POSITIVE_INT,
    SEED_MAX,
    Range,
    at_least,
    between,
    in_range,
    ranged,
)
from dsrecipes.utils.recipe_facts import RecipeFacts

# The library's configs are imported in the functions that build them: their modules import torch, and the
# recipe schema (RootConfig's `compression` field) imports this module when `python -m dsrecipes --help` composes.
if TYPE_CHECKING:
    from dsrecipes.compression.layer_reduction import DistillationConfig, LayerReductionConfig

__all__ = ["CompressionConfig", "PruningMethod", "PruningRamp", "QuantizationType", "RangeCalibration",
           "Rounding", "from_deepspeed", "library_configs", "validate_compression_config"]





class QuantizationType(ConfigEnum):
    """weight / activation quantization: a zero-centred range or a min..max range with a zero point."""

    symmetric = "symmetric"
    asymmetric = "asymmetric"


class Rounding(ConfigEnum):
    """weight quantization rounding: round half to even, or floor(t + u), u ~ U[0, 1)."""

    nearest = "nearest"
    stochastic = "stochastic"


# activation_quantization.RANGE_CALIBRATIONS, written out here: that module imports torch
RangeCalibration = config_enum("RangeCalibration", ("dynamic", "static"), __name__)


class PruningMethod(ConfigEnum):
    """What scores the weights / rows / heads / channels: their L1 norm, or learned importance scores (topk)."""

    l1 = "l1"
    topk = "topk"


class PruningRamp(ConfigEnum):
    """sparse pruning: shape of the sparsity ramp when schedule_offset_end > schedule_offset."""

    linear = "linear"
    cubic = "cubic"


@dataclass
class WeightQuantizationSection:
    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        switched_off(),
    )

    enabled: bool = False
    start_bits: int = ranged(8, between(2, 16))
    target_bits: int = ranged(8, between(2, 16))  # <= start_bits; bits drop by one every quantization_period steps
    quantization_period: int = ranged(1, COUNT)  # 0: target_bits at once
    schedule_offset: int = ranged(0, COUNT)
    quantization_type: QuantizationType = QuantizationType.symmetric  # symmetric | asymmetric
    rounding: Rounding = Rounding.nearest  # nearest | stochastic
    quantize_groups: int = ranged(1, POSITIVE_INT)  # 1 = per tensor; out_features = per channel; more = per group
    modules: list[str] = field(default_factory=lambda: ["blocks.*"])
    excluded_modules: list[str] = field(default_factory=list)
    # stochastic rounding generator seed
    seed: int | None = ranged(None, Range(low=0, high=SEED_MAX, nullable=True, null_means="unseeded"))


@dataclass
class ActivationQuantizationSection:
    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        switched_off(),
    )

    enabled: bool = False
    bits: int = ranged(8, between(4, 16))
    quantization_type: QuantizationType = QuantizationType.symmetric  # symmetric | asymmetric
    range_calibration: RangeCalibration = RangeCalibration.dynamic  # dynamic | static (DeepSpeed's code default: dynamic)
    schedule_offset: int = ranged(1000, COUNT)
    momentum: float = ranged(0.1, between(0, 1, low_open=True))  # static range EMA
    modules: list[str] = field(default_factory=lambda: ["blocks.*"])
    excluded_modules: list[str] = field(default_factory=list)


@dataclass
class SparsePruningSection:
    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        switched_off(),
    )

    enabled: bool = False
    method: PruningMethod = PruningMethod.l1  # l1 | topk
    dense_ratio: float = ranged(0.1, between(0, 1, low_open=True))  # fraction kept, in (0, 1]
    schedule_offset: int = ranged(1000, COUNT)
    # null = schedule_offset (one shot)
    schedule_offset_end: int | None = ranged(None, at_least(0, nullable=True, null_means="schedule_offset"))
    schedule_offset_stride: int = ranged(1, POSITIVE_INT)
    block_pattern: str = "4x1"  # 1x1 | NxM | N:M
    ramp: PruningRamp = PruningRamp.linear  # linear | cubic
    modules: list[str] = field(default_factory=lambda: ["blocks.*"])
    excluded_modules: list[str] = field(default_factory=list)


@dataclass
class RowPruningSection:
    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        switched_off(),
    )

    enabled: bool = False
    method: PruningMethod = PruningMethod.l1  # l1 | topk
    dense_ratio: float = ranged(0.5, between(0, 1, low_open=True))
    schedule_offset: int = ranged(1000, COUNT)
    modules: list[str] = field(default_factory=lambda: ["*mlp.fc_in"])
    excluded_modules: list[str] = field(default_factory=list)
    related_modules: list[str] = field(default_factory=lambda: ["fc_out"])  # consumers: columns pruned
    sibling_modules: list[str] = field(default_factory=list)  # parallel producers: rows pruned (llama: up)


@dataclass
class HeadPruningSection:
    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        switched_off(),
    )

    enabled: bool = False
    method: PruningMethod = PruningMethod.topk  # l1 | topk
    dense_ratio: float = ranged(0.5, between(0, 1, low_open=True))
    schedule_offset: int = ranged(1000, COUNT)
    num_heads: int | None = ranged(None, at_least(1, nullable=True, null_means="model.n_head"))  # null = model.n_head
    modules: list[str] = field(default_factory=lambda: ["*attn.out_proj"])
    excluded_modules: list[str] = field(default_factory=list)
    related_modules: list[str] = field(default_factory=lambda: ["q_proj", "kv_proj"])


@dataclass
class ChannelPruningSection:
    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        switched_off(),
    )

    enabled: bool = False
    method: PruningMethod = PruningMethod.l1  # l1 | topk
    dense_ratio: float = ranged(0.5, between(0, 1, low_open=True))
    schedule_offset: int = ranged(1000, COUNT)
    modules: list[str] = field(default_factory=lambda: ["*"])
    excluded_modules: list[str] = field(default_factory=list)
    related_modules: list[str] = field(default_factory=list)


@dataclass
class LayerReductionSection:
    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        switched_off(),
    )

    enabled: bool = False
    keep_number_layer: int | None = ranged(None, at_least(1, nullable=True))
    teacher_layer: list[int] = field(default_factory=list, metadata=in_range(COUNT))
    module_name_prefix: str = "blocks"
    other_module_name: list[str] = field(default_factory=list)
    teacher_path: str | None = None  # dsrecipes export dir of the trained teacher (required when enabled)
    temperature: float = ranged(2.0, POSITIVE)  # distillation: KL at temperature T, scaled by T^2
    kd_weight: float = ranged(1.0, NON_NEGATIVE)  # 0 = no logit distillation (layer reduction alone)
    hidden_weight: float = ranged(0.0, NON_NEGATIVE)  # > 0 adds MSE between student layer i and teacher layer teacher_layer[i]


def compression_enabled(root) -> list[str]:
    """The compression sections a recipe (a RootConfig) enables."""
    return [k for k, v in vars(root.compression).items() if getattr(v, "enabled", False)]


def _pp(cond: Callable, key: str) -> Callable:
    """A pipeline refusal: parallel.pp > 1 together with `key`."""
    def message(root, dims):
        if dims.pp > 1 and cond(root):
            return f"parallel.pp={dims.pp} with {key} is not supported yet"
        return None
    return message


def _tp_compression(root, dims):
    comp = root.compression
    for key in ("activation_quantization", "layer_reduction"):
        if dims.tp > 1 and getattr(comp, key).enabled:
            return (f"parallel.tp={dims.tp} with compression.{key}.enabled=true is not supported yet (activation "
                    "ranges would be read from a row-parallel layer's input shard; the distillation loss from "
                    "vocab-parallel logits); weight quantization and pruning run under tp")
    return None


@dataclass
class CompressionConfig:
    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        # not `export`: compression=none itself sets it false
        Inactive(lambda root, c: not c.enabled, lambda root, path: "no compression technique is enabled",
                 keys=("export_dirname",)),
    )

    # how the group composes with the layouts and the other groups (dsrecipes.config.compatibility)
    COMPATIBILITY: ClassVar[tuple[Refusal | Supported, ...]] = (
        Refusal("pp with compression", "not implemented yet", _pp(lambda r: bool(compression_enabled(r)), "compression")),
        Refusal("tp with activation quantization or layer reduction", "not implemented yet (activation ranges would "
                "come from a row-parallel input shard; KD from vocab-parallel logits)", _tp_compression),
        Supported("pruning / QAT with zero.stage 2/3 at dp > 1", "supported: masks and scales from whole weights, masks "
                  "applied to every copy the strategy holds (ZeRO-2 master shards, FSDP2 shards)",
                  ("compression-dp2-zero2", "compression-dp2-zero3",
                   "tests/integration/test_compression_sharded.py::test_dp2_zero2_bf16_master_keeps_pruned_weights_zero")),
        Supported("tp with weight quantization / pruning", "supported: fake-quant groups and masks of the whole weight, "
                  "each rank masking its shard", ("compression-tp2", "compression-dp2xtp2-zero3")),
    )

    weight_quantization: WeightQuantizationSection = field(default_factory=WeightQuantizationSection)
    activation_quantization: ActivationQuantizationSection = field(default_factory=ActivationQuantizationSection)
    sparse_pruning: SparsePruningSection = field(default_factory=SparsePruningSection)
    row_pruning: RowPruningSection = field(default_factory=RowPruningSection)
    head_pruning: HeadPruningSection = field(default_factory=HeadPruningSection)
    channel_pruning: ChannelPruningSection = field(default_factory=ChannelPruningSection)
    layer_reduction: LayerReductionSection = field(default_factory=LayerReductionSection)
    export: bool = True  # at the end of training: redundancy clean, write <run dir>/<export_dirname>/
    export_dirname: str = "export_compressed"

    @property
    def enabled(self) -> bool:
        return any(getattr(self, f.name).enabled for f in fields(self) if f.name not in ("export", "export_dirname"))

    def check(self, facts: RecipeFacts) -> None:
        """The group's own checks, against the model's heads and blocks."""
        validate_compression_config(self, n_head=facts.root.model.n_head, n_layer=facts.root.model.n_layer)


def _library() -> dict[str, type]:
    """{technique: its library config class} for the techniques init_compression builds (layer reduction aside)."""
    from dsrecipes.compression.activation_quantization import ActivationQuantConfig
    from dsrecipes.compression.pruning import SparsePruningConfig
    from dsrecipes.compression.quantization import WeightQuantConfig
    from dsrecipes.compression.structured_pruning import ChannelPruningConfig, HeadPruningConfig, RowPruningConfig

    return {
        "weight_quantization": WeightQuantConfig,
        "activation_quantization": ActivationQuantConfig,
        "sparse_pruning": SparsePruningConfig,
        "row_pruning": RowPruningConfig,
        "head_pruning": HeadPruningConfig,
        "channel_pruning": ChannelPruningConfig,
    }


def _section_kwargs(section, lib_cls) -> dict[str, Any]:
    names = {f.name for f in fields(lib_cls)}
    return {f.name: _plain(getattr(section, f.name)) for f in fields(section) if f.name in names}


def _plain(v):
    """Lists (and ListConfigs) as lists, Enum members as their plain string values."""
    if isinstance(v, Enum):
        return v.value
    return list(v) if isinstance(v, (list, tuple)) or type(v).__name__ == "ListConfig" else v


def library_configs(cfg: CompressionConfig, num_heads: int | None = None,
                    prefix: str = "compression") -> dict[str, Any]:
    """{technique: library config or None} for the techniques init_compression builds (layer
    reduction excluded); ValueError names `<prefix>.<section>` and the key."""
    out: dict[str, Any] = {}
    for name, lib_cls in _library().items():
        section = getattr(cfg, name)
        if not section.enabled:
            out[name] = None
            continue
        kwargs = _section_kwargs(section, lib_cls)
        if name == "head_pruning" and kwargs.get("num_heads") is None:
            kwargs["num_heads"] = num_heads
        try:
            out[name] = lib_cls(**kwargs)
        except ValueError as err:
            raise ValueError(f"{prefix}.{name}: {err}") from None
    return out


def layer_reduction_configs(cfg: CompressionConfig, prefix: str = "compression"
                            ) -> tuple[LayerReductionConfig, DistillationConfig] | None:
    section = cfg.layer_reduction
    if not section.enabled:
        return None
    from dsrecipes.compression.layer_reduction import DistillationConfig, LayerReductionConfig

    try:
        lr = LayerReductionConfig(keep_number_layer=section.keep_number_layer,
                                  teacher_layer=_plain(section.teacher_layer),
                                  module_name_prefix=section.module_name_prefix,
                                  other_module_name=_plain(section.other_module_name))
        kd = DistillationConfig(section.temperature, section.kd_weight, section.hidden_weight)
    except ValueError as err:
        raise ValueError(f"{prefix}.layer_reduction: {err}") from None
    return lr, kd


def validate_compression_config(cfg: CompressionConfig, n_head: int | None = None, n_layer: int | None = None,
                                prefix: str = "compression") -> None:
    """Every check that needs no model: key values, bit order, ratios, layer indices."""
    library_configs(cfg, num_heads=n_head, prefix=prefix)
    hp = cfg.head_pruning
    if hp.enabled and hp.num_heads is not None and n_head is not None and hp.num_heads != n_head:
        raise ValueError(f"{prefix}.head_pruning.num_heads={hp.num_heads} but model.n_head={n_head}; set it to "
                         f"{n_head} or null (the model's)")
    red = layer_reduction_configs(cfg, prefix)
    if red is not None and n_layer is not None:
        try:
            red[0].check_teacher_depth(n_layer)
        except ValueError as err:
            raise ValueError(f"{prefix}.layer_reduction: {err}") from None


def from_deepspeed(ds: dict[str, Any]) -> CompressionConfig:
    """Map a DeepSpeed `compression_training` block (or a whole ds_config holding one) onto CompressionConfig."""
    block = ds.get("compression_training", ds)
    library = _library()
    unknown = set(block) - set(library) - {"layer_reduction"}
    if unknown:
        raise ValueError(f"compression_training: unknown technique(s) {sorted(unknown)}; valid: "
                         f"{sorted(set(library) | {'layer_reduction'})}")
    cfg = CompressionConfig()
    for name, lib_cls in library.items():
        if name not in block:
            continue
        tech = block[name]
        groups = tech.get("different_groups", {})
        if len(groups) > 1:
            raise ValueError(f"compression_training.{name}.different_groups has {len(groups)} groups "
                             f"{sorted(groups)}; dsrecipes supports one group per technique")
        section = getattr(cfg, name)
        section.enabled = bool(tech.get("shared_parameters", {}).get("enabled", False))
        try:
            lib = lib_cls.from_deepspeed(tech)
        except ValueError as err:
            raise ValueError(f"compression_training.{name}: {err}") from None
        for f in fields(section):
            if hasattr(lib, f.name) and f.name != "enabled":
                setattr(section, f.name, getattr(lib, f.name))
        if name == "head_pruning" and "num_heads" not in {**tech.get("shared_parameters", {})}:
            section.num_heads = None
    if "layer_reduction" in block:
        lr = block["layer_reduction"]
        section = cfg.layer_reduction
        for k, v in lr.items():
            if not hasattr(section, k):
                raise ValueError(f"compression_training.layer_reduction.{k} is not a known key; valid: "
                                 f"{[f.name for f in fields(section)]}")
            setattr(section, k, list(v) if isinstance(v, list) else v)
    return cfg
