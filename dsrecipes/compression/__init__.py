"""dsrecipes.compression: quantization-aware training, pruning, layer reduction with distillation, and
redundancy clean.

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

from dsrecipes.utils.lazy_exports import lazy_exports

_EXPORTS = {
    "ActivationQuantConfig": "dsrecipes.compression.activation_quantization",
    "ActivationQuantization": "dsrecipes.compression.activation_quantization",
    "redundancy_clean": "dsrecipes.compression.clean",
    "state_dict_bytes": "dsrecipes.compression.clean",
    "Compressor": "dsrecipes.compression.compress",
    "init_compression": "dsrecipes.compression.compress",
    "CompressionConfig": "dsrecipes.compression.config",
    "from_deepspeed": "dsrecipes.compression.config",
    "library_configs": "dsrecipes.compression.config",
    "DistillationConfig": "dsrecipes.compression.layer_reduction",
    "DistillationLoss": "dsrecipes.compression.layer_reduction",
    "LayerReductionConfig": "dsrecipes.compression.layer_reduction",
    "init_student_from_teacher": "dsrecipes.compression.layer_reduction",
    "kd_kl_loss": "dsrecipes.compression.layer_reduction",
    "reduce_layers": "dsrecipes.compression.layer_reduction",
    "SparsePruner": "dsrecipes.compression.pruning",
    "SparsePruningConfig": "dsrecipes.compression.pruning",
    "compute_mask": "dsrecipes.compression.pruning",
    "dense_ratio_at": "dsrecipes.compression.pruning",
    "parse_block_pattern": "dsrecipes.compression.pruning",
    "QuantCodes": "dsrecipes.compression.quantization",
    "QuantizationAwareTraining": "dsrecipes.compression.quantization",
    "WeightQuantConfig": "dsrecipes.compression.quantization",
    "bits_at": "dsrecipes.compression.quantization",
    "dequantize_codes": "dsrecipes.compression.quantization",
    "fake_quantize": "dsrecipes.compression.quantization",
    "match_module_names": "dsrecipes.compression.quantization",
    "quantize_codes": "dsrecipes.compression.quantization",
    "QuantizedLinear": "dsrecipes.compression.quantized_linear",
    "pack_int4": "dsrecipes.compression.quantized_linear",
    "unpack_int4": "dsrecipes.compression.quantized_linear",
    "ChannelPruningConfig": "dsrecipes.compression.structured_pruning",
    "HeadPruningConfig": "dsrecipes.compression.structured_pruning",
    "RowPruningConfig": "dsrecipes.compression.structured_pruning",
    "StructuredPruner": "dsrecipes.compression.structured_pruning",
}

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


# Lazy, so that importing the recipe schema (dsrecipes.compression.config, which the `compression` group's
# RootConfig field needs) does not import torch: `python -m dsrecipes --help` composes the recipe only.
__getattr__ = lazy_exports(__name__, _EXPORTS)
