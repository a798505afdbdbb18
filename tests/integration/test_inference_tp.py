"""The multi-process, CLI and launcher tests (marked slow) whose in-process twins are tests/unit/test_inference_tp.py;
that module's docstring describes both halves.
"""

from __future__ import annotations

import pytest
import torch

from dsrecipes.inference import init_inference
from tests.helpers.distributed import run_distributed
from tests.unit.test_inference_tp import _model

PROMPTS = [[3, 1, 4, 1, 5, 9], [2, 7], [1, 8, 2, 8]]


def _tp_equals_single(rank: int, world: int, style: str, kv, quant) -> None:
    single = init_inference(_model(style, kv), quant=quant)
    tp = init_inference(_model(style, kv), tensor_parallel={"tp_size": world}, quant=quant)
    assert tp.model.blocks[0].attn.n_head == 4 // world  # really sharded
    assert tp.model.lm_head.shard.out_features == 27  # vocabulary 53 over 2 ranks: 27 + 26 rows (+1 zero row)
    ids = torch.tensor([PROMPTS[0]])
    torch.testing.assert_close(tp.logits(ids), single.logits(ids), atol=1e-5, rtol=1e-5)
    kwargs = dict(max_new_tokens=12)
    assert tp.generate(PROMPTS, **kwargs).tokens == single.generate(PROMPTS, **kwargs).tokens
    sampled = dict(max_new_tokens=12, temperature=0.9, top_p=0.9, seed=5)
    assert tp.generate(PROMPTS, **sampled).tokens == single.generate(PROMPTS, **sampled).tokens
    assert tp.weight_bytes() < single.weight_bytes()


CASES = [("gpt2", None, None), ("llama", 2, None), ("gpt2", None, {"bits": 8, "group_size": 16})]


def _all_cases(rank: int, world: int) -> None:
    for style, kv, quant in CASES:  # one process group for all cases: spawning dominates the cost
        _tp_equals_single(rank, world, style, kv, quant)


@pytest.mark.slow
def test_tp2_generation_equals_single_process():
    """gpt2 (MHA), llama with grouped-query attention, and int8 weights, each sharded over 2 ranks."""
    run_distributed(_all_cases, 2, timeout_s=150)
