"""`python -m dsrecipes.verify` end to end: ZeRO-3 at world 2 (and pp 2 x dp 2, matrix tier) equal one fp32 process;
a shrunk model (verify.shrink=true) under tensor parallelism equals one process of the same shrunk model;
precision=bf16 against the fp32 reference and a deliberately broken layout do not (exit 1, step and group named).

The command runs in this process (dsrecipes.verify.cli.main) with a runner that forks each training run from the
test's fork server (tests/helpers/cli.py) instead of a fresh interpreter, and reuses a reference already trained
with the same overrides: every test here but the shrunk one has the same reference (one process, micro-batch
4 x accumulation 4).
The broken layout comes through the test-only hook DSRECIPES_VERIFY_TEST_INJECT (dsrecipes/verify/plan.py): an
override the candidate alone runs, standing in for a layout that computes something else.
"""

from __future__ import annotations

import json
import shutil

import pytest

from dsrecipes.verify.cli import main
from dsrecipes.verify.plan import INJECT_ENV
from tests.helpers.cli import run_cli

RECIPE = ["model=gpt_debug", "model.max_seq_len=64", "data.max_bytes=300000", "trainer.train_batch_size=16",
          "trainer.train_micro_batch_size_per_gpu=4", "logger=jsonl", "verify.steps=4"]
ZERO3_WORLD_2 = [*RECIPE, "zero.stage=3", "launcher.nproc_per_node=2", "trainer.gradient_accumulation_steps=2"]


@pytest.fixture(scope="module")
def verify(tmp_path_factory):
    """verify(args) -> (exit code, verify.json, stdout) of `python -m dsrecipes.verify ARGS`, its runs forked."""
    root = tmp_path_factory.mktemp("verify")
    cache = root / "datasets"
    cache.mkdir()
    trained: dict[tuple[str, ...], object] = {}

    def runner(overrides, run_dir, log_file, nproc, launcher, timeout_s):
        key = tuple(sorted(overrides))
        if key in trained:  # the same reference: copied, not trained again
            shutil.copytree(trained[key], run_dir)
            log_file.write_text(f"copied from {trained[key]}\n")
            return 0
        result = run_cli([*overrides, f"data.cache_dir={cache}", f"hydra.run.dir={run_dir}"], cwd=root, timeout=300)
        log_file.write_text(result.stdout + result.stderr)
        if result.returncode == 0:
            trained[key] = run_dir
        return result.returncode

    def call(args, capsys):
        folder = root / f"verify_{len(list(root.glob('verify_*')))}"
        code = main([*args, f"verify.dir={folder}"], runner=runner)
        out = capsys.readouterr().out
        report = json.loads((folder / "verify.json").read_text()) if (folder / "verify.json").exists() else None
        return code, report, out

    return call


@pytest.mark.timeout(600)
def test_zero3_at_world_2_equals_one_process(verify, capsys):
    code, report, out = verify(ZERO3_WORLD_2, capsys)
    assert code == 0, out
    verdict = report["verdict"]
    assert verdict["equivalent"] and [row["step"] for row in verdict["steps"]] == [1, 2, 3, 4]
    assert max(row["loss_diff"] for row in verdict["steps"]) <= 2e-5
    assert {g["group"] for g in verdict["groups"]} >= {"embeddings", "attention", "mlp", "norms"}
    assert report["candidate_world"] == 2 and report["reference_world"] == 1
    assert "trainer.gradient_accumulation_steps=4" in report["reference"]  # the same global batch in one process
    assert "EQUIVALENT" in out and "ref grad norm" in out


@pytest.mark.timeout(600)
def test_a_shrunk_model_of_the_family_keeps_the_layout_and_equals_one_process(verify, capsys):
    """verify.shrink=true trains gpt_tiny's family at 2 layers and width 96 (6 heads of 16 kept: tp 2 divides them)
    under tensor parallelism, against one process of the same shrunk model."""
    code, report, out = verify([*RECIPE, "model=gpt_tiny", "model.max_seq_len=64", "parallel.tp=2",
                                "launcher.nproc_per_node=2", "trainer.gradient_accumulation_steps=4",
                                "verify.shrink=true"], capsys)
    assert code == 0, out
    assert report["verdict"]["equivalent"] and report["candidate_world"] == 2 and report["reference_world"] == 1
    for run in ("candidate", "reference"):
        assert {"model.n_layer=2", "model.d_model=96"} <= set(report[run]), report[run]
    assert any(line.startswith("shrink: model.n_layer 4 -> 2") for line in report["adjustments"])
    assert "shrink: model.n_layer 4 -> 2" in out


@pytest.mark.timeout(600)
def test_bf16_against_the_fp32_reference_differs(verify, capsys):
    code, report, out = verify([*RECIPE, "precision=bf16", "launcher.nproc_per_node=1",
                                "trainer.gradient_accumulation_steps=4"], capsys)
    assert code == 1, out
    verdict = report["verdict"]
    assert verdict["first_step"] == 1 and verdict["first_group"] is not None
    assert "NOT EQUIVALENT: first differing step 1" in out and f"tensor group '{verdict['first_group']}'" in out
    assert "precision=bf16 is held to it" in report["tolerance_reason"]


@pytest.mark.timeout(600)
def test_a_broken_layout_differs(verify, capsys, monkeypatch):
    monkeypatch.setenv(INJECT_ENV, "optimizer.lr=3e-3")
    code, report, out = verify(ZERO3_WORLD_2, capsys)
    assert code == 1, out
    verdict = report["verdict"]
    assert verdict["first_step"] == 2  # step 1's loss is before any update; the broken update shows from step 2
    assert verdict["first_group"] in {"embeddings", "attention", "mlp", "norms", "lm_head"}
    assert "first differing step 2" in out and "tensor group" in out and INJECT_ENV in out


@pytest.mark.matrix
@pytest.mark.timeout(900)
def test_pp2_x_dp2_equals_one_process(verify, capsys):
    code, report, out = verify([*RECIPE, "parallel.pp=2", "launcher.nproc_per_node=4",
                                "trainer.gradient_accumulation_steps=2"], capsys)
    assert code == 0, out
    assert report["verdict"]["equivalent"] and report["candidate_world"] == 4
