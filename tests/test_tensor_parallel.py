"""Tensor parallelism (CPU/gloo, through the real CLI) reproduces the single process.

TP=2 at world size 2 (dp 1), and dp 2 x tp 2 under ZeRO-3 at world size 4, train gpt_debug on the
same global batch as one process, with the default sequence-parallel activations (the replicated
layout, and Llama-style models with grouped-query attention, are checked layer by layer in
tests/test_tensor_parallel_layouts.py).
Tolerance as tests/test_distributed.py: losses within 2e-5, exported parameters within 5e-5 over 10
steps; the differences are fp32 summation orders (matmuls split over the hidden dimension and summed
by all-reduce, vocab-parallel lookups).
"""

import pytest

from tests.helpers.equivalence import (
    assert_matches_single_process,
    assert_refused,
    assert_resumes_in_one_process,
    common,
    run_and_read,
)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_tp2_reproduces_single_process(tmp_path, datasets_cache, single_gpt):
    losses, params = run_and_read(tmp_path, "tp2", common(datasets_cache) + [
        "parallel.tp=2", "launcher.nproc_per_node=2", "trainer.train_micro_batch_size_per_gpu=8"])
    assert_matches_single_process(losses, params, *single_gpt)


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_dp2_x_tp2_under_zero3_reproduces_single_process(tmp_path, datasets_cache, single_gpt):
    losses, params = run_and_read(tmp_path, "dp2tp2", common(datasets_cache) + [
        "parallel.tp=2", "zero.stage=3", "launcher.nproc_per_node=4", "trainer.train_micro_batch_size_per_gpu=4"])
    assert_matches_single_process(losses, params, *single_gpt)


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_tp2_checkpoint_resumes_in_a_single_process(tmp_path, datasets_cache, single_gpt):
    """TP=2 saves at step 5 (vocab- and head-sharded DTensors); one process resumes with the same losses."""
    assert_resumes_in_one_process(tmp_path, datasets_cache, ["parallel.tp=2", "launcher.nproc_per_node=2"], single_gpt)


def test_bad_parallel_layouts_are_refused_naming_the_keys():
    """Checked by validate_recipe, which the CLI runs before spawning (tests/test_distributed.py shows that path)."""
    cases = {
        ("parallel.tp=3", "launcher.nproc_per_node=2"):
            "parallel.tp=3 x parallel.sp=1 x parallel.pp=1 = 3 does not divide the world size 2",
        ("parallel.tp=2", "model.n_head=3", "model.d_model=96", "launcher.nproc_per_node=2"):
            "parallel.tp=2 does not divide model.n_head=3",
        ("parallel.tp=2", "launcher.nproc_per_node=4"): "parallel.tp=2 with 2 data-parallel ranks needs zero.stage 2 or 3",
        ("parallel.tp=2", "moe=top2", "moe.ep_size=2", "launcher.nproc_per_node=2"):
            "moe.ep_size=2 must divide the data-parallel size 1 (= world / parallel.tp",
        ("parallel.tp=2", "optimizer.impl=foreach", "launcher.nproc_per_node=2"): "parallel.tp=2 with optimizer.impl=foreach",
        ("parallel.tp=2", "data.block_size=63", "launcher.nproc_per_node=2"): "needs data.block_size divisible by 2",
    }
    assert_refused(cases)
