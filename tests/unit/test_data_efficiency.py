"""dsrecipes.data_efficiency as a library: pacing formulas, random-LTD layers, sampler, analyzer, config errors."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from datasets import Dataset

from dsrecipes.data_efficiency import (
    CurriculumConfig,
    CurriculumLearningConfig,
    CurriculumSampler,
    CurriculumScheduler,
    DataEfficiencyConfig,
    RandomLTD,
    RandomLTDConfig,
    RandomLTDScheduler,
    SeqlenCurriculum,
    build_curriculum_scheduler,
    layer_token_equivalent_step,
    validate_data_efficiency_config,
)
from dsrecipes.models import GPT
from dsrecipes.models.config import ModelConfig
from dsrecipes.models.layers import Block, apply_rope, rope_tables

# --------------------------------------------------------------------------- pacing functions vs formulas


def _formula_root(s, T, lo, hi, step, degree):
    """DeepSpeed's fixed_root written out independently (lower bound: ceil(min / step) * step)."""
    d = math.floor((s / T) ** (1.0 / degree) * (hi - lo) + lo)
    d -= d % step
    return min(max(d, -(-lo // step) * step), hi)


@pytest.mark.parametrize("lo, hi, T, step, degree", [(8, 1024, 100, 8, 1), (16, 512, 37, 16, 1), (8, 256, 50, 8, 2),
                                                     (32, 2048, 1000, 64, 3), (1, 100, 10, 1, 1.5)])
def test_fixed_linear_and_root_match_formula_at_every_step(lo, hi, T, step, degree):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kind = "fixed_linear" if degree == 1 else "fixed_root"
        sched = CurriculumScheduler(CurriculumConfig(min_difficulty=lo, max_difficulty=hi, schedule_type=kind,
                                                     total_curriculum_step=T, difficulty_step=step,
                                                     root_degree=degree if kind == "fixed_root" else None))
    for s in range(0, 2 * T + 3):
        assert sched.get_difficulty(s) == _formula_root(s, T, lo, hi, step, degree), s


def test_fixed_discrete_and_custom_target_from_group_config():
    cfg = CurriculumLearningConfig(enabled=True, min_difficulty=2, max_difficulty=9, schedule_type="fixed_discrete",
                                   difficulty=[2, 5, 9], max_step=[3, 7])
    sched = build_curriculum_scheduler(cfg)
    assert [sched.get_difficulty(s) for s in range(10)] == [2, 2, 2, 2, 5, 5, 5, 5, 9, 9]
    # custom by _target_, extra keys bound as keyword arguments: pow(step, exp=2)
    cfg = CurriculumLearningConfig(enabled=True, min_difficulty=0, max_difficulty=100, schedule_type="custom",
                                   custom_fn={"_target_": "builtins.pow", "exp": 2})
    assert [build_curriculum_scheduler(cfg).get_difficulty(s) for s in (0, 3, 7)] == [0, 9, 49]
    cfg.custom_fn = {"_target_": "math.isqrt"}
    assert [build_curriculum_scheduler(cfg).get_difficulty(s) for s in (0, 15, 16)] == [0, 3, 4]
    cfg.custom_fn = "math:isqrt"
    assert build_curriculum_scheduler(cfg).get_difficulty(99) == 9


def test_random_ltd_schedule_matches_deepspeed_formula():
    sched = RandomLTDScheduler(min_value=32, max_value=128, require_steps=100, seq_per_step=16)
    for s in range(0, 250):
        expected = min(128, math.floor(s / 100 * (128 - 32) + 32) // 16 * 16)
        assert sched.get_value(s) == expected, s
    state = sched.state_dict()
    sched.update(150)
    other = RandomLTDScheduler(min_value=32, max_value=128, require_steps=100, seq_per_step=16)
    other.load_state_dict(sched.state_dict())
    assert other.current == 128 and state["current_difficulty"] == 32


def test_layer_token_equivalent_step():
    # 2 sequences x 8 tokens x 4 layers = 64 layer-tokens per full step
    assert layer_token_equivalent_step(63, 64) == 0 and layer_token_equivalent_step(64 * 5 + 1, 64) == 5
    with pytest.raises(ValueError, match="full_layer_tokens_per_step"):
        layer_token_equivalent_step(1, 0)


# --------------------------------------------------------------------------- random-LTD layers


def _gpt(style="gpt2", n_layer=4, seed=0):
    torch.manual_seed(seed)
    return GPT(ModelConfig(style=style, n_layer=n_layer, n_head=4, d_model=32, max_seq_len=32, vocab_size=64,
                           bias=style == "gpt2"))


def _ltd(model, kept=None, layer_ids=None):
    ltd = RandomLTD(model, layer_ids, RandomLTDScheduler(min_value=kept or 32, max_value=32, require_steps=10,
                                                         seq_per_step=1))
    ltd.update(0)
    return ltd


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_random_ltd_full_length_is_bit_identical(style):
    plain, dropped = _gpt(style), _gpt(style)
    ltd = _ltd(dropped, kept=32)
    ids = torch.randint(0, 64, (3, 32))
    assert ltd.kept_length == 32
    out_plain = plain(ids, labels=ids)
    out_ltd = dropped(ids, labels=ids)
    assert torch.equal(out_plain.logits, out_ltd.logits) and torch.equal(out_plain.loss, out_ltd.loss)
    # The gather/scatter path itself with every token kept is bit-identical to the plain layer too.
    block = plain.blocks[1]
    x = torch.randn(3, 32, 32)
    rope = (plain.rope_cos, plain.rope_sin) if style == "llama" else None
    idx = torch.arange(32).expand(3, 32)
    assert torch.equal(ltd.dropped_forward(1, block.forward, x, rope, kept=32, indices=idx), block(x, rope))


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_random_ltd_shorter_length_shapes_untouched_tokens_and_gradients(style):
    model = _gpt(style)
    ltd = _ltd(model, kept=12)
    assert ltd.layer_ids == [1, 2]
    block = model.blocks[1]
    x = torch.randn(3, 32, 32, requires_grad=True)
    rope = (model.rope_cos, model.rope_sin) if style == "llama" else None
    y = block(x, rope)
    assert y.shape == x.shape
    idx = ltd.last_indices[1]
    assert idx.shape == (3, 12)
    assert bool((idx[:, 1:] > idx[:, :-1]).all()), "kept indices must be sorted (causal order)"
    if style == "gpt2":
        assert not all(torch.equal(idx[0], idx[r]) for r in range(1, 3)), "rows draw their own subsets"
    else:
        assert all(torch.equal(idx[0], idx[r]) for r in range(1, 3)), "rotary: one subset shared by the rows"
    dropped = torch.ones(3, 32, dtype=torch.bool)
    dropped.scatter_(1, idx, False)
    assert torch.equal(y[dropped], x[dropped]), "tokens not kept must bypass the layer unchanged"
    assert not torch.allclose(y[~dropped], x[~dropped])
    y.square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in block.parameters())
    assert torch.equal(x.grad[dropped], 2 * x[dropped].detach()), "bypassed tokens: identity gradient"
    # a whole model: first and last layers untouched, gradients reach every parameter
    ids = torch.randint(0, 64, (3, 32))
    model.zero_grad()
    model(ids, labels=ids).loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    # eval mode runs every token through every layer
    model.eval()
    ref = _gpt(style)
    ref.eval()
    assert torch.equal(model(ids).logits, ref(ids).logits)


def _reference_llama_block(block, x, idx, cos, sin):
    """The block over tokens idx (one sorted index row), computed from full-sequence projections:
    q/k rotated at their original positions, causal attention among the kept tokens, residual, MLP."""
    attn = block.attn
    bsz, seq, _ = x.shape
    h = block.attn_norm(x)
    q = attn.q_proj(h).view(bsz, seq, attn.n_head, attn.head_dim).transpose(1, 2)
    k, v = attn.kv_proj(h).view(bsz, seq, attn.n_kv_head, 2, attn.head_dim).unbind(3)
    k, v = k.transpose(1, 2), v.transpose(1, 2)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # every position rotated by its own angle
    q, k, v = q[:, :, idx], k[:, :, idx], v[:, :, idx]
    rep = attn.n_head // attn.n_kv_head
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    xk = x[:, idx] + attn.out_proj(y.transpose(1, 2).reshape(bsz, len(idx), -1))
    return xk + block.mlp(block.mlp_norm(xk))


def test_random_ltd_rotary_uses_original_positions_and_causal_order():
    cfg = ModelConfig(style="llama", n_layer=4, n_head=4, n_kv_head=2, d_model=32, max_seq_len=32, vocab_size=64,
                      bias=False)
    torch.manual_seed(0)
    block = Block(cfg)
    model = torch.nn.Module()
    model.blocks = torch.nn.ModuleList([Block(cfg), block, Block(cfg), Block(cfg)])
    ltd = _ltd(model, kept=10)
    cos, sin = rope_tables(cfg.head_dim, 32, cfg.rope_theta)
    x = torch.randn(2, 32, 32)
    y = block(x, (cos, sin))
    idx = ltd.last_indices[1][0]
    expected = _reference_llama_block(block, x, idx, cos, sin)
    torch.testing.assert_close(y[:, idx], expected, rtol=1e-5, atol=1e-5)
    # Rotating the kept tokens as if they sat at positions 0..9 would give something else.
    wrong = ltd.dropped_forward(1, block.forward, x, (cos[idx], sin[idx]), kept=10,
                                indices=torch.arange(10).expand(2, 10))
    assert not torch.allclose(wrong[:, :10], expected, atol=1e-3)


def test_random_ltd_draws_are_resumable_and_accounting():
    a, b = _gpt(), _gpt()
    la, lb = _ltd(a, kept=8), _ltd(b, kept=8)
    ids = torch.randint(0, 64, (2, 32))
    a(ids)
    lb.load_state_dict(la.state_dict())
    torch.testing.assert_close(a(ids).logits, b(ids).logits, rtol=0, atol=0)
    assert torch.equal(la.last_indices[1], lb.last_indices[1])
    la.reseed(1)  # another process's stream: other subsets (8 of 32 tokens: a repeat is ~1e-7 likely)
    a(ids)
    b(ids)
    assert not torch.equal(la.last_indices[1], lb.last_indices[1])
    # consumed layer-tokens: batch * (kept * n_ltd + seq * (n - n_ltd)) (DeepSpeed's formula)
    assert la.layer_tokens(16, 32) == 16 * (8 * 2 + 32 * 2)
    assert la.layer_tokens(16, 6) == 16 * 6 * 4  # sequences shorter than the kept length: nothing dropped
    la.account(16, 32)
    assert la.consumed_layer_tokens == 16 * 80 and la.consumed_tokens == 16 * 32


@pytest.mark.parametrize("ids, needle", [([0, 1], "layer 0 is the first or last"), ([4], "outside the model's 4 layers"),
                                         ([-1], "outside"), ([], r"=\[\]"), ([1, 1], "duplicate")])
def test_random_ltd_bad_layer_ids_name_the_key(ids, needle):
    with pytest.raises(ValueError, match="random_ltd_layer_id") as err:
        _ltd(_gpt(), layer_ids=ids)
    assert err.match(needle)


def test_random_ltd_needs_middle_layers():
    with pytest.raises(ValueError, match="random_ltd_layer_id=null.*only 2 layer"):
        _ltd(_gpt(n_layer=2))


# --------------------------------------------------------------------------- seqlen pack mode


def test_seqlen_pack_mode_keeps_tokens_and_label_alignment():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sched = CurriculumScheduler(CurriculumConfig(min_difficulty=5, max_difficulty=16, schedule_type="fixed_discrete",
                                                     difficulty=[5, 16], max_step=[3]))
    hook = SeqlenCurriculum(sched, mode="pack")
    ids = torch.arange(32).reshape(2, 16)
    out = hook({"input_ids": ids, "labels": ids + 1}, 0)
    assert out["input_ids"].shape == (6, 5)  # 16 // 5 = 3 chunks per row
    assert torch.equal(out["input_ids"][1], torch.arange(5, 10)) and torch.equal(out["input_ids"][3], torch.arange(16, 21))
    assert torch.equal(out["labels"], out["input_ids"] + 1)
    assert hook.metrics() == {"data/difficulty": 5, "data/kept_tokens": 30, "data/tokens_saved": 2}
    assert hook({"input_ids": ids, "labels": ids}, 4)["input_ids"].shape == (2, 16)


# --------------------------------------------------------------------------- sampler


def _blocks(n=40, t=9, seed=0):
    rng = np.random.default_rng(seed)
    return Dataset.from_dict({"tokens": rng.integers(0, 50, (n, t)).tolist()})


def _metric_sampler(ds, values, rank=0, world=1, difficulty_type="value", lo=3, hi=39, gas=1, micro=4):
    sched = CurriculumScheduler(CurriculumConfig(min_difficulty=lo, max_difficulty=hi, schedule_type="fixed_linear",
                                                 total_curriculum_step=10, difficulty_step=1))
    return CurriculumSampler(ds, values, sched, micro, seed=7, rank=rank, world_size=world,
                             gradient_accumulation_steps=gas, difficulty_type=difficulty_type)


@pytest.mark.filterwarnings("ignore:difficulty_step=1")
def test_sampler_draws_within_bound_and_resumes_exactly():
    ds = _blocks()
    values = np.arange(40)[::-1].copy()  # sample i has metric 39 - i
    tokens = np.asarray(ds["tokens"])
    straight = _metric_sampler(ds, values, gas=2)
    batches = [next(straight) for _ in range(30)]
    for g, batch in enumerate(batches):
        bound = straight.scheduler.get_difficulty(g // 2)
        rows = [int(np.flatnonzero((tokens[:, :-1] == r.numpy()).all(1))[0]) for r in batch["input_ids"]]
        assert all(values[i] <= bound for i in rows), (g, bound, rows)
        assert len(set(rows)) == 4  # distinct within a batch while enough are eligible
    assert straight.difficulty == 39 and straight.eligible == 40

    resumed = _metric_sampler(ds, values, gas=2)
    first = [next(resumed) for _ in range(11)]
    state = resumed.state_dict()
    again = _metric_sampler(ds, values, gas=2)
    again.load_state_dict(state)
    rest = [next(again) for _ in range(19)]
    for a, b in zip(batches, first + rest):
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])

    # two ranks together see exactly the single-process global batch
    single = _metric_sampler(ds, values, micro=4)
    r0, r1 = _metric_sampler(ds, values, rank=0, world=2, micro=2), _metric_sampler(ds, values, rank=1, world=2, micro=2)
    for _ in range(5):
        assert torch.equal(next(single)["input_ids"], torch.cat([next(r0)["input_ids"], next(r1)["input_ids"]]))


@pytest.mark.filterwarnings("ignore:difficulty_step=1")
def test_sampler_percentile_and_errors():
    ds = _blocks()
    values = np.linspace(0.0, 1.0, 40)
    s = _metric_sampler(ds, values, difficulty_type="percentile", lo=10, hi=100)
    assert s.eligible_count(10) == 4 and s.eligible_count(100) == 40 and s.eligible_count(25) == 10
    next(s)
    assert s.metrics()["data/eligible_samples"] == 4
    bad = _metric_sampler(ds, np.arange(40) + 100, lo=3)
    with pytest.raises(ValueError, match="admits no sample"):
        next(bad)
    with pytest.raises(ValueError, match="seed=8"):
        s.load_state_dict({**s.state_dict(), "seed": 8})
    with pytest.raises(ValueError, match="num_samples"):
        s.load_state_dict({**s.state_dict(), "num_samples": 3})
    with pytest.raises(ValueError, match="difficulty_type='rank'"):
        _metric_sampler(ds, values, difficulty_type="rank")
    with pytest.raises(ValueError, match="percentile.*max_difficulty=200"):
        _metric_sampler(ds, values, difficulty_type="percentile", lo=1, hi=200)


# --------------------------------------------------------------------------- config validation


def _de(**kw) -> DataEfficiencyConfig:
    cl = dict(enabled=True, metric="seqlen", min_difficulty=8, max_difficulty=None, schedule_type="fixed_linear",
              total_curriculum_step=10, difficulty_step=8)
    cl.update(kw.pop("cl", {}))
    ltd = dict(enabled=False)
    ltd.update(kw.pop("ltd", {}))
    return DataEfficiencyConfig(curriculum_learning=CurriculumLearningConfig(**cl), random_ltd=RandomLTDConfig(**ltd))


@pytest.mark.parametrize("kw, needle", [
    (dict(cl=dict(min_difficulty=96, max_difficulty=64)),
     r"data_efficiency\.curriculum_learning\.min_difficulty=96 must be <= max_difficulty=64"),
    (dict(cl=dict(min_difficulty=None)), r"data_efficiency\.curriculum_learning\.min_difficulty is missing"),
    (dict(cl=dict(total_curriculum_step=None)), r"data_efficiency\.curriculum_learning\.total_curriculum_step=None: required"),
    (dict(cl=dict(schedule_type="fixed_root")), r"curriculum_learning\.root_degree=None: required"),
    (dict(cl=dict(schedule_type="fixed_discrete")), r"curriculum_learning\.difficulty=None: required"),
    (dict(cl=dict(schedule_type="custom")), r"curriculum_learning\.custom_fn=None: required"),
    (dict(cl=dict(schedule_type="cosine")), r"curriculum_learning\.schedule_type='cosine'.*fixed_linear"),
    (dict(cl=dict(max_difficulty=256)), r"max_difficulty=256 exceeds data\.block_size=64"),
    (dict(cl=dict(metric="perplexity")), r"curriculum_learning\.metric='perplexity'.*vocab_rarity"),
    (dict(cl=dict(seqlen_mode="pad")), r"seqlen_mode='pad'.*truncate, pack"),
    (dict(cl=dict(metric="vocab_rarity", difficulty_type="percentile", min_difficulty=1, max_difficulty=120)),
     r"percentile"),
    (dict(cl=dict(enabled=False), ltd=dict(enabled=True, random_ltd_layer_id=[1, 9])),
     r"data_efficiency\.random_ltd\.random_ltd_layer_id=\[1, 9\].*outside"),
    (dict(cl=dict(enabled=False), ltd=dict(enabled=True, min_value=64, max_value=32)),
     r"data_efficiency\.random_ltd\.min_value=64 must be <= data_efficiency\.random_ltd\.max_value=32"),
    (dict(cl=dict(enabled=False), ltd=dict(enabled=True, require_steps=0)), r"random_ltd\.require_steps=0"),
    (dict(cl=dict(enabled=False), ltd=dict(enabled=True, max_value=128)), r"random_ltd\.max_value=128 exceeds"),
])
def test_config_errors_name_the_key(kw, needle):
    with pytest.raises(ValueError, match=needle):
        validate_data_efficiency_config(_de(**kw), n_layer=4, block_size=64)


def test_config_layer_token_lr_needs_closed_form_schedule():
    cfg = _de(cl=dict(enabled=False), ltd=dict(enabled=True, layer_token_lr_schedule=True))
    validate_data_efficiency_config(cfg, 4, 64)
    with pytest.raises(ValueError, match=r"layer_token_lr_schedule=true.*_target_='torch.optim"):
        validate_data_efficiency_config(cfg, 4, 64, lr_scheduler_target="torch.optim.lr_scheduler.StepLR")


# --------------------------------------------------------------------------- comparison script


def test_comparison_rows_same_budget_and_target():
    from dsrecipes.benchmarks.data_efficiency import compare

    def curve(losses, layer_tokens_per_eval):
        return {"curve": [{"step": 10 * (i + 1), "val_loss": v, "tokens": 100 * (i + 1),
                           "layer_tokens": layer_tokens_per_eval * (i + 1), "train_s": 2.0 * (i + 1)}
                          for i, v in enumerate(losses)]}

    results = {"baseline": curve([3.0, 2.5, 2.2], 400), "random_ltd": curve([2.9, 2.2, 2.0], 300),
               "slow": curve([3.1, 2.9, 2.6], 200)}
    rows, target = compare(results, None)
    assert target == 2.2
    by = {r["variant"]: r for r in rows}
    assert by["baseline"]["steps_to_target"] == 30 and by["baseline"]["layer_tokens_to_target"] == 1200
    assert by["random_ltd"]["steps_to_target"] == 20 and by["random_ltd"]["layer_tokens_to_target"] == 600
    assert by["random_ltd"]["layer_tokens_to_target_vs_baseline"] == 0.5
    assert by["random_ltd"]["layer_tokens_vs_baseline"] == 0.75
    assert by["slow"]["steps_to_target"] is None and by["slow"]["final_val_loss"] == 2.6
