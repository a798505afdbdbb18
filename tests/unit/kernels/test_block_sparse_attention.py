"""Block-sparse attention kernels (and the gathered torch path) against the dense masked reference.

CPU tier: fp32 under the Triton interpreter (TRITON_INTERPRET=1, set by tests/unit/kernels/conftest.py) at
tiny shapes: T of 2-4 blocks, per-head layouts, GQA, causal and bidirectional, an empty layout row.
GPU tier (`gpu`): bf16 at a real shape against an fp32 reference. Tolerances: TOLERANCES.md rows
`block_sparse_attention (...)`.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from dsrecipes.kernels.block_sparse_attention import (
    block_sparse_attention,
    block_sparse_attention_gathered,
    block_sparse_attention_reference,
)
from dsrecipes.models.sparsity_config import BigBirdSparsityConfig, FixedSparsityConfig, VariableSparsityConfig

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F32, BF16 = torch.float32, torch.bfloat16


def _inputs(B, hq, hkv, T, D, dtype=F32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g).to(DEVICE, dtype) for shape in
            ((B, hq, T, D), (B, hkv, T, D), (B, hkv, T, D), (B, hq, T, D))]


def _run(fn, q, k, v, do, *args, **kw):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = fn(q, k, v, *args, **kw)
    return (o, *torch.autograd.grad(o, (q, k, v), do)), o


def _layouts(H, nb):
    """Named layouts at nb blocks: per-head fixed patterns, bigbird with random blocks, variable windows."""
    fixed = FixedSparsityConfig(num_heads=H, block=1, different_layout_per_head=True, num_local_blocks=2,
                                num_global_blocks=1, num_different_global_patterns=2).make_layout(nb)
    bigbird = BigBirdSparsityConfig(num_heads=H, block=1, different_layout_per_head=True, num_random_blocks=1,
                                    num_sliding_window_blocks=1, seed=3).make_layout(nb)
    variable = VariableSparsityConfig(num_heads=H, block=1, local_window_blocks=[1, 2], global_block_indices=[1],
                                      num_random_blocks=1, seed=5).make_layout(nb)
    return {"fixed_per_head": fixed, "bigbird": bigbird, "variable": variable}


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidir"])
@pytest.mark.parametrize("shape", [(2, 4, 2, 16, 16, 4), (1, 2, 2, 32, 32, 2)], ids=["gqa_b16_d16", "mha_b32_d32"])
@pytest.mark.parametrize("name", ["fixed_per_head", "bigbird", "variable"])
def test_kernel_matches_reference_forward_and_grads(name, shape, causal, tolerance):
    B, hq, hkv, block, D, nb = shape
    layout = _layouts(hq, nb)[name]
    q, k, v, do = _inputs(B, hq, hkv, nb * block, D, seed=nb * 10 + D)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback to the reference would warn: fail instead
        got, out = _run(block_sparse_attention, q, k, v, do, layout, block, causal=causal)
    assert type(out.grad_fn).__name__ == "BlockSparseAttentionFunctionBackward"
    ref, _ = _run(block_sparse_attention_reference, q, k, v, do, layout, block, causal=causal)
    torch.testing.assert_close(got[0], ref[0], **tolerance("block_sparse_attention (output)", F32))
    for label, a, b in zip(("dq", "dk", "dv"), got[1:], ref[1:]):
        torch.testing.assert_close(a, b, **tolerance("block_sparse_attention (grads)", F32),
                                   msg=lambda m, label=label: f"{label}: {m}")


def test_kernel_empty_layout_row_gives_zeros(tolerance):
    """A query block attending nothing outputs 0 and passes no gradient (the reference's convention)."""
    layout = torch.tensor([[[1, 0, 0], [0, 0, 0], [1, 1, 1]]], dtype=torch.bool)
    q, k, v, do = _inputs(1, 1, 1, 48, 16, seed=1)
    got, _ = _run(block_sparse_attention, q, k, v, do, layout, 16, causal=False)
    ref, _ = _run(block_sparse_attention_reference, q, k, v, do, layout, 16, causal=False)
    assert torch.count_nonzero(got[0][:, :, 16:32]) == 0
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, **tolerance("block_sparse_attention (grads)", F32))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidir"])
def test_gathered_path_matches_reference(causal, tolerance):
    layout = _layouts(4, 4)["fixed_per_head"]
    q, k, v, do = _inputs(2, 4, 2, 32, 8, seed=2)  # block 8, head dim 8: the torch paths take any shape
    got, _ = _run(block_sparse_attention_gathered, q, k, v, do, layout, 8, causal=causal)
    ref, _ = _run(block_sparse_attention_reference, q, k, v, do, layout, 8, causal=causal)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, **tolerance("block_sparse_attention_gathered", F32))


def test_unsupported_block_falls_back_with_one_warning(fresh_fallback_warnings):
    layout = torch.ones(2, 4, 4, dtype=torch.bool)
    q, k, v, _ = _inputs(1, 2, 2, 32, 16)
    with pytest.warns(RuntimeWarning, match="block_sparse_attention: Triton path unavailable"):
        out = block_sparse_attention(q, k, v, layout, 8)
    torch.testing.assert_close(out, block_sparse_attention_reference(q, k, v, layout, 8))


def test_bad_inputs_raise():
    q, k, v, _ = _inputs(1, 2, 2, 32, 16)
    with pytest.raises(ValueError, match="multiple of the layout block"):
        block_sparse_attention(q, k, v, torch.ones(2, 3, 3, dtype=torch.bool), 12)
    with pytest.raises(ValueError, match="layout must be"):
        block_sparse_attention(q, k, v, torch.ones(1, 2, 2, dtype=torch.bool), 16)


@pytest.mark.gpu
def test_kernel_bf16_real_shape(tolerance):
    B, H, T, D, block = 2, 8, 2048, 64, 64
    layout = BigBirdSparsityConfig(num_heads=H, block=block, attention="unidirectional").make_layout(T)
    q, k, v, do = _inputs(B, H, H, T, D, dtype=BF16, seed=0)
    got, out = _run(block_sparse_attention, q, k, v, do, layout, block)
    assert type(out.grad_fn).__name__ == "BlockSparseAttentionFunctionBackward"
    ref, _ = _run(block_sparse_attention_reference, *(t.float() for t in (q, k, v, do)), layout, block)
    torch.testing.assert_close(got[0].float(), ref[0], **tolerance("block_sparse_attention (output)", BF16))
    for a, b in zip(got[1:], ref[1:]):
        torch.testing.assert_close(a.float(), b, **tolerance("block_sparse_attention (grads)", BF16))
