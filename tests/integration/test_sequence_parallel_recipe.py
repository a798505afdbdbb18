"""Ulysses sequence parallelism through the recipe (CPU/gloo, real CLI) reproduces the single process.

SP=2 at world size 2: both ranks read the same micro-batch, each runs its half of every sequence
(positions offset), attention sees the whole sequence for half the heads; gradients are averaged
over both ranks (DDP), the loss metrics over both chunks. Tolerances as tests/test_distributed.py
(losses 2e-5, exported parameters 5e-5 over 10 steps). Llama-style models with grouped- and
multi-query attention are checked in process (tests/test_sequence_parallel.py: logits, every
gradient and 6 optimizer steps).
"""

import pytest
import torch

from tests.helpers.equivalence import assert_matches_single_process, common, run_and_read


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_sp2_reproduces_single_process(tmp_path, datasets_cache, single_gpt):
    losses, params = run_and_read(tmp_path, "sp2", common(datasets_cache) + [
        "trainer.train_micro_batch_size_per_gpu=8", "parallel.sp=2", "launcher.nproc_per_node=2"])
    assert_matches_single_process(losses, params, *single_gpt)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_sp2_under_zero3_checkpoint_resumes_in_a_single_process(tmp_path, datasets_cache):
    base = common(datasets_cache) + ["trainer.train_micro_batch_size_per_gpu=8", "checkpoint.interval=5"]
    ref_losses, _ = run_and_read(tmp_path, "single", base + ["launcher.nproc_per_node=1"])
    losses, _ = run_and_read(tmp_path, "sp2", base + ["parallel.sp=2", "zero.stage=3", "launcher.nproc_per_node=2"])
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=0, atol=2e-5)
    (checkpoint,) = list((tmp_path / "sp2").glob("outputs/*/*/checkpoints/step_5"))
    resumed, _ = run_and_read(tmp_path, "sp1", base + ["launcher.nproc_per_node=1", f"trainer.resume={checkpoint}"])
    torch.testing.assert_close(torch.tensor(resumed), torch.tensor(ref_losses[5:]), rtol=0, atol=2e-5)
