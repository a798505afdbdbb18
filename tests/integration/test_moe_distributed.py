"""Expert parallelism at world size 2 (CPU/gloo, through the real CLI) reproduces the single process.

EP=2: each worker holds 2 of the 4 experts of every MoE block; tokens travel by all_to_all. The
single-process reference sees the same micro-batches (micro 4 x accumulation 4 vs 2 ranks x micro
4 x accumulation 2: BatchIterator hands rank r's i-th micro-batch to the single process as its
(2i + r)-th), so gating, capacity, dropped tokens and the auxiliary loss are computed over the same
token groups. Random routing choices are off (use_rts=false, no second-expert sampling: their
random streams differ per rank).

Tolerance: as tests/test_distributed.py (losses 2e-5 absolute, exported parameters 5e-5 over 10
steps); the only differences are fp32 summation orders (gradients summed across ranks, and over the
EP group by the all_to_all backward).
"""

import pytest
import torch

from tests.helpers.equivalence import (
    STEPS,
    assert_matches_single_process,
    common,
    run_and_read,
    run_layout,
    run_metric,
)

MOE = [
    "moe.num_experts=4", "moe.k=2", "moe.expert_interval=1", "moe.use_rts=false",
    "moe.top2_2nd_expert_sampling=false", "moe.capacity_factor=1.0", "moe.min_capacity=4",
]


@pytest.fixture(scope="module")
def moe_single_process(tmp_path_factory, datasets_cache):
    tmp = tmp_path_factory.mktemp("moe_single")
    return run_and_read(tmp, "single", common(datasets_cache) + MOE + [
        "launcher.nproc_per_node=1", "trainer.train_micro_batch_size_per_gpu=4", "trainer.gradient_accumulation_steps=4"])


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("zero", ["zero.stage=0", "zero.stage=1", "zero.stage=3"])
def test_expert_parallel_2_reproduces_single_process(tmp_path, datasets_cache, moe_single_process, zero):
    ref_losses, ref_params = moe_single_process
    losses, params = run_and_read(tmp_path, "ep2", common(datasets_cache) + MOE + [zero, "moe.ep_size=2",
        "launcher.nproc_per_node=2", "trainer.train_micro_batch_size_per_gpu=4"])
    assert params["blocks.0.mlp.experts.w_in"].shape[0] == 4  # the export holds every expert
    assert_matches_single_process(losses, params, ref_losses, ref_params)
    layout = run_layout(tmp_path / "ep2")
    dp = "replicate 1 x shard 2" if zero == "zero.stage=3" else "replicate 2 x shard 1"
    assert layout.startswith(f"world 2 = pp 1 x dp 2 ({dp}) x sp 1 x tp 1; ep 2 | data parallel: ")
    expected = {"zero.stage=0": "data parallel: ddp", "zero.stage=1": "data parallel: zero1_boundary: ZeRO-1",
                "zero.stage=3": "data parallel: fsdp2: FSDP2 (zero.stage=3)"}[zero]
    assert expected in layout


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_ep2_checkpoint_resumes_in_a_single_process(tmp_path, datasets_cache):
    """EP=2 saves at step 5 (experts as shards of global tensors); one process (EP=1) resumes it.

    drop_tokens=false and no aux loss make every token's output independent of how tokens are
    grouped, so an uninterrupted single-process run is the reference for the resumed steps.
    """
    base = common(datasets_cache) + MOE + ["moe.drop_tokens=false", "moe.aux_loss_coef=0", "checkpoint.interval=5"]
    ref_losses, _ = run_and_read(tmp_path, "ref", base + [
        "launcher.nproc_per_node=1", "trainer.train_micro_batch_size_per_gpu=8"])
    losses2, _ = run_and_read(tmp_path, "ep2", base + [
        "moe.ep_size=2", "launcher.nproc_per_node=2", "trainer.train_micro_batch_size_per_gpu=4"])
    torch.testing.assert_close(torch.tensor(losses2), torch.tensor(ref_losses), rtol=0, atol=2e-5)
    (checkpoint,) = list((tmp_path / "ep2").glob("outputs/*/*/checkpoints/step_5"))
    resumed, _ = run_and_read(tmp_path, "ep1", base + [
        "launcher.nproc_per_node=1", "trainer.train_micro_batch_size_per_gpu=8", f"trainer.resume={checkpoint}"])
    assert len(resumed) == STEPS - 5
    torch.testing.assert_close(torch.tensor(resumed), torch.tensor(ref_losses[5:]), rtol=0, atol=2e-5)


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_expert_data_parallel_world_4_ep_2_reproduces_single_process(tmp_path, datasets_cache):
    """World 4 = 2 expert-data-parallel replicas x EP 2: expert gradients also reduce across replicas.

    Single-process reference: micro 2 x accumulation 8 sees rank r's i-th micro-batch (micro 2,
    accumulation 2, 4 ranks) as its (4i + r)-th, the same token groups.
    """
    base = common(datasets_cache) + MOE
    ref, ref_params = run_and_read(tmp_path, "single", base + [
        "launcher.nproc_per_node=1", "trainer.train_micro_batch_size_per_gpu=2", "trainer.gradient_accumulation_steps=8"])
    losses, params = run_and_read(tmp_path, "w4", base + [
        "moe.ep_size=2", "launcher.nproc_per_node=4", "trainer.train_micro_batch_size_per_gpu=2"])
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref), rtol=0, atol=2e-5)
    for name in ref_params:
        torch.testing.assert_close(params[name], ref_params[name], rtol=0, atol=5e-5, msg=name)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [2, 4])
