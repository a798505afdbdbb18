"""`python -m dsrecipes.verify` plans every row of the layout-equivalence table as the table checks it.

For each row (every supported row of the compatibility matrix names rows here), verify's planner, given the row's
recipe with verify.reference_precision=same (the table's references keep the row's precision):
* accepts the layout (the training CLI's checks pass) at the row's world size;
* plans one reference process whose model, MoE, optimizer, schedule, precision, compression and data-efficiency
  groups are the table's reference's, on the same global batch;
* holds the row to the row's tolerance (16-bit rows: verify's one 16-bit tolerance, never tighter than the row's).

Together with test_layouts.py's `assert_verify_verdict` (verify's verdict on each row's two runs) this is the whole
table through verify without training any run twice; tests/integration/test_verify.py runs the command itself
(ZeRO-3 at world 2, pp 2 x dp 2, a shrunk model, torchrun, and the two NOT EQUIVALENT cases). In-process (no
training): about 1 s of Hydra composition per row.
"""

from __future__ import annotations

import functools

import pytest
from omegaconf import OmegaConf

from dsrecipes.config.preflight import check_train_job
from dsrecipes.config.store import compose
from dsrecipes.verify.config import VerifyConfig
from dsrecipes.verify.plan import build_plan
from tests.helpers.hf_models import resolve_checkpoints
from tests.integration.equivalence.table import ROWS, STEPS, Row

GROUPS = ("model", "moe", "optimizer", "lr_scheduler", "precision", "compression", "data_efficiency")


@functools.cache
def reference_config(overrides: tuple[str, ...]):
    """The table's reference, composed once per module (a dozen references serve the 48 rows)."""
    return compose(list(overrides))


def global_batch(cfg) -> int:
    return int(cfg.trainer.train_micro_batch_size_per_gpu) * int(cfg.trainer.gradient_accumulation_steps)


@pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in ROWS])
def test_verify_plans_the_row_against_the_tables_reference(row: Row, tmp_path_factory):
    # a Hugging Face row's model.path=@hf:ARCH names the session's tiny checkpoint (tests/helpers/hf_models.py)
    overrides = resolve_checkpoints(row.overrides(), tmp_path_factory)
    plan = build_plan(overrides, VerifyConfig(steps=STEPS, reference_precision="same"), compose, check_train_job)
    assert (plan.candidate_world, plan.reference_world) == (row.world_size, 1)
    reference = tuple(resolve_checkpoints(row.reference.overrides(), tmp_path_factory))
    planned, table = compose(plan.reference), reference_config(reference)
    for group in GROUPS:
        assert OmegaConf.to_container(planned[group], resolve=True) == \
            OmegaConf.to_container(table[group], resolve=True), group
    assert global_batch(planned) == global_batch(table)  # one process: the global batch is micro x accumulation
    if row.tolerance != plan.tolerance:  # only 16-bit rows: verify has one 16-bit tolerance (BF16_EXPERTS is tighter)
        assert str(table.precision.dtype) != "fp32", (row.tolerance, plan.tolerance)
        assert plan.tolerance.loss >= row.tolerance.loss and plan.tolerance.params >= row.tolerance.params
