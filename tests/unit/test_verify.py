"""dsrecipes.verify without training: the verdict on synthetic series, the tensor groups, the verify.* keys, and the
two runs' overrides it plans (the reference's batch, the aligned random draws, the tolerance, shrink, refusals)."""

from __future__ import annotations

import math

import pytest
import torch

from dsrecipes.config.preflight import check_train_job
from dsrecipes.config.store import compose
from dsrecipes.verify.compare import compare_params, compare_steps, group_of, verdict
from dsrecipes.verify.config import COMPILED, FP32, SIXTEEN_BIT, VerifyConfig, parse_arguments
from dsrecipes.verify.plan import INJECT_ENV, build_plan


def series(losses, lrs=None):
    lrs = lrs or [1e-3] * len(losses)
    return {i + 1: {"loss": loss, "grad_norm": 1.0, "lr": lr, "loss_scale": 1.0}
            for i, (loss, lr) in enumerate(zip(losses, lrs))}


def params(**shift):
    base = {"tok_emb.weight": torch.zeros(4, 2), "blocks.0.attn.q_proj.weight": torch.zeros(2, 2),
            "blocks.0.mlp.fc_in.weight": torch.zeros(2, 2), "blocks.0.attn_norm.weight": torch.ones(2),
            "blocks.0.mlp.experts.w_in": torch.zeros(2, 2, 2), "lm_head.weight": torch.zeros(4, 2)}
    for name, value in shift.items():
        base[name.replace("__", ".")] = base[name.replace("__", ".")] + value
    return base


def test_equal_runs_are_equivalent_within_the_fp32_tolerance():
    steps = compare_steps(series([5.0, 4.9, 4.8]), series([5.0, 4.9 + 1e-5, 4.8]), FP32)
    result = verdict(steps, compare_params(params(), params(lm_head__weight=4e-5), FP32), FP32, 3)
    assert result.equivalent and result.first_step is None and result.message.startswith("EQUIVALENT")


def test_the_first_differing_step_and_the_worst_group_are_named():
    steps = compare_steps(series([5.0, 4.9, 4.8, 4.7]), series([5.0, 4.9, 4.81, 4.6]), FP32)
    groups = compare_params(params(blocks__0__mlp__fc_in__weight=1e-3, blocks__0__attn__q_proj__weight=1e-4),
                            params(), FP32)
    result = verdict(steps, groups, FP32, 4)
    assert not result.equivalent and result.first_step == 3 and result.first_group == "mlp"
    assert "first differing step 3" in result.message and "tensor group 'mlp'" in result.message
    assert "also over tolerance: attention" in result.message
    assert {g.group: g.ok for g in groups} == {"embeddings": True, "attention": False, "mlp": False,
                                               "experts": True, "norms": True, "lm_head": True}


def test_an_lr_difference_a_missing_step_a_nan_or_a_missing_tensor_differs():
    assert not compare_steps(series([5.0, 5.0]), series([5.0, 5.0], [1e-3, 2e-3]), FP32)[1].ok
    rows = compare_steps(series([5.0, 5.0]), series([5.0]), FP32)
    assert "missing in the reference" in rows[1].why
    assert not verdict(rows, compare_params(params(), params(), FP32), FP32, 2).equivalent
    assert not compare_steps(series([float("nan")]), series([5.0]), FP32)[0].ok
    candidate = params()
    del candidate["lm_head.weight"]
    (head,) = [g for g in compare_params(candidate, params(), FP32) if g.group == "lm_head"]
    assert math.isinf(head.max_diff) and not head.ok
    # losses equal but parameters not: the message still names the group
    result = verdict(compare_steps(series([5.0]), series([5.0]), FP32),
                     compare_params(params(blocks__0__attn_norm__weight=1.0), params(), FP32), FP32, 1)
    assert "every step's loss within tolerance" in result.message and result.first_group == "norms"


@pytest.mark.parametrize("name, group", [
    ("pos_emb.weight", "embeddings"), ("blocks.3.attn.kv_proj.bias", "attention"), ("blocks.1.mlp.fc_out.weight", "mlp"),
    ("blocks.1.mlp.gate.weight", "experts"), ("blocks.0.mlp_norm.weight", "norms"), ("norm.weight", "norms"),
    ("lm_head.weight", "lm_head"), ("blocks.0.mlp.experts.w_out", "experts")])
def test_tensor_groups(name, group):
    assert group_of(name) == group


def test_verify_keys_are_parsed_and_checked():
    config, recipe = parse_arguments(["zero.stage=3", "verify.steps=4", "verify.shrink=true", "verify.loss_atol=null"])
    assert (config.steps, config.shrink, config.loss_atol, recipe) == (4, True, None, ["zero.stage=3"])
    with pytest.raises(ValueError, match="did you mean verify.steps"):
        parse_arguments(["verify.step=4"])
    with pytest.raises(ValueError, match="verify.reference_precision='bf16'; choose one of: fp32, same"):
        parse_arguments(["verify.reference_precision=bf16"])
    with pytest.raises(ValueError, match="verify.shrink='yes' is not a valid bool"):
        parse_arguments(["verify.shrink=yes"])