def test_moe_under_pipeline_parallel_reproduces_single_process(tmp_path, datasets_cache, moe_single_process, world):
    """pp 2 (world 2; and dp 2 x pp 2 with the experts sharded over ep 2 within each stage, world 4): every stage
    adds its own MoE layers' auxiliary-loss gradients where they arise (dsrecipes.distributed.pipeline_loss_terms);
    losses, the logged auxiliary loss and the exported parameters match one process (micro-batch 4, so every
    forward routes the same 4 rows)."""
    ref_losses, ref_params = moe_single_process
    layout = ["trainer.gradient_accumulation_steps=4"] if world == 2 else [
        "trainer.gradient_accumulation_steps=2", "moe.ep_size=2"]
    losses, params = run_and_read(tmp_path, "pp", common(datasets_cache) + MOE + layout + [
        "parallel.pp=2", f"launcher.nproc_per_node={world}", "trainer.train_micro_batch_size_per_gpu=4"])
    assert_matches_single_process(losses, params, ref_losses, ref_params)
    (single,) = {p.resolve() for p in tmp_path.parent.glob("moe_single*/single")}  # the fixture's run ("current" links)
    torch.testing.assert_close(torch.tensor(run_metric(tmp_path / "pp", "train/moe_aux_loss")),
                               torch.tensor(run_metric(single, "train/moe_aux_loss")), rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_gpt_3d_moe_reproduces_single_process(tmp_path, datasets_cache, moe_single_process):
    """+experiment=gpt_3d_moe's layout (world 8 = pp 2 x dp 2 x tp 2; 4 experts over ep 2 within each stage,
    their hidden widths over tp 2) on the reference recipe: losses 2e-5 and every exported parameter 5e-5 (the
    export gathers each stage's experts over ep and tp) of one process with micro-batch 4."""
    ref_losses, ref_params = moe_single_process
    losses, params = run_and_read(tmp_path, "3d", ["+experiment=gpt_3d_moe"] + common(datasets_cache) + MOE + [
        "trainer.train_batch_size=16", "trainer.train_micro_batch_size_per_gpu=4",
        "precision=fp32"])  # the experiment's precision=auto is bf16 autocast on CPUs with AMX tiles
    assert params["blocks.3.mlp.experts.w_in"].shape[0] == 4  # the last stage's experts, whole
    assert_matches_single_process(losses, params, ref_losses, ref_params)
    assert run_layout(tmp_path / "3d").startswith("world 8 = pp 2 x dp 2 (replicate 2 x shard 1) x sp 1 x tp 2; ep 2 |")
