"""Data efficiency under pipeline parallelism reproduces the single process.

random-LTD draws each dropping layer's token subsets from its own stream (seed, data-parallel rank, layer,
draw), so pipeline stages, which run some of the layers, draw what one process running all of them draws,
and the schedule's shape-inference forward takes no draw. The sequence-length curriculum changes the batch
shape between steps; the pipeline keeps one schedule per shape.

The recipe runs both at once (seqlen curriculum in pack mode, which also changes the row count, and
random-LTD in the middle layers) with evaluation every 5 steps (eval/train switches re-run the schedule's
shape inference): pp 2 against one process, losses and validation losses within 2e-5, exported parameters
within 5e-5 (fp32 summation order: gradients averaged over micro-batches by the schedule, the tied
embedding's gradient summed across stages).
"""

from __future__ import annotations

import torch

from dsrecipes.data_efficiency import RandomLTD, RandomLTDScheduler
from dsrecipes.models import GPT, ModelConfig


def _gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(style="gpt2", n_layer=4, n_head=4, d_model=32, max_seq_len=32, vocab_size=64))


def _ltd(model, layer_ids=(1, 2)) -> RandomLTD:
    ltd = RandomLTD(model, list(layer_ids), RandomLTDScheduler(min_value=8, max_value=32, require_steps=10,
                                                               seq_per_step=1))
    ltd.update(0)
    return ltd


def test_random_ltd_layers_draw_the_same_subsets_whichever_layers_a_process_runs():
    """A 'stage' running block 2 alone draws, pass after pass, what block 2 draws in the whole model."""
    whole, stage = _gpt(), _gpt()
    whole_ltd, stage_ltd = _ltd(whole), _ltd(stage, layer_ids=(2,))
    x = torch.randn(2, 32, 32)
    for _ in range(3):
        whole(torch.randint(0, 64, (2, 32)))
        stage.blocks[2](x)
        assert torch.equal(whole_ltd.last_indices[2], stage_ltd.last_indices[2])


def test_random_ltd_paused_draws_do_not_count():
    """A pass inside paused() (a pipeline schedule's shape inference) leaves the next real draw unchanged."""
    a, b = _gpt(), _gpt()
    la, lb = _ltd(a), _ltd(b)
    ids = torch.randint(0, 64, (2, 32))
    with la.paused():
        a(ids)
    a(ids)
    b(ids)
    assert la.draws == lb.draws == {1: 1, 2: 1}
    assert torch.equal(la.last_indices[1], lb.last_indices[1])


def test_random_ltd_state_from_before_per_layer_streams_loads():
    """Checkpoints written with one draw count for all layers resume with the count split over the layers."""
    ltd = _ltd(_gpt())
    state = ltd.state_dict()
    state["draws"] = 6
    ltd.load_state_dict(state)
    assert ltd.draws == {1: 3, 2: 3}
