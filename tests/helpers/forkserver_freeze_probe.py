"""Prints, as JSON, what a worker forked from the product's fork server sees of its garbage collector.

    python tests/helpers/forkserver_freeze_probe.py   # {"frozen": 397447, "tracked": 378, "modules": [...]}

Started by tests/integration/test_forkserver_preload.py in a fresh interpreter, so that the fork server it starts
is the product's (dsrecipes.launch.workers.FORKSERVER_PRELOAD), not the test process's own.
"""

import gc
import json
import multiprocessing
import sys

from dsrecipes.launch.workers import FORKSERVER_PRELOAD


def _report(queue) -> None:
    queue.put({"frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects()),
               "modules": [name for name in FORKSERVER_PRELOAD if name in sys.modules]})


if __name__ == "__main__":
    multiprocessing.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    context = multiprocessing.get_context("forkserver")
    queue = context.Queue()
    worker = context.Process(target=_report, args=(queue,))
    worker.start()
    print(json.dumps(queue.get(timeout=120)))
    worker.join()
