"""Structured pruning: rows of a linear layer, attention heads, conv channels (DeepSpeed's row_pruning,
head_pruning and channel_pruning), as masks now and as removed structure after `redundancy_clean`.

Each matched module owns `units` (its output rows, its heads, its output channels). At
`schedule_offset` (one shot, as DeepSpeed) the units are scored and the best round(dense_ratio *
units) (at least 1) are kept; the 0/1 keep-vector is then applied to every tensor the unit spans:

    row_pruning      module (nn.Linear) rows and bias entries; `sibling_modules` (parallel producers
                     fed the same input, e.g. llama's `up` next to `gate`) rows; `related_modules`
                     (the consumer, e.g. `fc_out` after `fc_in`) input columns.
    head_pruning     module = the attention output projection (`out_proj`, as DeepSpeed); its input
                     columns, grouped in `num_heads` heads of head_dim columns; `related_modules`
                     (q_proj, the fused kv_proj) rows: q as [num_heads, head_dim], the fused kv_proj
                     as [num_heads, k|v, head_dim] (its parts interleaved per head). Grouped-query
                     attention is refused.
    channel_pruning  module (nn.Conv1d/2d) output channels and bias; related nn.BatchNorm's vectors and
                     the next conv's input channels.

Scores (`method`): "l1" = L1 norm of the unit's slice of the module's weight (rows, the head's output
columns, channels); "topk" = scores you supply with `set_scores(name, [units])`, else l1.
`related_modules` / `sibling_modules` name modules relative to the matched module's parent
(e.g. "fc_out" for "blocks.0.mlp.fc_in"), or by their full name. Masks are multiplied into the
weights by `apply_masks()`, to be called after every optimizer step.

Public: `RowPruningConfig`, `HeadPruningConfig`, `ChannelPruningConfig`, `StructuredPruner`,
`PrunedTarget`, `UnitGroup`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from dsrecipes.compression.quantization import deepspeed_group_kwargs, match_module_names
from dsrecipes.utils.dtensors import mask_, whole

__all__ = ["RowPruningConfig", "HeadPruningConfig", "ChannelPruningConfig", "StructuredPruner",
           "PrunedTarget", "UnitGroup"]

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_NORM = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def _common_checks(cfg, kind: str, methods=("l1", "topk")) -> None:
    if isinstance(cfg.modules, str):
        cfg.modules = [cfg.modules]
    cfg.modules, cfg.excluded_modules = list(cfg.modules), list(cfg.excluded_modules)
    cfg.related_modules = _flatten(cfg.related_modules)
    if cfg.method not in methods:
        raise ValueError(f"{kind}.method must be one of {methods}, got {cfg.method!r}")
    if not (isinstance(cfg.dense_ratio, (int, float)) and 0.0 < float(cfg.dense_ratio) <= 1.0):
        raise ValueError(f"{kind}.dense_ratio must be in (0, 1], got {cfg.dense_ratio!r}")
    cfg.dense_ratio = float(cfg.dense_ratio)
    if not isinstance(cfg.schedule_offset, int) or cfg.schedule_offset < 0:
        raise ValueError(f"{kind}.schedule_offset must be an int >= 0, got {cfg.schedule_offset!r}")


def _flatten(names) -> list[str]:
    """DeepSpeed writes related_modules as a list of lists; accept both."""
    if isinstance(names, str):
        return [names]
    out = []
    for n in names or []:
        out += _flatten(n) if not isinstance(n, str) else [n]
    return out


@dataclass
class RowPruningConfig:
    """DeepSpeed `row_pruning`: keep `dense_ratio` of each matched nn.Linear's output rows."""

    method: str = "l1"
    dense_ratio: float = 0.5
    schedule_offset: int = 1000
    modules: list[str] = field(default_factory=lambda: ["*"])
    excluded_modules: list[str] = field(default_factory=list)
    related_modules: list[str] = field(default_factory=list)
    sibling_modules: list[str] = field(default_factory=list)

    def __post_init__(self):
        _common_checks(self, "row_pruning")
        self.sibling_modules = _flatten(self.sibling_modules)

    @classmethod
    def from_deepspeed(cls, block: dict[str, Any], group: str | None = None) -> RowPruningConfig:
        return cls(**_with_related(cls, block, group))


