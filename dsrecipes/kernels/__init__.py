"""dsrecipes.kernels: Triton kernels with pure-torch references.

Import as `dsrecipes.kernels`, never as `kernels`. Depends on torch and triton only. One op per
file, each with its torch reference (`<op>_reference`) beside it: layer_norm, rms_norm, activations
(bias-GELU, SwiGLU), rope, softmax, flash_attention, block_sparse_attention, cross_entropy,
fused_adamw, quantization (int8/int4), int8_matmul, moe_permute. Kernel injection
(dsrecipes.models.kernel_injection) swaps them into a model; each falls back to its reference, with
a warning, where Triton cannot run. Import a kernel module only after TRITON_INTERPRET is settled.
"""
