"""Block-sparse attention in the model: layouts against their definitions, dense equivalence, config, training.

Layouts are checked cell by cell against small hand-built matrices worked out from each mode's
definition (DeepSpeed's sparsity configs); a dense layout through the sparse path equals dense
causal SDPA (fp32, atol 1e-5: only the softmax/sum order differs); a short Trainer run with a sparse
layout trains. Kernel-vs-reference checks live in tests/unit/kernels/test_block_sparse_attention.py.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from hydra.errors import ConfigCompositionException

from dsrecipes.config import validate_recipe
from dsrecipes.config.store import compose
from dsrecipes.models import GPT
from dsrecipes.models.config import ModelConfig
from dsrecipes.models.sparse_attention import (
    BlockSparseAttention,
    SparseAttentionConfig,
    apply_sparse_attention,
    build_sparsity_config,
    validate_sparse_attention_config,
)
from dsrecipes.models.sparsity_config import (
    BigBirdSparsityConfig,
    BSLongformerSparsityConfig,
    DenseSparsityConfig,
    FixedSparsityConfig,
    LocalSlidingWindowSparsityConfig,
    VariableSparsityConfig,
    expand_layout,
)

ATOL = 1e-5  # fp32: blockwise vs one-shot softmax and P@V summation order


def grid(*rows: str) -> torch.Tensor:
    """'1100' style rows -> Bool[nb, nb]."""
    return torch.tensor([[c == "1" for c in row] for row in rows])


# --------------------------------------------------------------------------------------------------
# Layouts against their definitions (block=1 so seq_len == number of blocks)
# --------------------------------------------------------------------------------------------------

LAYOUT_CASES = {
    # windows [0,1] [2,3]; the last block of each window (1, 3) is a global column for later rows
    "fixed_uni": (FixedSparsityConfig(num_heads=2, block=1, num_local_blocks=2, attention="unidirectional"), 4,
                  grid("1000", "1100", "0110", "0111")),
    "fixed_bidir": (FixedSparsityConfig(num_heads=1, block=1, num_local_blocks=2), 4,
                    grid("1101", "1101", "0111", "0111")),
    # short last window [4]: its global block is min(4 + 1, 5 - 1) = 4
    "fixed_short_tail": (FixedSparsityConfig(num_heads=1, block=1, num_local_blocks=2, attention="unidirectional"), 5,
                         grid("10000", "11000", "01100", "01110", "01011")),
    "fixed_horizontal": (FixedSparsityConfig(num_heads=1, block=1, num_local_blocks=2, horizontal_global_attention=True),
                         4, grid("1101", "1111", "0111", "1111")),
    "bigbird_bidir": (BigBirdSparsityConfig(num_heads=1, block=1, num_random_blocks=0), 4,
                      grid("1111", "1110", "1111", "1011")),
    "bigbird_uni": (BigBirdSparsityConfig(num_heads=1, block=1, num_random_blocks=0, attention="unidirectional"), 4,
                    grid("1000", "1100", "1110", "1011")),
    "bslongformer_uni": (BSLongformerSparsityConfig(num_heads=1, block=1, attention="unidirectional"), 4,
                         grid("1000", "1100", "1110", "1011")),
    # global range [1, 3): rows 1-2 see everything, every row sees columns 1-2
    "bslongformer_range": (BSLongformerSparsityConfig(num_heads=1, block=1, global_block_indices=[1],
                                                      global_block_end_indices=[3]), 5,
                           grid("11100", "11111", "11111", "01111", "01111")),
    # windows [0] [1,2] then the last size repeats: [3,4] [5]; global column 0
    "variable_uni": (VariableSparsityConfig(num_heads=1, block=1, local_window_blocks=[1, 2], attention="unidirectional"),
                     6, grid("100000", "110000", "111000", "100100", "100110", "100001")),
    "variable_horizontal": (VariableSparsityConfig(num_heads=1, block=1, local_window_blocks=[2], global_block_indices=[2],
                                                   horizontal_global_attention=True), 4,
                            grid("1110", "1110", "1111", "0011")),
    "sliding_uni": (LocalSlidingWindowSparsityConfig(num_heads=1, block=1), 4, grid("1000", "1100", "0110", "0011")),
    "sliding_bidir": (LocalSlidingWindowSparsityConfig(num_heads=1, block=1, attention="bidirectional"), 4,
                      grid("1100", "1110", "0111", "0011")),
    "sliding_5": (LocalSlidingWindowSparsityConfig(num_heads=1, block=1, num_sliding_window_blocks=5), 5,
                  grid("10000", "11000", "11100", "01110", "00111")),
    "dense": (DenseSparsityConfig(num_heads=1, block=1), 3, grid("111", "111", "111")),
}


@pytest.mark.parametrize("case", sorted(LAYOUT_CASES))
def test_layout_matches_definition(case):
    cfg, seq_len, expected = LAYOUT_CASES[case]
    layout = cfg.make_layout(seq_len)
    assert layout.dtype == torch.bool and layout.shape == (cfg.num_heads, seq_len, seq_len)
    for h in range(cfg.num_heads):  # one layout for all heads unless different_layout_per_head
        assert torch.equal(layout[h], expected), f"head {h}:\n{layout[h].int()}\nexpected\n{expected.int()}"


def test_fixed_different_global_patterns_per_head():
    layout = FixedSparsityConfig(num_heads=3, block=1, different_layout_per_head=True, num_local_blocks=2,
                                 attention="unidirectional", num_different_global_patterns=2).make_layout(4)
    assert torch.equal(layout[0], grid("1000", "1100", "0110", "0111"))  # globals: last block of each window
    assert torch.equal(layout[1], grid("1000", "1100", "1010", "1011"))  # shifted one left: first block
    assert torch.equal(layout[2], layout[0])  # h % num_different_global_patterns


@pytest.mark.parametrize("attention", ["unidirectional", "bidirectional"])
def test_bigbird_random_blocks(attention):
    base = BigBirdSparsityConfig(num_heads=2, block=1, num_random_blocks=0, attention=attention).make_layout(32)
    cfg = BigBirdSparsityConfig(num_heads=2, block=1, num_random_blocks=2, attention=attention,
                                different_layout_per_head=True, seed=7)
    layout = cfg.make_layout(32)
    extra = layout & ~base
    assert (base & ~layout).sum() == 0  # random blocks only add
    assert int(extra.sum(-1).max()) <= 2 and int(extra.sum()) > 0
    if attention == "unidirectional":
        assert torch.equal(layout, torch.tril(layout))
    assert not torch.equal(layout[0], layout[1])  # per-head random draws
    assert torch.equal(layout, cfg.make_layout(32))  # seeded: every rank and every resume agree
    other = BigBirdSparsityConfig(num_heads=2, block=1, num_random_blocks=2, attention=attention,
                                  different_layout_per_head=True, seed=8).make_layout(32)
    assert not torch.equal(layout, other)


def test_variable_random_blocks_count_per_row():
    plain = VariableSparsityConfig(num_heads=1, block=1).make_layout(16)
    layout = VariableSparsityConfig(num_heads=1, block=1, num_random_blocks=3, seed=1).make_layout(16)
    assert (plain & ~layout).sum() == 0 and int((layout & ~plain).sum(-1).max()) <= 3


def test_expand_layout_is_the_block_kronecker_product_and_causal():
    layout = grid("10", "11")[None]
    mask = expand_layout(layout, 2, causal=False)[0]
    assert torch.equal(mask, torch.kron(layout[0].int(), torch.ones(2, 2, dtype=torch.int)).bool())
    causal = expand_layout(layout, 2, causal=True)[0]
    assert torch.equal(causal, grid("1000", "1100", "1110", "1111"))


@pytest.mark.parametrize("make, message", [
    (lambda: DenseSparsityConfig(num_heads=2, block=16).make_layout(40), "multiple of sparse_attention.block=16"),
    (lambda: FixedSparsityConfig(num_heads=2, num_local_blocks=4, num_global_blocks=3), "divisible by"),
    (lambda: FixedSparsityConfig(num_heads=2, num_different_global_patterns=2), "different_layout_per_head=true"),
    (lambda: FixedSparsityConfig(num_heads=2, attention="unidirectional", horizontal_global_attention=True),
     "needs sparse_attention.attention=bidirectional"),
    (lambda: FixedSparsityConfig(num_heads=2, attention="causal"), "choose one of: unidirectional, bidirectional"),
    (lambda: VariableSparsityConfig(num_heads=2, global_block_indices=[0, 4], global_block_end_indices=[2]),
     "global_block_end_indices has 1 entries"),
    (lambda: BSLongformerSparsityConfig(num_heads=2, global_block_indices=[3], global_block_end_indices=[3]),
     "start 3 must be < end 3"),
    (lambda: BigBirdSparsityConfig(num_heads=2, block=16, num_sliding_window_blocks=5).make_layout(64),
     "num_sliding_window_blocks=5 exceeds the 4 blocks"),
])
def test_layout_errors_name_the_key(make, message):
    with pytest.raises(ValueError, match=message):
        make()


# --------------------------------------------------------------------------------------------------
# Dense layout == dense causal attention; the model hook
# --------------------------------------------------------------------------------------------------


def _qkv(B=2, H=4, Hkv=2, T=64, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, T, D, generator=g), torch.randn(B, Hkv, T, D, generator=g),
            torch.randn(B, Hkv, T, D, generator=g))


def _sdpa_causal(q, k, v):
    group = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                          is_causal=True)


@pytest.mark.parametrize("impl", ["gathered", "reference", "triton"])
@pytest.mark.parametrize("T", [64, 57])  # 57: not a multiple of the block, right-padded inside
def test_dense_layout_equals_dense_causal_attention(impl, T):
    fn = BlockSparseAttention(DenseSparsityConfig(num_heads=4, block=16), impl=impl)
    q, k, v = (t.requires_grad_() for t in _qkv(T=T))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # impl=triton on CPU without the interpreter falls back
        out = fn(q, k, v)
    ref = _sdpa_causal(q, k, v)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=ATOL)
    do = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), do), torch.autograd.grad(ref, (q, k, v), do)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=5e-5)


def test_sparse_layout_in_model_differs_from_dense_and_matches_reference_impl():
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=4, d_model=64, max_seq_len=128, vocab_size=97)
    model = GPT(cfg).eval()
    ids = torch.randint(0, 97, (2, 128))
    dense_logits = model(ids).logits
    sa = SparseAttentionConfig(mode="sliding_window", block=16, num_sliding_window_blocks=3)
    assert apply_sparse_attention(model, sa, cfg.n_head) == 2
    sparse_logits = model(ids).logits
    assert not torch.allclose(sparse_logits, dense_logits, atol=1e-3)  # the layout really restricts attention
    torch.testing.assert_close(sparse_logits[:, :32], dense_logits[:, :32], rtol=1e-4, atol=ATOL)  # window covers 2 blocks
    apply_sparse_attention(model, SparseAttentionConfig(**{**sa.__dict__, "impl": "reference"}), cfg.n_head)
    torch.testing.assert_close(model(ids).logits, sparse_logits, rtol=1e-4, atol=ATOL)
    assert set(model.state_dict()) == set(GPT(cfg).state_dict())  # no new state: checkpoints interchange


def test_dense_mode_model_equals_plain_model():
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=4, n_kv_head=2, style="llama", d_model=64, max_seq_len=64, vocab_size=97)
    model = GPT(cfg).eval()
    ids = torch.randint(0, 97, (2, 64))
    ref = model(ids, labels=ids).loss
    apply_sparse_attention(model, SparseAttentionConfig(mode="dense", block=16), cfg.n_head)
    torch.testing.assert_close(model(ids, labels=ids).loss, ref, rtol=1e-5, atol=ATOL)


def test_fewer_heads_than_layout_broadcasts_shared_layouts_only():
    q, k, v = _qkv(H=2, Hkv=2)  # e.g. a tensor/sequence-parallel rank holding 2 of 4 heads
    shared = BlockSparseAttention(build_sparsity_config(SparseAttentionConfig(mode="bslongformer"), 4))
    full = BlockSparseAttention(build_sparsity_config(SparseAttentionConfig(mode="bslongformer"), 2))
    torch.testing.assert_close(shared(q, k, v), full(q, k, v))
    per_head = BlockSparseAttention(build_sparsity_config(
        SparseAttentionConfig(mode="bigbird", num_random_blocks=1, different_layout_per_head=True), 4))
    q, k, v = _qkv(H=2, Hkv=2, T=256)  # 16 blocks: the heads' random blocks differ
    with pytest.raises(ValueError, match="different_layout_per_head=true needs all 4 heads"):
        per_head(q, k, v)


# --------------------------------------------------------------------------------------------------
# Short sequences (generation): the corner of the master layout, as DeepSpeed's get_layout
# --------------------------------------------------------------------------------------------------

# Every layout of the group, with keys that make the short-prompt case bite: BigBird's window of 3
# blocks (plus random blocks), a Longformer window of 5, random blocks in `variable` (which draws from
# the whole row, so a layout built per length would change with the length).
SHORT_CASES = {
    "dense": {},
    "fixed": {},
    "variable": {"num_random_blocks": 2},
    "bigbird": {"num_random_blocks": 1, "num_sliding_window_blocks": 3, "num_global_blocks": 1},
    "bslongformer": {"num_sliding_window_blocks": 5},
    "sliding_window": {"num_sliding_window_blocks": 3},
}


def _sparse_gpt(mode: str, **keys) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=2, d_model=32, max_seq_len=128, vocab_size=61)
    model = GPT(cfg).eval()
    apply_sparse_attention(model, SparseAttentionConfig(mode=mode, block=8, **keys), cfg.n_head)
    return model


@pytest.mark.parametrize("mode", sorted(SHORT_CASES))
def test_every_length_uses_the_corner_of_the_context_layout(mode):
    model = _sparse_gpt(mode, **SHORT_CASES[mode])
    fn = model.blocks[0].attn.attention_fn
    master = fn.layout_config.make_layout(128)
    for T in (8, 16, 24, 64, 128):
        assert torch.equal(fn.block_layout(T), master[:, :T // 8, :T // 8]), T
    ids = torch.randint(0, 61, (1, 128), generator=torch.Generator().manual_seed(1))
    full = model(ids).logits
    for T in (1, 5, 8, 20, 40):  # below the layout's minimum, partial blocks, several blocks
        torch.testing.assert_close(model(ids[:, :T]).logits, full[:, :T], rtol=1e-4, atol=ATOL)


@pytest.mark.parametrize("mode", sorted(SHORT_CASES))
def test_sampling_with_every_sparse_layout_from_a_short_prompt(mode):
    """The end-of-run sample (Trainer.sample_text -> sample_tokens) from a one-token prompt."""
    from dsrecipes.models.sampling import sample_tokens

    model = _sparse_gpt(mode, **SHORT_CASES[mode])
    new = sample_tokens(model, [3], max_new_tokens=20, max_seq_len=16, temperature=0.8, top_k=10, seed=0)
    assert len(new) == 20 and all(0 <= i < 61 for i in new)
    greedy = sample_tokens(model, [3, 7], max_new_tokens=6, max_seq_len=128, temperature=0)
    ids = torch.tensor([[3, 7, *greedy]])
    assert greedy == model(ids).logits[0, 1:-1].argmax(-1).tolist()  # each step saw the full-length layout's rows


def test_without_a_context_short_sequences_use_the_layouts_minimum_length():
    layout_cfg = BigBirdSparsityConfig(num_heads=2, block=4, num_random_blocks=1, attention="unidirectional")
    fn = BlockSparseAttention(layout_cfg, impl="gathered")  # a plain module: no model context known
    assert torch.equal(fn.block_layout(4), layout_cfg.make_layout(12)[:, :1, :1])  # window 3 needs 3 blocks
    assert torch.equal(fn.block_layout(40), layout_cfg.make_layout(40))
    q, k, v = _qkv(H=2, Hkv=2, T=5, D=8)
    ref = BlockSparseAttention(layout_cfg, impl="reference")
    torch.testing.assert_close(fn(q, k, v), ref(q, k, v), rtol=1e-4, atol=ATOL)
    torch.testing.assert_close(fn(q, k, v), _sdpa_causal(q, k, v), rtol=1e-4, atol=ATOL)  # 2 blocks: all attended


# --------------------------------------------------------------------------------------------------
# Config group, validation, training through the Trainer
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides, message", [
    (["sparse_attention=bigbird", "model.max_seq_len=72"], "data.block_size=72 must be a multiple of sparse_attention.block=16"),
    (["sparse_attention=fixed", "sparse_attention.num_global_blocks=3"], "sparse_attention.num_local_blocks=4 must be divisible"),
    (["sparse_attention=bigbird", "sparse_attention.num_sliding_window_blocks=9"], "num_sliding_window_blocks=9 exceeds"),
    (["sparse_attention=variable", "sparse_attention.global_block_indices=[0,99]"],
     r"sparse_attention.global_block_indices=\[0, 99\]: \[99\] start past the \d+ blocks of a sequence"),
])
def test_recipe_validation_names_the_keys(overrides, message):
    with pytest.raises(ValueError, match=message):
        validate_recipe(compose(["model=gpt_debug", *overrides]), dp_world_size=1)


@pytest.mark.parametrize("override, message", [
    ("sparse_attention.mode=bogus", "Invalid value 'bogus', expected one of [none, dense, fixed, variable, bigbird"),
    ("sparse_attention.impl=cuda", "Invalid value 'cuda', expected one of [auto, triton, gathered, reference]"),
    ("sparse_attention.attention=causal", "Invalid value 'causal', expected one of [unidirectional, bidirectional]"),
])
def test_bad_choices_fail_at_composition_naming_the_key(override, message):
    with pytest.raises(ConfigCompositionException) as err:
        compose(["model=gpt_debug", "sparse_attention=fixed", override])
    assert message in str(err.value.__cause__)
    assert f"full_key: {override.split('=')[0]}" in str(err.value.__cause__)
    key, value = override.split("=")
    with pytest.raises(ValueError, match=f"{key}='{value}' is not valid"):  # a Python user's plain string
        validate_sparse_attention_config(SparseAttentionConfig(**{"mode": "fixed", key.split(".")[1]: value}), 2, 64)


def test_keys_the_mode_ignores_warn():
    with pytest.warns(UserWarning, match="sparse_attention.num_local_blocks"):
        validate_recipe(compose(["model=gpt_debug", "sparse_attention=bigbird", "sparse_attention.num_local_blocks=8"]),
                        dp_world_size=1)


def test_experiment_composes_with_a_long_sequence():
    root, _ = validate_recipe(compose(["+experiment=gpt_sparse_long"]), dp_world_size=1)
    assert root.sparse_attention.mode == "bigbird" and root.data.block_size >= 1024


def test_training_with_sparse_layout_through_trainer(tmp_path, fast_overrides):
    from dsrecipes.models.layers import CausalSelfAttention
    from dsrecipes.training.trainer import Trainer

    overrides = fast_overrides + ["sparse_attention=bigbird", "sparse_attention.block=16", "trainer.max_steps=12",
                                  "trainer.eval_interval=12", "trainer.eval_batches=1", "trainer.sample_tokens=8"]
    root, batch = validate_recipe(compose(overrides), dp_world_size=1)
    trainer = Trainer(root, tmp_path / "run", batch, overrides=overrides)
    summary = trainer.fit()
    attn = [m for m in trainer.gpt.modules() if isinstance(m, CausalSelfAttention)]
    assert attn and all(isinstance(m.attention_fn, BlockSparseAttention) for m in attn)
    m = summary["metrics"]
    assert m["train/loss"] < m["train/first_loss"] - 0.5, m
    assert summary["sample"].startswith(root.trainer.sample_prompt)  # a 4-token prompt: 1 block of a 3-block window

    # mode=generate from the export and from the checkpoint: the KV-cache decoder attends densely, and says so
    from dsrecipes.inference_cli import run_inference_mode

    printed: list[str] = []
    for source in (tmp_path / "run" / "export", tmp_path / "run" / "checkpoints"):
        gen = ["mode=generate", f"generate.checkpoint={source}", "generate.prompt=def f", "generate.max_new_tokens=4"]
        printed.clear()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("builtins.print", lambda *a, **k: printed.append(" ".join(map(str, a))))
            out = run_inference_mode(compose(gen), str(tmp_path / "gen"), gen)
        assert out["generations"][0]["prompt"] == "def f"
        assert any("trained with sparse_attention.mode=bigbird; generation attends densely" in p for p in printed), printed


def test_benchmark_memory_grows_linearly_for_sparse_and_quadratically_for_masked(tmp_path):
    """The benchmark's CPU memory measure (bytes saved for backward) is deterministic: check its growth."""
    from dsrecipes.benchmarks.sparse_attention import main

    rows = main(["--seq-lens", "128", "256", "--repeats", "1", "--heads", "2", "--dim", "16", "--with-masked",
                 "--out", str(tmp_path)])
    assert (tmp_path / "sparse_attention.csv").exists() and len(rows) == 2
    assert (tmp_path / "sparse_attention.md").read_text().count("\n| ") == len(rows) + 1  # the table: header + rows
    sparse = rows[1]["sparse_mem_mib"] / rows[0]["sparse_mem_mib"]
    masked = rows[1]["masked_mem_mib"] / rows[0]["masked_mem_mib"]
    assert 1.8 <= sparse <= 2.2 and masked >= 3.5, (sparse, masked)
