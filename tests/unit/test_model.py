"""The GPT family: both block styles, GQA, causality, tying, flavors on meta, counts and FLOPs."""

import time

import pytest
import torch

from dsrecipes.models import GPT, ModelConfig, available_flavors, load_flavor


def small(style: str, **kw) -> ModelConfig:
    base = dict(style=style, n_layer=2, n_head=4, d_model=32, vocab_size=50, max_seq_len=16, bias=style == "gpt2")
    base.update(kw)
    return ModelConfig(**base)


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_forward_shapes_and_loss(style):
    torch.manual_seed(0)
    model = GPT(small(style))
    ids, labels = torch.randint(0, 50, (3, 16)), torch.randint(0, 50, (3, 16))
    out = model(ids, labels=labels)
    assert out.logits.shape == (3, 16, 50)
    # an untrained model predicts roughly uniformly: loss near ln(vocab)
    assert abs(out.loss.item() - torch.log(torch.tensor(50.0)).item()) < 0.5
    out.loss.backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_causal(style):
    """Changing a later token never changes earlier logits."""
    torch.manual_seed(0)
    model = GPT(small(style)).eval()
    ids = torch.randint(0, 50, (1, 16))
    changed = ids.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % 50
    a, b = model(ids).logits, model(changed).logits
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_grouped_query_attention_matches_repeated_heads():
    """GQA with n_kv_head=2 equals MHA whose k/v heads are the GQA heads repeated."""
    torch.manual_seed(0)
    gqa = GPT(small("llama", n_kv_head=2)).eval()
    mha = GPT(small("llama")).eval()
    state = gqa.state_dict()
    for i in range(2):
        w = state[f"blocks.{i}.attn.kv_proj.weight"].view(2, 2, 8, 32)  # (kv_head, k|v, head_dim, d)
        state[f"blocks.{i}.attn.kv_proj.weight"] = w.repeat_interleave(2, dim=0).reshape(4 * 2 * 8, 32)
    mha.load_state_dict(state)
    ids = torch.randint(0, 50, (2, 16))
    torch.testing.assert_close(gqa(ids).logits, mha(ids).logits)
    assert gqa.num_params() < mha.num_params()


def test_tied_and_untied_embeddings():
    tied, untied = GPT(small("gpt2")), GPT(small("gpt2", tie_embeddings=False))
    assert tied.lm_head.weight is tied.tok_emb.weight
    assert untied.num_params() - tied.num_params() == 50 * 32


def test_every_flavor_builds_instantly_on_meta():
    flavors = available_flavors()
    assert {"gpt_debug", "gpt_tiny", "gpt_1_3b", "llama_7b"} <= set(flavors)
    for name in flavors:
        start = time.perf_counter()
        with torch.device("meta"):
            model = GPT(load_flavor(name, vocab_size=32000))
        assert time.perf_counter() - start < 5.0, name
        assert all(p.is_meta for p in model.parameters())


@pytest.mark.parametrize(
    "flavor, vocab, expected",
    [("gpt2_124m", 50257, 124_439_808), ("llama_7b", 32000, 6_738_415_616)],
)
def test_parameter_counts_match_the_published_models(flavor, vocab, expected):
    with torch.device("meta"):
        model = GPT(load_flavor(flavor, vocab_size=vocab))
    assert model.num_params() == expected


def test_flops_per_token_is_6n_plus_attention():
    cfg = small("gpt2")
    model = GPT(cfg)
    n = model.num_params(non_embedding=True)
    assert n == model.num_params() - 16 * 32  # only the position table is lookup-only when tied
    assert model.flops_per_token(16) == 6 * n + 12 * 2 * 32 * 16


def test_meta_model_materialises_with_init_weights():
    cfg = small("llama")
    with torch.device("meta"):
        model = GPT(cfg)
    model.to_empty(device="cpu")
    model.init_weights()
    assert torch.isfinite(model(torch.randint(0, 50, (1, 8))).logits).all()
    assert torch.equal(model.blocks[0].attn_norm.weight, torch.ones(32))


def test_bad_shapes_raise_clear_errors():
    with pytest.raises(ValueError, match="model.d_model=30 must be divisible by model.n_head=4"):
        GPT(small("gpt2", d_model=30))
    with pytest.raises(ValueError, match="model.style='bert'"):
        GPT(small("bert"))
    with pytest.raises(ValueError, match="unknown model flavor 'gpt5'"):
        load_flavor("gpt5")
