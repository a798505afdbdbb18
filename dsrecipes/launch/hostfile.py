"""Launch a recipe on the hosts of a DeepSpeed hostfile with torchrun, as `deepspeed --hostfile` launches a script.

    python -m dsrecipes.launch.hostfile myhostfile +experiment=gpt_zero3 zero.stage=2   # prints one torchrun command per node
    python -m dsrecipes.launch.hostfile myhostfile --include "worker-0:0,1@worker-1" ...   # DeepSpeed's include/exclude syntax
    python -m dsrecipes.launch.hostfile myhostfile --exclude worker-1:0 / --num_nodes 2 / --num_gpus 4 ...
    python -m dsrecipes.launch.hostfile myhostfile --master_addr 10.0.0.1 --master_port 29600 --rdzv_id job7 ...
    python -m dsrecipes.launch.hostfile myhostfile --launch ssh ...   # runs them over ssh (in parallel, output prefixed by host)
    python -m dsrecipes.launch.hostfile myhostfile --launch pdsh ...  # one pdsh command, as DeepSpeed's default launcher

The hostfile is DeepSpeed's (`hostname slots=N` lines, below), the flags are named and
behave as DeepSpeed's runner's, and everything after them is the dsrecipes overrides. Before anything runs,
the recipe is composed and validated at the hostfile's world size (dsrecipes.launch.layout): a bad hostfile,
filter or layout prints `dsrecipes.launch.hostfile: error: <message>` and exits 2. Every node is assumed to have this
installation at the same path and to see the working directory (as DeepSpeed assumes); the variables of
`.deepspeed_env` and the launching shell's NCCL_*/PYTHON*/UCX*/MV2*/MLFLOW* are exported on every node
(dsrecipes.launch.remote_env). With --launch print (the default) the commands go to stdout, one line per
node in node-rank order, and a summary to stderr.

The hostfile and its filters:

DeepSpeed's hostfile and its resource filters follow DeepSpeed 0.19.8's semantics (deepspeed/launcher/runner.py).

A hostfile lists one host a line, `hostname slots=N`, in rank order; `#` starts a comment line and blank lines
are skipped. As in DeepSpeed, the rest of a line after `slots=N` is ignored (`worker-0 slots=8 max_slots=8`,
OpenMPI's form, reads as 8 slots), a host listed twice is an error, and the hosts keep the file's order.

The filters pick slots (GPU ids 0..N-1) from the hosts:

    --include "worker-0:0,1@worker-1"   only these: slots 0 and 1 of worker-0, every slot of worker-1
    --exclude "worker-1:0@worker-2"     everything but these: slot 0 of worker-1, the whole of worker-2
    --num_nodes 2 / --num_gpus 4        the first 2 hosts / slots 0..3 of every host

--include and --exclude exclude each other, and neither goes with --num_nodes/--num_gpus, as in DeepSpeed.
A host named twice in one filter has its slot lists merged, and a bare name merged with a slot list means
those slots only (`worker-0@worker-0:1` is slot 1), as DeepSpeed's parse_node_config_list does.

Where DeepSpeed would go on with something that cannot be meant, this module stops with a ValueError that
names the file, line and text or the flag and value: slots=0 (a host that starts no process), slots that
are not a whole number (`slots=4x`, which DeepSpeed's regex reads as 4), --num_nodes larger than the hostfile
(DeepSpeed quietly runs on fewer), --num_gpus above a host's slots (DeepSpeed would start more processes than
the host has GPUs), 0 for either (DeepSpeed reads it as "no limit"; -1 still means that), and a filter that
leaves nothing to run on.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

VALID_FORM = "`hostname slots=N` (N a whole number >= 1; '#' starts a comment line)"
FILTER_FORM = "NAME[:SLOT[,SLOT...]][@NAME[:SLOT[,SLOT...]]...], e.g. worker-0:0,1@worker-1"
_ENTRY = re.compile(r"^(\S+)\s+slots=(\S+)")
_NUMBER = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class Node:
    """One host of the job: its name, the slot ids (GPU ids) it runs on, and how many slots the hostfile gives it."""

    host: str
    slot_ids: tuple[int, ...]
    hostfile_slots: int

    @property
    def narrowed(self) -> bool:
        """Whether the filters picked particular slot ids (the processes must then see only those GPUs)."""
        return self.slot_ids != tuple(range(self.hostfile_slots))


def parse_hostfile(lines: list[str], source: str = "hostfile") -> list[tuple[str, int]]:
    """The hosts of a hostfile's lines and their slot counts, in the file's order (DeepSpeed's _parse_hostfile)."""
    hosts: dict[str, int] = {}
    first_line: dict[str, int] = {}
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source} line {number}: {line!r}"
        match = _ENTRY.match(line)
        if match is None:
            raise ValueError(f"{where} is not a hostfile entry; the valid form is {VALID_FORM}")
        host, count = match.group(1), match.group(2)
        if not _NUMBER.fullmatch(count) or int(count) < 1:
            raise ValueError(f"{where}: slots={count} is not valid; slots must be a whole number >= 1, "
                             f"the valid form is {VALID_FORM}")
        if host in hosts:
            raise ValueError(f"{where}: host {host} is listed again (first on line {first_line[host]}); "
                             f"each host appears once, as {VALID_FORM}")
        hosts[host] = int(count)
        first_line[host] = number
    if not hosts:
        raise ValueError(f"{source} lists no hosts; each line is {VALID_FORM}")
    return list(hosts.items())


