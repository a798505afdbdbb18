"""Tensor-parallel GPT layouts (TP=2, CPU/gloo, in process) against the unsharded model.

Every worker builds the same seeded GPT and batch, runs the unsharded reference itself, then a copy
sharded by apply_tensor_parallel, with the activations between the sharded layers replicated or
sequence-parallel (norms and residuals on seq/2 rows; learned position embeddings sliced), and
compares the loss, the gathered logits and every parameter's gathered gradient, for gpt2 (learned
positions, GELU, tied embeddings) and llama (RoPE, SwiGLU, grouped-query attention) styles. The
replicated layout also runs an odd sequence length; the sequence-parallel one refuses it with a
clear error, and text sampling (which grows the sequence one token at a time) right-pads for it and
samples the same tokens as the unsharded model.

Tolerance (fp32): loss/logits 1e-5, gradients 1e-5 absolute + 1e-4 relative: the same math with
matmuls split over the hidden dimension and summed by all-reduce / reduce-scatter, and replicated
weights' gradients summed over the ranks' sequence halves.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from dsrecipes.distributed.tensor_parallel import apply_tensor_parallel, full_logits
from dsrecipes.models import GPT
from dsrecipes.models.config import ModelConfig
from dsrecipes.models.sampling import sample_tokens
from tests.helpers.distributed import run_distributed

FWD = dict(rtol=1e-5, atol=1e-5)
GRAD = dict(rtol=1e-4, atol=1e-5)
VOCAB = 64
STYLES = {
    "gpt2": dict(style="gpt2", n_head=4, tie_embeddings=True),
    "llama_gqa": dict(style="llama", n_head=4, n_kv_head=2),
}


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _check(rank: int, world: int, style: str, sequence_parallel: bool) -> None:
    torch.manual_seed(0)
    ref = GPT(ModelConfig(n_layer=2, d_model=64, vocab_size=VOCAB, max_seq_len=32, **STYLES[style]))
    tp = copy.deepcopy(ref)
    apply_tensor_parallel(tp, init_device_mesh("cpu", (world,)), sequence_parallel=sequence_parallel)
    assert tp.activation_seq_shards == (world if sequence_parallel else 1)
    if sequence_parallel:
        with pytest.raises(ValueError, match="sequence length 13 is not divisible by parallel.tp=2"):
            tp(torch.zeros(1, 13, dtype=torch.long))
        want = sample_tokens(ref, [1, 2, 3], max_new_tokens=6, max_seq_len=8, temperature=0)
        assert sample_tokens(tp, [1, 2, 3], max_new_tokens=6, max_seq_len=8, temperature=0) == want
    for seq in (16,) if sequence_parallel else (16, 13):
        ids = torch.randint(0, VOCAB, (2, seq + 1), generator=torch.Generator().manual_seed(seq))
        inputs, labels = ids[:, :-1], ids[:, 1:]
        ref.zero_grad()
        tp.zero_grad()
        want = ref(inputs, labels=labels)
        want.loss.backward()
        with loss_parallel():
            got = tp(inputs, labels=labels)
            got.loss.backward()
        torch.testing.assert_close(got.loss, want.loss, **FWD)
        torch.testing.assert_close(full_logits(got.logits), want.logits, **FWD)
        ref_grads = dict(ref.named_parameters())
        for name, param in tp.named_parameters():
            torch.testing.assert_close(_full(param.grad), ref_grads[name].grad, **GRAD, msg=f"{name} at seq {seq}")


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("sequence_parallel", [True, False], ids=["sequence_parallel", "replicated"])
@pytest.mark.parametrize("style", sorted(STYLES))
def test_tp2_layout_matches_unsharded_model(style, sequence_parallel):
    run_distributed(_check, 2, style, sequence_parallel)
