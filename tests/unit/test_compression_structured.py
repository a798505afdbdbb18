"""Activation quantization, row / head / channel pruning, DeepSpeed block mapping and bad input."""

import pytest
import torch
from torch import nn

from dsrecipes.compression import (
    ActivationQuantConfig,
    ActivationQuantization,
    ChannelPruningConfig,
    HeadPruningConfig,
    RowPruningConfig,
    StructuredPruner,
    WeightQuantConfig,
    from_deepspeed,
    init_compression,
    library_configs,
)
from dsrecipes.compression.activation_quantization import batch_range, fake_quantize_range
from dsrecipes.compression.config import CompressionConfig
from dsrecipes.kernels.quantization import dequantize_int8_reference, quantize_int8_reference
from dsrecipes.models import GPT, ModelConfig


def tiny_gpt(**kw):
    torch.manual_seed(0)
    return GPT(ModelConfig(**{"n_layer": 2, "n_head": 4, "d_model": 32, "vocab_size": 64, "max_seq_len": 16, **kw}))


# ------------------------------------------------------------------------------------- activations


def test_dynamic_activation_quant_uses_the_kernel_grid_and_ste():
    # activations keep the kernel library's grid (0-inclusive range, 2^bits - 1 symmetric levels), not
    # DeepSpeed's weight grid: at 8 bits, exactly quantize_int8_reference over the whole tensor
    x = torch.randn(4, 8, 16, requires_grad=True)
    flat = x.detach().reshape(1, -1)
    for symmetric in (True, False):
        lo, hi = batch_range(x, symmetric)
        q, s, z = quantize_int8_reference(flat, "symmetric" if symmetric else "asymmetric", "channel")
        assert torch.equal(fake_quantize_range(x, lo, hi, 8, symmetric).detach(),
                           dequantize_int8_reference(q, s, z).reshape(x.shape))
    lo, hi = x.detach().abs().amax().neg(), x.detach().abs().amax()
    y = fake_quantize_range(x, lo, hi, 4, True)
    g = torch.randn_like(x)
    y.backward(g)
    assert torch.equal(x.grad, g)
    # error bound: half a step of max|x| / 7
    assert (y - x).abs().max() <= hi / 7 / 2 + 1e-6


def test_activation_quant_schedule_and_static_calibration():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    aq = ActivationQuantization(model, ActivationQuantConfig(bits=4, range_calibration="static", schedule_offset=2,
                                                             modules=["0"]))
    x = torch.randn(16, 8)
    ref = model(x)
    aq.step(1)
    torch.testing.assert_close(model(x), ref)  # before the offset: untouched
    aq.step(2)
    model.train()
    model(x)  # first batch sets the range
    r0 = aq.ranges["0"].clone()
    torch.testing.assert_close(r0, torch.stack([-x.abs().amax(), x.abs().amax()]))
    model(2 * x)  # EMA with momentum 0.1
    torch.testing.assert_close(aq.ranges["0"], 0.9 * r0 + 0.1 * 2 * r0)
    model.eval()
    r = aq.ranges["0"].clone()
    y = model(3 * x)  # eval: range frozen
    assert torch.equal(aq.ranges["0"], r)
    expect = model[2](model[1](nn.functional.linear(fake_quantize_range(3 * x, r[0], r[1], 4, True),
                                                    model[0].weight, model[0].bias)))
    torch.testing.assert_close(y, expect)


# ------------------------------------------------------------------------------------- row pruning


def test_row_pruning_density_related_columns_and_stays_zero():
    model = tiny_gpt()
    cfg = CompressionConfig()
    cfg.row_pruning.enabled = True
    cfg.row_pruning.schedule_offset = 3
    cfg.row_pruning.dense_ratio = 0.25
    comp = init_compression(model, cfg)
    p = comp.structured[0]
    assert p.module_names == ["blocks.0.mlp.fc_in", "blocks.1.mlp.fc_in"]
    x = torch.randint(0, 64, (2, 16))
    _train_lm(model, comp, 0, 3, x)
    assert (model.blocks[0].mlp.fc_in.weight != 0).all()  # before schedule_offset
    _train_lm(model, comp, 3, 10, x)
    fc_in, fc_out = model.blocks[0].mlp.fc_in, model.blocks[0].mlp.fc_out
    dead = (fc_in.weight == 0).all(1)
    assert int(dead.sum()) == 96  # 128 rows, 25% kept
    assert (fc_in.bias[dead] == 0).all() and (fc_out.weight[:, dead] == 0).all()
    assert (fc_in.weight[~dead] != 0).all()
    # the kept rows had the largest L1 norm at the offset: they are a fixed set through training
    assert p.density()["blocks.0.mlp.fc_in"] == 0.25


