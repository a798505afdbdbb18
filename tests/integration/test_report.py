"""`python -m dsrecipes report`: runs here (no CUDA), shows CUDA rows when CUDA is there, and a probe that raises
shows an error cell instead of a traceback."""

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_report_from_the_command_line():
    done = subprocess.run([sys.executable, "-m", "dsrecipes", "report"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "dsrecipes report: versions" in done.stdout and "features" in done.stdout
    assert "Traceback" not in done.stderr
