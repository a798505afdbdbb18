"""The multi-process, CLI and launcher tests (marked slow) whose in-process twins are tests/unit/test_bad_input.py;
that module's docstring describes both halves.
"""

from __future__ import annotations

import os

import pytest

from tests.helpers.cli import run_cli

# ------------------------------------------------------------------ the real CLI, as a user runs it


@pytest.mark.slow
def test_multirun_checks_every_job_before_the_first_starts(tmp_path):
    result = run_cli(["-m", "optimizer.lr=1e-3,-1", "trainer.max_steps=2", "logger=none"], cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "multirun job #1 (optimizer.lr=-1 trainer.max_steps=2 logger=none)" in result.stderr
    assert "optimizer.lr=-1.0 must be > 0" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "outputs").exists()  # no sweep directory: job #0 never started


@pytest.mark.slow
def test_bad_value_prints_one_line_and_no_traceback_unless_asked(tmp_path):
    (tmp_path / "corpus.txt").write_bytes(b"\x00\x01binary")
    args = ["data=files", f"data.paths=[{tmp_path}/corpus.txt]"]
    result = run_cli(args, cwd=tmp_path)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"dsrecipes: error: data.paths: '{tmp_path}/corpus.txt' is not a text file: it holds NUL bytes "
                     "(binary data) at byte 0; give text, JSON lines or Parquet files with their own suffix"], lines
    full = run_cli(args, cwd=tmp_path, env_extra={"HYDRA_FULL_ERROR": "1"})
    assert full.returncode != 0 and "Traceback" in full.stderr and "NUL bytes" in full.stderr


@pytest.mark.slow
def test_no_run_directory_is_created_for_a_bad_value(tmp_path):
    result = run_cli(["model.d_ff=0"], cwd=tmp_path)
    assert result.returncode == 2 and "model.d_ff=0 must be >= 1" in result.stderr
    (tmp_path / "blocker").write_text("a file")
    result = run_cli([f"hydra.run.dir={tmp_path}/blocker/run"], cwd=tmp_path)
    assert result.returncode == 2 and "hydra.run.dir=" in result.stderr and "is a file" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["blocker"]  # no outputs/, nothing under the file
