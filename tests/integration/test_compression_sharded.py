"""Compression under sharding (through the real CLI): QAT + sparse, row and head pruning at dp 2 under ZeRO-2
and ZeRO-3, and at tp 2, reproduce the same recipe in one process; a compressed run resumed from its step-5
checkpoint (in one process, and a ZeRO-3 checkpoint resumed in one process) ends where the uninterrupted run
does. Tolerances as tests/test_distributed.py (losses 2e-5, exported parameters 5e-5), and every entry the
masks prune is exactly zero in the sharded run's export, as in the reference. (The float export is compared:
the int8 codes of export_compressed can differ by one step where a weight sits on a rounding boundary, the
weights themselves differing by fp32 summation order.) ZeRO-2 with bf16 master weights, whose fp32 master
shards are separate copies, is checked for exact zeros.

The recipe (`RECIPE`) makes every technique take effect within the 10 steps: sparse pruning of q_proj ramped
from step 2 to 6 (mask updates at 2, 4, 6), row pruning of fc_in (fc_out columns with it) and head pruning
at step 4, int8 weight QAT of the block linears from step 6. Masks and quantization scales come from whole
weights (DTensor shards gathered), so the sharded runs make the decisions one process makes.
"""

from pathlib import Path

import pytest
import torch

from tests.helpers.equivalence import STEPS, assert_matches_single_process, common, run_and_read

pytestmark = pytest.mark.filterwarnings("ignore:dsrecipes.kernels")

RECIPE = [
    "compression=combined", "compression.row_pruning.schedule_offset=4", "compression.head_pruning.schedule_offset=4",
    "compression.weight_quantization.schedule_offset=6", "compression.weight_quantization.quantize_groups=4",
    "compression.sparse_pruning.enabled=true",
    "compression.sparse_pruning.schedule_offset=2", "compression.sparse_pruning.schedule_offset_end=6",
    "compression.sparse_pruning.schedule_offset_stride=2", "compression.sparse_pruning.dense_ratio=0.5",
    "compression.sparse_pruning.modules=[blocks.*.attn.q_proj]", "checkpoint.interval=5",
]
PRUNED = [f"blocks.{i}.{name}.weight" for i in range(4) for name in ("mlp.fc_in", "mlp.fc_out", "attn.q_proj",
                                                                      "attn.kv_proj", "attn.out_proj")]


@pytest.fixture(scope="module")
def single_compressed(tmp_path_factory, datasets_cache):
    """The recipe in one process (micro-batch 8 x accumulation 2), saving at step 5: (losses, export, run folder)."""
    folder = tmp_path_factory.mktemp("single_compressed")
    losses, params = run_and_read(folder, "single", common(datasets_cache) + RECIPE + [
        "launcher.nproc_per_node=1", "trainer.train_micro_batch_size_per_gpu=8"])
    return losses, params, folder / "single"


def assert_same_compressed_model(losses, params, reference) -> None:
    ref_losses, ref_params, _ = reference
    assert_matches_single_process(losses, params, ref_losses, ref_params)
    for name in PRUNED:  # pruned entries exactly zero, the same entries as in one process
        zeros, ref_zeros = params[name] == 0, ref_params[name] == 0
        assert ref_zeros.float().mean() > 0.2, name
        assert torch.equal(zeros, ref_zeros), name


def checkpoint_of(folder: Path) -> Path:
    (checkpoint,) = list(folder.glob("outputs/*/*/checkpoints/step_5"))
    return checkpoint


def resume_in_one_process(tmp_path, datasets_cache, checkpoint: Path, reference) -> None:
    resumed, params = run_and_read(tmp_path, "resumed", common(datasets_cache) + RECIPE + [
        "launcher.nproc_per_node=1", "trainer.train_micro_batch_size_per_gpu=8", f"trainer.resume={checkpoint}"])
    ref_losses, ref_params, _ = reference
    torch.testing.assert_close(torch.tensor(resumed), torch.tensor(ref_losses[5:]), rtol=0, atol=2e-5)
    for name in ref_params:
        torch.testing.assert_close(params[name], ref_params[name], rtol=0, atol=5e-5, msg=name)


# name -> the layout's overrides (global batch 16 = micro-batch x accumulation 2 x dp, as the reference's)
LAYOUTS = {
    "dp2_zero2": ["zero.stage=2", "launcher.nproc_per_node=2", "trainer.train_micro_batch_size_per_gpu=4"],
    "dp2_zero3": ["zero.stage=3", "launcher.nproc_per_node=2", "trainer.train_micro_batch_size_per_gpu=4"],
    "tp2": ["parallel.tp=2", "launcher.nproc_per_node=2", "trainer.train_micro_batch_size_per_gpu=8"],
    "dp2_x_tp2_zero3": ["parallel.tp=2", "zero.stage=3", "launcher.nproc_per_node=4",
                        "trainer.train_micro_batch_size_per_gpu=4"],
}


def assert_layout_matches(tmp_path, datasets_cache, layout: str, reference) -> None:
    losses, params = run_and_read(tmp_path, layout, common(datasets_cache) + RECIPE + LAYOUTS[layout])
    assert_same_compressed_model(losses, params, reference)


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("layout", ["dp2_zero2", "tp2", "dp2_x_tp2_zero3"])
def test_layout(tmp_path, datasets_cache, single_compressed, layout):
    """dp2_zero2: replicated parameters, sharded fp32 masters (views of them in fp32): the masks reach the master
    shards too. tp2: Colwise Shard(0) / Rowwise Shard(1) DTensors: masks and fake-quant groups of the whole
    weight. dp2_x_tp2_zero3 (world size 4): FSDP2 shards of tensor-parallel DTensors (2-D placements)."""
    assert_layout_matches(tmp_path, datasets_cache, layout, single_compressed)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dp2_zero2_bf16_master_keeps_pruned_weights_zero(tmp_path, datasets_cache):
    """ZeRO-2 with precision.master_weights: the fp32 master shards are separate copies, gathered into the bf16
    parameters after every step, so the masks must reach them or the pruned weights come back. The export
    (from the masters) holds exact zeros: half of fc_in's rows, the same columns of fc_out, over half of q_proj."""
    _, params = run_and_read(tmp_path, "zero2_bf16", common(datasets_cache) + RECIPE + LAYOUTS["dp2_zero2"] + [
        "precision=bf16_master"])
    for i in range(4):
        dead_rows = (params[f"blocks.{i}.mlp.fc_in.weight"] == 0).all(1)
        assert int(dead_rows.sum()) == dead_rows.numel() // 2
        assert torch.equal((params[f"blocks.{i}.mlp.fc_out.weight"] == 0).all(0), dead_rows)
        assert (params[f"blocks.{i}.attn.q_proj.weight"] == 0).float().mean() >= 0.5


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_dp2_zero3_and_its_checkpoint_resumes(tmp_path, datasets_cache, single_compressed):
    """ZeRO-3 (FSDP2 shards between forwards): masks from gathered weights, each rank masking its shard; its
    step-5 checkpoint (masks and bit schedule in the callback state) resumes in one process."""
    assert_layout_matches(tmp_path, datasets_cache, "dp2_zero3", single_compressed)
    resume_in_one_process(tmp_path, datasets_cache, checkpoint_of(tmp_path / "dp2_zero3"), single_compressed)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_resume(tmp_path, datasets_cache, single_compressed):
    """The one-process run's step-5 checkpoint, resumed, ends with the uninterrupted run's losses and weights."""
    assert len(single_compressed[0]) == STEPS
    resume_in_one_process(tmp_path, datasets_cache, checkpoint_of(single_compressed[2]), single_compressed)
