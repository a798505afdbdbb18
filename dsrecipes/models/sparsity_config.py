"""Block-sparse attention layouts with DeepSpeed's sparsity configs (semantics and keys).

Why: attention over long sequences costs O(T^2); a block layout lets each query block attend to a
few key blocks only (a local window, a few global blocks, some random blocks), so work and memory
grow ~linearly with T. These classes reproduce DeepSpeed's `deepspeed.ops.sparse_attention`
sparsity configs — Dense, Fixed, Variable, BigBird, BSLongformer, LocalSlidingWindow — with the same
keys and defaults, each producing a block layout with `make_layout(seq_len)`:

    layout: BoolTensor [num_heads, seq_len // block, seq_len // block]
    layout[h, i, j] is True when query block i of head h attends to key block j.

`attention="unidirectional"` gives DeepSpeed's causal variants (what a decoder needs);
`"bidirectional"` the encoder ones. The model path (dsrecipes.models.sparse_attention) additionally
intersects the layout with the block-causal pattern and applies the within-block causal mask on
diagonal blocks, so the only thing a layout decides is *which earlier blocks* a query block sees.

Deliberate differences from DeepSpeed (documented, not accidental):
  * layouts are bool, not int64;
  * random blocks come from a `torch.Generator` seeded with `seed` (DeepSpeed uses the unseeded
    `random` module), so every rank and every resume builds the same layout;
  * BigBird unidirectional samples min(num_random_blocks, row + 1) blocks on early rows where DeepSpeed's
    `random.sample` would raise.
Pure torch; no Hydra (the config group lives in dsrecipes.models.sparse_attention).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

# torch is imported in the functions that build layouts: the recipe schema (dsrecipes.models.sparse_attention's
# SparseAttentionConfig) reads ATTENTION_TYPES and LAYOUT_CLASSES' names from here, and composing a recipe
# (`python -m dsrecipes --help`) must not import torch.
if TYPE_CHECKING:
    import torch

ATTENTION_TYPES = ("unidirectional", "bidirectional")


def _check_attention(name: str, attention: str, prefix: str) -> None:
    if attention not in ATTENTION_TYPES:
        raise ValueError(f"{prefix}.attention={attention!r} is not valid for {name}; choose one of: "
                         f"{', '.join(ATTENTION_TYPES)}")


@dataclass
class SparsityConfig:
    """Shared keys: heads, block size (tokens per block side) and one layout for all heads or one each."""

    num_heads: int
    block: int = 16
    different_layout_per_head: bool = False
    prefix: str = field(default="sparse_attention", repr=False)  # config path named in errors

    def __post_init__(self) -> None:
        if self.num_heads < 1:
            raise ValueError(f"model.n_head={self.num_heads} must be >= 1 for sparse attention")
        if self.block < 1:
            raise ValueError(f"{self.prefix}.block={self.block} must be >= 1")

    @property
    def num_layout_heads(self) -> int:
        return self.num_heads if self.different_layout_per_head else 1

    def setup_layout(self, seq_len: int) -> torch.Tensor:
        """All-False [num_heads, nb, nb]; ValueError unless seq_len is a positive multiple of block."""
        import torch

        if seq_len < 1 or seq_len % self.block != 0:
            raise ValueError(f"sequence length {seq_len} must be a positive multiple of {self.prefix}.block="
                             f"{self.block} (set data.block_size to a multiple of it)")
        nb = seq_len // self.block
        return torch.zeros(self.num_heads, nb, nb, dtype=torch.bool)

    def propagate_first_head(self, layout: torch.Tensor) -> torch.Tensor:
        if not self.different_layout_per_head:
            layout[1:] = layout[0]
        return layout

    def make_layout(self, seq_len: int) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def min_blocks(self) -> int:
        """The fewest blocks make_layout accepts (a window or a random-block count may need several)."""
        return 1

    def _require_blocks(self, key: str, value: int, nb: int) -> None:
        if nb < value:
            raise ValueError(f"{self.prefix}.{key}={value} exceeds the {nb} blocks of the sequence "
                             f"(seq_len / {self.prefix}.block)")


def _check_global_blocks(prefix: str, starts: list[int], ends: list[int] | None) -> None:
    """Global block starts >= 0 and, when ends are given, one end per start with start < end."""
    if any(i < 0 for i in starts):
        raise ValueError(f"{prefix}.global_block_indices={list(starts)} must be >= 0")
    if ends is None:
        return
    if len(ends) != len(starts):
        raise ValueError(f"{prefix}.global_block_end_indices has {len(ends)} entries but "
                         f"{prefix}.global_block_indices has {len(starts)}; they must match")
    for s, e in zip(starts, ends):
        if s >= e:
            raise ValueError(f"{prefix}.global_block_indices/{prefix}.global_block_end_indices: start {s} must be "
                             f"< end {e}")


def _global_ranges(starts: list[int], ends: list[int] | None) -> list[tuple[int, int]]:
    """[start, end) block ranges of the global blocks: one block each when no ends are given."""
    if ends is None:
        return [(i, i + 1) for i in starts]
    return list(zip(starts, ends))


def _local_windows(layout: torch.Tensor, h: int, start: int, end: int, causal: bool) -> None:
    """Block-diagonal window [start, end): full square, or its lower triangle when causal."""
    for row in range(start, end):
        layout[h, row, start:(row + 1 if causal else end)] = True


def _sliding_window(layout: torch.Tensor, h: int, width: int, causal: bool) -> None:
    """Each block row sees `width // 2` blocks either side (only the left side and itself when causal)."""
    nb, w = layout.shape[1], width // 2
    for row in range(nb):
        layout[h, row, max(0, row - w):(row + 1 if causal else min(row + w + 1, nb))] = True


def _random_cols(gen: torch.Generator, population: int, k: int) -> torch.Tensor:
    import torch

    return torch.randperm(population, generator=gen)[:k]


@dataclass
class DenseSparsityConfig(SparsityConfig):
    """Every block attends to every block (for comparison; the causal mask still applies in a decoder)."""

    def make_layout(self, seq_len: int) -> torch.Tensor:
        layout = self.setup_layout(seq_len)
        layout[:] = True
        return layout


@dataclass
class FixedSparsityConfig(SparsityConfig):
    """Sparse Transformer "fixed": local windows of num_local_blocks, plus global blocks per window.

    The last num_global_blocks of each local window are global (head variants shift them left by
    num_global_blocks per pattern); every later row attends to them (all rows when bidirectional),
    and with horizontal_global_attention they also attend to everything (bidirectional only).
    """

    num_local_blocks: int = 4
    num_global_blocks: int = 1
    attention: str = "bidirectional"
    horizontal_global_attention: bool = False
    num_different_global_patterns: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        p = self.prefix
        if self.num_local_blocks < 1 or self.num_global_blocks < 1:
            raise ValueError(f"{p}.num_local_blocks={self.num_local_blocks} and {p}.num_global_blocks="
                             f"{self.num_global_blocks} must be >= 1")
        if self.num_local_blocks % self.num_global_blocks != 0:
            raise ValueError(f"{p}.num_local_blocks={self.num_local_blocks} must be divisible by "
                             f"{p}.num_global_blocks={self.num_global_blocks}")
        _check_attention("fixed", self.attention, p)
        if self.horizontal_global_attention and self.attention != "bidirectional":
            raise ValueError(f"{p}.horizontal_global_attention=true needs {p}.attention=bidirectional, "
                             f"got {self.attention!r}")
        if self.num_different_global_patterns > 1 and not self.different_layout_per_head:
            raise ValueError(f"{p}.num_different_global_patterns={self.num_different_global_patterns} needs "
                             f"{p}.different_layout_per_head=true")
        limit = self.num_local_blocks // self.num_global_blocks
        if not 1 <= self.num_different_global_patterns <= limit:
            raise ValueError(f"{p}.num_different_global_patterns={self.num_different_global_patterns} must be in "
                             f"[1, num_local_blocks / num_global_blocks = {limit}]")

    def _set_global(self, layout: torch.Tensor, h: int) -> None:
        nb, g, local = layout.shape[1], self.num_global_blocks, self.num_local_blocks
        bidir = self.attention == "bidirectional"
        first = local - (1 + h % self.num_different_global_patterns) * g
        full_windows_end = nb - nb % local

        def mark(start: int, stop: int) -> None:
            layout[h, 0 if bidir else start:, start:stop] = True  # vertical: later rows see the global blocks
            if self.horizontal_global_attention:
                layout[h, start:stop, :] = True

        for i in range(first, full_windows_end, local):
            mark(i, i + g)
        if full_windows_end < nb:  # a short last window still gets global blocks, clipped to the end
            start = min(full_windows_end + first, nb - g)
            mark(start, start + g)

    def make_layout(self, seq_len: int) -> torch.Tensor:
        layout = self.setup_layout(seq_len)
        nb, causal = layout.shape[1], self.attention == "unidirectional"
        for h in range(self.num_layout_heads):
            for start in range(0, nb, self.num_local_blocks):
                _local_windows(layout, h, start, min(start + self.num_local_blocks, nb), causal)
            self._set_global(layout, h)
        return self.propagate_first_head(layout)


@dataclass
class VariableSparsityConfig(SparsityConfig):
    """Fixed, generalised: random blocks per row, a list of local window sizes, explicit global blocks.

    Local windows take the sizes in local_window_blocks in order, then repeat the last size to the
    end. Global blocks are global_block_indices (or the ranges [start, end) with
    global_block_end_indices): columns every later row sees (all rows when bidirectional), rows that
    see everything with horizontal_global_attention. Random blocks are drawn from the whole row, as
    DeepSpeed does (a causal decoder then drops the ones in the future).
    """

    num_random_blocks: int = 0
    local_window_blocks: list[int] = field(default_factory=lambda: [4])
    global_block_indices: list[int] = field(default_factory=lambda: [0])
    global_block_end_indices: list[int] | None = None
    attention: str = "bidirectional"
    horizontal_global_attention: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        p = self.prefix
        if not self.local_window_blocks or any(w < 1 for w in self.local_window_blocks):
            raise ValueError(f"{p}.local_window_blocks={list(self.local_window_blocks)} must be a non-empty list of "
                             "positive block counts")
        if self.num_random_blocks < 0:
            raise ValueError(f"{p}.num_random_blocks={self.num_random_blocks} must be >= 0")
        _check_global_blocks(p, self.global_block_indices, self.global_block_end_indices)
        _check_attention("variable", self.attention, p)
        if self.horizontal_global_attention and self.attention != "bidirectional":
            raise ValueError(f"{p}.horizontal_global_attention=true needs {p}.attention=bidirectional, "
                             f"got {self.attention!r}")

    @property
    def min_blocks(self) -> int:
        return max(1, self.num_random_blocks)

    def make_layout(self, seq_len: int) -> torch.Tensor:
        import torch

        layout = self.setup_layout(seq_len)
        nb, causal = layout.shape[1], self.attention == "unidirectional"
        self._require_blocks("num_random_blocks", self.num_random_blocks, nb)
        gen = torch.Generator().manual_seed(self.seed)
        ranges = _global_ranges(self.global_block_indices, self.global_block_end_indices)
        for h in range(self.num_layout_heads):
            if self.num_random_blocks:
                for row in range(nb):
                    layout[h, row, _random_cols(gen, nb, self.num_random_blocks)] = True
            start = 0
            for width in self.local_window_blocks:
                _local_windows(layout, h, start, min(start + width, nb), causal)
                start += width
            for s in range(start, nb, self.local_window_blocks[-1]):
                _local_windows(layout, h, s, min(s + self.local_window_blocks[-1], nb), causal)
            for s, e in ranges:
                if s < nb:
                    e = min(e, nb)
                    if self.horizontal_global_attention:
                        layout[h, s:e, :] = True
                    layout[h, 0 if not causal else s:, s:e] = True
        return self.propagate_first_head(layout)

@dataclass
class BigBirdSparsityConfig(SparsityConfig):
    """BigBird: random blocks per row + a sliding window + the first num_global_blocks global (rows and columns)."""

    num_random_blocks: int = 1
    num_sliding_window_blocks: int = 3
    num_global_blocks: int = 1
    attention: str = "bidirectional"
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        p = self.prefix
        for key in ("num_random_blocks", "num_global_blocks"):
            if getattr(self, key) < 0:
                raise ValueError(f"{p}.{key}={getattr(self, key)} must be >= 0")
        if self.num_sliding_window_blocks < 1:
            raise ValueError(f"{p}.num_sliding_window_blocks={self.num_sliding_window_blocks} must be >= 1")
        _check_attention("bigbird", self.attention, p)

    @property
    def min_blocks(self) -> int:
        return max(1, self.num_random_blocks, self.num_sliding_window_blocks, self.num_global_blocks)

    def make_layout(self, seq_len: int) -> torch.Tensor:
        import torch

        layout = self.setup_layout(seq_len)
        nb, causal = layout.shape[1], self.attention == "unidirectional"
        for key in ("num_random_blocks", "num_sliding_window_blocks", "num_global_blocks"):
            self._require_blocks(key, getattr(self, key), nb)
        gen = torch.Generator().manual_seed(self.seed)
        for h in range(self.num_layout_heads):
            if self.num_random_blocks:
                for row in range(nb):
                    population = row + 1 if causal else nb
                    layout[h, row, _random_cols(gen, population, min(self.num_random_blocks, population))] = True
            # BigBird's window is symmetric even when causal; the tril below removes its right half.
            _sliding_window(layout, h, self.num_sliding_window_blocks, causal=False)
            layout[h, : self.num_global_blocks, :] = True
            layout[h, :, : self.num_global_blocks] = True
        if causal:
            layout = torch.tril(layout)
        return self.propagate_first_head(layout)


@dataclass
class BSLongformerSparsityConfig(SparsityConfig):
    """Block-sparse Longformer: a sliding window + global blocks (rows and columns) at given indices/ranges."""

    num_sliding_window_blocks: int = 3
    global_block_indices: list[int] = field(default_factory=lambda: [0])
    global_block_end_indices: list[int] | None = None
    attention: str = "bidirectional"

    def __post_init__(self) -> None:
        super().__post_init__()
        p = self.prefix
        if self.num_sliding_window_blocks < 1:
            raise ValueError(f"{p}.num_sliding_window_blocks={self.num_sliding_window_blocks} must be >= 1")
        _check_global_blocks(p, self.global_block_indices, self.global_block_end_indices)
        _check_attention("bslongformer", self.attention, p)

    @property
    def min_blocks(self) -> int:
        return self.num_sliding_window_blocks

    def make_layout(self, seq_len: int) -> torch.Tensor:
        import torch

        layout = self.setup_layout(seq_len)
        nb = layout.shape[1]
        self._require_blocks("num_sliding_window_blocks", self.num_sliding_window_blocks, nb)
        ranges = _global_ranges(self.global_block_indices, self.global_block_end_indices)
        for h in range(self.num_layout_heads):
            _sliding_window(layout, h, self.num_sliding_window_blocks, causal=False)
            for s, e in ranges:
                if s < nb:
                    layout[h, s:min(e, nb), :] = True
                    layout[h, :, s:min(e, nb)] = True
        if self.attention == "unidirectional":
            layout = torch.tril(layout)
        return self.propagate_first_head(layout)


@dataclass
class LocalSlidingWindowSparsityConfig(SparsityConfig):
    """Each block row sees num_sliding_window_blocks // 2 blocks to its left and itself (and to its right when bidirectional)."""

    num_sliding_window_blocks: int = 3
    attention: str = "unidirectional"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_sliding_window_blocks < 1:
            raise ValueError(f"{self.prefix}.num_sliding_window_blocks={self.num_sliding_window_blocks} must be >= 1")
        _check_attention("sliding_window", self.attention, self.prefix)

    @property
    def min_blocks(self) -> int:
        return self.num_sliding_window_blocks

    def make_layout(self, seq_len: int) -> torch.Tensor:
        layout = self.setup_layout(seq_len)
        self._require_blocks("num_sliding_window_blocks", self.num_sliding_window_blocks, layout.shape[1])
        _sliding_window(layout, 0, self.num_sliding_window_blocks, causal=self.attention == "unidirectional")
        layout[1:] = layout[0]
        return layout


LAYOUT_CLASSES: dict[str, type[SparsityConfig]] = {
    "dense": DenseSparsityConfig,
    "fixed": FixedSparsityConfig,
    "variable": VariableSparsityConfig,
    "bigbird": BigBirdSparsityConfig,
    "bslongformer": BSLongformerSparsityConfig,
    "sliding_window": LocalSlidingWindowSparsityConfig,
}


def expand_layout(layout: torch.Tensor, block: int, causal: bool) -> torch.Tensor:
    """Token-level mask [H, nb*block, nb*block] from a block layout (True = attend); causal adds j <= i."""
    import torch

    mask = layout.bool().repeat_interleave(block, dim=1).repeat_interleave(block, dim=2)
    if causal:
        t = mask.shape[-1]
        mask = mask & torch.ones(t, t, dtype=torch.bool, device=mask.device).tril()
    return mask
