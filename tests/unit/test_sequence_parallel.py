"""Ulysses sequence parallelism (SP=2, CPU/gloo) reproduces the single process on the full sequence.

Every worker builds the same seeded model and batch, runs the single-process reference on the whole
sequence itself, then the SP=2 copy on its half (all-to-alls around attention, position offset r*T/2)
and compares: its logits with the reference's rows for its chunk, the mean of the two ranks' losses
with the full-sequence loss, and every parameter gradient averaged over the two ranks (as DDP does)
with the reference gradient; then a few AdamW steps under DDP against single-process steps, at
SP=2 (world 2) and at dp 2 x sp 2 (world 4, sp groups {0,1} and {2,3}).

Tolerance (fp32): logits/loss 1e-5 absolute + 1e-5 relative, gradients 1e-5 / 1e-4; the optimizer
run's losses 2e-5 absolute over 6 steps (tests/integration/equivalence/table.py's). The math is the same; only
summation orders differ (attention over a re-assembled sequence, gradients summed across ranks by
the all-to-all backward and by the gradient all-reduce).
"""

from __future__ import annotations

import pytest
import torch

from dsrecipes.distributed.sequence_parallel import (
    apply_sequence_parallel,
    shard_sequence,
    validate_sequence_parallel,
    validate_sequence_parallel_recipe,
)
from dsrecipes.models import GPT
from dsrecipes.models.config import ModelConfig

SEQ = 16
VOCAB = 64

STYLES = {
    "gpt2": dict(style="gpt2", n_head=4),
    "llama_gqa2": dict(style="llama", n_head=4, n_kv_head=2),  # kv heads split over sp
    "llama_mqa": dict(style="llama", n_head=4, n_kv_head=1),  # 1 kv head < sp=2: repeated first
}


def _model(style: str, **extra) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, d_model=64, vocab_size=VOCAB, max_seq_len=32, **STYLES[style], **extra)
    return GPT(cfg)


def _batch(bsz: int = 2, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (bsz, SEQ + 1), generator=g)
    return {"input_ids": ids[:, :-1].contiguous(), "labels": ids[:, 1:].contiguous()}


# ------------------------------------------------------------------ single process


def test_bad_layouts_raise_errors_naming_the_keys():
    with pytest.raises(ValueError, match=r"parallel.sp=3 does not divide model.n_head=4"):
        validate_sequence_parallel(3, n_head=4, n_kv_head=4, block_size=48)
    with pytest.raises(ValueError, match=r"data.block_size=30 is not divisible by parallel.sp=4"):
        validate_sequence_parallel(4, n_head=8, n_kv_head=2, block_size=30)
    with pytest.raises(ValueError, match=r"model.n_kv_head=3 must divide model.n_head=4"):
        validate_sequence_parallel(2, n_head=4, n_kv_head=3, block_size=32)
    with pytest.raises(ValueError, match=r"parallel.sp=0 must be >= 1"):
        validate_sequence_parallel(0, n_head=4)
    validate_sequence_parallel(2, n_head=4, n_kv_head=1, block_size=32)  # MQA: kv heads repeated, fine
    validate_sequence_parallel(1, n_head=3, block_size=7)  # sp=1 constrains nothing
    with pytest.raises(ValueError, match=r"sequence length 15 \(data.block_size\) is not divisible by parallel.sp=2"):
        shard_sequence({"input_ids": torch.zeros(1, 15)}, 0, 2)


def _recipe(sp=2, tp=1, n_head=4, n_kv_head=None, block_size=32, dropout=0.0, random_ltd=False, seqlen_cl=False):
    from types import SimpleNamespace

    from dsrecipes.data_efficiency.config import DataEfficiencyConfig

    de = DataEfficiencyConfig()
    de.random_ltd.enabled = random_ltd
    de.curriculum_learning.enabled = seqlen_cl
    return SimpleNamespace(
        parallel=SimpleNamespace(sp=sp, tp=tp, pp=1),
        model=ModelConfig(n_head=n_head, n_kv_head=n_kv_head, d_model=16 * n_head, dropout=dropout),
        data=SimpleNamespace(block_size=block_size),
        data_efficiency=de,
    )


def test_recipe_validation_names_the_keys():
    validate_sequence_parallel_recipe(_recipe())
    validate_sequence_parallel_recipe(_recipe(sp=1, dropout=0.1, random_ltd=True))  # sp=1: nothing applies
    for kwargs, message in [
        (dict(n_head=6, sp=4), "parallel.sp=4 does not divide model.n_head=6"),
        (dict(block_size=31), "data.block_size=31 is not divisible by parallel.sp=2"),
        (dict(tp=4), "model.n_head=4 is not divisible by parallel.tp=4 x parallel.sp=2"),
        (dict(dropout=0.1), "model.dropout=0.1 with parallel.sp=2"),
    ]:
        with pytest.raises(ValueError) as err:
            validate_sequence_parallel_recipe(_recipe(**kwargs))
        assert message in str(err.value), (kwargs, str(err.value))


def test_shard_sequence_slices_ids_and_labels_and_returns_the_offset():
    batch = _batch()
    batch["doc_ids"] = torch.tensor([7, 8])
    parts = [shard_sequence(batch, r, 4) for r in range(4)]
    assert [offset for _, offset in parts] == [0, 4, 8, 12]
    torch.testing.assert_close(torch.cat([p["input_ids"] for p, _ in parts], 1), batch["input_ids"])
    torch.testing.assert_close(torch.cat([p["labels"] for p, _ in parts], 1), batch["labels"])
    assert all(p["doc_ids"] is batch["doc_ids"] for p, _ in parts)  # other entries pass through


@pytest.mark.parametrize("style", ["gpt2", "llama_gqa2"])
def test_position_offset_shifts_positions_and_defaults_to_unchanged(style):
    """With a token-local attention (output = q + v), a chunk run at offset o equals the full run's rows
    o..: position embeddings / rotary tables are read from the offset. Offset 0 is the old forward."""
    model = _model(style).eval()

    def token_local(q, k, v):  # q carries the rotary position (llama), both the learned one (gpt2)
        return q + v.repeat_interleave(q.shape[1] // v.shape[1], 1)

    for block in model.blocks:
        block.attn.attention_fn = token_local
    ids = _batch()["input_ids"]
    full = model(ids).logits
    torch.testing.assert_close(model(ids[:, 6:], position_offset=6).logits, full[:, 6:], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(model(ids[:, 6:]).logits, full[:, 6:], atol=1e-3)  # positions matter
    torch.testing.assert_close(model(ids, position_offset=0).logits, full, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"exceed model.max_seq_len=32"):
        model(ids, position_offset=20)


def test_install_rejects_attention_dropout():
    """attention_fn has no dropout; silently dropping model.dropout under SP would change the recipe."""

    class OneRankGroup:  # apply_sequence_parallel only asks the group's size
        pass

    model = _model("gpt2", dropout=0.1)
    import unittest.mock as mock

    with mock.patch("torch.distributed.get_world_size", return_value=2):
        with pytest.raises(ValueError, match=r"model.dropout=0.1.*set model.dropout=0"):
            apply_sequence_parallel(model, OneRankGroup())
        with pytest.raises(ValueError, match=r"parallel.sp=2 does not divide model.n_head=3"):
            apply_sequence_parallel(GPT(ModelConfig(n_layer=1, n_head=3, d_model=48, vocab_size=VOCAB)), OneRankGroup())
