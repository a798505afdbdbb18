"""A restarted worker group re-forms its gloo group even when a peer joins late (launcher.max_restarts).

The elastic agent's c10d rendezvous shares one TCPStore with every attempt's workers. Keys written by
the first attempt's process group (each rank's gloo address) are still there when the restarted
workers join, so without a per-attempt namespace a restarted rank 0 that reads rank 1's key before the
new rank 1 rewrote it connects to the dead worker ("connectFullMesh ... connection refused"). Delaying
rank 1 on the restart makes that ordering certain instead of a 1-in-3 race on busy cores: this test
fails every time with torch's plain env:// init and passes with dsrecipes.launch.workers.init_distributed.
"""

import os
import time
import uuid

import pytest
import torch
import torch.distributed as dist

from dsrecipes.launch.workers import init_distributed


def _worker() -> tuple[int, float]:
    attempt, rank = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), int(os.environ["RANK"])
    if attempt > 0 and rank == 1:
        time.sleep(2.0)  # rank 0 of the restarted group looks up rank 1's address first
    init_distributed("gloo", timeout_s=60)
    total = torch.ones(1)
    dist.all_reduce(total)
    if attempt == 0:
        if rank == 1:
            os._exit(3)  # dies after the group formed, like a crashed worker
        dist.all_reduce(total)  # rank 0 is left waiting in a collective; it fails when rank 1 is gone
    dist.barrier()
    dist.destroy_process_group()
    return attempt, total.item()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_restarted_group_forms_when_a_peer_joins_late():
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id=f"test-{uuid.uuid4().hex[:8]}",
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=1, monitor_interval=0.1,
                          start_method="spawn")
    results = elastic_launch(config, _worker)()
    assert results == {0: (1, 2.0), 1: (1, 2.0)}  # both ranks finished on the restart, all-reduce of ones over 2
