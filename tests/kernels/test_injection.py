"""Kernel injection into a tiny GPT: what is swapped, numerics vs the torch model, state dicts, training.

Runs the Triton kernels on CPU through the interpreter (this folder's conftest sets TRITON_INTERPRET=1
before dsrecipes.kernels is imported); fp32 only. Tolerances: the whole model chains ~10 kernels
whose per-op fp32 rows in TOLERANCES.md are <= (1e-4, 5e-5); logits, loss and every parameter
gradient are compared at MODEL_TOL (rtol 1e-4, atol 1e-5); after TRAIN_STEPS AdamW steps the
per-step losses at TRAIN_LOSS_TOL (rtol 1e-4, atol 1e-5; observed differences ~1e-6).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from dsrecipes.models import GPT, ModelConfig
from dsrecipes.models.kernel_injection import inject_kernels

MODEL_TOL = {"rtol": 1e-4, "atol": 1e-5}
TRAIN_LOSS_TOL = {"rtol": 1e-4, "atol": 1e-5}
TRAIN_STEPS = 5

STYLES = {
    # head_dim 16, MHA, biases (bias_gelu gets a real bias), untied head
    "gpt2": dict(style="gpt2", n_layer=2, n_head=2, d_model=32, vocab_size=64, max_seq_len=16, tie_embeddings=False),
    # head_dim 16, grouped-query attention (4 q heads, 2 kv heads), RoPE, tied embeddings
    "llama": dict(style="llama", n_layer=2, n_head=4, n_kv_head=2, d_model=64, vocab_size=64, max_seq_len=16, bias=False),
}
EXPECTED = {
    "gpt2": {"LayerNorm -> FusedLayerNorm": 5, "GeluMLP": 2, "SDPA -> flash_attention": 2, "loss": 1},
    "llama": {"RMSNorm -> FusedRMSNorm": 5, "SwiGLUMLP": 2, "SDPA -> flash_attention": 2, "RoPE": 2, "loss": 1},
}


def _pair(style: str):
    torch.manual_seed(0)
    ref = GPT(ModelConfig(**STYLES[style]))
    fused = copy.deepcopy(ref)
    return ref, fused, inject_kernels(fused, "triton")


def _batch(vocab: int, batch: int = 2, seq: int = 16, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    labels = torch.randint(0, vocab, (batch, seq), generator=g)
    labels[0, :3] = -100  # ignored positions must stay ignored
    return ids, labels


@pytest.mark.parametrize("style", sorted(STYLES))
def test_injection_replaces_ops_and_matches_torch(style, fresh_fallback_warnings):
    ref, fused, lines = _pair(style)
    assert lines and all(line.startswith("replaced ") for line in lines), lines
    text = "\n".join(lines)
    for what, n in EXPECTED[style].items():
        assert any(what in line and f"replaced {n} x" in line for line in lines), (what, n, text)
    assert inject_kernels(copy.deepcopy(ref), "torch") == []

    # same parameter names / shapes: checkpoints move between backends
    assert list(ref.state_dict()) == list(fused.state_dict())
    fused.load_state_dict(ref.state_dict())

    ids, labels = _batch(STYLES[style]["vocab_size"])
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out_f = fused(ids, labels=labels)
        out_f.loss.backward()
    fallbacks = [str(w.message) for w in record if "Triton path unavailable" in str(w.message)]
    assert not fallbacks, fallbacks  # every injected op ran its Triton kernel (interpreter)
    assert type(out_f.loss.grad_fn).__name__ == "CrossEntropyFunctionBackward"

    out_r = ref(ids, labels=labels)
    out_r.loss.backward()
    torch.testing.assert_close(out_f.logits, out_r.logits, **MODEL_TOL)
    torch.testing.assert_close(out_f.loss, out_r.loss, **MODEL_TOL)
    grads_r = dict(ref.named_parameters())
    for name, p in fused.named_parameters():
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, grads_r[name].grad, **MODEL_TOL, msg=lambda m, n=name: f"{n}: {m}")


def test_attention_kept_on_sdpa_for_unsupported_head_dim():
    model = GPT(ModelConfig(style="gpt2", n_layer=1, n_head=2, d_model=48, vocab_size=64, max_seq_len=8))
    lines = inject_kernels(model, "triton")
    assert any("kept 1 x CausalSelfAttention on SDPA: head_dim 24" in line for line in lines), lines
    assert model.blocks[0].attn.attention_fn is None
    assert any("LayerNorm -> FusedLayerNorm" in line for line in lines)


def test_training_with_kernels_matches_torch():
    losses = {}
    ref, fused, _ = _pair("llama")
    for name, model in (("torch", ref), ("triton", fused)):
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
        losses[name] = []
        for step in range(TRAIN_STEPS):
            ids, labels = _batch(64, seed=10 + step)
            loss = model(ids, labels=labels).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses[name].append(loss.item())
    assert losses["triton"][-1] < losses["triton"][0]
    torch.testing.assert_close(torch.tensor(losses["triton"]), torch.tensor(losses["torch"]), **TRAIN_LOSS_TOL)


def test_kernels_config_group_and_extension():
    from dsrecipes.config import validate_recipe
    from dsrecipes.config.store import compose
    from dsrecipes.models.kernels_config import KernelsConfig, resolve_kernels_backend, validate_kernels_config
    from dsrecipes.training.extensions import build_extensions
    from dsrecipes.training.kernel_extension import kernel_injection_extension

    assert compose([]).kernels.backend == "torch"  # the default until the injected GPU path has been measured
    root, _ = validate_recipe(compose(["kernels=triton", "model=gpt_debug"]), dp_world_size=1)
    assert root.kernels.backend == "triton"
    with pytest.raises(ValueError, match=r"kernels\.backend='cuda'.*auto, torch, triton"):
        validate_kernels_config(KernelsConfig(backend="cuda"))
    with pytest.raises(ValueError, match=r"kernels\.backend='fast'"):
        validate_recipe(compose(["kernels.backend=fast"]), dp_world_size=1)
    assert resolve_kernels_backend("auto", "cpu") == "torch"
    assert resolve_kernels_backend("triton", "cpu") == "triton"

    extensions = build_extensions(root)  # importing the trainer module registered the builder
    assert any(getattr(t, "__qualname__", "").startswith("kernel_injection_extension") for t in extensions.model_transforms)
    model = GPT(ModelConfig(**STYLES["gpt2"]))
    for transform in kernel_injection_extension(root).model_transforms:
        model = transform(model)
    assert type(model.final_norm).__name__ == "FusedLayerNorm" and model.loss_fn is not None
    torch_root, _ = validate_recipe(compose(["kernels=torch"]), dp_world_size=1)
    model = GPT(ModelConfig(**STYLES["gpt2"]))
    for transform in kernel_injection_extension(torch_root).model_transforms:
        model = transform(model)
    assert type(model.final_norm).__name__ == "LayerNorm" and model.loss_fn is None
