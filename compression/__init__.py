"""dsrecipes.compression: quantization-aware training and sparse pruning (installed from compression/).

Import as `dsrecipes.compression`. A plain Python library usable without Hydra; pure torch on CPU
(Triton is never required). DeepSpeed's `compression_training` key names are kept:

- `quantization`: `WeightQuantConfig` (start_bits, target_bits, quantization_period,
  schedule_offset, quantization_type, rounding, quantize_groups, modules), `fake_quantize`
  (straight-through estimator), `bits_at` (the bit schedule), `QuantizationAwareTraining`
  (fake-quantized nn.Linear forwards; `step(global_step)`, `current_bits()`, `state_dict()`).
- `pruning`: `SparsePruningConfig` (method, dense_ratio, schedule_offset, schedule_offset_end,
  schedule_offset_stride, block_pattern "1x1"/"4x1"/"N:M", modules), `SparsePruner`
  (`step(global_step)` / `apply_masks()` after each optimizer step, `sparsity()`),
  `dense_ratio_at`, `compute_mask`.

Layer reduction is not implemented yet.
"""

from dsrecipes.compression.pruning import (
    SparsePruner,
    SparsePruningConfig,
    compute_mask,
    dense_ratio_at,
    parse_block_pattern,
)
from dsrecipes.compression.quantization import (
    QuantizationAwareTraining,
    WeightQuantConfig,
    bits_at,
    fake_quantize,
    match_module_names,
)

__all__ = [
    "WeightQuantConfig",
    "fake_quantize",
    "bits_at",
    "QuantizationAwareTraining",
    "match_module_names",
    "SparsePruningConfig",
    "SparsePruner",
    "dense_ratio_at",
    "compute_mask",
    "parse_block_pattern",
]
