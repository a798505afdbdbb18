"""`dsrecipes.initialize` under torchrun joins the launcher's process group itself (as deepspeed.initialize)."""

import json
import subprocess
import sys

import pytest

from tests.helpers.paths import HELPERS

SCRIPT = HELPERS / "initialize_under_torchrun.py"


@pytest.mark.slow
@pytest.mark.parametrize("stage, strategy", [(0, "ddp"), (1, "zero1")])
def test_initialize_under_torchrun_needs_no_init_process_group(tmp_path, stage, strategy):
    out = tmp_path / "result.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(SCRIPT),
           str(stage), str(out)]
    result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert (report["world"], report["backend"], report["strategy"], report["steps"]) == (2, "gloo", strategy, 3)
