"""Unstructured / semi-structured sparse pruning of nn.Linear weights with a dense-ratio schedule.

What: `SparsePruner` keeps a 0/1 mask per selected nn.Linear weight [out, in] and multiplies the
weight by it in place (`apply_masks()`, to be called after every optimizer step, so whatever the
optimizer writes into pruned entries is zeroed again). Masks are recomputed from the current
weights at each schedule update (`step(global_step)`), and frozen once the schedule ends.

Scoring (`method`, DeepSpeed names):
    "l1":   score = |w| per element (per block: the L1 norm of the block); layer-wise ranking.
    "topk": like "l1", but ranked by a score tensor you may supply per module with
            `set_scores(name, scores)` (e.g. movement scores); defaults to |w|. DeepSpeed's "topk"
            learns the scores through a straight-through TopK binarizer; that is not done here.

Block pattern (`block_pattern`):
    "1x1": element-wise.
    "NxM" (e.g. "4x1"): blocks of N consecutive rows (output features) x M consecutive columns
        (input features), scored by their L1 norm; a block is kept or pruned whole. N must divide
        out_features and M in_features.
    "N:M" (e.g. "2:4"): in every group of M consecutive weights along the input dim keep the N
        largest |w| (or scores). Its density is N/M by construction; `dense_ratio` is ignored.

Dense-ratio schedule (fraction of weights kept), with offset = schedule_offset,
end = max(schedule_offset_end, schedule_offset), stride = schedule_offset_stride:
    step < offset:       1.0 (no pruning, no masks applied)
    offset <= step:      s = offset + ((min(step, end) - offset) // stride) * stride  (last update point),
                         progress = 1 if end == offset or step >= end else (s - offset) / (end - offset),
                         dense = 1 - (1 - dense_ratio) * progress          ("linear", default)
                         dense = 1 - (1 - dense_ratio) * (1 - (1 - progress)^3)   ("cubic", Zhu & Gupta)
With DeepSpeed's default schedule_offset_end = schedule_offset this is one-shot pruning to
`dense_ratio` at schedule_offset (DeepSpeed's "l1"/"topk"); a later end gives the gradual ramp
DeepSpeed delegates to Intel Neural Compressor for "snip_momentum" (start_step = schedule_offset,
end_step = schedule_offset_end, pruning_frequency = schedule_offset_stride). N:M masks are applied
from the end of the schedule (they cannot be ramped).

The number kept per module is round(dense * n_units) (units = elements or blocks), so after the
schedule the sparsity is exactly 1 - dense_ratio up to that rounding (ties broken by index).

Public: `SparsePruningConfig`, `SparsePruner`, `dense_ratio_at`, `compute_mask`.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from dsrecipes.compression.quantization import deepspeed_group_kwargs, match_module_names
from dsrecipes.utils.dtensors import mask_, whole

__all__ = ["SparsePruningConfig", "SparsePruner", "dense_ratio_at", "compute_mask", "parse_block_pattern"]

_NxM = re.compile(r"^(\d+)x(\d+)$")
_N_M = re.compile(r"^(\d+):(\d+)$")


def parse_block_pattern(pattern: str) -> tuple[str, int, int]:
    """("block", rows, cols) for "NxM", ("nm", n, m) for "N:M"."""
    p = str(pattern).strip()
    m = _NxM.match(p)
    if m:
        r, c = int(m.group(1)), int(m.group(2))
        if r < 1 or c < 1:
            raise ValueError(f"block_pattern {pattern!r}: sizes must be >= 1")
        return "block", r, c
    m = _N_M.match(p)
    if m:
        n, mm = int(m.group(1)), int(m.group(2))
        if not 1 <= n <= mm:
            raise ValueError(f"block_pattern {pattern!r}: need 1 <= N <= M")
        return "nm", n, mm
    raise ValueError(f"block_pattern must be 'NxM' (e.g. '1x1', '4x1') or 'N:M' (e.g. '2:4'), got {pattern!r}")


@dataclass
class SparsePruningConfig:
    """DeepSpeed `sparse_pruning` (shared_parameters + one group's params), flattened.

    method: "l1" | "topk".  dense_ratio: fraction of weights kept at the end, in (0, 1].
    schedule_offset: first pruning step.  schedule_offset_end: end of the ramp (None = offset:
    one-shot).  schedule_offset_stride: steps between mask updates during the ramp.
    block_pattern: "1x1" | "NxM" (e.g. "4x1") | "N:M" (e.g. "2:4").
    ramp: "linear" | "cubic" (not a DeepSpeed key; shape of the ramp when end > offset).
    modules / excluded_modules: name patterns (glob or regex) selecting nn.Linear layers.
    """

    method: str = "l1"
    dense_ratio: float = 0.1
    schedule_offset: int = 1000
    schedule_offset_end: int | None = None
    schedule_offset_stride: int = 1
    block_pattern: str = "4x1"
    ramp: str = "linear"
    modules: list[str] = field(default_factory=lambda: ["*"])
    excluded_modules: list[str] = field(default_factory=list)

    def __post_init__(self):
        if isinstance(self.modules, str):
            self.modules = [self.modules]
        self.modules = list(self.modules)
        self.excluded_modules = list(self.excluded_modules)
        if self.method not in ("l1", "topk"):
            raise ValueError(f"SparsePruningConfig.method must be 'l1' or 'topk', got {self.method!r}")
        if not (isinstance(self.dense_ratio, (int, float)) and 0.0 < float(self.dense_ratio) <= 1.0):
            raise ValueError(f"SparsePruningConfig.dense_ratio must be in (0, 1], got {self.dense_ratio!r}")
        self.dense_ratio = float(self.dense_ratio)
        if not isinstance(self.schedule_offset, int) or self.schedule_offset < 0:
            raise ValueError(f"SparsePruningConfig.schedule_offset must be an int >= 0, got {self.schedule_offset!r}")
        if self.schedule_offset_end is None:
            self.schedule_offset_end = self.schedule_offset
        if not isinstance(self.schedule_offset_end, int) or self.schedule_offset_end < self.schedule_offset:
            raise ValueError(f"SparsePruningConfig.schedule_offset_end ({self.schedule_offset_end!r}) must be an "
                             f"int >= schedule_offset ({self.schedule_offset})")
        if not isinstance(self.schedule_offset_stride, int) or self.schedule_offset_stride < 1:
            raise ValueError(f"SparsePruningConfig.schedule_offset_stride must be an int >= 1, got "
                             f"{self.schedule_offset_stride!r}")
        if self.ramp not in ("linear", "cubic"):
            raise ValueError(f"SparsePruningConfig.ramp must be 'linear' or 'cubic', got {self.ramp!r}")
        parse_block_pattern(self.block_pattern)

    @classmethod
    def from_deepspeed(cls, block: dict[str, Any], group: str | None = None) -> SparsePruningConfig:
        """Build from a DeepSpeed `compression_training.sparse_pruning` dict (shared_parameters +
        `different_groups[group]`, the only group when None; the group's params win)."""
        return cls(**deepspeed_group_kwargs(cls, block, group))


def _schedule_point(cfg: SparsePruningConfig, step: int) -> int | None:
    """The last mask-update step <= `step` (None before schedule_offset)."""
    off, end, stride = cfg.schedule_offset, cfg.schedule_offset_end, cfg.schedule_offset_stride
    if step < off:
        return None
    if step >= end:
        return end
    return off + ((step - off) // stride) * stride


def dense_ratio_at(cfg: SparsePruningConfig, step: int) -> float:
    """Fraction of weights kept at `step` (1.0 before schedule_offset)."""
    s = _schedule_point(cfg, step)
    if s is None:
        return 1.0
    off, end = cfg.schedule_offset, cfg.schedule_offset_end
    progress = 1.0 if s >= end or end == off else (s - off) / (end - off)
    if cfg.ramp == "cubic":
        progress = 1.0 - (1.0 - progress) ** 3
    return 1.0 - (1.0 - cfg.dense_ratio) * progress


def _topk_mask(scores: torch.Tensor, keep: int) -> torch.Tensor:
    flat = scores.flatten()
    mask = torch.zeros_like(flat, dtype=torch.bool)
    if keep > 0:
        idx = torch.topk(flat, keep, largest=True, sorted=False).indices
        mask[idx] = True
    return mask.reshape(scores.shape)


@torch.no_grad()
def compute_mask(scores: torch.Tensor, dense_ratio: float, block_pattern: str = "1x1") -> torch.Tensor:
    """0/1 mask (scores' dtype) for a 2-D score tensor [out, in] (e.g. |w|).

    "1x1"/"NxM": keep round(dense_ratio * n_blocks) blocks of largest L1 score. "N:M": keep the N
    largest of every M consecutive entries along dim 1 (dense_ratio ignored).
    """
    if scores.dim() != 2:
        raise ValueError(f"compute_mask: expected a 2-D [out, in] tensor, got shape {tuple(scores.shape)}")
    kind, a, b = parse_block_pattern(block_pattern)
    out_f, in_f = scores.shape
    s = scores.detach().float().abs()
    if kind == "nm":
        n, m = a, b
        if in_f % m != 0:
            raise ValueError(f"compute_mask: N:M pattern {block_pattern!r} needs in_features ({in_f}) divisible by {m}")
        g = s.reshape(out_f, in_f // m, m)
        idx = torch.topk(g, n, dim=-1, largest=True, sorted=False).indices
        mask = torch.zeros_like(g, dtype=torch.bool).scatter_(-1, idx, True)
        return mask.reshape(out_f, in_f).to(scores.dtype)
    r, c = a, b
    if out_f % r != 0 or in_f % c != 0:
        raise ValueError(f"compute_mask: block pattern {block_pattern!r} needs out ({out_f}) divisible by {r} "
                         f"and in ({in_f}) divisible by {c}")
    blocks = s.reshape(out_f // r, r, in_f // c, c).sum(dim=(1, 3))  # L1 norm per block
    keep = int(round(dense_ratio * blocks.numel()))
    keep = min(max(keep, 0), blocks.numel())
    bmask = _topk_mask(blocks, keep)
    mask = bmask.repeat_interleave(r, dim=0).repeat_interleave(c, dim=1)
    return mask.to(scores.dtype)


class SparsePruner:
    """Masks for `model`'s matching nn.Linear weights, following the dense-ratio schedule.

    Trainer protocol: ``pruner.step(global_step)`` once per optimizer step (after `optimizer.step()`),
    which updates the masks when the schedule says so and calls `apply_masks()`; or call
    `update(global_step)` and `apply_masks()` separately. Parameter names and state-dict keys are
    unchanged (masks live in the pruner; see `state_dict()`).
    """

    def __init__(self, model: nn.Module, cfg: SparsePruningConfig):
        self.model = model
        self.cfg = cfg
        self.module_names = match_module_names(model, cfg.modules, cfg.excluded_modules)
        if not self.module_names:
            raise ValueError(f"SparsePruner: no nn.Linear matches modules={cfg.modules!r}")
        mods = dict(model.named_modules())
        self._modules: dict[str, nn.Linear] = {n: mods[n] for n in self.module_names}
        kind, a, b = parse_block_pattern(cfg.block_pattern)
        for n, mod in self._modules.items():
            out_f, in_f = mod.weight.shape
            if (kind == "nm" and in_f % b) or (kind == "block" and (out_f % a or in_f % b)):
                raise ValueError(f"SparsePruner: {n}.weight {tuple(mod.weight.shape)} is not divisible by "
                                 f"block_pattern {cfg.block_pattern!r}")
        self._kind = kind
        self.masks: dict[str, torch.Tensor] = {}
        self._scores: dict[str, torch.Tensor] = {}
        self._point: int | None = None  # schedule point the masks were computed at
        self._dense: float = 1.0
        self.global_step: int | None = None

    # schedule -------------------------------------------------------------------------------------

    def current_dense_ratio(self) -> float:
        """Dense ratio of the masks now in force (1.0 = no pruning)."""
        return self._dense

    def set_scores(self, name: str, scores: torch.Tensor) -> None:
        """Importance scores for module `name` (same shape as its weight), used by method "topk"."""
        if name not in self._modules:
            raise KeyError(f"SparsePruner.set_scores: {name!r} is not a pruned module")
        if scores.shape != self._modules[name].weight.shape:
            raise ValueError(f"SparsePruner.set_scores: shape {tuple(scores.shape)} != weight "
                             f"{tuple(self._modules[name].weight.shape)}")
        self._scores[name] = scores.detach()

    @torch.no_grad()
    def update(self, global_step: int) -> bool:
        """Recompute masks if `global_step` reached a new schedule point; True when they changed."""
        self.global_step = int(global_step)
        point = _schedule_point(self.cfg, self.global_step)
        if point is None:
            changed = bool(self.masks)
            self.masks, self._point, self._dense = {}, None, 1.0
            return changed
        if point == self._point:
            return False
        end = self.cfg.schedule_offset_end
        if self._kind == "nm" and point < end:  # N:M cannot ramp: only at the schedule's end
            return False
        dense = dense_ratio_at(self.cfg, self.global_step)
        for name, mod in self._modules.items():
            w = whole(mod.weight)  # sharded weights (FSDP2, tensor parallel): scored whole, as in one process
            scores = self._scores.get(name) if self.cfg.method == "topk" else None
            if scores is None:
                scores = w.detach().abs()
            elif name in self.masks:
                scores = scores.abs() * self.masks[name].to(scores.device, scores.dtype)  # pruned stay pruned
            mask = compute_mask(scores, dense, self.cfg.block_pattern)
            self.masks[name] = mask.to(device=w.device, dtype=w.dtype)
        self._point, self._dense = point, (dense if self._kind != "nm" else self._kind_density())
        return True

    def _kind_density(self) -> float:
        _, n, m = parse_block_pattern(self.cfg.block_pattern)
        return n / m

    @torch.no_grad()
    def apply_masks(self) -> None:
        """Multiply each masked weight by its mask in place (call after every optimizer step)."""
        for name, mask in self.masks.items():
            w = self._modules[name].weight
            if mask.device != w.device or mask.dtype != w.dtype:
                mask = self.masks[name] = mask.to(device=w.device, dtype=w.dtype)
            mask_(w, mask)

    def named_masks(self) -> dict[str, torch.Tensor]:
        """Parameter name (relative to the model) -> its whole 0/1 mask, for every masked weight."""
        return {f"{n}.weight": m for n, m in self.masks.items()}

    def mask_pairs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(weight, 0/1 mask) for every masked weight (e.g. to mask fp32 master copies as well)."""
        return [(self._modules[n].weight, m) for n, m in self.masks.items()]

    def step(self, global_step: int) -> None:
        """`update(global_step)` then `apply_masks()`."""
        self.update(global_step)
        self.apply_masks()

    # reporting / checkpointing --------------------------------------------------------------------

    @torch.no_grad()
    def sparsity(self) -> dict[str, float]:
        """Fraction of exactly-zero weights per pruned module (of the weights as they are now)."""
        weights = {n: whole(m.weight) for n, m in self._modules.items()}  # a collective when sharded
        return {n: float((w == 0).sum().item()) / w.numel() for n, w in weights.items()}

    def state_dict(self) -> dict[str, Any]:
        return {"global_step": self.global_step, "point": self._point, "dense": self._dense,
                "masks": {n: m.detach().to("cpu", torch.bool) for n, m in self.masks.items()},
                "config": asdict(self.cfg)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.global_step = state.get("global_step")
        self._point = state.get("point")
        self._dense = float(state.get("dense", 1.0))
        self.masks = {}
        for n, m in state.get("masks", {}).items():
            if n not in self._modules:
                raise KeyError(f"SparsePruner.load_state_dict: unknown module {n!r}")
            w = self._modules[n].weight
            self.masks[n] = m.to(device=w.device, dtype=w.dtype)
