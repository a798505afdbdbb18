"""Pipeline parallelism (CPU/gloo, through the real CLI) reproduces the single process.

gpt_debug (4 blocks, tied embeddings: the first and last stages hold copies of the one weight and
sum their gradients) trains 10 steps with micro-batches = gradient accumulation steps = 2 under
each schedule, at PP=2, at dp 2 x pp 2 (world 4) and at dp 2 x tp 2 x pp 2 (world 8), against one
process on the same global batch.
Tolerance as tests/test_distributed.py: losses within 2e-5, exported parameters within 5e-5; the
differences are fp32 summation orders (gradients averaged over micro-batches by the schedule, the
tied gradient summed across stages).
"""

import pytest

from tests.helpers.equivalence import (
    assert_matches_single_process,
    assert_resumes_in_one_process,
    common,
    run_and_read,
    run_layout,
)


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved_1f1b parallel.pp_partition=parameters"])
def test_pp2_reproduces_single_process(tmp_path, datasets_cache, single_gpt, schedule):
    losses, params = run_and_read(tmp_path, "pp2", common(datasets_cache) + f"parallel.pp_schedule={schedule}".split() + [
        "parallel.pp=2", "launcher.nproc_per_node=2", "trainer.train_micro_batch_size_per_gpu=8"])
    assert_matches_single_process(losses, params, *single_gpt)


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_dp2_x_pp2_reproduces_single_process(tmp_path, datasets_cache, single_gpt):
    losses, params = run_and_read(tmp_path, "dp2pp2", common(datasets_cache) + [
        "parallel.pp=2", "launcher.nproc_per_node=4", "trainer.train_micro_batch_size_per_gpu=4"])
    assert_matches_single_process(losses, params, *single_gpt)


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_dp2_x_tp2_x_pp2_reproduces_single_process(tmp_path, datasets_cache, single_gpt):
    """3D (gpt_3d's layout) at world size 8: tensor-parallel stages with sequence-parallel activations
    between them, the vocab-parallel loss on the last stage, vocab-sharded tied copies, dp 2."""
    losses, params = run_and_read(tmp_path, "dp2tp2pp2", common(datasets_cache) + [
        "parallel.pp=2", "parallel.tp=2", "launcher.nproc_per_node=8", "trainer.train_micro_batch_size_per_gpu=4"])
    assert_matches_single_process(losses, params, *single_gpt)
    layout = run_layout(tmp_path / "dp2tp2pp2")  # the run says what it ran (not "one data-parallel rank")
    assert layout.startswith("world 8 = pp 2 x dp 2 (replicate 2 x shard 1) x sp 1 x tp 2; ep 1 | pipeline: ")
    assert "tensor parallel: sequence-parallel activations" in layout and "data parallel: allreduce" in layout
    assert "precision: fp32 weights and compute" in layout


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_pp2_checkpoint_resumes_in_a_single_process(tmp_path, datasets_cache, single_gpt):
    """PP=2 saves at step 5 (each stage writes its own parameters); one process resumes with the same losses."""
    assert_resumes_in_one_process(tmp_path, datasets_cache, ["parallel.pp=2", "launcher.nproc_per_node=2"], single_gpt)
