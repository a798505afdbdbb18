"""Pipeline ranks build only their own stages (issue 24, item 6): a GPT built on the meta device, of which
materialize_pipeline_rank allocates what one pipeline rank runs, holds exactly the single process's initial
values (every local tensor bit-identical, the random stream left where one process leaves it) and nothing
else. The CLI path is the pipeline equivalence tests' (tests/integration/equivalence/table.py)."""

from __future__ import annotations

import pytest
import torch

from dsrecipes.distributed.pipeline_parallel import materialize_pipeline_rank
from dsrecipes.models import GPT, ModelConfig
from dsrecipes.models.moe_config import MoEConfig


def _cfg(style: str, tie: bool) -> ModelConfig:
    return ModelConfig(style=style, n_layer=4, n_head=4, d_model=32, max_seq_len=32, vocab_size=64, tie_embeddings=tie)


@pytest.mark.parametrize("style, tie, moe", [("gpt2", True, False), ("llama", False, False), ("gpt2", False, True)])
@pytest.mark.parametrize("rank, schedule, partition", [(0, "1f1b", "uniform"), (1, "1f1b", "parameters"),
                                                       (0, "interleaved_1f1b", "uniform"), (1, "interleaved_1f1b", "uniform")])
def test_a_pipeline_rank_holds_exactly_its_stages_at_the_single_process_values(style, tie, moe, rank, schedule, partition):
    cfg, moe_cfg = _cfg(style, tie), MoEConfig(num_experts=4, k=2) if moe else None
    torch.manual_seed(0)
    reference = GPT(cfg, moe=moe_cfg)
    next_draw = torch.rand(4)
    torch.manual_seed(0)
    with torch.device("meta"):
        gpt = GPT(cfg, moe=moe_cfg)
    blocks = materialize_pipeline_rank(gpt, rank, 2, schedule, partition, torch.device("cpu"))
    assert torch.equal(torch.rand(4), next_draw)  # the random stream is where the single process leaves it
    state, ref_state = gpt.state_dict(), reference.state_dict()
    local = {k for k, v in state.items() if not v.is_meta}
    first = rank == 0
    expected = {k for k in ref_state if k.startswith(tuple(f"blocks.{i}." for i in blocks))}
    expected |= {k for k in ref_state if not k.startswith("blocks.") and
                 ((first and k.startswith(("tok_emb", "pos_emb"))) or (not first and k.startswith(("final_norm", "lm_head"))))}
    if tie:  # the one tied tensor is materialised under both names on either end
        expected |= {"tok_emb.weight", "lm_head.weight"}
    assert local == expected
    for name in local:
        assert torch.equal(state[name], ref_state[name]), name
    assert sum(state[k].numel() for k in local) < 0.6 * sum(v.numel() for v in ref_state.values())
    if tie:
        assert gpt.lm_head.weight is gpt.tok_emb.weight
    if style == "llama":
        assert torch.equal(gpt.rope_cos, reference.rope_cos) and torch.equal(gpt.rope_sin, reference.rope_sin)