def read_hostfile(path: str | os.PathLike) -> list[tuple[str, int]]:
    """parse_hostfile of a file; a missing or unreadable file is a ValueError naming it (DeepSpeed's fetch_hostfile
    falls back to the local GPUs instead: here the hostfile is what the user asked to launch on)."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.readlines()
    except FileNotFoundError:
        raise ValueError(f"hostfile {path} does not exist; it lists one host a line, {VALID_FORM}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"hostfile {path} cannot be read: {error}") from None
    return parse_hostfile(lines, str(path))


def parse_filter(text: str, flag: str) -> dict[str, list[int]]:
    """A --include/--exclude value: {host: sorted slot ids} ([] = the whole host), merged per host as DeepSpeed does."""
    specs: dict[str, list[int]] = {}
    for spec in text.split("@"):
        name, colon, slot_text = spec.partition(":")
        if not name:
            raise ValueError(f"{flag} {text!r}: an empty host name; the form is {FILTER_FORM}")
        slots: list[int] = []
        if colon:
            for item in slot_text.split(","):
                if not _NUMBER.fullmatch(item.strip()):
                    raise ValueError(f"{flag} {text!r}: slot {item!r} of {name} is not a slot id (a whole number); "
                                     f"the form is {FILTER_FORM}")
                slots.append(int(item))
        specs[name] = specs.get(name, []) + slots
    return {name: sorted(set(slots)) for name, slots in specs.items()}


def _apply_filter(pool: dict[str, list[int]], text: str, flag: str, source: str) -> dict[str, list[int]]:
    """DeepSpeed's parse_resource_filter: the slots of `pool` that --include keeps or --exclude leaves."""
    including = flag == "--include"
    picked: dict[str, list[int]] = {} if including else {host: list(slots) for host, slots in pool.items()}
    for host, slots in parse_filter(text, flag).items():
        if host not in pool:
            raise ValueError(f"{flag} {text!r}: host {host} is not in {source} (its hosts: {', '.join(pool)})")
        for slot in slots:
            if slot not in pool[host]:
                raise ValueError(f"{flag} {text!r}: {host} has no slot {slot} in {source} "
                                 f"(its slots: {_slot_range(len(pool[host]))})")
        if including:
            picked[host] = slots or list(pool[host])
        else:
            picked[host] = [slot for slot in picked[host] if slot not in slots] if slots else []
    return {host: picked[host] for host in pool if picked.get(host)}


def _slot_range(count: int) -> str:
    return "0" if count == 1 else f"0-{count - 1}"


def _check_limit(flag: str, value: int) -> None:
    if value == 0 or value < -1:
        raise ValueError(f"{flag} {value} is not valid; give a number >= 1 (or -1, the default: no limit)")


