"""PeftConfig: what parameter-efficient fine-tuning (LoRA) does to a model, and its checks.

A plain dataclass (no Hydra), so it serves both as an OmegaConf structured-config schema (only str / int / float /
bool / list[str] fields, None-able with `| None`) and as the argument of `dsrecipes.peft.apply_lora` for Python users.
`validate_peft_config` raises ValueError naming the key, its value and what would be valid, the way every dsrecipes
config section does.

target_modules follow PEFT's rules, so an adapter's config reads the same in both:
  * "q_proj" matches a module whose qualified name is "q_proj" or ends with ".q_proj";
  * "re:<regex>" matches a module whose qualified name the regex fullmatches;
  * "all-linear" matches every nn.Linear but the LM head.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from dsrecipes.utils.compatibility_rows import Refusal, Supported
from dsrecipes.utils.config_enum import ConfigEnum
from dsrecipes.utils.name_patterns import REGEX_PREFIX, check_regex, regex_matches
from dsrecipes.utils.ranges import POSITIVE, POSITIVE_INT, SEED_MAX, Range, between, ranged

PEFT_METHODS = ("none", "lora")
LORA_BIASES = ("none", "all", "lora_only")
ALL_LINEAR = "all-linear"

# dsrecipes' own blocks (dsrecipes.models.layers) and the Hugging Face Llama / Qwen / Mistral family alike
DEFAULT_TARGET_MODULES = (
    "q_proj", "kv_proj", "out_proj", "gate", "up", "fc_in", "fc_out",
    "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
)


class PeftMethod(ConfigEnum):
    """``peft.method``: train every parameter, or low-rank adapters on a frozen model."""

    none = "none"
    lora = "lora"


class LoraBias(ConfigEnum):
    """``peft.bias``: PEFT's meaning (none frozen, all trained, lora_only: the adapted Linears' biases trained)."""

    none = "none"
    all = "all"
    lora_only = "lora_only"


class QuantizeBase(ConfigEnum):
    """``peft.quantize_base``: keep the frozen base weights of the adapted Linears in float, int8 or int4 (QLoRA)."""

    none = "none"
    int8 = "int8"
    int4 = "int4"


def _quantized_base_with(root, dims):
    if not root.peft.enabled or root.peft.quantize_base == "none":
        return None
    if root.zero.stage == 3 or dims.tp > 1 or dims.pp > 1:
        return (f"peft.quantize_base={root.peft.quantize_base} is not supported with zero.stage={root.zero.stage} "
                f"parallel.tp={dims.tp} parallel.pp={dims.pp}: the codes are buffers that FSDP2 and the tp plans do not "
                "shard; use zero.stage=0..2 (DDP, ZeRO-1/2) or peft.quantize_base=none")
    return None


def _pp_lora(root, dims):
    if dims.pp > 1 and root.peft.enabled:
        return (f"peft.method=lora is not supported with parallel.pp={dims.pp}: the adapters are not placed on "
                "pipeline stages yet; use parallel.pp=1")
    return None


def _tp_lora(root, dims):
    if dims.tp > 1 and root.peft.enabled and root.model.runs_transformers:
        return (f"peft.method=lora is not supported with parallel.tp={dims.tp} on the transformers path "
                f"(model.style=hf) yet: its own tp plan shards the Linears, not the adapters around them; use ZeRO "
                "(zero.stage=0..3), or model.impl=native where the architecture allows")
    return None


def _lora_with(root, dims):
    if not root.peft.enabled:
        return None
    from dsrecipes.compression.config import compression_enabled

    for key, on in (("compression", bool(compression_enabled(root))), ("moe", root.moe.enabled),
                    ("fp8", root.fp8.enabled)):
        if on:
            return (f"peft.method=lora is not supported with {key} on: it replaces or reads the same nn.Linear "
                    f"weights the adapters wrap; turn {key} off, or peft=none")
    return None


@dataclass
class PeftConfig:
    """Parameter-efficient fine-tuning.

    method: "none" (train every parameter) or "lora" (freeze the model, train low-rank adapters).
    r: the adapters' rank; alpha: their scale numerator (the update is B @ A * alpha / r).
    dropout: dropout on the adapters' input (PEFT's lora_dropout).
    target_modules: which nn.Linear modules get an adapter (see the module docstring).
    bias: PEFT's meaning: "none" (every bias frozen), "all" (every bias of the model trained),
          "lora_only" (the biases of the adapted Linears trained).
    quantize_base: QLoRA-style: the adapted Linears' frozen weights kept as int8 (per output channel) or int4 (per
          group of quantize_group_size inputs) codes, dequantized in each forward (dsrecipes.peft.quantized_base).
    quantize_group_size: int4's group size (even, dividing every adapted Linear's input size).
    init_seed: seed of lora_A's initialisation (its own generator, so every rank and device draws the same
          values whatever the global random state); None = the global random stream (the recipe: trainer.seed).
    """

    COMPATIBILITY: ClassVar[tuple[Refusal | Supported, ...]] = (
        Refusal("LoRA with pp", "the adapters are not placed on pipeline stages yet", _pp_lora),
        Refusal("LoRA with tp on the transformers path", "its own tp plan does not shard the adapters yet", _tp_lora),
        Refusal("LoRA with a quantized base under ZeRO-3, tp or pp", "its codes are buffers FSDP2 and tp do not shard",
                _quantized_base_with),
        Supported("LoRA with an int8 / int4 base (QLoRA-style) under ZeRO 0-2", "supported: frozen codes dequantized "
                  "per call, the adapters in float", ("qlora-int8-dp2-zero2",)),
        Refusal("LoRA with compression, dsrecipes MoE or fp8", "they replace or read the wrapped Linears' weights",
                _lora_with),
        Supported("LoRA under ZeRO 0-3", "supported: only the adapters trained and given optimizer state, the base "
                  "weights frozen and sharded like any parameter", ("lora-dp2-zero3", "lora-dp2-zero2")),
        Supported("LoRA with tp on dsrecipes' blocks", "supported: column-parallel Linears' lora_B sharded as their "
                  "rows, row-parallel Linears' lora_A as their columns (sequence-parallel activations included)",
                  ("lora-tp2",)),
    )

    method: PeftMethod = PeftMethod.none
    r: int = ranged(8, POSITIVE_INT)
    alpha: float = ranged(16.0, POSITIVE)
    dropout: float = ranged(0.0, between(0, 1, high_open=True))
    target_modules: list[str] = field(default_factory=lambda: list(DEFAULT_TARGET_MODULES))
    bias: LoraBias = LoraBias.none
    quantize_base: QuantizeBase = QuantizeBase.none
    quantize_group_size: int = ranged(64, POSITIVE_INT)
    init_seed: int | None = ranged(None, Range(low=0, high=SEED_MAX, nullable=True, null_means="trainer.seed"))

    def check(self, facts) -> None:
        """The group's keys (the rest is the compatibility matrix's)."""
        validate_peft_config(self)
        if self.enabled and self.quantize_base != "none" and self.bias != "none":
            raise ValueError(f"peft.bias={self.bias} is not valid with peft.quantize_base={self.quantize_base}: a "
                             "quantized base keeps its bias frozen; use peft.bias=none")

    @property
    def enabled(self) -> bool:
        return str(self.method) == "lora"

    @property
    def scaling(self) -> float:
        """The factor of the low-rank update: alpha / r."""
        return float(self.alpha) / int(self.r)


def validate_peft_config(cfg: PeftConfig, prefix: str = "peft") -> None:
    """Raise ValueError naming the key, its value and what would be valid."""
    if cfg.method not in PEFT_METHODS:
        raise ValueError(f"{prefix}.method={cfg.method!r} is not valid; choose one of: {', '.join(PEFT_METHODS)}")
    if cfg.bias not in LORA_BIASES:
        raise ValueError(f"{prefix}.bias={cfg.bias!r} is not valid; choose one of: {', '.join(LORA_BIASES)}")
    if isinstance(cfg.r, bool) or not isinstance(cfg.r, int) or cfg.r < 1:
        raise ValueError(f"{prefix}.r={cfg.r!r} is not valid; the adapters' rank must be an integer >= 1")
    if not _is_number(cfg.alpha) or not cfg.alpha > 0:
        raise ValueError(f"{prefix}.alpha={cfg.alpha!r} is not valid; it must be a number > 0 (the update is "
                         f"scaled by alpha / r)")
    if not _is_number(cfg.dropout) or not 0 <= cfg.dropout < 1:
        raise ValueError(f"{prefix}.dropout={cfg.dropout!r} is not valid; it must lie in [0, 1)")
    if cfg.init_seed is not None and (isinstance(cfg.init_seed, bool) or not isinstance(cfg.init_seed, int)):
        raise ValueError(f"{prefix}.init_seed={cfg.init_seed!r} is not valid; give an integer or null (the global "
                         "random stream)")
    targets = list(cfg.target_modules or [])
    if not targets:
        raise ValueError(f"{prefix}.target_modules={targets!r} is empty; name the nn.Linear modules to adapt (e.g. "
                         f"[{', '.join(DEFAULT_TARGET_MODULES[:3])}], 're:<regex>' or '{ALL_LINEAR}')")
    for entry in targets:
        if not isinstance(entry, str) or not entry:
            raise ValueError(f"{prefix}.target_modules entry {entry!r} is not valid; each entry is a module name, "
                             f"'re:<regex>' or '{ALL_LINEAR}'")
        check_regex(entry, f"{prefix}.target_modules")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def target_matches(name: str, entry: str) -> bool:
    """Whether the module qualified `name` is selected by one target_modules entry (PEFT's rule)."""
    if entry.startswith(REGEX_PREFIX):
        return regex_matches(name, entry)
    return name == entry or name.endswith("." + entry)


def names_explicitly(name: str, entry: str) -> bool:
    """Whether an entry names the module itself (a plain name, not a regex or all-linear): the LM head is adapted
    only when named so."""
    return entry != ALL_LINEAR and not entry.startswith(REGEX_PREFIX) and target_matches(name, entry)
