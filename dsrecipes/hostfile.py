"""Launch a recipe on the hosts of a DeepSpeed hostfile with torchrun, as `deepspeed --hostfile` launches a script.

    python -m dsrecipes.hostfile myhostfile +experiment=gpt_zero3 zero.stage=2          # prints one torchrun command per node
    python -m dsrecipes.hostfile myhostfile --include "worker-0:0,1@worker-1" ...       # DeepSpeed's include/exclude syntax
    python -m dsrecipes.hostfile myhostfile --exclude worker-1:0 / --num_nodes 2 / --num_gpus 4 ...
    python -m dsrecipes.hostfile myhostfile --master_addr 10.0.0.1 --master_port 29600 --rdzv_id job7 ...
    python -m dsrecipes.hostfile myhostfile --launch ssh ...   # runs them over ssh (in parallel, output prefixed by host)
    python -m dsrecipes.hostfile myhostfile --launch pdsh ...  # one pdsh command, as DeepSpeed's default launcher

The hostfile is DeepSpeed's (`hostname slots=N` lines; dsrecipes.cluster.hostfile), the flags are named and
behave as DeepSpeed's runner's, and everything after them is the dsrecipes overrides. Before anything runs,
the recipe is composed and validated at the hostfile's world size (dsrecipes.cluster.layout): a bad hostfile,
filter or layout prints `dsrecipes.hostfile: error: <message>` and exits 2. Every node is assumed to have this
installation at the same path and to see the working directory (as DeepSpeed assumes); the variables of
`.deepspeed_env` and the launching shell's NCCL_*/PYTHON*/UCX*/MV2*/MLFLOW* are exported on every node
(dsrecipes.cluster.remote_env). With --launch print (the default) the commands go to stdout, one line per
node in node-rank order, and a summary to stderr.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

PROG = "dsrecipes.hostfile"
LAUNCH_MODES = ("print", "ssh", "pdsh")


def build_parser() -> argparse.ArgumentParser:
    from dsrecipes.cluster.hostfile import FILTER_FORM
    from dsrecipes.cluster.torchrun_commands import DEFAULT_MASTER_PORT, DEFAULT_RDZV_ID

    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("hostfile", help="DeepSpeed hostfile: one `hostname slots=N` line per host, in rank order")
    parser.add_argument("-i", "--include", default="", help=f"only these slots: {FILTER_FORM}")
    parser.add_argument("-e", "--exclude", default="", help="every slot but these (same form as --include)")
    parser.add_argument("--num_nodes", type=int, default=-1, help="use the first N hosts (-1: all)")
    parser.add_argument("--num_gpus", "--num_accelerators", type=int, default=-1,
                        help="use slots 0..N-1 of every host (-1: all)")
    parser.add_argument("--master_addr", default="", help="rendezvous host (default: the first host)")
    parser.add_argument("--master_port", type=int, default=DEFAULT_MASTER_PORT, help="rendezvous port")
    parser.add_argument("--rdzv_id", default=DEFAULT_RDZV_ID, help="torchrun's --rdzv-id (the job's id)")
    parser.add_argument("--launch", choices=LAUNCH_MODES, default="print",
                        help="print the per-node commands, run them over ssh, or run one pdsh command")
    parser.add_argument("overrides", nargs="*", help="dsrecipes overrides, e.g. +experiment=gpt_zero3 zero.stage=2")
    return parser


def default_torchrun() -> tuple[str, ...]:
    """The torchrun beside this interpreter, else this interpreter with `-m torch.distributed.run` (torchrun's own
    module): the nodes run the launching installation, not whichever torchrun comes first on their PATH."""
    beside = Path(sys.executable).with_name("torchrun")
    return (str(beside),) if beside.is_file() else (sys.executable, "-m", "torch.distributed.run")


def plan(args: argparse.Namespace, environ: Mapping[str, str], cwd: str, home: str, torchrun: tuple[str, ...]):
    """The checked Launch of the parsed arguments (every check before anything runs)."""
    from dsrecipes.cluster.hostfile import read_hostfile, select_nodes
    from dsrecipes.cluster.layout import check_layout
    from dsrecipes.cluster.remote_env import forwarded_env
    from dsrecipes.cluster.torchrun_commands import Launch, check_endpoint, processes_per_node

    if not 1 <= args.master_port <= 65535:
        raise ValueError(f"--master_port {args.master_port} is not a port; give 1-65535")
    if not args.rdzv_id or any(c.isspace() for c in args.rdzv_id):
        raise ValueError(f"--rdzv_id {args.rdzv_id!r} is not valid; give a name without spaces")
    hosts = read_hostfile(args.hostfile)
    nodes = select_nodes(hosts, args.include, args.exclude, args.num_nodes, args.num_gpus, source=args.hostfile)
    processes_per_node(nodes, source=args.hostfile)
    check_endpoint(args.master_addr or nodes[0].host, nodes)
    layout = check_layout(args.overrides, nodes, args.hostfile)
    return Launch(nodes=tuple(nodes), overrides=layout.overrides, cwd=cwd, master_addr=args.master_addr,
                  master_port=args.master_port, rdzv_id=args.rdzv_id, env=forwarded_env(environ, home, cwd),
                  torchrun=torchrun, torchrun_args=layout.torchrun_args)


def summary(launch) -> str:
    from dsrecipes.cluster.torchrun_commands import rdzv_endpoint

    nodes = len(launch.nodes)
    return (f"{PROG}: {nodes} node{'s' if nodes != 1 else ''} x {launch.nproc} process(es) = world "
            f"{nodes * launch.nproc}; rendezvous {rdzv_endpoint(launch.addr, launch.master_port)} "
            f"(id {launch.rdzv_id})")


def launch_ssh(launch) -> int:
    from dsrecipes.cluster.ssh_launch import run_parallel
    from dsrecipes.cluster.torchrun_commands import ssh_argv, ssh_command

    for index in range(len(launch.nodes)):
        print(f"{PROG}: {ssh_command(launch, index)}", file=sys.stderr, flush=True)
    return run_parallel([(node.host, ssh_argv(launch, index)) for index, node in enumerate(launch.nodes)])


def launch_pdsh(launch) -> int:
    from dsrecipes.cluster.torchrun_commands import pdsh_argv, pdsh_command

    print(f"{PROG}: {pdsh_command(launch)}", file=sys.stderr, flush=True)
    try:
        return subprocess.run(pdsh_argv(launch), env={**os.environ, "PDSH_RCMD_TYPE": "ssh"}).returncode
    except KeyboardInterrupt:  # pdsh got the Ctrl-C too and stops its remote commands itself
        return 130


def main(argv: Sequence[str] | None = None) -> int:
    from dsrecipes.cluster.torchrun_commands import node_command
    from dsrecipes.utils.errors import USER_ERRORS, exit_on_user_error

    args = build_parser().parse_intermixed_args(argv)
    try:
        if args.launch == "pdsh" and shutil.which("pdsh") is None:
            raise ValueError("--launch pdsh but pdsh is not installed here (not on PATH); install it, or use --launch ssh")
        launch = plan(args, os.environ, os.getcwd(), os.path.expanduser("~"), default_torchrun())
        print(summary(launch), file=sys.stderr, flush=True)
        if args.launch == "ssh":
            return launch_ssh(launch)
        if args.launch == "pdsh":
            return launch_pdsh(launch)
    except USER_ERRORS as error:
        exit_on_user_error(error, program=PROG)
    for index, node in enumerate(launch.nodes):  # a shell comment names the host of each command
        print(f"# on {node.host} (node {index}):\n{node_command(launch, index)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