def _train_lm(model, comp, start, end, x):
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(start, end):
        comp.step(step)
        loss = model(x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        comp.apply_masks()
        for t, m in comp.mask_pairs():
            assert (t[(m == 0).expand_as(t)] == 0).all()


def test_row_pruning_picks_largest_l1_rows():
    lin, out = nn.Linear(4, 6), nn.Linear(6, 3)
    model = nn.Sequential(lin, out)
    with torch.no_grad():
        lin.weight.copy_(torch.arange(6.0)[:, None].expand(6, 4) - 2.5)  # |rows|: 2.5 1.5 .5 .5 1.5 2.5
    p = StructuredPruner(model, RowPruningConfig(dense_ratio=0.34, schedule_offset=0, modules=["0"],
                                                 related_modules=["1"]))
    p.step(0)
    assert p.groups["0"].keep.tolist() == [True, False, False, False, False, True]


# ------------------------------------------------------------------------------------- head pruning


def test_head_pruning_masks_whole_heads_in_q_kv_and_out():
    model = tiny_gpt()
    p = StructuredPruner(model, HeadPruningConfig(num_heads=4, dense_ratio=0.5, schedule_offset=0, method="l1"))
    assert p.module_names == ["blocks.0.attn.out_proj", "blocks.1.attn.out_proj"]
    p.step(0)
    keep = p.groups["blocks.0.attn.out_proj"].keep
    assert int(keep.sum()) == 2
    attn = model.blocks[0].attn
    d = 8
    for h in range(4):
        cols = attn.out_proj.weight[:, h * d:(h + 1) * d]
        qrows = attn.q_proj.weight[h * d:(h + 1) * d]
        krows = attn.kv_proj.weight[2 * h * d:(2 * h + 1) * d]  # kv_proj rows: [head, k|v, head_dim]
        vrows = attn.kv_proj.weight[(2 * h + 1) * d:(2 * h + 2) * d]
        for t in (cols, qrows, krows, vrows):
            assert bool((t == 0).all()) == (not keep[h])


def test_head_pruning_topk_scores_and_errors():
    model = tiny_gpt()
    p = StructuredPruner(model, HeadPruningConfig(num_heads=4, dense_ratio=0.25, schedule_offset=0))
    p.set_scores("blocks.1.attn.out_proj", torch.tensor([0.0, 0.0, 5.0, 1.0]))
    p.step(0)
    assert p.groups["blocks.1.attn.out_proj"].keep.tolist() == [False, False, True, False]
    with pytest.raises(ValueError, match="num_heads"):
        StructuredPruner(tiny_gpt(), HeadPruningConfig(num_heads=3, schedule_offset=0))
    with pytest.raises(ValueError, match="num_heads"):
        HeadPruningConfig(num_heads=None)
    with pytest.raises(ValueError, match="grouped-query"):
        StructuredPruner(tiny_gpt(n_kv_head=2), HeadPruningConfig(num_heads=4))


# ------------------------------------------------------------------------------------- channel pruning


def conv_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3, padding=1))


