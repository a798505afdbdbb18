"""The multi-process, CLI and launcher tests (marked slow) whose in-process twins are tests/unit/test_param_groups.py;
that module's docstring describes both halves.
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
