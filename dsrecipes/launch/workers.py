"""Starting the workers of a recipe: spawn them through torch's elastic agent, or join a launcher.

    python -m dsrecipes +experiment=gpt_zero3                  # spawns launcher.nproc_per_node workers
    torchrun --nproc-per-node 8 -m dsrecipes +experiment=gpt_zero3   # joins: RANK/WORLD_SIZE are set
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 -m dsrecipes ...
    python -m dsrecipes launcher.nnodes=2 launcher.node_rank=0 launcher.rdzv_endpoint=HOST:29500 ...  # on each node

With launcher.nnodes > 1 every node's `python -m dsrecipes` starts its workers through the same agent
torchrun uses, joined by a c10d rendezvous at launcher.rdzv_endpoint that node_rank 0 hosts. Each
node's launching process resolved a run directory of its own; the workers take node 0's, and a node
whose own directory ended up unused removes it (it holds only Hydra's copy of the config). Global
ranks follow the rendezvous' order of the nodes (torch sorts them by address), not node_rank.

The launching process composes and validates the recipe once, resolves the run directory once and
hands every worker a plain resolved config (never Hydra state). The agent is the machinery behind
torchrun (no home-made process manager): a worker that raises ends the job with its traceback, and
launcher.max_restarts > 0 restarts the workers, which resume from the run's newest checkpoint.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure, record

from dsrecipes.launch.environment import adopt_slurm_environment, under_launcher  # noqa: F401 (re-exported)
from dsrecipes.launch.multinode import NodeReports, remove_unused_run_dir, rendezvous, rendezvous_error

RUN_DIR_KEY = "run_dir"  # what workers without rank 0 return: the run directory the job used
# launcher.start_method=forkserver: the modules the fork server imports once, so the workers it forks start with
# torch, Hydra and the trainer imported (Python's default preloads only __main__, which imports none of them).
# torch._dynamo too: torch imports it lazily the first time a worker builds an optimizer, an nn.Embedding or a
# DTensor layout, so every worker would otherwise pay it (about 0.6 s of CPU each).
FORKSERVER_IMPORTS = ("dsrecipes.launch.workers", "dsrecipes.training.trainer", "torch._dynamo")
# last: out of the garbage collector's sight, what the imports built (see the module)
FREEZE_PRELOADED = "dsrecipes.launch.freeze_preloaded"
FORKSERVER_PRELOAD = (*FORKSERVER_IMPORTS, FREEZE_PRELOADED)
# a recipe whose model is the Hugging Face module (model.style=hf) has the server import transformers too
HF_PRELOAD = "dsrecipes.models.hf_preload"


def forkserver_preload(config: dict) -> list[str]:
    """The fork server's preload for this recipe (a resolved container): FORKSERVER_PRELOAD, with transformers'
    model machinery before the freeze when the recipe runs a Hugging Face module."""
    if str(config.get("model", {}).get("style")) != "hf":
        return list(FORKSERVER_PRELOAD)
    return [*FORKSERVER_IMPORTS, HF_PRELOAD, FREEZE_PRELOADED]


def backend_for(configured: str) -> str:
    if configured != "auto":
        return configured
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def attempt_store(timeout: timedelta) -> dist.Store | None:
    """Under the elastic agent's shared TCPStore: a client of it whose keys are scoped to this restart attempt.

    The c10d rendezvous hands every attempt's workers the same store (TORCHELASTIC_USE_AGENT_STORE=True,
    same MASTER_PORT), and torch's env:// init uses it without an attempt prefix. The keys a process group
    writes there (gloo's per-rank listening addresses) therefore outlive the workers that wrote them: a
    restarted rank that reads its peer's key before the restarted peer rewrote it gets the dead worker's
    address, and gloo's connectFullMesh fails with "connection refused" (pytorch/pytorch#135712). A prefix
    with the restart count gives every attempt fresh keys, so a rank waits for its new peer instead.
    None when the agent's store is not shared (torchrun opt-out, SLURM, plain env://).
    """
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
        return None
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), int(env["WORLD_SIZE"]),
                          is_master=False, timeout=timeout)
    attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"dsrecipes/{env.get('TORCHELASTIC_RUN_ID', '')}/attempt_{attempt}/", store)


def init_distributed(backend: str = "auto", timeout_s: int = 600) -> None:
    """Join the process group described by the launcher's environment (idempotent)."""
    if dist.is_initialized():
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    else:  # share the cores between the workers of this node
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    timeout = timedelta(seconds=timeout_s)
    store = attempt_store(timeout)
    if store is None:
        dist.init_process_group(backend=backend_for(backend), timeout=timeout)
    else:
        dist.init_process_group(backend=backend_for(backend), timeout=timeout, store=store,
                                rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))


