"""ModelConfig: the shape of a decoder-only GPT, shared by the Hydra `model` group and Python users.

Plain dataclass (no Hydra) so it doubles as the structured-config schema of conf/model/*.yaml and as
the constructor argument of `dsrecipes.models.GPT`. `style` is a ConfigEnum (ModelStyle), so a bad
value fails at composition; Python users may pass the plain string (`ModelConfig(style="llama")`),
which `validate_model_config` checks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from dsrecipes.models.hf_compatibility import HF_MODULE_ROWS
from dsrecipes.utils.config_enum import ConfigEnum, enum_values
from dsrecipes.utils.inactive_rules import Inactive
from dsrecipes.utils.ranges import POSITIVE, POSITIVE_INT, at_least, between, check_section, ranged
from dsrecipes.utils.recipe_facts import RecipeFacts


class ModelStyle(ConfigEnum):
    """gpt2: LayerNorm, GELU MLP, learned positions; llama: RMSNorm, SwiGLU MLP, rotary positions, GQA (both
    dsrecipes' own blocks); hf: the Hugging Face module itself (model.path's architecture as transformers builds it,
    dsrecipes.models.hf_module)."""

    gpt2 = "gpt2"
    llama = "llama"
    hf = "hf"


MODEL_STYLES = enum_values(ModelStyle)
NATIVE_STYLES = ("gpt2", "llama")


class ModelImpl(ConfigEnum):
    """model.impl for model.path=DIR: native (dsrecipes' blocks, where the architecture maps onto them exactly),
    transformers (the Hugging Face module), or auto (native where it maps, else transformers)."""

    auto = "auto"
    native = "native"
    transformers = "transformers"


class RopeType(ConfigEnum):
    """Rotary frequencies: default (theta only), linear (positions / rope_factor), llama3 (Llama 3.1's
    wavelength-dependent scaling by rope_factor, rope_low_freq_factor, rope_high_freq_factor)."""

    default = "default"
    linear = "linear"
    llama3 = "llama3"


def padded_vocab_size(tokenizer_vocab: int, multiple: int = 64) -> int:
    """Round the embedding table up to a multiple of 64 rows (faster matmuls; extra rows never targets)."""
    return multiple * math.ceil(tokenizer_vocab / multiple)


@dataclass
class ModelConfig:
    """Decoder-only transformer shape.

    style: "gpt2" = LayerNorm, GELU MLP, learned positions, biases;
           "llama" = RMSNorm, SwiGLU MLP, rotary positions, optional grouped-query attention.
    bias: biases of every linear layer (and LayerNorm); qkv_bias overrides it for the query/key/value
          projections alone (Qwen2's layout: bias=false, qkv_bias=true).
    d_head: the size of one attention head; None = d_model / n_head (Qwen3 and Gemma set their own head_dim).
    qk_norm: an RMSNorm over each query and key head before the rotary embedding (Qwen3's q_norm / k_norm).
    rope_type / rope_factor / rope_low_freq_factor / rope_high_freq_factor / rope_original_max_seq_len: scaled
          rotary frequencies (Llama 3.1's llama3 scaling; linear position interpolation), HF's rope_scaling.
    path: a Hugging Face checkpoint directory (or hub name) whose weights the Trainer starts from;
          conf/model/hf.yaml fills the other fields from its config.json (dsrecipes.models.hf_config).
    impl: with path, how it runs (ModelImpl); the chosen way shows in `style` (hf = the transformers module).
    trust_remote_code: with path, let transformers run the checkpoint's own modelling code (auto_map).
    """

    # how a Hugging Face module (style hf) composes with the other groups (dsrecipes.config.compatibility)
    COMPATIBILITY: ClassVar[tuple] = HF_MODULE_ROWS

    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        Inactive(lambda root, m: m.style != "llama", lambda root, path: f"model.style={root.model.style} has learned "
                 "positions (rotary embeddings are llama's)", keys=("rope_theta", "rope_type")),
        Inactive(lambda root, m: m.rope_type == "default" or m.style != "llama", lambda root, path: "model.rope_type="
                 f"{root.model.rope_type} (or a style without rotary embeddings)",
                 keys=("rope_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_seq_len")),
        Inactive(lambda root, m: not m.path, lambda root, path: "model.path is not set (they choose how a Hugging "
                 "Face checkpoint runs)", keys=("impl", "trust_remote_code")),
    )

    name: str = "custom"
    style: ModelStyle = ModelStyle.gpt2
    n_layer: int = ranged(4, POSITIVE_INT)
    n_head: int = ranged(4, POSITIVE_INT)
    # None = n_head (multi-head); fewer = grouped-query attention
    n_kv_head: int | None = ranged(None, at_least(1, nullable=True, null_means="model.n_head"))
    d_model: int = ranged(128, POSITIVE_INT)
    # None = 4*d_model (gpt2) or ~8/3*d_model rounded to 64 (llama)
    d_ff: int | None = ranged(None, at_least(1, nullable=True, null_means="4*d_model, or SwiGLU's 8/3*d_model for llama"))
    # None = taken from the tokenizer by the recipe
    vocab_size: int | None = ranged(None, at_least(1, nullable=True, null_means="the tokenizer's"))
    max_seq_len: int = ranged(128, POSITIVE_INT)
    dropout: float = ranged(0.0, between(0, 1, high_open=True))
    bias: bool = True
    qkv_bias: bool | None = None  # None = bias
    norm_eps: float = ranged(1e-5, POSITIVE)
    rope_theta: float = ranged(10000.0, POSITIVE)
    tie_embeddings: bool = True
    init_std: float = ranged(0.02, POSITIVE)
    d_head: int | None = ranged(None, at_least(1, nullable=True, null_means="d_model / n_head"))
    qk_norm: bool = False
    rope_type: RopeType = RopeType.default
    rope_factor: float = ranged(1.0, POSITIVE)
    rope_low_freq_factor: float = ranged(1.0, POSITIVE)
    rope_high_freq_factor: float = ranged(4.0, POSITIVE)
    rope_original_max_seq_len: int | None = ranged(None, at_least(1, nullable=True, null_means="model.max_seq_len"))
    path: str | None = None  # model=hf: the Hugging Face checkpoint the weights come from
    impl: ModelImpl = ModelImpl.auto
    trust_remote_code: bool = False

    @property
    def attn_qkv_bias(self) -> bool:
        """Whether the query/key/value projections have biases."""
        return self.bias if self.qkv_bias is None else bool(self.qkv_bias)

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def head_dim(self) -> int:
        return self.d_head or self.d_model // self.n_head

    @property
    def runs_transformers(self) -> bool:
        """Whether the model is the Hugging Face module itself (style hf), not dsrecipes' blocks."""
        return self.style == "hf"

    @property
    def ffn_dim(self) -> int:
        if self.d_ff:
            return self.d_ff
        if self.style == "llama":
            return 64 * ((int(8 * self.d_model / 3) + 63) // 64)
        return 4 * self.d_model

    def check(self, facts: RecipeFacts) -> None:
        """The group's own checks (dsrecipes.config.validate walks the groups); with model.path, the checkpoint's
        (dsrecipes.models.hf_checks: transformers, weights, tokenizer, sizes against tp / sp)."""
        validate_model_config(self)
        if self.path:
            from dsrecipes.models.hf_checks import check_checkpoint_recipe

            check_checkpoint_recipe(facts.root)


def validate_model_config(cfg: ModelConfig, prefix: str = "model") -> None:
    """Raise ValueError naming the key, its value and what would be valid."""

    if cfg.style not in MODEL_STYLES:
        raise ValueError(f"{prefix}.style={cfg.style!r} is not valid; choose one of: {', '.join(MODEL_STYLES)}")
    if cfg.style == "hf" and not cfg.path:
        raise ValueError(f"{prefix}.style=hf runs a Hugging Face module and needs {prefix}.path=DIR (use model=hf "
                         f"{prefix}.path=DIR)")
    if cfg.rope_type not in enum_values(RopeType):
        raise ValueError(f"{prefix}.rope_type={cfg.rope_type!r} is not valid; choose one of: "
                         f"{', '.join(enum_values(RopeType))}")
    # every numeric field: n_layer, n_head, d_model, max_seq_len, d_ff, vocab_size >= 1 (or null), dropout in
    # [0, 1), norm_eps, rope_theta, init_std > 0 (finite)
    check_section(cfg, prefix)
    if cfg.style == "hf":  # transformers' own config says what its module computes
        return
    if cfg.d_head is None and cfg.d_model % cfg.n_head:
        raise ValueError(
            f"{prefix}.d_model={cfg.d_model} must be divisible by {prefix}.n_head={cfg.n_head} (or set "
            f"{prefix}.d_head, the size of one head)"
        )
    if cfg.n_kv_head is not None and (cfg.n_kv_head <= 0 or cfg.n_head % cfg.n_kv_head):
        raise ValueError(
            f"{prefix}.n_kv_head={cfg.n_kv_head} must be a positive divisor of {prefix}.n_head={cfg.n_head}"
        )
    if cfg.style == "llama" and cfg.head_dim % 2:
        raise ValueError(
            f"{prefix}: rotary embeddings need an even head dim, got {cfg.head_dim} ({prefix}.d_head, or d_model/n_head)"
        )
    if cfg.style != "llama" and (cfg.qk_norm or cfg.d_head not in (None, cfg.d_model // cfg.n_head)):
        key = "qk_norm" if cfg.qk_norm else "d_head"
        raise ValueError(f"{prefix}.{key}={getattr(cfg, key)} needs {prefix}.style=llama (gpt2 blocks have neither "
                         "per-head norms nor a head size other than d_model / n_head)")
