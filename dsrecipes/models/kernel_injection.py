"""Swap the GPT's hot ops for dsrecipes.kernels' fused Triton ops, in place.

    lines = inject_kernels(model, "triton")   # ["replaced 9 x LayerNorm -> FusedLayerNorm", ...]

What is swapped (backend "triton"):
  * every nn.LayerNorm -> kernels.layer_norm.FusedLayerNorm, every layers.RMSNorm ->
    kernels.rms_norm.FusedRMSNorm; the new module takes over the *same* Parameter objects, so
    module names, state-dict keys, devices, dtypes and parameter identity are unchanged;
  * GeluMLP: gelu_tanh(fc_in(x)) -> bias_gelu(x @ fc_in.weight.T, fc_in.bias) (bias add fused);
  * SwiGLUMLP: silu(gate) * up -> swiglu(gate, up);
  * CausalSelfAttention: SDPA -> flash_attention (native GQA) when the head dim is supported and
    dropout is 0 (otherwise SDPA stays and a "kept ..." line says why); RoPE -> kernels' rope;
  * GPT loss: F.cross_entropy -> kernels' cross_entropy.
The function swaps go through the None-by-default hooks of dsrecipes.models.layers / gpt
(`bias_gelu_fn`, `swiglu_fn`, `attention_fn`, `rope_fn`, `loss_fn`), so no monkeypatching.

Backend "auto" swaps, on a CUDA device, only the ops the measured per-op policy marks "triton"
(dsrecipes.models.kernel_policy, the packaged kernel_policy.json), and nothing elsewhere; its first
lines say what it chose for each op and why ("auto: cross_entropy -> triton (7.90x torch on NVIDIA
H200 ...)"). Backend "torch" changes nothing and returns []. dsrecipes.kernels is imported only when injecting
(Triton decides interpreter vs compiled when a kernel module is imported). Each op itself falls back
to its torch reference, with one warning per op, where Triton cannot run on the given tensors.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import torch
from torch import nn

from dsrecipes.models.kernel_policy import OpChoice, OpPolicy, choose_ops, describe_choices
from dsrecipes.models.kernels_config import KERNEL_BACKENDS, resolve_kernels_backend
from dsrecipes.models.layers import CausalSelfAttention, GeluMLP, RMSNorm, SwiGLUMLP

__all__ = ["inject_kernels", "kernel_choices", "resolve_kernels_backend"]


def _children_to_swap(model: nn.Module, match):
    """(parent, child_name, child) for every module under `model` (not model itself) with match(child)."""
    found = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if match(child):
                found.append((parent, name, child))
    return found


def _swap_norms(model: nn.Module, counts: Counter, kept: list[str], ops: set[str]) -> None:
    from dsrecipes.kernels.layer_norm import FusedLayerNorm
    from dsrecipes.kernels.rms_norm import FusedRMSNorm

    layer_norms = _children_to_swap(model, lambda m: type(m) is nn.LayerNorm) if "layer_norm" in ops else []
    rms_norms = _children_to_swap(model, lambda m: type(m) is RMSNorm) if "rms_norm" in ops else []
    for parent, name, ln in layer_norms:
        if len(ln.normalized_shape) != 1 or ln.weight is None:
            kept.append(f"kept {name}: nn.LayerNorm{tuple(ln.normalized_shape)} without a 1-D affine weight")
            continue
        new = FusedLayerNorm(ln.normalized_shape[0], eps=ln.eps, bias=ln.bias is not None, device="meta")
        new.weight = ln.weight  # the same Parameter: no copy, identity and state-dict keys kept
        if ln.bias is not None:
            new.bias = ln.bias
        new.train(ln.training)
        setattr(parent, name, new)
        counts["LayerNorm -> FusedLayerNorm"] += 1
    for parent, name, rms in rms_norms:
        new = FusedRMSNorm(rms.weight.shape[0], eps=rms.eps, device="meta")
        new.weight = rms.weight
        new.train(rms.training)
        setattr(parent, name, new)
        counts["RMSNorm -> FusedRMSNorm"] += 1


def _flash_unsupported(module: CausalSelfAttention, head_dims) -> str | None:
    """Why flash_attention cannot replace this module's SDPA, or None."""
    if module.head_dim not in head_dims:
        return f"head_dim {module.head_dim} is not one of flash_attention's {', '.join(map(str, head_dims))}"
    if module.dropout > 0:
        return f"attention dropout {module.dropout} (flash_attention has none)"
    return None


def _device_type(model: nn.Module) -> str:
    param = next(model.parameters(), None)
    if param is not None:
        return param.device.type
    return "cuda" if torch.cuda.is_available() else "cpu"


def kernel_choices(model: nn.Module, backend: str, policy: Mapping[str, OpPolicy] | None = None) -> dict[str, OpChoice]:
    """{op: OpChoice} inject_kernels would apply to `model` (auto: by the model's device and the policy)."""
    if backend not in KERNEL_BACKENDS:
        raise ValueError(f"kernels.backend={backend!r} is not valid; choose one of: {', '.join(KERNEL_BACKENDS)}")
    return choose_ops(backend, _device_type(model) if backend == "auto" else None, policy)


def inject_kernels(model: nn.Module, backend: str, policy: Mapping[str, OpPolicy] | None = None) -> list[str]:
    """Swap in the fused kernels for `backend` ("triton": every op; "torch": no change; "auto": the ops the
    per-op policy marks triton when the model is on CUDA, see kernel_policy) and return human-readable lines
    of what auto chose, what was replaced (and what was kept, and why)."""
    choices = kernel_choices(model, backend, policy)
    ops = {op for op, c in choices.items() if c.backend == "triton"}
    head = describe_choices(backend, choices)
    if not ops:
        return head

    from dsrecipes.kernels.activations import bias_gelu, swiglu
    from dsrecipes.kernels.cross_entropy import cross_entropy
    from dsrecipes.kernels.flash_attention import SUPPORTED_HEAD_DIMS, flash_attention
    from dsrecipes.kernels.rope import rope
    from dsrecipes.models.gpt import GPT

    counts: Counter = Counter()
    kept: list[str] = []
    _swap_norms(model, counts, kept, ops)
    kept_attention: Counter = Counter()
    for module in model.modules():
        if isinstance(module, GeluMLP) and "bias_gelu" in ops:
            module.bias_gelu_fn = bias_gelu
            counts["GeluMLP gelu_tanh(fc_in(x)) -> bias_gelu"] += 1
        elif isinstance(module, SwiGLUMLP) and "swiglu" in ops:
            module.swiglu_fn = swiglu
            counts["SwiGLUMLP silu(gate) * up -> swiglu"] += 1
        elif isinstance(module, CausalSelfAttention):
            if module.use_rope and "rope" in ops:
                module.rope_fn = rope
                counts["RoPE apply_rope -> rope"] += 1
            if "flash_attention" in ops:
                why = _flash_unsupported(module, SUPPORTED_HEAD_DIMS)
                if why:
                    kept_attention[why] += 1
                else:
                    module.attention_fn = flash_attention
                    counts["CausalSelfAttention SDPA -> flash_attention"] += 1
        elif isinstance(module, GPT) and "cross_entropy" in ops:
            module.loss_fn = cross_entropy
            counts["GPT loss F.cross_entropy -> cross_entropy"] += 1
    lines = head + [f"replaced {n} x {what}" for what, n in counts.items()]
    lines += [f"kept {n} x CausalSelfAttention on SDPA: {why}" for why, n in kept_attention.items()]
    return lines + kept