def join_launcher_group(backend: str = "auto", timeout_s: int = 600) -> bool:
    """Under a launcher (torchrun, srun) that started more than one process: join its group (a group that
    exists already is kept). Returns whether this process is in a multi-process group.

    A group joined here that the caller has not destroyed by the time the interpreter exits (a user's script
    after dsrecipes.initialize) is destroyed at exit (leave_group without waiting)."""
    if not under_launcher() or int(os.environ["WORLD_SIZE"]) <= 1:
        return False
    if not dist.is_initialized():
        init_distributed(backend, timeout_s)
        # left to the interpreter's teardown, a live gloo group can abort the process after its work is done (seen
        # under load in a CI-like run, 2026-12-04); no barrier then: a rank that leaves on an error must not wait
        # for the others, and the launcher stops them
        atexit.register(leave_group, wait=False)
    return True


@record
def worker_main(config: dict, run_dir: str, overrides: list[str], sweep_name: str | None,
                report_run_dir: bool = False) -> dict | None:
    """Body of one worker: join the group, train, leave. Returns the summary on rank 0; elsewhere None, or with
    report_run_dir (spawned workers) {RUN_DIR_KEY: the run directory the job uses}.

    A user error (dsrecipes.utils.errors) ends the worker with one line and status 2, SIGINT/SIGTERM
    with 128 + the signal (dsrecipes.utils.interrupts); anything else keeps its traceback.
    """
    import sys

    from omegaconf import OmegaConf

    from dsrecipes.config.loading import load_config
    from dsrecipes.config.validate import validate_recipe
    from dsrecipes.training.trainer import Trainer
    from dsrecipes.utils.errors import USER_ERRORS, exit_on_user_error
    from dsrecipes.utils.interrupts import exit_code, received_signal, stop_on_signals

    stop_on_signals()
    launcher = config.get("launcher", {})
    finished = False
    try:
        init_distributed(launcher.get("backend", "auto"), launcher.get("collective_timeout_s", 600))
        nodes = NodeReports(launcher, run_dir)
        if report_run_dir:  # spawned by this package's launcher: its launcher.* keys set up the rendezvous
            nodes.check_agree()
        cfg = load_config(OmegaConf.create(config))
        if nodes.restarted:
            cfg.trainer.resume = "auto"  # restarted workers continue from the newest checkpoint
        root, batch = validate_recipe(cfg, dp_world_size=dist.get_world_size())
        rank = dist.get_rank()
        run_dir = nodes.run_dir
        summary = Trainer(root, run_dir, batch, overrides=overrides, rank=rank, sweep_name=sweep_name).fit()
        finished = True
        return summary if rank == 0 else ({RUN_DIR_KEY: run_dir} if report_run_dir else None)
    except BaseException as error:
        if received_signal() is not None:  # stopping: a peer's collective may have failed first
            sys.exit(exit_code(received_signal()))
        if isinstance(error, USER_ERRORS):
            exit_on_user_error(error, prefix=f"rank {os.environ.get('RANK', '?')}: ")
        raise
    finally:
        # Only a clean finish leaves the group politely; a failing rank just exits, which closes its
        # connections so the peers' collectives fail and the agent ends (or restarts) the job, rather
        # than risking a teardown that waits on peers stuck in a collective.
        if finished:
            leave_group()


