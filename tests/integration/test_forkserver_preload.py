"""A worker forked from launcher.start_method=forkserver's server starts with the preload imported and frozen.

The server imports torch, Hydra and the trainer once (dsrecipes.launch.workers.FORKSERVER_PRELOAD) and then
freezes them out of the garbage collector's sight (dsrecipes.launch.freeze_preloaded), so a worker's full
collections walk its own objects only. Checked in a fresh interpreter: this test process's multiprocessing
already runs the tests' own fork server (tests/helpers/fork_server.py).
"""

import json
import subprocess
import sys

from tests.helpers.environment import subprocess_env
from tests.helpers.paths import HELPERS, REPO


def test_a_forked_worker_finds_the_preload_imported_and_frozen():
    result = subprocess.run([sys.executable, str(HELPERS / "forkserver_freeze_probe.py")], cwd=REPO,
                            env=subprocess_env(PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    from dsrecipes.launch.workers import FORKSERVER_PRELOAD

    assert seen["modules"] == list(FORKSERVER_PRELOAD)  # every preloaded module is there, the freeze last
    assert seen["frozen"] > 100_000  # torch alone leaves several hundred thousand objects
    assert seen["tracked"] < 10_000  # what the worker's own collections walk: its own objects only