def plan(*recipe, **keys):
    return build_plan(["model=gpt_debug", "data.max_bytes=300000", *recipe], VerifyConfig(**keys), compose,
                      check_train_job)


def test_the_reference_is_one_fp32_process_with_the_same_global_batch_and_micro_batch():
    made = plan("zero.stage=3", "launcher.nproc_per_node=2", "trainer.train_micro_batch_size_per_gpu=4",
                "trainer.gradient_accumulation_steps=2", "precision=bf16_master", "compile=blocks", steps=3)
    assert made.candidate_world == 2 and made.reference_world == 1
    reference = compose(made.reference)
    assert (reference.zero.stage, reference.precision.dtype, reference.compile.scope) == (0, "fp32", "none")
    assert (reference.trainer.train_micro_batch_size_per_gpu, reference.trainer.gradient_accumulation_steps,
            reference.trainer.train_batch_size) == (4, 4, 16)
    assert "trainer.max_steps=3" in made.candidate and "checkpoint.export_safetensors=true" in made.candidate
    assert made.tolerance == COMPILED and "precision=bf16 is held to it" in made.tolerance_reason
    assert any("compile=blocks" in line for line in made.adjustments)
    same = plan("parallel.pp=2", "launcher.nproc_per_node=2", "trainer.gradient_accumulation_steps=2",
                "trainer.train_micro_batch_size_per_gpu=8",
                "precision=fp16", reference_precision="same")
    assert same.tolerance == SIXTEEN_BIT and compose(same.reference).precision.dtype == "fp16"


def test_random_draws_are_aligned_and_said():
    made = plan("model.dropout=0.1", "moe=top2", "moe.num_experts=4", "data_efficiency=random_ltd",
                "zero.stage=0", "launcher.nproc_per_node=2")
    for overrides in (made.candidate, made.reference):
        cfg = compose(overrides)
        assert cfg.model.dropout == 0 and not cfg.moe.top2_2nd_expert_sampling
        assert not cfg.data_efficiency.random_ltd.enabled  # data-parallel 2: draws seeded per rank
    said = " ".join(made.adjustments)
    assert "model.dropout=0.1 -> 0" in said and "top2_2nd_expert_sampling" in said and "random_ltd -> off" in said
    kept = plan("data_efficiency=random_ltd", "parallel.pp=2", "launcher.nproc_per_node=2",
                "trainer.gradient_accumulation_steps=2", "trainer.train_micro_batch_size_per_gpu=8")
    assert compose(kept.candidate).data_efficiency.random_ltd.enabled
    assert any("random_ltd kept" in line for line in kept.adjustments)


def test_shrink_keeps_the_layout_valid():
    made = plan("model=gpt_tiny", "parallel.pp=2", "parallel.pp_schedule=interleaved_1f1b", "parallel.tp=2",
                "launcher.nproc_per_node=4", "trainer.gradient_accumulation_steps=4",
                "trainer.train_micro_batch_size_per_gpu=4", shrink=True)
    cfg = compose(made.candidate)
    assert cfg.model.n_layer == 4 and cfg.model.d_model == cfg.model.n_head * 16
    assert made.adjustments[0].startswith("shrink: model.n_layer")


def test_refused_layouts_get_the_training_clis_message(monkeypatch):
    args = ["model=gpt_debug", "parallel.pp=2", "launcher.nproc_per_node=2", "trainer.gradient_accumulation_steps=1",
            "trainer.train_micro_batch_size_per_gpu=8"]
    with pytest.raises(ValueError) as training:
        check_train_job(compose(args))
    with pytest.raises(ValueError) as verifying:
        build_plan(args, VerifyConfig(), compose, check_train_job)
    assert str(verifying.value) == str(training.value) and "parallel.pp=2" in str(training.value)
    monkeypatch.setenv(INJECT_ENV, "optimizer.lr=0.5")
    made = plan()
    assert "optimizer.lr=0.5" in made.candidate and "optimizer.lr=0.5" not in made.reference


@pytest.mark.parametrize("bad, said", [
    ("+trainer.max_stepz=3", "did you mean trainer.max_steps?"),  # `+` adds a key no schema has
    ("trainer.max_stepz=3", "did you mean trainer.max_steps?"),  # Hydra refuses it: the closest key added
    ("prompt=def(", "quote the value: \"prompt='def('\""),
])
def test_bad_command_lines_get_the_training_clis_hints_before_any_run(bad, said, tmp_path, capsys):
    from dsrecipes.verify.cli import main

    def runner(*args):
        raise AssertionError("nothing may run")

    assert main(["model=gpt_debug", bad, f"verify.dir={tmp_path / 'verify'}"], runner=runner) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "verify").exists()
