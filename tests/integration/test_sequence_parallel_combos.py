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

import pytest

from tests.helpers.equivalence import assert_matches_single_process, common, run_and_read, run_metric


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("stage, tp_sequence_parallel", [(0, "true"), (3, "false")])
def test_sp2_tp2_reproduces_single_process(tmp_path, datasets_cache, single_gpt, stage, tp_sequence_parallel):
    losses, params = run_and_read(tmp_path, "sp2tp2", common(datasets_cache) + [
        "trainer.train_micro_batch_size_per_gpu=8", "parallel.sp=2", "parallel.tp=2", f"zero.stage={stage}",
        f"parallel.tp_sequence_parallel={tp_sequence_parallel}", "launcher.nproc_per_node=4"])
    assert_matches_single_process(losses, params, *single_gpt)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sp2_pp2_reproduces_single_process(tmp_path, tmp_path_factory, datasets_cache, single_gpt):
    losses, params = run_and_read(tmp_path, "sp2pp2", common(datasets_cache) + [
        "trainer.train_micro_batch_size_per_gpu=8", "parallel.sp=2", "parallel.pp=2", "launcher.nproc_per_node=4"])
    assert_matches_single_process(losses, params, *single_gpt)
    # single_gpt's run folder (pytest also links it as single_gptcurrent): its final validation loss
    (reference,) = {p.resolve() for p in tmp_path_factory.getbasetemp().glob("single_gpt*/single")}
    assert run_metric(tmp_path / "sp2pp2", "val/loss")[-1] == pytest.approx(run_metric(reference, "val/loss")[-1], abs=2e-5)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_sp2_tp2_pp2_reproduces_single_process(tmp_path, datasets_cache, single_gpt):
    losses, params = run_and_read(tmp_path, "sp2tp2pp2", common(datasets_cache) + [
        "trainer.train_micro_batch_size_per_gpu=8", "parallel.sp=2", "parallel.tp=2", "parallel.pp=2",
        "launcher.nproc_per_node=8"])
    assert_matches_single_process(losses, params, *single_gpt)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_llama_gqa_sp2_pp2_reproduces_single_process(tmp_path, datasets_cache):
    """Rotary tables at the chunk's positions on every stage (gpt2 only offsets the first stage's position
    embedding), grouped-query kv heads repeated for Ulysses: against its own single-process run."""
    base = common(datasets_cache) + ["trainer.train_micro_batch_size_per_gpu=8", "model.style=llama",
                                     "model.n_kv_head=2"]
    reference = run_and_read(tmp_path, "single", base + ["launcher.nproc_per_node=1"])
    losses, params = run_and_read(tmp_path, "sp2pp2", base + ["parallel.sp=2", "parallel.pp=2",
                                                              "launcher.nproc_per_node=4"])
    assert_matches_single_process(losses, params, *reference)