def test_channel_pruning_conv_bn_next_conv():
    model = conv_net()
    comp_cfg = ChannelPruningConfig(dense_ratio=0.5, schedule_offset=0, modules=["0"], related_modules=["1", "3"])
    p = StructuredPruner(model, comp_cfg)
    p.step(0)
    keep = p.groups["0"].keep
    assert int(keep.sum()) == 4
    assert ((model[0].weight.flatten(1) == 0).all(1) == ~keep).all()
    assert (model[1].weight[~keep] == 0).all() and (model[3].weight[:, ~keep] == 0).all()
    # the cleaned net drops the channels and computes the same thing (eval-mode BN)
    model.eval()
    from dsrecipes.compression import Compressor

    comp = Compressor(model, channel_pruning=comp_cfg)
    comp.structured[0].groups["0"].keep = keep
    clean = comp.redundancy_clean()
    assert clean[0].out_channels == 4 and clean[1].num_features == 4 and clean[3].in_channels == 4
    x = torch.randn(2, 3, 6, 6)
    torch.testing.assert_close(clean(x), model(x), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------- config mapping and errors


def test_deepspeed_block_maps_onto_group():
    ds = {"compression_training": {
        "weight_quantization": {"shared_parameters": {"enabled": True, "quantizer_kernel": False, "schedule_offset": 10,
                                                      "quantize_groups": 4, "quantization_type": "asymmetric",
                                                      "rounding": "stochastic"},
                                "different_groups": {"wq1": {"params": {"start_bits": 8, "target_bits": 4,
                                                                        "quantization_period": 50},
                                                             "modules": ["attn"]}}},
        "activation_quantization": {"shared_parameters": {"enabled": True, "range_calibration": "static",
                                                          "schedule_offset": 5},
                                    "different_groups": {"aq1": {"params": {"bits": 8}, "modules": ["mlp"]}}},
        "sparse_pruning": {"shared_parameters": {"enabled": True, "method": "topk", "schedule_offset": 30,
                                                 "block_pattern": "2:4"},
                           "different_groups": {"sp1": {"params": {"dense_ratio": 0.5}}}},
        "row_pruning": {"shared_parameters": {"enabled": True, "method": "l1", "schedule_offset": 20},
                        "different_groups": {"rp1": {"params": {"dense_ratio": 0.25}, "modules": ["fc_in"],
                                                     "related_modules": [["fc_out"]]}}},
        "head_pruning": {"shared_parameters": {"enabled": True, "method": "topk", "schedule_offset": 20,
                                               "num_heads": 4},
                         "different_groups": {"hp1": {"params": {"dense_ratio": 0.5}, "modules": ["out_proj"],
                                                      "related_modules": [["q_proj", "kv_proj"]]}}},
        "layer_reduction": {"enabled": True, "keep_number_layer": 1, "module_name_prefix": "blocks",
                            "teacher_layer": [1], "other_module_name": ["tok_emb"]},
    }}
    cfg = from_deepspeed(ds)
    wq = cfg.weight_quantization
    assert wq.enabled and (wq.start_bits, wq.target_bits, wq.quantization_period, wq.schedule_offset) == (8, 4, 50, 10)
    assert wq.quantize_groups == 4 and wq.quantization_type == "asymmetric" and wq.rounding == "stochastic"
    assert wq.modules == ["attn"]
    assert cfg.activation_quantization.range_calibration == "static" and cfg.activation_quantization.bits == 8
    assert cfg.sparse_pruning.block_pattern == "2:4" and cfg.sparse_pruning.method == "topk"
    assert cfg.row_pruning.related_modules == ["fc_out"] and cfg.row_pruning.dense_ratio == 0.25
    assert cfg.head_pruning.num_heads == 4 and cfg.head_pruning.related_modules == ["q_proj", "kv_proj"]
    assert cfg.layer_reduction.teacher_layer == [1] and cfg.layer_reduction.keep_number_layer == 1
    assert not cfg.channel_pruning.enabled
    comp = init_compression(tiny_gpt(), ds)
    assert comp.weight_quant.module_names == ["blocks.0.attn.q_proj", "blocks.0.attn.kv_proj",
                                              "blocks.0.attn.out_proj", "blocks.1.attn.q_proj",
                                              "blocks.1.attn.kv_proj", "blocks.1.attn.out_proj"]
    assert [p.kind for p in comp.structured] == ["row", "head"]
    with pytest.raises(ValueError, match="one group per technique"):
        from_deepspeed({"weight_quantization": {"different_groups": {"a": {}, "b": {}}}})


@pytest.mark.parametrize("section,key,value,match", [
    ("weight_quantization", "target_bits", 16, "compression.weight_quantization.*target_bits"),
    ("sparse_pruning", "dense_ratio", 0.0, "compression.sparse_pruning.*dense_ratio"),
    ("sparse_pruning", "dense_ratio", 1.5, "compression.sparse_pruning.*dense_ratio"),
    ("row_pruning", "dense_ratio", -0.1, "compression.row_pruning.*dense_ratio"),
    ("activation_quantization", "bits", 2, "compression.activation_quantization.*bits"),
    ("activation_quantization", "range_calibration", "minmax", "compression.activation_quantization.*range_calibration"),
])
def test_bad_group_values_name_the_key(section, key, value, match):
    cfg = CompressionConfig()
    getattr(cfg, section).enabled = True
    setattr(getattr(cfg, section), key, value)
    with pytest.raises(ValueError, match=match):
        library_configs(cfg, num_heads=4)


def test_patterns_that_match_nothing_are_errors():
    with pytest.raises(ValueError, match="no nn.Linear matches"):
        init_compression(tiny_gpt(), {"weight_quantization": {"shared_parameters": {"enabled": True},
                                                              "different_groups": {"g": {"modules": ["nothing*"]}}}})
    with pytest.raises(ValueError, match="row_pruning.modules"):
        StructuredPruner(tiny_gpt(), RowPruningConfig(modules=["nothing"]))
    with pytest.raises(ValueError, match="related module"):
        StructuredPruner(tiny_gpt(), RowPruningConfig(modules=["*fc_in"], related_modules=["fc_missing"]))
    with pytest.raises(ValueError, match="target_bits"):
        WeightQuantConfig(start_bits=4, target_bits=8)


# ------------------------------------------------------------------------------------- layer reduction + KD


def test_layer_reduction_copies_chosen_layers_and_kd_loss():
    from dsrecipes.compression import (
        DistillationConfig,
        DistillationLoss,
        LayerReductionConfig,
        init_student_from_teacher,
        kd_kl_loss,
        reduce_layers,
    )

    teacher = GPT(ModelConfig(n_layer=4, n_head=4, d_model=32, vocab_size=64, max_seq_len=16))
    cfg = LayerReductionConfig(keep_number_layer=2, teacher_layer=[1, 3])
    student = init_student_from_teacher(tiny_gpt(), teacher, cfg)
    for i, t in enumerate([1, 3]):
        for (n, a), (_, b) in zip(student.blocks[i].state_dict().items(), teacher.blocks[t].state_dict().items()):
            assert torch.equal(a, b), n
    assert torch.equal(student.tok_emb.weight, teacher.tok_emb.weight)
    inplace = reduce_layers(GPT(teacher.cfg.__class__(**{**teacher.cfg.__dict__})), cfg)
    assert len(inplace.blocks) == 2 and inplace.cfg.n_layer == 2
    with pytest.raises(ValueError, match="teacher_layer"):
        init_student_from_teacher(tiny_gpt(), teacher, LayerReductionConfig(keep_number_layer=2, teacher_layer=[1, 4]))
    with pytest.raises(ValueError, match="teacher_layer"):
        LayerReductionConfig(keep_number_layer=2, teacher_layer=[1])
    # KD: T^2 * KL(teacher || student) at temperature T; 0 for equal logits; gradient only to the student
    s = torch.randn(2, 5, 7, requires_grad=True)
    t = torch.randn(2, 5, 7)
    T = 2.0
    pt, ls = torch.softmax(t / T, -1), torch.log_softmax(s / T, -1)
    expect = (pt * (pt.log() - ls)).sum(-1).mean() * T * T
    got = kd_kl_loss(s, t, T)
    torch.testing.assert_close(got, expect)
    assert kd_kl_loss(t, t, T).abs() < 1e-6
    got.backward()
    assert s.grad is not None and s.grad.abs().sum() > 0
    x = torch.randint(0, 64, (2, 16))
    kd = DistillationLoss(teacher, DistillationConfig(temperature=1.0, hidden_weight=1.0), student=student,
                          layer_map=[1, 3])
    out = student(x, labels=x)
    terms = kd(student, {"input_ids": x, "labels": x}, out)
    assert set(terms) == {"kd_loss", "hidden_loss"}
    # the student starts as the teacher's layers 1, 3 on the teacher's embeddings: its layer-0 output is
    # teacher layer 1 applied to the embeddings, not to teacher layer 0's output, so the loss is > 0
    assert terms["hidden_loss"] > 0 and terms["kd_loss"] > 0
    assert not any(p.requires_grad for p in teacher.parameters())
