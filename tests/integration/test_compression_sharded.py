"""Compression runs that are not layout rows: a compressed run resumed from its own step-5 checkpoint, and ZeRO-2
with bf16 master weights keeping the pruned entries at exactly zero.

The compression recipe under sharding (dp 2 at ZeRO-2 and ZeRO-3, tp 2, dp 2 x tp 2) is held against one process
by the layout-equivalence table (tests/integration/equivalence/table.py: the compression-* rows and COMPRESSED).
"""

import pytest

from tests.helpers.equivalence import assert_resumed_matches
from tests.helpers.run_cache import cached_run
from tests.integration.equivalence.table import CHECKPOINT_STEP, COMPRESSED, STEPS, merged, world

pytestmark = pytest.mark.filterwarnings("ignore:dsrecipes.kernels")


@pytest.mark.timeout(300)
def test_dp2_zero2_bf16_master_keeps_pruned_weights_zero(tmp_path_factory):
    """ZeRO-2 with precision.master_weights: the fp32 master shards are separate copies, gathered into the bf16
    parameters after every step, so the masks must reach them or the pruned weights come back. The export
    (from the masters) holds exact zeros: half of fc_in's rows, the same columns of fc_out, over half of q_proj."""
    params = cached_run(tmp_path_factory, merged(COMPRESSED.overrides(), ("zero.stage=2", *world(2, 4),
                                                                          "precision=bf16_master"))).params
    for i in range(4):
        dead_rows = (params[f"blocks.{i}.mlp.fc_in.weight"] == 0).all(1)
        assert int(dead_rows.sum()) == dead_rows.numel() // 2
        assert (params[f"blocks.{i}.mlp.fc_out.weight"] == 0).all(0).equal(dead_rows)
        assert (params[f"blocks.{i}.attn.q_proj.weight"] == 0).float().mean() >= 0.5


@pytest.mark.timeout(600)
def test_a_compressed_run_resumes_from_its_own_checkpoint(tmp_path_factory):
    """The one-process compressed run's step-5 checkpoint (masks and bit schedule in the callback state), resumed,
    ends with the uninterrupted run's losses (2e-5) and weights (5e-5)."""
    reference = cached_run(tmp_path_factory, COMPRESSED.overrides())
    assert len(reference.losses) == STEPS
    resumed = cached_run(tmp_path_factory, merged(COMPRESSED.overrides(), (
        f"trainer.resume={reference.checkpoint(CHECKPOINT_STEP)}",)))
    assert_resumed_matches(resumed.losses, resumed.params, reference.losses, reference.params)
