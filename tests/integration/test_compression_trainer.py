"""The `compression` group through the recipe Trainer: masks stay zero after every optimizer step, the
export is smaller and evaluated, and a layer-reduced student learns more with distillation than without."""


import pytest
import torch

from tests.unit.test_compression_trainer import run, small

pytestmark = pytest.mark.filterwarnings("ignore:dsrecipes.kernels")


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
    3: 2.787 vs 2.851 (-0.064). On another 2-core machine (AMD EPYC, AVX-512 kernels; 2026-12-04) the same code
    gives seed 2: 2.804 vs 2.821 (-0.018; teacher 2.734): the CPU's float rounding moves these short runs. The test
    fixes seed 2 and asserts a margin of 0.01 (under two thirds of the smallest observed), and that the teacher is
    clearly better than the student without KD."""
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
    assert kd_loss < plain_loss - 0.01, figures