def select_nodes(hosts: list[tuple[str, int]], include: str = "", exclude: str = "", num_nodes: int = -1,
                 num_gpus: int = -1, source: str = "hostfile") -> list[Node]:
    """The nodes of the job and their slot ids: the filters applied to the hostfile's hosts, in its order
    (DeepSpeed's parse_inclusion_exclusion, then apply_num_nodes_and_gpus)."""
    _check_limit("--num_nodes", num_nodes)
    _check_limit("--num_gpus", num_gpus)
    if include and exclude:
        raise ValueError(f"--include {include!r} and --exclude {exclude!r}: give one of them, not both")
    if (include or exclude) and (num_nodes != -1 or num_gpus != -1):
        given = "--include" if include else "--exclude"
        raise ValueError(f"{given} cannot be combined with --num_nodes/--num_gpus (as in DeepSpeed); "
                         f"pick the slots with one or the other")
    slots_of = dict(hosts)
    pool = {host: list(range(count)) for host, count in hosts}
    if include:
        pool = _apply_filter(pool, include, "--include", source)
    elif exclude:
        pool = _apply_filter(pool, exclude, "--exclude", source)
    if not pool:
        raise ValueError(f"--exclude {exclude!r} leaves no slot of {source} to run on")
    if num_nodes > 0:
        if num_nodes > len(pool):
            raise ValueError(f"--num_nodes {num_nodes} but {source} lists {len(pool)} host(s): {', '.join(pool)}")
        pool = dict(list(pool.items())[:num_nodes])
    if num_gpus > 0:
        short = [f"{host}: {slots_of[host]}" for host in pool if slots_of[host] < num_gpus]
        if short:
            raise ValueError(f"--num_gpus {num_gpus} but {source} gives fewer slots to {', '.join(short)}")
        pool = {host: list(range(num_gpus)) for host in pool}
    return [Node(host, tuple(slots), slots_of[host]) for host, slots in pool.items()]


# the command

PROG = "dsrecipes.launch.hostfile"
LAUNCH_MODES = ("print", "ssh", "pdsh")


def build_parser() -> argparse.ArgumentParser:
    from dsrecipes.launch.torchrun_commands import DEFAULT_MASTER_PORT, DEFAULT_RDZV_ID

    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\nThe hostfile and its filters:")[0],
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
    from dsrecipes.launch.layout import check_layout
    from dsrecipes.launch.remote_env import forwarded_env
    from dsrecipes.launch.torchrun_commands import Launch, check_endpoint, processes_per_node

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
    from dsrecipes.launch.torchrun_commands import rdzv_endpoint

    nodes = len(launch.nodes)
    return (f"{PROG}: {nodes} node{'s' if nodes != 1 else ''} x {launch.nproc} process(es) = world "
            f"{nodes * launch.nproc}; rendezvous {rdzv_endpoint(launch.addr, launch.master_port)} "
            f"(id {launch.rdzv_id})")


def launch_ssh(launch) -> int:
    from dsrecipes.launch.ssh_launch import run_parallel
    from dsrecipes.launch.torchrun_commands import ssh_argv, ssh_command

    for index in range(len(launch.nodes)):
        print(f"{PROG}: {ssh_command(launch, index)}", file=sys.stderr, flush=True)
    return run_parallel([(node.host, ssh_argv(launch, index)) for index, node in enumerate(launch.nodes)])


def launch_pdsh(launch) -> int:
    from dsrecipes.launch.torchrun_commands import pdsh_argv, pdsh_command

    print(f"{PROG}: {pdsh_command(launch)}", file=sys.stderr, flush=True)
    try:
        return subprocess.run(pdsh_argv(launch), env={**os.environ, "PDSH_RCMD_TYPE": "ssh"}).returncode
    except KeyboardInterrupt:  # pdsh got the Ctrl-C too and stops its remote commands itself
        return 130


def main(argv: Sequence[str] | None = None) -> int:
    from dsrecipes.launch.torchrun_commands import node_command
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
