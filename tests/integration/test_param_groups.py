"""`dsrecipes.initialize(model_parameters=...)`: the caller's parameter groups, DeepSpeed's argument, at every ZeRO stage.

The configured optimizer is built over the groups the caller gives (per-group lr, weight decay ...).
At world 2, ZeRO 0-3 (DDP, ZeroRedundancyOptimizer, replicated ZeRO-2, FSDP2, whose fully_shard
replaces the parameter objects: the groups are found again by parameter name) must train like one
process running torch.optim.SGD over the same groups. Tolerance: SGD + momentum differs from one
process only in fp32 summation order (half batches averaged), ~1e-7, so parameters agree within 1e-6
(as in test_zero2.py); the two groups' lrs differ 10x, so ignoring the groups misses by far more.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.distributed import run_distributed
from tests.unit.test_param_groups import _reference, _train

STAGES = (0, 1, 2, 3)


def _all_stages(rank: int, world: int, results: str) -> None:
    out = {stage: _train(rank, world, stage) for stage in STAGES}
    if rank == 0:
        torch.save(out, results)


@pytest.fixture(scope="module")
def world2_runs(tmp_path_factory):
    results = tmp_path_factory.mktemp("param_groups") / "world2.pt"
    run_distributed(_all_stages, 2, str(results), timeout_s=240)
    return torch.load(results)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("stage", STAGES)
def test_two_groups_with_different_lr_train_like_one_process_at_world_2(world2_runs, stage):
    state, lrs = world2_runs[stage]
    assert lrs == [0.2, 0.02]
    reference = _reference(2)
    for name, value in reference.items():
        torch.testing.assert_close(state[name], value, rtol=0, atol=1e-6, msg=f"zero.stage={stage}: {name}")
    # the groups matter: one group at the config's lr ends far from there
    assert max((state[k] - v).abs().max().item() for k, v in _reference(2, groups=False).items()) > 1e-2
