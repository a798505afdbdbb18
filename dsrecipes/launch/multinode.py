"""What several nodes' `python -m dsrecipes launcher.nnodes=N ...` processes must agree on, and how they meet.

    python -m dsrecipes launcher.nnodes=2 launcher.node_rank=0 launcher.rdzv_endpoint=node0:29500 ...   # node 0
    python -m dsrecipes launcher.nnodes=2 launcher.node_rank=1 launcher.rdzv_endpoint=node0:29500 ...   # node 1

* `rendezvous`: the elastic agent's settings (torchrun's --nnodes / --rdzv-endpoint / --rdzv-id): a c10d
  rendezvous hosted by node_rank 0 (`is_host`, so "nodes" sharing one machine do not both try to host it).
* `rendezvous_error`: the agent's rendezvous failures (a port taken, a node that never came) as one line
  naming the launcher.* keys.
* `NodeReports`: gathered once from every rank after the process group forms, it answers the questions the
  ranks must answer alike: do the nodes' launcher settings agree (else a ValueError on every rank, before
  training), did any rank restart (a replacement node's agent counts from 0 while the survivors count 1),
  and which run directory is the job's (node 0's: each node's launcher resolved one of its own).
* `remove_unused_run_dir`: a node whose own directory ended up unused removes it (it holds Hydra's files only).
"""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist


def rendezvous(launcher: dict) -> dict:
    """LaunchConfig fields for launcher.nnodes / node_rank / rdzv_endpoint / rdzv_id.

    One node: a private c10d store on a free local port. Several: the c10d rendezvous at rdzv_endpoint,
    hosted by node_rank 0, under the job's rdzv_id, which every node shares.
    """
    nnodes = int(launcher.get("nnodes", 1))
    if nnodes == 1:
        return {"min_nodes": 1, "max_nodes": 1, "run_id": f"dsrecipes-{uuid.uuid4().hex[:8]}",
                "rdzv_endpoint": "localhost:0", "rdzv_configs": {}}
    return {"min_nodes": nnodes, "max_nodes": nnodes, "run_id": str(launcher["rdzv_id"]),
            "rdzv_endpoint": str(launcher["rdzv_endpoint"]),
            "rdzv_configs": {"is_host": int(launcher.get("node_rank", 0)) == 0,
                             "join_timeout": int(launcher.get("rdzv_timeout_s", 600))}}


def rendezvous_error(error: Exception, launcher: dict) -> ValueError | None:
    """A one-line error for the agent's rendezvous failures under launcher.nnodes > 1 (None for anything else)."""
    from torch.distributed.elastic.rendezvous.api import (
        RendezvousClosedError,
        RendezvousConnectionError,
        RendezvousTimeoutError,
    )

    if int(launcher.get("nnodes", 1)) == 1:
        return None
    endpoint, node_rank, nnodes = launcher["rdzv_endpoint"], launcher.get("node_rank", 0), launcher["nnodes"]
    if isinstance(error, RendezvousTimeoutError):
        return ValueError(f"launcher.nnodes={nnodes}: not every node joined the rendezvous at "
                          f"launcher.rdzv_endpoint={endpoint} within launcher.rdzv_timeout_s="
                          f"{launcher.get('rdzv_timeout_s', 600)}; start `python -m dsrecipes ... "
                          f"launcher.nnodes={nnodes} launcher.node_rank=K launcher.rdzv_endpoint={endpoint}` on every "
                          f"node K in 0..{nnodes - 1}, with the same launcher.rdzv_id")
    if isinstance(error, RendezvousClosedError):
        return ValueError(f"the rendezvous at launcher.rdzv_endpoint={endpoint} was closed by another node, which gave "
                          f"up (see its error); every node needs the same launcher.nnodes (here {nnodes}) and "
                          "launcher.rdzv_id")
    if isinstance(error, RendezvousConnectionError):
        what = (f"launcher.node_rank=0 hosts the rendezvous at {endpoint}, but could not listen there (another node "
                "started with node_rank 0 too, or the port is in use)") if node_rank == 0 else \
            f"launcher.node_rank={node_rank} could not reach node 0's rendezvous at launcher.rdzv_endpoint={endpoint}"
        return ValueError(f"{what}: {error.__cause__ or error}")
    return None


@dataclass(frozen=True)
class NodeReport:
    """One rank's view of how it was launched."""

    rank: int
    node_rank: int
    nnodes: int
    local_world_size: int
    group_rank: int  # the agent's index of this rank's node in the rendezvous
    host: str
    restart_count: int
    run_dir: str


class NodeReports:
    """Every rank's NodeReport, gathered once (one all_gather_object)."""

    def __init__(self, launcher: dict, run_dir: str):
        env = os.environ
        mine = NodeReport(dist.get_rank(), int(launcher.get("node_rank", 0)), int(launcher.get("nnodes", 1)),
                          int(env.get("LOCAL_WORLD_SIZE", dist.get_world_size())), int(env.get("GROUP_RANK", 0)),
                          socket.gethostname(), int(env.get("TORCHELASTIC_RESTART_COUNT", "0")), run_dir)
        self.reports: list[NodeReport] = [None] * dist.get_world_size()  # type: ignore[list-item]
        dist.all_gather_object(self.reports, mine)

    @property
    def restarted(self) -> bool:
        """Whether any rank runs a restarted attempt: then every rank resumes from the newest checkpoint."""
        return any(report.restart_count > 0 for report in self.reports)

    @property
    def run_dir(self) -> str:
        """The job's run directory: the one launcher.node_rank 0's launching process resolved. Node 0 hosts the
        rendezvous, so it stays for the whole job, through restarts that may give global rank 0 to another node."""
        return min(self.reports, key=lambda report: (report.node_rank, report.rank)).run_dir

    def check_agree(self) -> None:
        """ValueError (the same text on every rank) when the nodes' launcher.* settings contradict the rendezvous."""
        nnodes = sorted({report.nnodes for report in self.reports})
        if len(nnodes) > 1:
            raise ValueError(f"launcher.nnodes differs between the nodes ({', '.join(map(str, nnodes))}); give every "
                             "node the same launcher.nnodes")
        nodes: dict[int, set[int]] = {}
        for report in self.reports:
            nodes.setdefault(report.group_rank, set()).add(report.node_rank)
        if len(nodes) != nnodes[0]:
            raise ValueError(f"launcher.nnodes={nnodes[0]}, but {len(nodes)} node(s) joined the rendezvous")
        claimed: dict[int, int] = {}
        for group, ranks in sorted(nodes.items()):
            for node_rank in ranks:
                if node_rank in claimed and claimed[node_rank] != group:
                    raise ValueError(f"launcher.node_rank={node_rank} was given to more than one node; give each "
                                     f"node its own, 0..{nnodes[0] - 1}")
                claimed[node_rank] = group


def remove_unused_run_dir(own: str, agreed: str) -> None:
    """The run directory this process resolved, if the job used another node's instead and this one holds nothing
    but Hydra's files (.hydra/, the launcher's log)."""
    path = Path(own)
    if not path.is_dir() or path.resolve() == Path(agreed).resolve():
        return
    if all(entry.name == ".hydra" or entry.suffix == ".log" for entry in path.iterdir()):
        shutil.rmtree(path, ignore_errors=True)
