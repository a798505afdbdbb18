"""dsrecipes.compression: quantization-aware training, pruning, layer reduction with distillation, and
redundancy clean (installed from compression/).

Import as `dsrecipes.compression`. A plain Python library usable without Hydra; pure torch on CPU,
dsrecipes.kernels' int8 weight-only matmul for exported layers where it runs. DeepSpeed's `compression_training`
key names are kept:

- `quantization`: `WeightQuantConfig`, `fake_quantize` (DeepSpeed's symmetric / asymmetric weight
  quantizers, straight-through estimator), `quantize_codes` / `dequantize_codes` (its integer codes),
  `bits_at` (the bit schedule), `QuantizationAwareTraining` (fake-quantized nn.Linear forwards).
- `activation_quantization`: `ActivationQuantConfig`, `ActivationQuantization` (dynamic / static range).
- `pruning`: `SparsePruningConfig`, `SparsePruner` (l1/topk, 1x1 / NxM blocks / N:M, dense-ratio schedule).
- `structured_pruning`: `RowPruningConfig`, `HeadPruningConfig`, `ChannelPruningConfig`, `StructuredPruner`.
- `layer_reduction`: `LayerReductionConfig`, `init_student_from_teacher`, `reduce_layers`,
  `DistillationConfig`, `DistillationLoss`, `kd_kl_loss`.
- `compress`: `init_compression(model, config) -> Compressor` (`step`, `apply_masks`, `redundancy_clean`).
- `clean`: `redundancy_clean` (masks and fake quantization made real), `state_dict_bytes`;
  `quantized_linear.QuantizedLinear` (int8 / packed int4 codes + scales).
- `config`: `CompressionConfig` (the `compression` recipe group), `from_deepspeed`.

A cleaned GPT is saved / loaded by dsrecipes.models.compressed_export (export_compressed, load_compressed).
"""

from dsrecipes.compression.activation_quantization import ActivationQuantConfig, ActivationQuantization
from dsrecipes.compression.clean import redundancy_clean, state_dict_bytes
from dsrecipes.compression.compress import Compressor, init_compression
from dsrecipes.compression.config import CompressionConfig, from_deepspeed, library_configs
from dsrecipes.compression.layer_reduction import (
    DistillationConfig,
    DistillationLoss,
    LayerReductionConfig,
    init_student_from_teacher,
    kd_kl_loss,
    reduce_layers,
)
from dsrecipes.compression.pruning import (
    SparsePruner,
    SparsePruningConfig,
    compute_mask,
    dense_ratio_at,
    parse_block_pattern,
)
from dsrecipes.compression.quantization import (
    QuantCodes,
    QuantizationAwareTraining,
    WeightQuantConfig,
    bits_at,
    dequantize_codes,
    fake_quantize,
    match_module_names,
    quantize_codes,
)
from dsrecipes.compression.quantized_linear import QuantizedLinear, pack_int4, unpack_int4
from dsrecipes.compression.structured_pruning import (
    ChannelPruningConfig,
    HeadPruningConfig,
    RowPruningConfig,
    StructuredPruner,
)

__all__ = [
    "WeightQuantConfig", "fake_quantize", "bits_at", "QuantizationAwareTraining", "match_module_names",
    "quantize_codes", "dequantize_codes", "QuantCodes",
    "ActivationQuantConfig", "ActivationQuantization",
    "SparsePruningConfig", "SparsePruner", "dense_ratio_at", "compute_mask", "parse_block_pattern",
    "RowPruningConfig", "HeadPruningConfig", "ChannelPruningConfig", "StructuredPruner",
    "LayerReductionConfig", "DistillationConfig", "DistillationLoss", "init_student_from_teacher",
    "reduce_layers", "kd_kl_loss",
    "Compressor", "init_compression", "redundancy_clean", "state_dict_bytes",
    "QuantizedLinear", "pack_int4", "unpack_int4",
    "CompressionConfig", "from_deepspeed", "library_configs",
]
