"""Kernel injection for inference: the decode-attention Triton kernel against its reference, and a
kernel-injected engine (fused norms, flash prefill attention, decode attention, fused MLP activations)
against the plain engine. On CPU the Triton kernels run under TRITON_INTERPRET=1 (fp32), in the kernel
tests' own copy of dsrecipes (this folder's conftest.py).

Tolerance: fp32 kernels differ from torch only in summation order (online softmax, fused norms):
1e-5 on attention outputs, 1e-4 on logits after two blocks.
"""

from __future__ import annotations

import pytest
import torch

from dsrecipes.inference import init_inference
from dsrecipes.models import GPT, ModelConfig


@pytest.mark.parametrize("b,h,hkv,s,d", [(2, 4, 4, 37, 16), (3, 4, 2, 70, 24), (1, 8, 1, 5, 64), (2, 2, 2, 1, 32)])
def test_decode_attention_matches_reference(b, h, hkv, s, d):
    from dsrecipes.inference.decode_attention import _decode_attention_kernel, decode_attention, decode_attention_reference
    from dsrecipes.kernels._utils import triton_unavailable_reason

    torch.manual_seed(0)
    cache_k = torch.randn(2, b, hkv, s + 9, d)  # a view of a bigger cache, as the engine passes it
    cache_v = torch.randn(2, b, hkv, s + 9, d)
    k, v = cache_k[1, :, :, :s], cache_v[1, :, :, :s]
    q = torch.randn(b, h, 1, d)
    start = torch.randint(0, s, (b,))
    out = decode_attention(q, k, v, start)
    ref = decode_attention_reference(q, k, v, start)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    # the reference itself: attention over the valid slots only
    for row in range(b):
        kk = k[row, :, start[row]:].repeat_interleave(h // hkv, 0)
        vv = v[row, :, start[row]:].repeat_interleave(h // hkv, 0)
        expect = torch.softmax(q[row] @ kk.transpose(-1, -2) / d**0.5, -1) @ vv
        torch.testing.assert_close(ref[row], expect, atol=1e-5, rtol=1e-5)
    assert triton_unavailable_reason(_decode_attention_kernel, q, k, v) is None  # the kernel really ran
    # `end` on the device (the CUDA-graph decode step): the whole capacity passed, slots [start, end) read
    end = torch.tensor([int(start.max()) + 1])
    full_k, full_v = cache_k[1], cache_v[1]
    want = decode_attention_reference(q, k[:, :, :int(end)], v[:, :, :int(end)], start)
    torch.testing.assert_close(decode_attention(q, full_k, full_v, start, end), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(decode_attention_reference(q, full_k, full_v, start, end), want, atol=1e-5, rtol=1e-5)


def test_decode_attention_rejects_bad_shapes():
    from dsrecipes.inference.decode_attention import decode_attention

    with pytest.raises(ValueError, match=r"q must be \[B, H, 1, D\]"):
        decode_attention(torch.zeros(1, 2, 3, 16), torch.zeros(1, 2, 4, 16), torch.zeros(1, 2, 4, 16),
                         torch.zeros(1, dtype=torch.long))
    with pytest.raises(ValueError, match="H a multiple of Hkv"):
        decode_attention(torch.zeros(1, 3, 1, 16), torch.zeros(1, 2, 4, 16), torch.zeros(1, 2, 4, 16),
                         torch.zeros(1, dtype=torch.long))


@pytest.mark.parametrize("style,kv", [("gpt2", None), ("llama", 2)])
def test_kernel_injected_engine_matches_plain_engine(style, kv):
    def model():
        torch.manual_seed(0)
        return GPT(ModelConfig(style=style, n_layer=2, n_head=4, n_kv_head=kv, d_model=64, vocab_size=53, max_seq_len=32)).eval()

    plain = init_inference(model())
    fused = init_inference(model(), kernel_inject=True)
    text = "\n".join(fused.injected)
    assert "FusedLayerNorm" in text or "FusedRMSNorm" in text
    assert "decode attention: decode_attention" in text and "prefill attention: flash_attention" in text
    ids = torch.tensor([[5, 3, 8, 1, 9, 2, 7]])
    torch.testing.assert_close(fused.logits(ids), plain.logits(ids), atol=1e-4, rtol=1e-4)
    prompts = [[5, 3, 8, 1], [9, 2]]  # the padded batch takes the masked-SDPA prefill, then the decode kernel
    assert fused.generate(prompts, max_new_tokens=6).tokens == plain.generate(prompts, max_new_tokens=6).tokens
    assert fused.generate([[4, 4, 2]], max_new_tokens=6).tokens == plain.generate([[4, 4, 2]], max_new_tokens=6).tokens


def test_kernel_injection_composes_with_int8_weights():
    """bias+GELU takes x @ W.T from the int8 matmul (Triton under the interpreter) and adds the bias itself."""
    def model():
        torch.manual_seed(0)
        return GPT(ModelConfig(n_layer=2, n_head=2, d_model=32, vocab_size=40, max_seq_len=24)).eval()

    plain = init_inference(model(), quant="int8")
    fused = init_inference(model(), quant="int8", kernel_inject=True)
    ids = torch.tensor([[1, 5, 9, 2]])
    torch.testing.assert_close(fused.logits(ids), plain.logits(ids), atol=1e-4, rtol=1e-4)
    assert fused.generate([[1, 5, 9]], max_new_tokens=5).tokens == plain.generate([[1, 5, 9]], max_new_tokens=5).tokens


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_decode_attention_half_precision_on_gpu(dtype):
    from dsrecipes.inference.decode_attention import decode_attention, decode_attention_reference

    torch.manual_seed(0)
    q = torch.randn(4, 16, 1, 128, device="cuda", dtype=dtype)
    k = torch.randn(4, 4, 1000, 128, device="cuda", dtype=dtype)
    v = torch.randn(4, 4, 1000, 128, device="cuda", dtype=dtype)
    start = torch.tensor([0, 5, 999, 300], device="cuda")
    ref = decode_attention_reference(q.float(), k.float(), v.float(), start)
    torch.testing.assert_close(decode_attention(q, k, v, start).float(), ref, atol=2e-2, rtol=2e-2)


def test_static_decode_with_the_decode_kernel_equals_eager():
    """The CUDA-graph step's kernel path (decode attention bounded by a device-side `end`), interpreted."""
    from dsrecipes.inference.decoder import CachedDecoder, InferenceKernels
    from dsrecipes.inference.generation import generate

    torch.manual_seed(0)
    model = GPT(ModelConfig(style="llama", n_layer=2, n_head=4, n_kv_head=2, d_model=64, vocab_size=53, max_seq_len=32)).eval()
    kernels = InferenceKernels.triton(model.cfg.head_dim)
    eager, static = CachedDecoder(model, kernels), CachedDecoder(model, kernels, decode_mode="static")
    prompts = [[5, 3, 8, 1], [9, 2]]
    assert generate(static, prompts, 6).tokens == generate(eager, prompts, 6).tokens


@pytest.mark.gpu
@pytest.mark.parametrize("quant", [None, "int8"])
def test_cuda_graph_decode_equals_eager_on_gpu(quant):
    """enable_cuda_graph: the replayed step gives the eager engine's tokens, across batch sizes and calls."""
    def model():
        torch.manual_seed(0)
        return GPT(ModelConfig(style="llama", n_layer=4, n_head=8, n_kv_head=2, d_model=512, vocab_size=1000,
                               max_seq_len=256)).eval()

    eager = init_inference(model(), dtype="bf16", device="cuda", kernel_inject=True, quant=quant)
    graph = init_inference(model(), dtype="bf16", device="cuda", kernel_inject=True, quant=quant, enable_cuda_graph=True)
    for prompts in ([list(range(1, 40))], [list(range(1, 50)), list(range(7, 20))], [list(range(3, 30))]):
        assert graph.generate(prompts, max_new_tokens=24).tokens == eager.generate(prompts, max_new_tokens=24).tokens
    assert len(graph.decoder._graphs) == 2  # batch 1 and batch 2, the batch-1 graph replayed on the third call


@pytest.mark.gpu
def test_kernel_injected_bf16_int8_engine_on_gpu():
    def model():
        torch.manual_seed(0)
        return GPT(ModelConfig(n_layer=4, n_head=8, d_model=512, vocab_size=1000, max_seq_len=256)).eval()

    plain = init_inference(model(), dtype="bf16", device="cuda")
    fused = init_inference(model(), dtype="bf16", device="cuda", kernel_inject=True)
    int8 = init_inference(model(), dtype="bf16", device="cuda", kernel_inject=True, quant="int8")
    ids = torch.randint(0, 1000, (2, 100), device="cuda")
    ref = plain.logits(ids).float()
    torch.testing.assert_close(fused.logits(ids).float(), ref, atol=0.1, rtol=0.05)
    assert (int8.logits(ids).float() - ref).abs().max() < 0.5
    prompts = [list(range(1, 50)), list(range(7, 20))]
    a = plain.generate(prompts, max_new_tokens=32).tokens
    b = fused.generate(prompts, max_new_tokens=32).tokens
    agree = sum(x == y for ra, rb in zip(a, b) for x, y in zip(ra, rb)) / sum(map(len, a))
    assert agree >= 0.9
