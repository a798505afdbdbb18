"""Every row of the layout-equivalence table (table.py) reproduces its single-process reference, and the rows that
resume, resume in one process.

    pytest tests/integration/equivalence                       # the whole table
    pytest tests/integration/equivalence -k "dp2-zero3"        # one row
    pytest tests/integration/equivalence -m "not matrix"       # without the world >= 4 rows

Runs go through the real CLI and are cached for the whole pytest run (tests/helpers/run_cache.py): the references
train once however many rows and workers read them, and a row's two checks read its one run. The rows are grouped
by family into classes only so that pytest-xdist (loadscope: a class is a unit of work) spreads them over its
workers; the table is one list.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.equivalence import assert_resumed_matches, assert_same_training
from tests.helpers.run_cache import cached_run
from tests.integration.equivalence.table import (
    ADAMW_BF16_STATE,
    CHECKPOINT_STEP,
    COMPRESSED,
    DATA_EFFICIENCY,
    GPT,
    HF_REFERENCES,
    MUON,
    ROWS,
    STEPS,
    Row,
    merged,
    row,
)


def family(row: Row) -> str:
    if row.reference in HF_REFERENCES:
        return "hf"
    if any(o.startswith("compile=") for o in row.layout):
        return "compile"
    if row.reference in (COMPRESSED, DATA_EFFICIENCY, MUON, ADAMW_BF16_STATE):
        return "features"
    if "moe" in row.reference.name:
        return "moe"
    if any(o.startswith(("parallel.tp=", "parallel.pp=", "parallel.sp=")) for o in row.layout):
        return "model_parallel"
    return "data_parallel"


def params(rows) -> list:
    """pytest.param per row: its id, its timeout, and the matrix marker at world size >= 4."""
    out = []
    for r in rows:
        marks = [pytest.mark.timeout(2 * r.timeout)]  # the reference may be training on the other worker first
        if r.world_size >= 4:
            marks.append(pytest.mark.matrix)
        out.append(pytest.param(r, id=r.id, marks=marks))
    return out


def check_row(row: Row, tmp_path_factory) -> None:
    reference = cached_run(tmp_path_factory, row.reference.overrides())
    run = cached_run(tmp_path_factory, row.overrides(), timeout=row.timeout)
    assert_same_training(run.losses, run.params, reference.losses, reference.params, row.tolerance.loss,
                         row.tolerance.params, trained_by=row.reference.trained_by)
    assert_verify_verdict(run, reference, row.tolerance)
    for key, atol in row.metrics:
        got, want = run.metric(key), reference.metric(key)
        assert len(got) == len(want) > 0, (key, got, want)
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=0, atol=atol, msg=key)
    layout = run.layout
    for fragment in row.layout_line:
        assert fragment in layout, f"{fragment!r} not in the run's layout line: {layout}"
    if row.check is not None:
        row.check(run, reference)


def assert_verify_verdict(run, reference, tolerance) -> None:
    """`python -m dsrecipes.verify`'s own verdict on the row's two runs (dsrecipes.verify.compare.judge: per-step loss
    and lr, max |param diff| per tensor group) at the row's tolerance: equivalent, as the table's assertions found. So
    every row of the table (every supported row of the compatibility matrix) is judged by verify's code too."""
    from dsrecipes.verify.compare import judge, read_series

    result = judge(read_series(run.run_dir / "metrics.jsonl"), read_series(reference.run_dir / "metrics.jsonl"),
                   run.params, reference.params, tolerance, STEPS)
    assert result.equivalent, result.message


def check_resume(row: Row, tmp_path_factory) -> None:
    reference = cached_run(tmp_path_factory, row.reference.overrides())
    run = cached_run(tmp_path_factory, row.overrides(), timeout=row.timeout)
    resumed = cached_run(tmp_path_factory, row.resume_overrides(run.checkpoint(CHECKPOINT_STEP)))
    assert len(resumed.losses) == STEPS - CHECKPOINT_STEP
    assert_resumed_matches(resumed.losses, resumed.params, reference.losses, reference.params, row.tolerance.loss,
                           row.tolerance.params)


def _family_class(name: str, doc: str):
    rows = [r for r in ROWS if family(r) == name]
    resuming = [r for r in rows if r.resume]

    class Family:
        @pytest.mark.parametrize("row", params(rows))
        def test_matches_reference(self, row, tmp_path_factory):
            check_row(row, tmp_path_factory)

    if resuming:
        @pytest.mark.parametrize("row", params(resuming))
        def test_resumes_in_one_process(self, row, tmp_path_factory):
            check_resume(row, tmp_path_factory)

        Family.test_resumes_in_one_process = test_resumes_in_one_process

    Family.__doc__ = doc
    return Family


TestDataParallel = _family_class("data_parallel", "Data parallelism and ZeRO 0-3 (+ offload, checkpointing).")
TestModelParallel = _family_class("model_parallel", "Tensor, pipeline and sequence parallelism and their products.")
TestMixtureOfExperts = _family_class("moe", "Expert, expert-data and expert-tensor parallelism; MoE under pipelines.")
TestCompile = _family_class("compile", "compile=blocks / full against the eager single process.")
TestFeatures = _family_class("features", "Compression, data efficiency and optimizers under sharding and pipelines.")
TestHuggingFace = _family_class("hf", "Hugging Face checkpoints: the transformers module and dsrecipes' blocks.")


def test_every_row_is_in_one_family_class():
    checked = {r.id for cls in (TestDataParallel, TestModelParallel, TestMixtureOfExperts, TestCompile, TestFeatures,
                           TestHuggingFace)
               for mark in cls.test_matches_reference.pytestmark if mark.name == "parametrize"
               for p in mark.args[1] for r in p.values}
    assert checked == {r.id for r in ROWS}


@pytest.mark.matrix
@pytest.mark.timeout(800)
def test_a_zero3_checkpoint_of_world_2_resumes_at_world_4(tmp_path_factory):
    """The dp2-zero3 row's step-5 checkpoint (one DCP shard file per rank) resumes at world 4 (micro-batch 2, the same
    global batch) with the world-2 run's losses for steps 6-10; at world 1 it is the row's resume check."""
    run = cached_run(tmp_path_factory, row("dp2-zero3").overrides())
    checkpoint = run.checkpoint(CHECKPOINT_STEP)
    assert sorted(p.name for p in (checkpoint / "dcp").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    resumed = cached_run(tmp_path_factory, merged(GPT.overrides(), (
        "zero.stage=3", "launcher.nproc_per_node=4", "trainer.train_micro_batch_size_per_gpu=2",
        f"trainer.resume={checkpoint}")))
    assert len(resumed.losses) == STEPS - CHECKPOINT_STEP
    torch.testing.assert_close(torch.tensor(resumed.losses), torch.tensor(run.losses[CHECKPOINT_STEP:]), rtol=0,
                               atol=2e-5)
