"""Data efficiency under pipeline parallelism reproduces the single process.

random-LTD draws each dropping layer's token subsets from its own stream (seed, data-parallel rank, layer,
draw), so pipeline stages, which run some of the layers, draw what one process running all of them draws,
and the schedule's shape-inference forward takes no draw. The sequence-length curriculum changes the batch
shape between steps; the pipeline keeps one schedule per shape.

The recipe runs both at once (seqlen curriculum in pack mode, which also changes the row count, and
random-LTD in the middle layers) with evaluation every 5 steps (eval/train switches re-run the schedule's
shape inference): pp 2 against one process, losses and validation losses within 2e-5, exported parameters
within 5e-5 (fp32 summation order: gradients averaged over micro-batches by the schedule, the tied
embedding's gradient summed across stages).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.equivalence import common, run_and_read, run_metric

DATA_EFFICIENCY = [
    "data_efficiency=combined", "data_efficiency.curriculum_learning.seqlen_mode=pack",
    "data_efficiency.curriculum_learning.min_difficulty=16", "data_efficiency.curriculum_learning.total_curriculum_step=8",
    "data_efficiency.random_ltd.min_value=16", "data_efficiency.random_ltd.require_steps=8",
    "trainer.eval_interval=5", "trainer.train_micro_batch_size_per_gpu=8",
]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_pp2_with_seqlen_curriculum_and_random_ltd_reproduces_single_process(tmp_path, datasets_cache):
    recipe = common(datasets_cache) + DATA_EFFICIENCY
    ref_losses, ref_params = run_and_read(tmp_path, "one", recipe + ["launcher.nproc_per_node=1"])
    losses, params = run_and_read(tmp_path, "pp2", recipe + ["launcher.nproc_per_node=2", "parallel.pp=2"])
    assert ref_losses[-1] < ref_losses[0] - 0.3
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=0, atol=2e-5)
    ref_val, val = run_metric(tmp_path / "one", "val/loss"), run_metric(tmp_path / "pp2", "val/loss")
    assert len(ref_val) == 2
    torch.testing.assert_close(torch.tensor(val), torch.tensor(ref_val), rtol=0, atol=2e-5)
    for name in ref_params:
        torch.testing.assert_close(params[name], ref_params[name], rtol=0, atol=5e-5, msg=name)
