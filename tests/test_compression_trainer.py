"""The `compression` group through the recipe Trainer: masks stay zero after every optimizer step, the
export is smaller and evaluated, and a layer-reduced student learns more with distillation than without."""

import json

import pytest
import torch

from dsrecipes.config import validate_recipe
from dsrecipes.config.store import compose
from dsrecipes.training.trainer import Trainer

pytestmark = pytest.mark.filterwarnings("ignore:dsrecipes.kernels")


def run(tmp_path, overrides, name="run"):
    root, batch = validate_recipe(compose(overrides), dp_world_size=1)
    trainer = Trainer(root, tmp_path / name, batch, overrides=overrides)
    return trainer, trainer.fit()


def small(fast_overrides, steps):
    return fast_overrides + [f"trainer.max_steps={steps}", "trainer.sample_tokens=0", "trainer.eval_interval=0",
                             "checkpoint.save_final=false"]


def test_recipe_qat_and_pruning_masks_stay_zero_and_export(tmp_path, fast_overrides):
    overrides = small(fast_overrides, 12) + [
        "compression=combined",
        "compression.row_pruning.schedule_offset=4", "compression.head_pruning.schedule_offset=4",
        "compression.weight_quantization.schedule_offset=6",
        "compression.sparse_pruning.enabled=true", "compression.sparse_pruning.schedule_offset=4",
        "compression.sparse_pruning.dense_ratio=0.5", "compression.sparse_pruning.modules=[blocks.*.attn.q_proj]",
    ]
    trainer, summary = run(tmp_path, overrides)
    model = trainer.engine.module
    comp = trainer.extensions.callbacks[-1].compressor
    assert comp.weight_quant.current_bits() == 8
    fc_in = model.blocks[0].mlp.fc_in
    dead = (fc_in.weight == 0).all(1)
    assert int(dead.sum()) == fc_in.out_features // 2
    for t, m in comp.mask_pairs():  # after 8 optimizer steps with the masks on, pruned entries are still 0
        assert (t[(m == 0).expand_as(t)] == 0).all()
    q = model.blocks[1].attn.q_proj.weight
    live_heads = (q.reshape(4, -1) != 0).any(1)
    assert int(live_heads.sum()) == 2
    report = summary["compression"]
    assert report["bytes_compressed"] < report["bytes_fp32"]
    assert abs(report["val_loss_after"] - report["val_loss_before"]) < 0.05
    saved = json.loads((trainer.run_dir / "summary.json").read_text())
    assert saved["compression"]["size_ratio"] == pytest.approx(report["size_ratio"])
    assert (trainer.run_dir / "export_compressed" / "model.safetensors").exists()


@pytest.fixture
def kd_teacher(tmp_path, fast_overrides):
    """A 4-layer gpt_debug teacher (d_model 128): 200 steps x 32 sequences of 64
    bytes at lr 3e-3 (val ~2.73). It must be trained well past the student's budget and lean on its
    middle layers, or KD has nothing to add (a 100-200 step, batch-16 teacher is barely better than its
    own reduced student after 30 more steps). One intra-op thread: these matmuls are too small to share, and
    two threads contending with other processes on a 2-core machine were measured 5x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    _, summary = run(tmp_path, small(fast_overrides, 200) + ["optimizer.lr=3e-3", "trainer.train_micro_batch_size_per_gpu=32"],
                     "teacher")
    yield tmp_path / "teacher" / "export", summary["metrics"]["val/loss"]
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_layer_reduction_student_learns_more_with_kd(tmp_path, fast_overrides, kd_teacher):
    """Student: teacher layers [0, 3] (2 of 4) plus embeddings / head, 30 steps x 8 sequences at lr 3e-3,
    with KD (T=2, kd_weight=1, conf/compression/layer_reduction_kd.yaml) vs the same run with kd_weight=0.

    Measured (2-core CPU, torch 2.13; teacher val 2.730; the reduced student starts at 2.928), val/loss
    after 30 steps, KD vs no KD, per student seed: 1: 2.802 vs 2.847 (-0.045); 2: 2.776 vs 2.830 (-0.054);
    3: 2.787 vs 2.851 (-0.064). The test fixes seed 2 and asserts a margin of 0.02 (under half the
    smallest observed), and that the teacher is clearly better than the student without KD."""
    teacher_dir, teacher_loss = kd_teacher
    student = small(fast_overrides, 30) + [
        "optimizer.lr=3e-3", "trainer.seed=2", "compression=layer_reduction_kd",
        f"compression.layer_reduction.teacher_path={teacher_dir}", "compression.export=false",
        "checkpoint.export_safetensors=false"]
    kd_trainer, with_kd = run(tmp_path, student, "kd")
    _, without_kd = run(tmp_path, student + ["compression.layer_reduction.kd_weight=0"], "plain")
    assert kd_trainer.gpt.cfg.n_layer == 2 and len(kd_trainer.gpt.blocks) == 2
    assert kd_trainer.extensions.callbacks[-1].kd is not None  # the KD loss term was active
    kd_loss = with_kd["metrics"]["val/loss"]
    plain_loss = without_kd["metrics"]["val/loss"]
    figures = {"teacher": teacher_loss, "kd": kd_loss, "plain": plain_loss}
    assert teacher_loss < plain_loss - 0.05, figures
    assert kd_loss < plain_loss - 0.02, figures


def test_recipe_errors_name_the_key(tmp_path, fast_overrides):
    with pytest.raises(ValueError, match="compression.layer_reduction.teacher_path"):
        run(tmp_path, small(fast_overrides, 2) + ["compression=layer_reduction_kd"])
    with pytest.raises(ValueError, match="compression.layer_reduction.*teacher_layer"):
        validate_recipe(compose(["compression=layer_reduction_kd", "compression.layer_reduction.teacher_layer=[0,9]"]),
                        dp_world_size=1)
    with pytest.raises(ValueError, match="compression.head_pruning.*num_heads"):
        validate_recipe(compose(["compression=prune_heads", "compression.head_pruning.num_heads=4"]), dp_world_size=1)
    with pytest.raises(ValueError, match="compression.weight_quantization.*target_bits"):
        validate_recipe(compose(["compression=qat_int4", "compression.weight_quantization.target_bits=9"]),
                        dp_world_size=1)
