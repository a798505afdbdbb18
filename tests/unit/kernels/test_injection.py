"""Kernel injection into a tiny GPT: what is swapped, numerics vs the torch model, state dicts, training.

Runs the Triton kernels on CPU through the interpreter (this folder's conftest sets TRITON_INTERPRET=1
before dsrecipes.kernels is imported); fp32 only. Tolerances: the whole model chains ~10 kernels
whose per-op fp32 rows in TOLERANCES.md are <= (1e-4, 5e-5); logits, loss and every parameter
gradient are compared at MODEL_TOL (rtol 1e-4, atol 1e-5); after TRAIN_STEPS AdamW steps the
per-step losses at TRAIN_LOSS_TOL (rtol 1e-4, atol 1e-5; observed differences ~1e-6).
"""

from __future__ import annotations

import copy
import functools
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


def test_kernels_config_group():
    from dsrecipes.config import validate_recipe
    from dsrecipes.config.store import compose
    from dsrecipes.models.kernels_config import KernelsConfig, resolve_kernels_backend, validate_kernels_config

    assert compose([]).kernels.backend == "torch"  # the default until the injected GPU path has been measured
    assert KernelsConfig().backend == "torch"  # the library path's default too
    root, _ = validate_recipe(compose(["kernels=triton", "model=gpt_debug"]), dp_world_size=1)
    assert root.kernels.backend == "triton"
    with pytest.raises(ValueError, match=r"kernels\.backend='cuda'.*auto, torch, triton"):
        validate_kernels_config(KernelsConfig(backend="cuda"))
    with pytest.raises(Exception) as err:  # an Enum: fails at composition, naming the key and the values
        compose(["kernels.backend=fast"])
    text = f"{err.value} {err.value.__cause__}"
    assert "kernels.backend" in text and "Invalid value 'fast', expected one of [auto, torch, triton]" in text
    assert resolve_kernels_backend("auto", "cpu") == "torch"
    assert resolve_kernels_backend("triton", "cpu") == "triton"


class UserBlock(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.proj = torch.nn.Linear(width, width)

    def forward(self, x):
        return x + self.proj(self.norm(x))


class UserModel(torch.nn.Module):
    """Not a dsrecipes model: a stack of LayerNorm + Linear blocks in an nn.ModuleList."""

    def __init__(self, width: int = 16, depth: int = 2):
        super().__init__()
        self.blocks = torch.nn.ModuleList(UserBlock(width) for _ in range(depth))
        self.head = torch.nn.Linear(width, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_initialize_applies_kernels_and_checkpointing_to_a_user_module():
    """dsrecipes.initialize goes through parallelize: the user's LayerNorms become FusedLayerNorm, every
    block is checkpointed, and the engine trains exactly like the plain module (fp32, SGD)."""
    import dsrecipes
    from dsrecipes.kernels.layer_norm import FusedLayerNorm

    torch.manual_seed(0)
    plain = UserModel()
    fused = copy.deepcopy(plain)
    overrides = ["kernels=triton", "activation_checkpointing=full", "optimizer=sgd", "optimizer.lr=0.1",
                 "optimizer.momentum=0.0", "optimizer.nesterov=false", "optimizer.weight_decay=0.0",
                 "lr_scheduler=constant", "trainer.device=cpu", "trainer.gradient_clipping=0.0",
                 "trainer.train_micro_batch_size_per_gpu=8"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine, *_ = dsrecipes.initialize(model=fused, config=overrides)
    assert not [w for w in caught if "ignored" in str(w.message) or "changed nothing" in str(w.message)]
    assert all(type(b.norm) is FusedLayerNorm for b in engine.module.blocks)
    assert all(isinstance(b.forward, functools.partial) for b in engine.module.blocks)  # checkpointed
    reference = torch.optim.SGD(plain.parameters(), lr=0.1)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    for _ in range(3):
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        ref_loss = torch.nn.functional.mse_loss(plain(x), y)
        ref_loss.backward()
        reference.step()
        reference.zero_grad()
        torch.testing.assert_close(loss, ref_loss, **MODEL_TOL)
    for a, b in zip(engine.module.parameters(), plain.parameters()):
        torch.testing.assert_close(a, b, **MODEL_TOL)


def test_initialize_warns_by_name_for_groups_that_cannot_apply():
    import dsrecipes

    class NoBlocks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.linear(x)

    overrides = ["trainer.device=cpu", "trainer.train_micro_batch_size_per_gpu=2"]
    for group, expected in (("activation_checkpointing=full", "activation_checkpointing.mode=full is ignored"),
                            ("kernels=triton", "kernels.backend=triton changed nothing in NoBlocks"),
                            ("sparse_attention=bigbird", "sparse_attention.mode=bigbird is ignored"),
                            ("moe=top2", "moe.num_experts=8 is ignored"),
                            ("compression=qat_int8", "compression is ignored by dsrecipes.initialize")):
        with pytest.warns(UserWarning, match=expected):
            dsrecipes.initialize(model=NoBlocks(), config=[group, *overrides])
    with pytest.raises(ValueError, match="parallel.pp=2 needs a dsrecipes GPT"):
        from dsrecipes.distributed.parallel_dims import ParallelDims
        from dsrecipes.distributed.parallelize import _pipeline_split
        _pipeline_split(NoBlocks(), ParallelDims.from_degrees(2, pp=2), None, 1, torch.device("cpu"))
