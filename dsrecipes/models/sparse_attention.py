"""The `sparse_attention` config group and the model hook that runs a GPT's attention block-sparse.

Why: long sequences (1-2k tokens and up) make dense attention's T^2 scores dominate; DeepSpeed's
sparse attention lets each query block see only a few key blocks (dsrecipes.models.sparsity_config).
Select a layout per recipe:

    python -m dsrecipes sparse_attention=bigbird data.block_size=1024 model.max_seq_len=1024
    python -m dsrecipes +experiment=gpt_sparse_long

`SparseAttentionConfig` is the group's schema (DeepSpeed's keys, flat; each mode reads its own).
`apply_sparse_attention(model, cfg)` sets `CausalSelfAttention.attention_fn` on every attention
module to a `BlockSparseAttention` callable: the layout for each sequence length (cached per length
and device; see below) uses the *global* head count, is intersected with the causal block triangle, and the
within-block causal mask applies on diagonal blocks. Nothing is added to the state dict, so
checkpoints move freely between sparse and dense recipes. Sequences that are not a multiple of the
block (generation) are right-padded to one: padded keys lie after every real query, so the causal
mask hides them and the real rows are exact.

Shorter sequences use the top-left corner of one master layout, as DeepSpeed's SparseSelfAttention
does (`master_layout = make_layout(max_seq_length)`, `get_layout(L)` = its first L/block rows and
columns): the master is built at the model's context (`max_seq_len`, rounded up to whole blocks and
to the layout's minimum block count). A causal query block's row then never depends on the sequence
length, so the first tokens of a training sequence and a short generation prompt see the same key
blocks, and lengths below a layout's minimum (BigBird's window of 3 blocks, say, with a one-token
prompt) work. Without a known context, each length gets its own layout, built at the layout's
minimum length when the sequence is shorter.

impl: auto (Triton kernel on CUDA, the gathered pure-torch path otherwise — both ~linear in T),
triton (the kernel; falls back to the dense reference with a warning where Triton cannot run),
gathered, reference (dense masked attention, O(T^2), for checking). The inference engine's KV-cache
decoder keeps dense attention (it does not call `attention_fn`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, ClassVar

from dsrecipes.models.sparsity_config import ATTENTION_TYPES, LAYOUT_CLASSES, SparsityConfig
from dsrecipes.utils.config_enum import ConfigEnum, config_enum, enum_values, plain
from dsrecipes.utils.inactive_rules import Inactive
from dsrecipes.utils.ranges import COUNT, POSITIVE_INT, SEED, at_least, in_range, ranged
from dsrecipes.utils.recipe_facts import RecipeFacts

# torch is imported in the methods that use it: the recipe schema imports SparseAttentionConfig from here, and
# composing a recipe (`python -m dsrecipes --help`) must not import torch.
if TYPE_CHECKING:
    import torch
    from torch import nn

# sparse_attention.mode: none or a layout of dsrecipes.models.sparsity_config (its LAYOUT_CLASSES are the list)
SparseMode = config_enum("SparseMode", ("none", *LAYOUT_CLASSES), __name__)
# sparse_attention.attention: the layouts' attention types (sparsity_config.ATTENTION_TYPES)
SparseAttentionType = config_enum("SparseAttentionType", ATTENTION_TYPES, __name__)


class SparseImpl(ConfigEnum):
    """auto: the Triton kernel on CUDA, gathered elsewhere; triton; gathered (pure torch); reference (dense, masked)."""

    auto = "auto"
    triton = "triton"
    gathered = "gathered"
    reference = "reference"


SPARSE_MODES = enum_values(SparseMode)
SPARSE_IMPLS = enum_values(SparseImpl)
_COMMON_KEYS = ("mode", "block", "impl", "different_layout_per_head", "attention")


@dataclass
class SparseAttentionConfig:
    """DeepSpeed's `sparse_attention` block (same keys and defaults except where noted).

    Deliberate differences: `attention` defaults to unidirectional (our models are causal decoders;
    DeepSpeed's JSON default is bidirectional), `mode` defaults to none (off), `seed` makes random
    blocks reproducible, `impl` picks the implementation.
    """

    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        Inactive(lambda root, s: s.mode == "none", lambda root, path: "sparse_attention.mode=none (dense attention)",
                 but=("mode",)),
    )

    mode: SparseMode = SparseMode.none  # none | dense | fixed | variable | bigbird | bslongformer | sliding_window
    block: int = ranged(16, POSITIVE_INT)  # tokens per layout block side; data.block_size must be a multiple
    impl: SparseImpl = SparseImpl.auto  # auto | triton | gathered | reference
    different_layout_per_head: bool = False
    # unidirectional (causal) | bidirectional (layouts only; the model is causal)
    attention: SparseAttentionType = SparseAttentionType.unidirectional
    num_local_blocks: int = ranged(4, POSITIVE_INT)  # fixed
    num_global_blocks: int = ranged(1, COUNT)  # fixed, bigbird
    horizontal_global_attention: bool = False  # fixed, variable (bidirectional only)
    num_different_global_patterns: int = ranged(1, POSITIVE_INT)  # fixed
    num_random_blocks: int = ranged(0, COUNT)  # variable, bigbird (conf/sparse_attention/bigbird.yaml sets BigBird's 1)
    local_window_blocks: list[int] = field(default_factory=lambda: [4], metadata=in_range(POSITIVE_INT))  # variable
    global_block_indices: list[int] = field(default_factory=lambda: [0], metadata=in_range(COUNT))  # variable, bslongformer
    # variable, bslongformer
    global_block_end_indices: list[int] | None = ranged(None, at_least(1, nullable=True, null_means="one block per start"))
    num_sliding_window_blocks: int = ranged(3, POSITIVE_INT)  # bigbird, bslongformer, sliding_window
    seed: int = ranged(0, SEED)  # random blocks (variable, bigbird): same layout on every rank and after resume

    def check(self, facts: RecipeFacts) -> None:
        """The group's own checks, against the model's heads and dropout and the data's block."""
        model = facts.root.model
        validate_sparse_attention_config(self, model.n_head, facts.root.data.block_size, model.dropout)


def build_sparsity_config(cfg: SparseAttentionConfig, num_heads: int, prefix: str = "sparse_attention") -> SparsityConfig:
    """The layout object for cfg.mode (keys the mode does not use are ignored; see `unused_keys`)."""
    if cfg.mode not in LAYOUT_CLASSES:
        raise ValueError(f"{prefix}.mode={cfg.mode!r} has no layout; choose one of: {', '.join(LAYOUT_CLASSES)}")
    cls = LAYOUT_CLASSES[cfg.mode]
    names = {f.name for f in fields(cls)} - {"num_heads", "prefix"}
    kwargs = {name: plain(getattr(cfg, name)) for name in names if hasattr(cfg, name)}  # layouts take plain strings
    for key in ("local_window_blocks", "global_block_indices", "global_block_end_indices"):
        if key in kwargs and kwargs[key] is not None:
            kwargs[key] = [int(x) for x in kwargs[key]]
    return cls(num_heads=num_heads, prefix=prefix, **kwargs)


def unused_keys(cfg: SparseAttentionConfig) -> list[str]:
    """Keys set away from their defaults that cfg.mode does not read (they would be silently ignored)."""
    if cfg.mode not in LAYOUT_CLASSES:
        return []
    used = {f.name for f in fields(LAYOUT_CLASSES[cfg.mode])} | set(_COMMON_KEYS)
    default = SparseAttentionConfig()
    return [f.name for f in fields(SparseAttentionConfig)
            if f.name not in used and getattr(cfg, f.name) != getattr(default, f.name)]


def validate_sparse_attention_config(cfg: SparseAttentionConfig, n_head: int, seq_len: int, dropout: float = 0.0,
                                     prefix: str = "sparse_attention") -> None:
    """ValueError naming the key unless the layout can be built for `seq_len` (data.block_size) and n_head."""
    if cfg.mode not in SPARSE_MODES:
        raise ValueError(f"{prefix}.mode={cfg.mode!r} is not valid; choose one of: {', '.join(SPARSE_MODES)}")
    if cfg.mode == "none":
        return
    if cfg.impl not in SPARSE_IMPLS:
        raise ValueError(f"{prefix}.impl={cfg.impl!r} is not valid; choose one of: {', '.join(SPARSE_IMPLS)}")
    if cfg.attention not in ATTENTION_TYPES:
        raise ValueError(f"{prefix}.attention={cfg.attention!r} is not valid; choose one of: "
                         f"{', '.join(ATTENTION_TYPES)}")
    if cfg.block < 1:
        raise ValueError(f"{prefix}.block={cfg.block} must be >= 1")
    if seq_len % cfg.block != 0:
        raise ValueError(f"data.block_size={seq_len} must be a multiple of {prefix}.block={cfg.block} "
                         f"(e.g. {max(cfg.block, seq_len - seq_len % cfg.block)})")
    build_sparsity_config(cfg, n_head, prefix).make_layout(seq_len)  # raises on layout-specific problems
    _check_global_blocks_fit(cfg, seq_len, prefix)
    if dropout > 0:
        warnings.warn(f"{prefix}.mode={cfg.mode} with model.dropout={dropout}: block-sparse attention applies no "
                      "attention-probability dropout (residual dropout still applies)", stacklevel=2)
    ignored = unused_keys(cfg)
    if ignored:
        warnings.warn(f"{prefix}.mode={cfg.mode} does not use {', '.join(prefix + '.' + k for k in ignored)}; "
                      "they are ignored", stacklevel=2)


def _check_global_blocks_fit(cfg: SparseAttentionConfig, seq_len: int, prefix: str) -> None:
    """A global block that starts past the last block of a training sequence never attends (make_layout skips it,
    as DeepSpeed's does for a master layout longer than the sequence): a recipe that names one is refused."""
    if cfg.mode not in LAYOUT_CLASSES or "global_block_indices" not in {f.name for f in fields(LAYOUT_CLASSES[cfg.mode])}:
        return
    blocks = seq_len // cfg.block
    beyond = [i for i in cfg.global_block_indices if i >= blocks]
    if beyond:
        raise ValueError(f"{prefix}.global_block_indices={list(cfg.global_block_indices)}: {beyond} start past the "
                         f"{blocks} blocks of a sequence (data.block_size={seq_len} / {prefix}.block={cfg.block}), so "
                         f"they would never attend; use block indices 0..{blocks - 1}")


class BlockSparseAttention:
    """`attention_fn(q [B,H,T,D], k, v [B,Hkv,T,D]) -> [B,H,T,D]`: causal attention over a block layout.

    A plain object (not an nn.Module), so assigning it to attention modules adds no state. Layouts
    and their kernel indices are cached per (T, device). When q carries fewer heads than the layout
    (tensor or sequence parallelism shards heads), identical per-head layouts are broadcast; distinct
    per-head layouts need the full head count (ValueError otherwise).
    """

    def __init__(self, layout_config: SparsityConfig, impl: str = "auto", max_seq_len: int | None = None):
        if impl not in SPARSE_IMPLS:
            raise ValueError(f"sparse_attention.impl={impl!r} is not valid; choose one of: {', '.join(SPARSE_IMPLS)}")
        self.layout_config = layout_config
        self.block = layout_config.block
        self.impl = impl
        self.max_seq_len = max_seq_len  # the master layout's length (the model's context); None: one per length
        self._cache: dict = {}
        self._full: dict[int, torch.Tensor] = {}

    def block_layout(self, seq_len: int) -> torch.Tensor:
        """Bool[layout heads, nb, nb] for a whole-block `seq_len`: the corner of the layout it is cut from."""
        nb = seq_len // self.block
        if seq_len < 1 or seq_len % self.block:
            raise ValueError(f"sequence length {seq_len} must be a positive multiple of sparse_attention.block="
                             f"{self.block}")
        master = -(-self.max_seq_len // self.block) if self.max_seq_len else 0
        source = master if nb <= master else nb  # past the context (or without one): this length's own layout
        source = max(source, self.layout_config.min_blocks)
        if source not in self._full:
            self._full[source] = self.layout_config.make_layout(source * self.block)
        return self._full[source][:, :nb, :nb]

    def layout(self, seq_len: int, num_heads: int, device) -> tuple[torch.Tensor, object]:
        key = (seq_len, num_heads, str(device))
        if key not in self._cache:
            import torch

            layout = torch.tril(self.block_layout(seq_len))
            if num_heads != layout.shape[0]:
                if not bool((layout == layout[:1]).all()):
                    raise ValueError(
                        f"sparse_attention.different_layout_per_head=true needs all {layout.shape[0]} heads in one "
                        f"attention call, got {num_heads} (heads sharded by tensor/sequence parallelism)")
                layout = layout[:1].expand(num_heads, -1, -1)
            layout = layout.contiguous().to(device)
            self._cache[key] = (layout, {})
        return self._cache[key]

    def _prepared(self, extras: dict, what: str, build):
        """Per-layout derived data (kernel index, gather plan), built on first use."""
        if what not in extras:
            extras[what] = build()
        return extras[what]

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F

        from dsrecipes.kernels import block_sparse_attention as bsa

        T = q.shape[2]
        pad = (-T) % self.block
        if pad:  # right-pad to a whole block: padded keys come after every real query (causal hides them)
            q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        layout, extras = self.layout(T + pad, q.shape[1], q.device)
        impl = self.impl
        if impl == "auto":
            impl = "triton" if q.is_cuda else "gathered"
        if impl == "triton":
            index = self._prepared(extras, "index", lambda: bsa.BlockSparseIndex.from_layout(layout, True, q.device))
            out = bsa.block_sparse_attention(q, k, v, layout, self.block, causal=True, index=index)
        elif impl == "gathered":
            plan = self._prepared(extras, ("plan", k.shape[1]),
                                  lambda: bsa.GatherPlan.from_layout(layout, self.block, True, k.shape[1], q.device))
            out = bsa.block_sparse_attention_gathered(q, k, v, layout, self.block, causal=True, plan=plan)
        else:
            out = bsa.block_sparse_attention_reference(q, k, v, layout, self.block, causal=True)
        return out[:, :, :T] if pad else out


def apply_sparse_attention(model: nn.Module, cfg: SparseAttentionConfig, num_heads: int,
                           max_seq_len: int | None = None) -> int:
    """Route every CausalSelfAttention of `model` through one BlockSparseAttention; returns how many.

    max_seq_len: the master layout's length (see the module docstring); default the model's own
    context (`model.cfg.max_seq_len` of a dsrecipes GPT), else one layout per sequence length.
    """
    from dsrecipes.models.layers import CausalSelfAttention

    if cfg.mode == "none":
        return 0
    if max_seq_len is None:
        max_seq_len = getattr(getattr(model, "cfg", None), "max_seq_len", None)
    fn = BlockSparseAttention(build_sparsity_config(cfg, num_heads), cfg.impl, max_seq_len=max_seq_len)
    count = 0
    for module in model.modules():
        if isinstance(module, CausalSelfAttention):
            module.attention_fn = fn
            count += 1
    return count
