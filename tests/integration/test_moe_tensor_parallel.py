"""MoE under tensor-parallel inference (expert-tensor parallelism) generates what one process generates (CPU/gloo).

Training under tp with MoE is a row of the layout-equivalence table (tests/integration/equivalence/table.py:
tp2-moe, dp2xtp2xep2-moe, gpt_3d_moe).
"""

import pytest
import torch


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


@pytest.mark.timeout(120)
def test_tp2_moe_inference_equals_single_process():
    """An MoE model (gpt2 with a residual MoE; llama) under tensor-parallel inference generates the
    single process's tokens; logits within fp32 reduction-order noise (1e-5)."""
    from tests.helpers.distributed import run_distributed

    run_distributed(_tp_inference_equals_single, 2, timeout_s=150)
