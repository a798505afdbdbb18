"""MoE permute/unpermute Triton kernels vs their torch references, and through an MoE layer.

Tolerances: tests/unit/kernels/TOLERANCES.md, row moe_permute.
"""

import pytest
import torch

from dsrecipes.kernels.moe_permute import permute_rows, permute_rows_reference, unpermute_rows, unpermute_rows_reference
from dsrecipes.models import ModelConfig
from dsrecipes.models.moe import MoELayer
from dsrecipes.models.moe_config import MoEConfig
from dsrecipes.models.moe_dispatch import slot_sources
from dsrecipes.models.moe_gating import top2_gating


def routed(num_tokens=13, num_experts=4, d_model=40, capacity_factor=0.75, device="cpu", dtype=torch.float32):
    torch.manual_seed(0)
    logits = torch.randn(num_tokens, num_experts, device=device)
    routing = top2_gating(logits, capacity_factor, 2, second_expert_sampling=False)
    assert int(routing.dropped) > 0  # the test covers dropped routes and empty slots
    tokens = torch.randn(num_tokens, d_model, device=device, dtype=dtype, requires_grad=True)
    return tokens, routing


def test_permute_forward_and_backward_match_reference(tolerance):
    tokens, routing = routed()
    source, slots = slot_sources(routing, tokens.shape[0]), routing.flat_slots()
    out = permute_rows(tokens, source, slots)
    ref = permute_rows_reference(tokens, source, slots)
    torch.testing.assert_close(out, ref, **tolerance("moe_permute", "float32"))
    grad = torch.randn_like(out)
    (g,) = torch.autograd.grad(out, tokens, grad)
    (g_ref,) = torch.autograd.grad(ref, tokens, grad)
    torch.testing.assert_close(g, g_ref, **tolerance("moe_permute", "float32"))


def test_unpermute_forward_and_backward_match_reference(tolerance):
    tokens, routing = routed()
    num_slots = routing.num_experts * routing.capacity
    y = torch.randn(num_slots, tokens.shape[1], requires_grad=True)
    weight = routing.weight.detach().clone().requires_grad_(True)
    source, slots = slot_sources(routing, tokens.shape[0]), routing.flat_slots()
    out = unpermute_rows(y, slots, weight, source)
    ref = unpermute_rows_reference(y, slots, weight, source)
    torch.testing.assert_close(out, ref, **tolerance("moe_permute", "float32"))
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (y, weight), grad)
    want = torch.autograd.grad(ref, (y, weight), grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **tolerance("moe_permute", "float32"))


def test_moe_layer_with_triton_dispatch_equals_torch_dispatch(tolerance):
    cfg = ModelConfig(n_layer=2, n_head=2, d_model=32, vocab_size=32, max_seq_len=16)
    torch.manual_seed(0)
    layers = {}
    for backend in ("torch", "triton"):
        torch.manual_seed(0)
        layers[backend] = MoELayer(cfg, MoEConfig(num_experts=4, k=2, capacity_factor=0.5, use_rts=False,
                                                  top2_2nd_expert_sampling=False, dispatch=backend))
    x = torch.randn(2, 8, 32, requires_grad=True)
    outs, grads = {}, {}
    for backend, layer in layers.items():
        outs[backend] = layer(x)
        grads[backend] = torch.autograd.grad(outs[backend].pow(2).sum(), [x, *layer.parameters()])
    torch.testing.assert_close(outs["triton"], outs["torch"], rtol=1e-5, atol=1e-5)
    for a, b in zip(grads["triton"], grads["torch"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_permute_kernels_bf16_on_gpu(tolerance):
    tokens, routing = routed(num_tokens=4096, num_experts=8, d_model=1024, device="cuda", dtype=torch.bfloat16)
    source, slots = slot_sources(routing, tokens.shape[0]), routing.flat_slots()
    ref_tokens = tokens.detach().float()
    torch.testing.assert_close(permute_rows(tokens, source, slots).float(), permute_rows_reference(ref_tokens, source, slots),
                               **tolerance("moe_permute", "bfloat16"))
    y = torch.randn(routing.num_experts * routing.capacity, 1024, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(unpermute_rows(y, slots, routing.weight, source).float(),
                               unpermute_rows_reference(y.float(), slots, routing.weight, source),
                               **tolerance("moe_permute", "bfloat16"))
