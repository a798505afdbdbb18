"""Tensor-parallel inference (dsrecipes.inference.tensor_parallel) at world size 2 on gloo: generation
equals single-process generation token for token; logits agree to fp32 reduction-order noise (1e-5).
The vocabulary (53) does not divide by 2, so the vocab-parallel LM head's padded last shard is covered.

int8 is checked with groups of 16, which divide every row-parallel shard's width: each rank then holds
exactly the groups the single process has. (With per-channel scales a row-parallel shard gets its own
scale per output row over its half of the columns, a slightly different, finer quantization.)"""

from __future__ import annotations

import pytest
import torch

from dsrecipes.inference import init_inference
from dsrecipes.models import GPT, ModelConfig


def _model(style: str, kv) -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(style=style, n_layer=2, n_head=4, n_kv_head=kv, d_model=32, vocab_size=53, max_seq_len=40)).eval()


def test_tp_size_must_match_the_launch_and_divide_heads():
    with pytest.raises(ValueError, match="tensor_parallel.tp_size=2 needs exactly 2 processes, but the world size is 1"):
        init_inference(_model("gpt2", None), tensor_parallel=2)
    with pytest.raises(ValueError, match=r"tensor_parallel.tp_size=4 does not divide the kv heads \(model.n_kv_head=2\)"):
        init_inference(_model("llama", 2), mp_size=4)
