"""`python -m dsrecipes` paths that do not train import no torch (nor the other heavy training libraries).

`--help` lists the config groups and `--cfg job` composes the recipe and prints it: the schemas, the ConfigStore
registration and the CLI's own modules must stay free of torch, which alone costs seconds at every start. Each case
runs the real entry (`python -m dsrecipes ARGS`, through runpy as `-m` does) in a fresh interpreter, the test
process having imported torch already, and reports which of the heavy modules it had imported by the end. Timing is
left to benchmarks; this holds the import graph.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers.environment import subprocess_env

# imported by training, workers, loggers and charts only
HEAVY = ("torch", "datasets", "transformers", "matplotlib", "wandb", "tensorboard")

_RUN_CLI = """
import json, runpy, sys
args, heavy = json.loads(sys.argv[1]), set(json.loads(sys.argv[2]))
sys.argv = ["dsrecipes", *args]
try:
    runpy.run_module("dsrecipes", run_name="__main__", alter_sys=True)
finally:
    print("HEAVY_IMPORTED=" + json.dumps(sorted({name.split(".")[0] for name in sys.modules} & heavy)))
"""


def _heavy_modules_after(args: list[str], cwd) -> tuple[list[str], subprocess.CompletedProcess]:
    result = subprocess.run([sys.executable, "-c", _RUN_CLI, json.dumps(args), json.dumps(HEAVY)], cwd=cwd,
                            env=subprocess_env(), capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    marker = [line for line in result.stdout.splitlines() if line.startswith("HEAVY_IMPORTED=")]
    assert marker, result.stdout[-3000:]
    return json.loads(marker[-1].removeprefix("HEAVY_IMPORTED=")), result


# --help is dsrecipes' own (dsrecipes.cli_help: no composition); --cfg job composes once (~1 s)
@pytest.mark.parametrize("args, printed", [
    pytest.param(["--help"], "config groups (GROUP=OPTION", id="help"),
    pytest.param(["--cfg", "job"], "optimizer:", id="cfg_job"),
])
def test_composing_without_training_imports_no_torch(tmp_path, args, printed):
    heavy, result = _heavy_modules_after(args, tmp_path)
    assert printed in result.stdout
    assert heavy == [], f"python -m dsrecipes {' '.join(args)} imported {heavy}"
    assert list(tmp_path.iterdir()) == []  # nothing written: no run directory for a command that does not run