def leave_group(wait: bool = True) -> None:
    """Destroy the process group, if one is left; after a clean finish, first wait for every rank (`wait`). A
    process that exits with its gloo group alive can abort in the group's destructor (`terminate called without
    an active exception`, exit -6) after its work is done."""
    if dist.is_initialized():
        gc.collect()
        if wait:
            dist.barrier()
        dist.destroy_process_group()


def _start_method(config: dict) -> str:
    """launcher.start_method of the resolved config; fork is refused once this process has initialised CUDA
    (a forked child cannot use it)."""
    method = str(config.get("launcher", {}).get("start_method", "spawn"))
    if method == "fork" and torch.cuda.is_initialized():
        raise ValueError("launcher.start_method=fork but this process has initialised CUDA, which forked workers "
                         "cannot use; choose launcher.start_method=spawn or forkserver")
    return method


def spawn_workers(nproc: int, max_restarts: int, config: dict, run_dir: str, overrides: list[str], sweep_name) -> dict:
    """Start `nproc` local workers with the elastic agent (on each of launcher.nnodes nodes); returns rank 0's
    summary, or on a node without rank 0 None."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if _start_method(config) == "forkserver":
        import multiprocessing

        multiprocessing.set_forkserver_preload(forkserver_preload(config))
    launch_config = LaunchConfig(
        nproc_per_node=nproc,
        rdzv_backend="c10d",
        **rendezvous(config.get("launcher", {})),
        max_restarts=max_restarts,
        monitor_interval=0.1,
        start_method=_start_method(config),
        shutdown_timeout=10,  # on SIGINT/SIGTERM, workers that have not stopped 10 s later are killed
    )
    if int(config.get("launcher", {}).get("nnodes", 1)) > 1:
        # Each attempt's workers get a fresh TCPStore (hosted by rank 0) instead of the agents' shared one, whose
        # keys outlive an attempt and are scoped by a restart count that a replacement node's agent restarts at 0.
        os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    # The agent logs each failed worker with a traceback of its own process-joining code; the worker's
    # own error reaches the user anyway (one line for a user error, the ChildFailedError's root cause else).
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
    try:
        results = elastic_launch(launch_config, worker_main)(config, run_dir, overrides, sweep_name, True)
    except ChildFailedError as error:
        raise with_unobserved_failures(error) from None
    except Exception as error:
        clear = rendezvous_error(error, config.get("launcher", {}))
        if clear is None:
            raise
        raise clear from error
    # rank 0 returns the summary (which names the run directory too), the other ranks {RUN_DIR_KEY: ...}
    agreed = next((r[RUN_DIR_KEY] for r in results.values() if isinstance(r, dict) and RUN_DIR_KEY in r), run_dir)
    remove_unused_run_dir(run_dir, agreed)
    return results.get(0)


def with_unobserved_failures(error: ChildFailedError) -> ChildFailedError:
    """The job's failure with every worker that wrote an error file, the one that started it first.

    The agent reports the workers it saw exit with an error. When one rank raises, its peers fail in the collective
    it left ("connection reset by peer") a moment later; if the agent polls after both have exited it sees a peer
    first, stops the rest, and the rank that raised is never reported, though its traceback is in its error file
    (@record writes it before the worker exits). Those files sit side by side (.../attempt_N/<local_rank>/
    error.json): each one missing from the report is added ahead of the reported ones, so the root cause shown is
    the earliest error and, on a tie in its one-second timestamp, the one the agent did not see.
    """
    root_rank, root = error.get_first_failure()
    if not root.error_file or not os.path.isfile(root.error_file):
        return error
    node_offset = root_rank - root.local_rank  # global rank of this node's local rank 0
    attempt = os.path.dirname(os.path.dirname(root.error_file))
    reported = {failure.local_rank for rank, failure in error.failures.items() if rank - failure.local_rank == node_offset}
    unobserved = {}
    for entry in sorted(os.listdir(attempt)):
        path = os.path.join(attempt, entry, "error.json")
        if entry.isdigit() and int(entry) not in reported and os.path.isfile(path):
            unobserved[node_offset + int(entry)] = ProcessFailure(local_rank=int(entry), pid=-1, exitcode=1, error_file=path)
    if not unobserved:
        return error
    return ChildFailedError(error.name, {**unobserved, **error.failures})
