"""The multi-process, CLI and launcher tests (marked slow) whose in-process twins are tests/unit/test_inference_loading.py;
that module's docstring describes both halves.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.unit.test_inference_loading import (
    _reference,
    runs,  # noqa: F401 - fixtures, used by name
)


def _cli(args, cwd, timeout=120):
    return subprocess.run([sys.executable, "-m", "dsrecipes", *args, f"hydra.run.dir={cwd}/hydra_run"],
                          cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_cli_generate_from_run_dir_with_prompts_file(runs, tmp_path):
    run, _, model = runs["dcp"]
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hel\n\nwo\n")
    out_file = tmp_path / "out.jsonl"
    result = _cli(["mode=generate", f"checkpoint={run}", f"generate.prompts_file={prompts}", "generate.batch_size=2",
                   "generate.max_new_tokens=8", "generate.stop_tokens=[]", f"generate.output_file={out_file}"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(line) for line in out_file.read_text().splitlines()]
    from dsrecipes.data.tokenizers import ByteTokenizer

    expected = [ByteTokenizer().decode(t) for t in _reference(model)]
    assert [r["prompt"] for r in records] == ["hel", "wo"]
    assert [r["completion"] for r in records] == expected
    assert "time to first token" in result.stdout
    # a user error exits with code 2 and its message, no traceback
    result = _cli(["mode=generate", f"checkpoint={run}", "prompt=hi", "model.n_head=2"], tmp_path)
    assert result.returncode == 2 and "model.n_head=2 (checkpoint: 4)" in result.stderr
    assert "Traceback" not in result.stderr
