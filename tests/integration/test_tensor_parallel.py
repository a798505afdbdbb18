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
