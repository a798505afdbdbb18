"""Imported last by a fork server's preload: moves everything the preload built out of the garbage collector's sight.

    multiprocessing.set_forkserver_preload([..., "dsrecipes.launch.freeze_preloaded"])   # see FORKSERVER_PRELOAD

A fork server imports torch, Hydra and the trainer once (dsrecipes.launch.workers.FORKSERVER_PRELOAD), then
forks every worker from that state. Those ~0.5 M objects live as long as the worker, yet each full collection
in the worker walks them all again (about 0.15-0.4 s each on a CPU; a 10-second run makes several), and each
walk writes to their collector headers, copying the server's memory pages into every worker. gc.freeze() here,
after the imports and before any fork, is CPython's own advice for fork without exec: the workers collect their
own garbage as before, over their own objects only. (What a worker later drops of those frozen objects inside a
reference cycle is never freed: bounded by the preload's size.)

Importing this module has that effect on whatever process imports it, so only a fork server's preload list names
it: `python -m dsrecipes` with launcher.start_method=forkserver, and the tests' fork server.
"""

from __future__ import annotations

import gc

gc.collect()  # what the imports left as garbage goes now, not into the frozen generation
gc.freeze()
