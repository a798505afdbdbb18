"""Run a function on N local processes joined in a gloo process group, with a timeout (test helper).

Like DeepSpeed's DistributedTest: file-store rendezvous, every rank runs `fn(rank, world_size, *args)`,
a rank that raises fails the test with its traceback, a hang past `timeout_s` fails instead of blocking.
The ranks are forked from the test process where that is safe (tests/helpers/forking.py: no re-import
of torch in each), else spawned.
"""

from __future__ import annotations

import os
import tempfile
import time

import torch.distributed as dist
import torch.multiprocessing as mp

from tests.helpers.forking import fork_is_safe


def _entry(rank: int, fn, world_size: int, store_path: str, args: tuple) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size))
    import torch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world_size)
    fn(rank, world_size, *args)
    import gc

    gc.collect()  # release optimizer/communication objects before teardown (ZeroRedundancyOptimizer
    dist.barrier()  # otherwise can abort the interpreter at exit)
    dist.destroy_process_group()


def run_distributed(fn, world_size: int, *args, timeout_s: float = 240.0) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        context = mp.start_processes(
            _entry, args=(fn, world_size, os.path.join(tmp, "store"), args), nprocs=world_size, join=False,
            start_method="fork" if fork_is_safe() else "spawn",
        )
        deadline = time.monotonic() + timeout_s
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                for process in context.processes:
                    process.kill()
                raise TimeoutError(f"distributed test did not finish within {timeout_s} s (a hang?)")
