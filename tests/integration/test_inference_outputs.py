"""The multi-process, CLI and launcher tests (marked slow) whose in-process twins are tests/unit/test_inference_outputs.py;
that module's docstring describes both halves.
"""

from __future__ import annotations

import json
import os

import pytest

from dsrecipes.inference_cli import GENERATIONS_FILE
from tests.helpers.cli import run_cli
from tests.unit.test_inference_outputs import (
    GENERATE,
    SERVE_BENCH,
    export,  # noqa: F401 - fixtures, used by name
)


@pytest.mark.slow
def test_cli_generate_leaves_no_directory_behind(export, tmp_path):
    result = run_cli([*GENERATE, f"checkpoint={export}", "generate.output_file=out.jsonl"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert os.listdir(tmp_path) == ["out.jsonl"] and "Hi" in result.stdout
    result = run_cli([*GENERATE, f"checkpoint={export}", "model.n_head=4"], cwd=tmp_path)
    assert result.returncode == 2 and "model.n_head=4 (checkpoint: 2)" in result.stderr
    assert os.listdir(tmp_path) == ["out.jsonl"]


@pytest.mark.slow
def test_cli_generate_multirun_writes_each_jobs_generations_into_its_directory(export, tmp_path):
    result = run_cli(["-m", *GENERATE, f"checkpoint={export}", "generate.temperature=0,0.8"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    (sweep,) = (tmp_path / "outputs" / "multirun").glob("*/*")
    assert sorted(os.listdir(sweep)) == ["0", "1", "multirun.yaml"]  # no summary: generate jobs have no metrics
    for job, temperature in (("0", "0"), ("1", "0.8")):
        assert sorted(os.listdir(sweep / job)) == [".hydra", GENERATIONS_FILE]
        assert f"generate.temperature={temperature}" in (sweep / job / ".hydra" / "overrides.yaml").read_text()
        assert json.loads((sweep / job / GENERATIONS_FILE).read_text())["prompt"] == "Hi"


@pytest.mark.slow
def test_cli_serve_bench_writes_into_its_run_directory_and_a_failed_one_leaves_none(export, tmp_path):
    result = run_cli([*SERVE_BENCH, f"checkpoint={export}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    (run,) = (tmp_path / "outputs").glob("*/*")
    from dsrecipes.utils.charts import charts_available

    chart = ["serve_bench.png"] if charts_available() else []  # a bar chart beside the rows, with matplotlib
    assert sorted(os.listdir(run)) == [".hydra", "serve_bench.csv", "serve_bench.json", "serve_bench.md", *chart]
    assert f"wrote {run}/serve_bench.csv" in result.stdout
    result = run_cli([*SERVE_BENCH, f"checkpoint={export}", "model.n_head=4"], cwd=tmp_path)
    assert result.returncode == 2 and "model.n_head=4 (checkpoint: 2)" in result.stderr
    assert list((tmp_path / "outputs").glob("*/*")) == [run]
