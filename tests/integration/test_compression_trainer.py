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
    with KD (T=2, kd_weight=1, conf/compression/layer_reduction_kd.yaml) vs the same run with kd_weight=0,
    for student seeds 1-4 (about 2 s a pair).

    One seed is not enough: the gain moves with the CPU's float rounding in these short runs. Measured val/loss,
    KD minus no KD, seeds 1-4: -0.037, -0.043, -0.047, -0.017 (mean -0.036; teacher 2.748; 2-core Intel Xeon,
    torch 2.13, 2026-12-08); an AMD EPYC machine gave -0.018 for seed 2 where the Xeon gave -0.054, and a CI
    machine failed a single-seed margin of 0.01. The test asserts the mean gain over the four seeds is above 0.01
    (a quarter of the measured mean, about four standard errors of the seed spread below it), and that the
    teacher is clearly better than the students without KD."""
    teacher_dir, teacher_loss = kd_teacher
    gains, plain_losses = [], []
    for seed in (1, 2, 3, 4):
        student = small(fast_overrides, 30) + [
            "optimizer.lr=3e-3", f"trainer.seed={seed}", "compression=layer_reduction_kd",
            f"compression.layer_reduction.teacher_path={teacher_dir}", "compression.export=false",
            "checkpoint.export_safetensors=false"]
        kd_trainer, with_kd = run(tmp_path, student, f"kd{seed}")
        _, without_kd = run(tmp_path, student + ["compression.layer_reduction.kd_weight=0"], f"plain{seed}")
        assert kd_trainer.gpt.cfg.n_layer == 2 and len(kd_trainer.gpt.blocks) == 2
        assert kd_trainer.extensions.callbacks[-1].kd is not None  # the KD loss term was active
        plain_losses.append(without_kd["metrics"]["val/loss"])
        gains.append(plain_losses[-1] - with_kd["metrics"]["val/loss"])
    figures = {"teacher": teacher_loss, "plain": plain_losses, "kd gain": gains}
    assert teacher_loss < min(plain_losses) - 0.05, figures
    assert sum(gains) / len(gains) > 0.01, figures
