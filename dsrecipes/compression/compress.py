"""`init_compression(model, config)` -> `Compressor`: every compression technique on one model, one step call.

Shaped like DeepSpeed's `deepspeed.compression.compress.init_compression` / `redundancy_clean`:

    comp = init_compression(model, CompressionConfig(...))   # or a DeepSpeed compression_training dict
    for step in range(n):
        comp.step(step)                # bits / activation switch / masks for this step
        loss = model(x).loss; loss.backward(); opt.step(); opt.zero_grad()
        comp.apply_masks()             # after every optimizer step: pruned weights stay zero
    small = comp.redundancy_clean(model)

Order inside `step`: weight-quantization bits, activation quantization on/off, sparse-pruning mask
update, structured (row, head, channel) mask update, then all masks multiplied into the weights.

Public: `Compressor`, `init_compression`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dsrecipes.compression.activation_quantization import ActivationQuantConfig, ActivationQuantization
from dsrecipes.compression.pruning import SparsePruner, SparsePruningConfig
from dsrecipes.compression.quantization import QuantizationAwareTraining, WeightQuantConfig
from dsrecipes.compression.structured_pruning import (
    ChannelPruningConfig,
    HeadPruningConfig,
    RowPruningConfig,
    StructuredPruner,
)
from dsrecipes.utils.dtensors import mask_

__all__ = ["Compressor", "init_compression"]


class Compressor:
    def __init__(self, model: nn.Module, weight_quantization: WeightQuantConfig | None = None,
                 activation_quantization: ActivationQuantConfig | None = None,
                 sparse_pruning: SparsePruningConfig | None = None, row_pruning: RowPruningConfig | None = None,
                 head_pruning: HeadPruningConfig | None = None, channel_pruning: ChannelPruningConfig | None = None):
        self.model = model
        self.weight_quant = QuantizationAwareTraining(model, weight_quantization) if weight_quantization else None
        self.activation_quant = (ActivationQuantization(model, activation_quantization)
                                 if activation_quantization else None)
        self.sparse = SparsePruner(model, sparse_pruning) if sparse_pruning else None
        self.structured = [StructuredPruner(model, c) for c in (row_pruning, head_pruning, channel_pruning) if c]
        self.global_step: int | None = None

    @property
    def enabled(self) -> bool:
        return any([self.weight_quant, self.activation_quant, self.sparse, self.structured])

    def step(self, global_step: int) -> None:
        """Bring every technique to `global_step` and apply the masks."""
        self.global_step = int(global_step)
        if self.weight_quant is not None:
            self.weight_quant.step(global_step)
        if self.activation_quant is not None:
            self.activation_quant.step(global_step)
        if self.sparse is not None:
            self.sparse.update(global_step)
        for p in self.structured:
            p.update(global_step)
        self.apply_masks()

    def mask_pairs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(tensor, 0/1 mask broadcastable to it) for every masked tensor of the model."""
        pairs = self.sparse.mask_pairs() if self.sparse is not None else []
        for p in self.structured:
            pairs += p.mask_pairs()
        return pairs

    def named_masks(self) -> dict[str, torch.Tensor]:
        """Parameter name (as in model.named_parameters()) -> its 0/1 mask over the whole tensor (or
        broadcastable to it); a tensor masked by several techniques gets their product. What a
        data-parallel strategy applies to every copy of the weight it holds (shards, fp32 masters)."""
        out: dict[str, torch.Tensor] = {}
        for pruner in ([self.sparse] if self.sparse is not None else []) + self.structured:
            for name, m in pruner.named_masks().items():
                out[name] = out[name] * m if name in out else m
        return out

    @torch.no_grad()
    def apply_masks(self) -> None:
        """Multiply every mask into its tensor (call after each optimizer step); a DTensor gets its piece."""
        for t, m in self.mask_pairs():
            mask_(t, m)

    def metrics(self) -> dict[str, float]:
        """compression/* values for the metric loggers."""
        out: dict[str, float] = {}
        if self.weight_quant is not None:
            out["compression/weight_bits"] = float(self.weight_quant.current_bits() or 0)
        if self.activation_quant is not None:
            out["compression/act_quant_on"] = float(self.activation_quant.active)
        if self.sparse is not None:
            out["compression/sparse_dense_ratio"] = self.sparse.current_dense_ratio()
        for p in self.structured:
            d = p.density()
            out[f"compression/{p.kind}_dense_ratio"] = sum(d.values()) / max(1, len(d))
        return out

    def redundancy_clean(self, model: nn.Module | None = None) -> nn.Module:
        """A smaller copy of the model (see dsrecipes.compression.clean.redundancy_clean)."""
        from dsrecipes.compression.clean import redundancy_clean

        return redundancy_clean(model if model is not None else self.model, self)

    def state_dict(self) -> dict[str, Any]:
        return {
            "global_step": self.global_step,
            "weight_quantization": self.weight_quant.state_dict() if self.weight_quant else None,
            "activation_quantization": self.activation_quant.state_dict() if self.activation_quant else None,
            "sparse_pruning": self.sparse.state_dict() if self.sparse else None,
            "structured": [p.state_dict() for p in self.structured],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.weight_quant is not None and state.get("weight_quantization"):
            self.weight_quant.load_state_dict(state["weight_quantization"])
        if self.activation_quant is not None and state.get("activation_quantization"):
            self.activation_quant.load_state_dict(state["activation_quantization"])
        if self.sparse is not None and state.get("sparse_pruning"):
            self.sparse.load_state_dict(state["sparse_pruning"])
        for p, s in zip(self.structured, state.get("structured", [])):
            p.load_state_dict(s)
        self.global_step = state.get("global_step")


def init_compression(model: nn.Module, config, num_heads: int | None = None) -> Compressor:
    """A Compressor for `model` from a `CompressionConfig` (the recipe group), or a DeepSpeed
    `compression_training` dict (or a whole DeepSpeed config holding one).

    `num_heads` fills head_pruning.num_heads when the config leaves it null.
    """
    from dsrecipes.compression.config import CompressionConfig, from_deepspeed, library_configs

    if isinstance(config, dict):
        config = from_deepspeed(config)
    if not isinstance(config, CompressionConfig):
        raise TypeError(f"init_compression: config must be a CompressionConfig or a dict, got {type(config).__name__}")
    return Compressor(model, **library_configs(config, num_heads=num_heads))
