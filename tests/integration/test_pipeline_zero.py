"""Pipeline parallelism with ZeRO-1/2/3 on the data axis, fp16 loss scaling and fp32 master weights
(CPU/gloo, through the real CLI), against one process.

* dp 2 x pp 2 at zero.stage=2 and 3: FSDP2 on each stage module (fp32: the suite's tolerances); the
  stage-3 checkpoint resumes in one process.

* dp 2 x pp 2 at zero.stage=1 (DeepSpeed's default 3D layout): the zero1_boundary strategy partitions
  the optimizer state over the two data-parallel ranks of each stage. fp32: the suite's tolerances
  (losses 2e-5, exported parameters 5e-5). Its step-5 checkpoint (DCP: each rank's optimizer holds
  only the parameters it owns, so the ranks write disjoint keys) resumes in one process.
* pp 2 with precision=fp16 (fp16 parameters, fp32 masters, dynamic loss scaling: the same steps
  overflow as in one process) and dp 2 x pp 2 ZeRO-1 with bf16_master (the owners step and broadcast
  the fp32 masters), against one process of the same precision. 16-bit activations and gradients
  round differently (tied-gradient sums across stages, half-batch gradients at dp 2): losses within
  2e-2 and exported parameters within 5e-3 (tests/test_precision_matrix.py's master-weight
  tolerance); measured: losses 4e-3 / 3e-3, parameters 1e-3 / 2e-3 (fp16 / bf16_master).
"""

import pytest
import torch

from tests.helpers.equivalence import (
    STEPS,
    assert_matches_single_process,
    assert_resumed_matches,
    common,
    run_and_read,
    run_layout,
)

PP2 = ["parallel.pp=2", "launcher.nproc_per_node=2", "trainer.train_micro_batch_size_per_gpu=8"]
DP2_PP2_ZERO1 = ["parallel.pp=2", "zero.stage=1", "launcher.nproc_per_node=4", "trainer.train_micro_batch_size_per_gpu=4"]


STRATEGY_OF_STAGE = {1: "zero1_boundary: ZeRO-1", 2: "fsdp2: FSDP2 (zero.stage=2)", 3: "fsdp2: FSDP2 (zero.stage=3)"}


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_dp2_x_pp2_zero_reproduces_single_process(tmp_path, datasets_cache, single_gpt, stage):
    """ZeRO-1 (zero1_boundary) and ZeRO-2 / ZeRO-3 (FSDP2 on each stage module, the schedule reduce-scattering the
    gradients at the last micro-batch) of pipeline stages; the stage-1 and stage-3 runs' step-5 checkpoints (DCP)
    resume in one process."""
    base = common(datasets_cache) + ["checkpoint.interval=5"]
    losses, params = run_and_read(tmp_path, "layout", base + [
        "parallel.pp=2", f"zero.stage={stage}", "launcher.nproc_per_node=4", "trainer.train_micro_batch_size_per_gpu=4"])
    assert_matches_single_process(losses, params, *single_gpt)
    assert f"data parallel: {STRATEGY_OF_STAGE[stage]}" in run_layout(tmp_path / "layout")
    if stage != 2:
        (checkpoint,) = list((tmp_path / "layout").glob("outputs/*/*/checkpoints/step_5"))
        resumed, params = run_and_read(tmp_path, "one", base + [
            "launcher.nproc_per_node=1", "trainer.train_micro_batch_size_per_gpu=8", f"trainer.resume={checkpoint}"])
        assert_resumed_matches(resumed, params, single_gpt)


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("precision, layout", [("fp16", PP2), ("bf16_master", DP2_PP2_ZERO1)], ids=["fp16-pp2",
                         "bf16_master-dp2xpp2-zero1"])
def test_pipeline_with_master_weights_follows_one_process(tmp_path, datasets_cache, precision, layout):
    base = common(datasets_cache) + [f"precision={precision}"]
    ref_losses, ref_params = run_and_read(tmp_path, "one", base + [
        "launcher.nproc_per_node=1", "trainer.train_micro_batch_size_per_gpu=8"])
    losses, params = run_and_read(tmp_path, "layout", base + layout)
    assert len(losses) == len(ref_losses) == STEPS
    assert ref_losses[-1] < ref_losses[0] - 0.3  # it trained
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=0, atol=2e-2)
    assert params.keys() == ref_params.keys()
    for name in ref_params:
        assert params[name].dtype == torch.float32, name  # the export holds every stage's fp32 masters
        torch.testing.assert_close(params[name], ref_params[name], rtol=0, atol=5e-3, msg=name)