@dataclass
class HeadPruningConfig:
    """DeepSpeed `head_pruning`: keep `dense_ratio` of the `num_heads` heads of each matched output projection."""

    method: str = "topk"
    dense_ratio: float = 0.5
    schedule_offset: int = 1000
    num_heads: int | None = None
    modules: list[str] = field(default_factory=lambda: ["*out_proj"])
    excluded_modules: list[str] = field(default_factory=list)
    related_modules: list[str] = field(default_factory=lambda: ["q_proj", "kv_proj"])

    def __post_init__(self):
        _common_checks(self, "head_pruning")
        if not isinstance(self.num_heads, int) or self.num_heads < 1:
            raise ValueError(f"head_pruning.num_heads is required: a positive int, got {self.num_heads!r}")

    @classmethod
    def from_deepspeed(cls, block: dict[str, Any], group: str | None = None) -> HeadPruningConfig:
        return cls(**_with_related(cls, block, group))


@dataclass
class ChannelPruningConfig:
    """DeepSpeed `channel_pruning`: keep `dense_ratio` of each matched conv's output channels."""

    method: str = "l1"
    dense_ratio: float = 0.5
    schedule_offset: int = 1000
    modules: list[str] = field(default_factory=lambda: ["*"])
    excluded_modules: list[str] = field(default_factory=list)
    related_modules: list[str] = field(default_factory=list)

    def __post_init__(self):
        _common_checks(self, "channel_pruning")

    @classmethod
    def from_deepspeed(cls, block: dict[str, Any], group: str | None = None) -> ChannelPruningConfig:
        return cls(**_with_related(cls, block, group))


def _with_related(cls, block, group):
    kwargs = deepspeed_group_kwargs(cls, block, group)
    groups = dict(block.get("different_groups", {}))
    g = groups.get(group if group is not None else next(iter(groups), None), {}) if groups else {}
    if "related_modules" in g:
        kwargs["related_modules"] = _flatten(g["related_modules"])
    return kwargs


@dataclass
class PrunedTarget:
    """One tensor dimension a unit group spans: `module`'s `dim` laid out as [repeat, units, unit_size]."""

    module: str
    dim: int  # 0 = output rows/channels (and bias), 1 = input columns/channels; -1 = a norm's vectors
    repeat: int = 1
    unit_size: int = 1
    interleaved: bool = False  # laid out [units, repeat, unit_size] (dsrecipes' fused kv_proj: [head, k|v, dim])


@dataclass
class UnitGroup:
    """A matched module's units, where they live, and which are kept (None before pruning)."""

    name: str
    units: int
    targets: list[PrunedTarget]
    keep: torch.Tensor | None = None  # bool [units]
    heads: bool = False  # the units are attention heads (clean updates the attention's head counts)

    def element_mask(self, target: PrunedTarget) -> torch.Tensor:
        if target.interleaved:
            return self.keep.view(self.units, 1, 1).expand(self.units, target.repeat, target.unit_size).reshape(-1)
        keep = self.keep.view(1, self.units, 1).expand(target.repeat, self.units, target.unit_size)
        return keep.reshape(-1)


def _resolve(model_modules: dict[str, nn.Module], name: str, rel: str, key: str) -> str:
    parent = name.rpartition(".")[0]
    cand = f"{parent}.{rel}" if parent else rel
    if cand in model_modules:
        return cand
    if rel in model_modules:
        return rel
    raise ValueError(f"{key}: related module {rel!r} of {name!r} not found (looked for {cand!r} and {rel!r})")


