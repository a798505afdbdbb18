"""MoE under tensor parallelism (expert-tensor parallelism) reproduces the single process (CPU/gloo, real CLI).

tp 2: both ranks see the same micro-batches, route them alike and each holds half of every expert's
hidden width; the partial expert outputs are summed over tp. dp 2 x tp 2 x ep 2 (world 4, ZeRO-3):
the ep groups hold ranks of one tp rank (data-parallel peers), so tokens travel between data shards.

Reference: one process at micro 4 x accumulation 4 (tp 2 keeps micro 4 x accumulation 4; dp 2 gives
rank r's i-th micro-batch of micro 4 x accumulation 2 as the single process's (2i + r)-th), so gating,
capacity and the auxiliary loss see the same token groups. Tolerance as tests/test_moe_distributed.py
(losses 2e-5, exported parameters 5e-5): only fp32 summation orders differ (the expert outputs summed
over the tp ranks' hidden slices, gradients over ranks).
"""

import pytest
import torch

from tests.helpers.equivalence import STEPS, assert_matches_single_process, common, run_and_read, run_layout
from tests.integration import test_moe_distributed
from tests.integration.test_moe_distributed import MOE

moe_single_process = test_moe_distributed.moe_single_process  # the reference fixture: micro 4 x accumulation 4


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tp2_moe_reproduces_single_process_and_resumes_in_one(tmp_path, datasets_cache, moe_single_process):
    """tp 2 saves at step 5 (experts as hidden-dim shards of global tensors in DCP); one process resumes it."""
    micro = ["trainer.train_micro_batch_size_per_gpu=4", "trainer.gradient_accumulation_steps=4"]
    losses, params = run_and_read(tmp_path, "tp2", common(datasets_cache) + MOE + micro + [
        "parallel.tp=2", "launcher.nproc_per_node=2", "checkpoint.interval=5"])
    assert params["blocks.0.mlp.experts.w_in"].shape == moe_single_process[1]["blocks.0.mlp.experts.w_in"].shape
    assert_matches_single_process(losses, params, *moe_single_process)
    assert "tp 2" in run_layout(tmp_path / "tp2")
    (checkpoint,) = list((tmp_path / "tp2").glob("outputs/*/*/checkpoints/step_5"))
    resumed, resumed_params = run_and_read(tmp_path, "one", common(datasets_cache) + MOE + micro + [
        "launcher.nproc_per_node=1", f"trainer.resume={checkpoint}"])
    ref_losses, ref_params = moe_single_process
    torch.testing.assert_close(torch.tensor(resumed), torch.tensor(ref_losses[5:]), rtol=0, atol=2e-5)
    for name in ref_params:
        torch.testing.assert_close(resumed_params[name], ref_params[name], rtol=0, atol=5e-5, msg=name)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dp2_tp2_ep2_moe_reproduces_single_process(tmp_path, datasets_cache, moe_single_process):
    losses, params = run_and_read(tmp_path, "w4", common(datasets_cache) + MOE + [
        "parallel.tp=2", "moe.ep_size=2", "zero.stage=3", "launcher.nproc_per_node=4",
        "trainer.train_micro_batch_size_per_gpu=4"])
    assert_matches_single_process(losses, params, *moe_single_process)
    layout = run_layout(tmp_path / "w4")
    assert layout.startswith("world 4 = pp 1 x dp 2 (replicate 1 x shard 2) x sp 1 x tp 2; ep 2"), layout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ep2_bf16_master_weights_stage0_match_single_process_and_resume(tmp_path, datasets_cache):
    """EP=2 with fp32 master weights beside a bf16 model at zero.stage 0: the full-state checkpoint and the
    export hold every expert (fp32 masters, optimizer moments); one process resumes the step-5 checkpoint.

    Reference: one process with the same precision at micro 8 (the batch a resume needs: micro x world as
    saved); drop_tokens=false and no aux loss make every token's output independent of how tokens are
    grouped (as tests/test_moe_distributed.py's resume). Tolerance: bf16 gradients rounded from
    half-batch sums at world 2 (tests/test_precision_matrix.py's 5e-3 for parameters); losses within 1e-2.
    """
    bf16 = common(datasets_cache) + MOE + ["precision=bf16_master", "moe.drop_tokens=false", "moe.aux_loss_coef=0"]
    one = ["launcher.nproc_per_node=1", "trainer.train_micro_batch_size_per_gpu=8"]
    ref_losses, ref_params = run_and_read(tmp_path, "single", bf16 + one)
    losses, params = run_and_read(tmp_path, "ep2", bf16 + [
        "moe.ep_size=2", "zero.stage=0", "launcher.nproc_per_node=2", "trainer.train_micro_batch_size_per_gpu=4",
        "checkpoint.interval=5"])
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=0, atol=1e-2)
    for name in ref_params:
        torch.testing.assert_close(params[name], ref_params[name], rtol=0, atol=5e-3, msg=name)
    (checkpoint,) = list((tmp_path / "ep2").glob("outputs/*/*/checkpoints/step_5"))
    assert torch.load(checkpoint / "model.pt")["blocks.0.mlp.experts.w_in"].shape[0] == 4  # every expert
    resumed, resumed_params = run_and_read(tmp_path, "one", bf16 + one + [f"trainer.resume={checkpoint}"])
    assert len(resumed) == STEPS - 5
    torch.testing.assert_close(torch.tensor(resumed), torch.tensor(ref_losses[5:]), rtol=0, atol=1e-2)
    for name in ref_params:
        torch.testing.assert_close(resumed_params[name], ref_params[name], rtol=0, atol=5e-3, msg=name)


def _moe_model(style: str, residual: bool):
    from dsrecipes.models import GPT, ModelConfig
    from dsrecipes.models.moe_config import MoEConfig

    torch.manual_seed(0)
    cfg = ModelConfig(style=style, n_layer=2, n_head=4, d_model=32, vocab_size=53, max_seq_len=40)
    return GPT(cfg, moe=MoEConfig(num_experts=4, k=2, use_residual=residual, eval_capacity_factor=2.0)).eval()


def _tp_inference_equals_single(rank: int, world: int) -> None:
    from dsrecipes.inference import init_inference

    prompts = [[3, 1, 4, 1, 5, 9], [2, 7], [1, 8, 2, 8]]
    for style, residual in (("gpt2", True), ("llama", False)):
        single = init_inference(_moe_model(style, residual))
        tp = init_inference(_moe_model(style, residual), tensor_parallel={"tp_size": world})
        experts = tp.model.blocks[0].mlp.experts
        assert experts.w_in.shape[-1] * world == single.model.blocks[0].mlp.experts.w_in.shape[-1]  # really sliced
        ids = torch.tensor([prompts[0]])
        torch.testing.assert_close(tp.logits(ids), single.logits(ids), atol=1e-5, rtol=1e-5)
        assert tp.generate(prompts, max_new_tokens=12).tokens == single.generate(prompts, max_new_tokens=12).tokens


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_tp2_moe_inference_equals_single_process():
    """An MoE model (gpt2 with a residual MoE; llama) under tensor-parallel inference generates the
    single process's tokens; logits within fp32 reduction-order noise (1e-5)."""
    from tests.helpers.distributed import run_distributed

    run_distributed(_tp_inference_equals_single, 2, timeout_s=150)