class StructuredPruner:
    """Row, head or channel pruning of `model` (kind = "row" | "head" | "channel")."""

    def __init__(self, model: nn.Module, cfg: RowPruningConfig | HeadPruningConfig | ChannelPruningConfig):
        self.model, self.cfg = model, cfg
        self.kind = {RowPruningConfig: "row", HeadPruningConfig: "head", ChannelPruningConfig: "channel"}[type(cfg)]
        key = f"{self.kind}_pruning"
        types_ = _CONV if self.kind == "channel" else (nn.Linear,)
        self.module_names = match_module_names(model, cfg.modules, cfg.excluded_modules, types_=types_)
        if not self.module_names:
            raise ValueError(f"{key}.modules={cfg.modules!r} matches no "
                             f"{'/'.join(t.__name__ for t in types_)} module")
        self._mods = dict(model.named_modules())
        self.groups: dict[str, UnitGroup] = {}
        for name in self.module_names:
            self.groups[name] = getattr(self, f"_{self.kind}_group")(name, key)
        self._scores: dict[str, torch.Tensor] = {}
        self.global_step: int | None = None

    # unit layouts ---------------------------------------------------------------------------------

    def _row_group(self, name: str, key: str) -> UnitGroup:
        mod = self._mods[name]
        rows = mod.out_features
        targets = [PrunedTarget(name, 0)]
        for rel in self.cfg.sibling_modules:
            sib = _resolve(self._mods, name, rel, f"{key}.sibling_modules")
            if self._mods[sib].weight.shape[0] != rows:
                raise ValueError(f"{key}.sibling_modules: {sib} has {self._mods[sib].weight.shape[0]} rows, "
                                 f"{name} has {rows}")
            targets.append(PrunedTarget(sib, 0))
        for rel in self.cfg.related_modules:
            rm = _resolve(self._mods, name, rel, f"{key}.related_modules")
            if self._mods[rm].weight.shape[1] != rows:
                raise ValueError(f"{key}.related_modules: {rm} has {self._mods[rm].weight.shape[1]} input "
                                 f"features, {name} has {rows} output rows")
            targets.append(PrunedTarget(rm, 1))
        return UnitGroup(name, rows, targets)

    def _head_group(self, name: str, key: str) -> UnitGroup:
        mod = self._mods[name]
        h = self.cfg.num_heads
        if mod.in_features % h:
            raise ValueError(f"{key}.num_heads={h} does not divide {name}'s input features ({mod.in_features})")
        head_dim = mod.in_features // h
        parent = self._mods.get(name.rpartition(".")[0])
        n_head, n_kv = getattr(parent, "n_head", h), getattr(parent, "n_kv_head", h)
        if n_head != h:
            raise ValueError(f"{key}.num_heads={h} but the attention module of {name} has {n_head} heads")
        if n_kv != n_head:
            raise ValueError(f"{key}: {name} uses grouped-query attention (n_kv_head={n_kv} != n_head={n_head}); "
                             "head pruning needs n_kv_head == n_head")
        targets = [PrunedTarget(name, 1, 1, head_dim)]
        for rel in self.cfg.related_modules:
            rm = _resolve(self._mods, name, rel, f"{key}.related_modules")
            rows = self._mods[rm].weight.shape[0]
            if rows % (h * head_dim):
                raise ValueError(f"{key}.related_modules: {rm} has {rows} rows, not a multiple of "
                                 f"num_heads * head_dim = {h * head_dim}")
            repeat = rows // (h * head_dim)
            # a fused projection of dsrecipes' attention (kv_proj) interleaves its parts per head
            targets.append(PrunedTarget(rm, 0, repeat, head_dim, interleaved=repeat > 1))
        return UnitGroup(name, h, targets, heads=True)

    def _channel_group(self, name: str, key: str) -> UnitGroup:
        mod = self._mods[name]
        ch = mod.out_channels
        targets = [PrunedTarget(name, 0)]
        for rel in self.cfg.related_modules:
            rm = _resolve(self._mods, name, rel, f"{key}.related_modules")
            m = self._mods[rm]
            if isinstance(m, _NORM):
                if m.num_features != ch:
                    raise ValueError(f"{key}.related_modules: {rm} has {m.num_features} features, {name} has {ch}")
                targets.append(PrunedTarget(rm, -1))
            else:
                if m.weight.shape[1] != ch:
                    raise ValueError(f"{key}.related_modules: {rm} takes {m.weight.shape[1]} input channels, "
                                     f"{name} gives {ch}")
                targets.append(PrunedTarget(rm, 1))
        return UnitGroup(name, ch, targets)

    # scoring and schedule -------------------------------------------------------------------------

    def set_scores(self, name: str, scores: torch.Tensor) -> None:
        """Per-unit importance for module `name` (shape [units]), used by method "topk"."""
        if name not in self.groups:
            raise KeyError(f"{self.kind}_pruning.set_scores: {name!r} is not a pruned module")
        if scores.shape != (self.groups[name].units,):
            raise ValueError(f"{self.kind}_pruning.set_scores: expected shape ({self.groups[name].units},), "
                             f"got {tuple(scores.shape)}")
        self._scores[name] = scores.detach().float()

    @torch.no_grad()
    def unit_scores(self, name: str) -> torch.Tensor:
        g = self.groups[name]
        if self.cfg.method == "topk" and name in self._scores:
            return self._scores[name]
        w = whole(self._mods[name].weight).detach().float().abs()  # sharded weights are scored whole
        if self.kind == "head":  # out_proj columns of each head
            return w.reshape(w.shape[0], g.units, -1).sum(dim=(0, 2))
        return w.reshape(g.units, -1).sum(dim=1)

    def n_keep(self, units: int) -> int:
        return max(1, min(units, int(round(self.cfg.dense_ratio * units))))

    @torch.no_grad()
    def update(self, global_step: int) -> bool:
        """Compute the keep-vectors at schedule_offset (once); True when they were computed now."""
        self.global_step = int(global_step)
        if self.global_step < self.cfg.schedule_offset or all(g.keep is not None for g in self.groups.values()):
            return False
        for name, g in self.groups.items():
            scores = self.unit_scores(name)
            keep = torch.zeros(g.units, dtype=torch.bool)
            keep[torch.topk(scores.cpu(), self.n_keep(g.units)).indices] = True
            g.keep = keep
        return True

    def _masked(self) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
        """(parameter name, tensor, broadcastable 0/1 mask over its whole shape) for every tensor the
        kept units span (empty before pruning)."""
        out = []
        for g in self.groups.values():
            if g.keep is None:
                continue
            for t in g.targets:
                m = self._mods[t.module]
                em = g.element_mask(t)
                if t.dim == -1:  # norm vectors
                    tensors = [(k, 0) for k in ("weight", "bias") if getattr(m, k, None) is not None]
                else:
                    tensors = [("weight", t.dim)]
                    if t.dim == 0 and getattr(m, "bias", None) is not None:
                        tensors.append(("bias", 0))
                for key, d in tensors:
                    p = getattr(m, key)
                    shape = [1] * p.dim()
                    shape[d] = -1
                    out.append((f"{t.module}.{key}", p, em.view(shape).to(device=p.device, dtype=p.dtype)))
        return out

    def mask_pairs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(tensor, broadcastable 0/1 mask) for every tensor the kept units span (empty before pruning)."""
        return [(p, m) for _, p, m in self._masked()]

    def named_masks(self) -> dict[str, torch.Tensor]:
        """Parameter name (relative to the model) -> its broadcastable 0/1 mask over the whole tensor."""
        out: dict[str, torch.Tensor] = {}
        for name, _, m in self._masked():
            out[name] = out[name] * m if name in out else m
        return out

    @torch.no_grad()
    def apply_masks(self) -> None:
        for p, mask in self.mask_pairs():
            mask_(p, mask)

    def step(self, global_step: int) -> None:
        self.update(global_step)
        self.apply_masks()

    def density(self) -> dict[str, float]:
        """Fraction of units kept per module (1.0 before pruning)."""
        return {n: (float(g.keep.float().mean()) if g.keep is not None else 1.0) for n, g in self.groups.items()}

    def state_dict(self) -> dict[str, Any]:
        return {"global_step": self.global_step, "config": asdict(self.cfg),
                "keep": {n: g.keep.clone() for n, g in self.groups.items() if g.keep is not None}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.global_step = state.get("global_step")
        for n, keep in state.get("keep", {}).items():
            if n not in self.groups:
                raise KeyError(f"{self.kind}_pruning.load_state_dict: unknown module {n!r}")
            self.groups[n].keep = keep.clone().bool()
