"""The per-node torchrun commands of a hostfile's nodes, and the ssh / pdsh commands that start them.

Node i (hostfile order) runs

    [KEY=VALUE ...] [CUDA_VISIBLE_DEVICES=ids] torchrun --nnodes N --node-rank i --nproc-per-node S \
        --rdzv-backend c10d --rdzv-endpoint MASTER_ADDR:MASTER_PORT --rdzv-id ID -m dsrecipes OVERRIDES...

torchrun starts the same number of processes on every node, so the nodes' slot counts must be equal.
CUDA_VISIBLE_DEVICES is set where the filters picked particular slots of a host (DeepSpeed's launch.py
sets it from the same slot ids), so local rank k runs on the k-th picked GPU. The forwarded variables
(dsrecipes.launch.remote_env) come first on the line, so torchrun and its workers inherit them.

    ssh HOST 'cd CWD && <node command>'                     one per node (--launch ssh)
    PDSH_RCMD_TYPE=ssh pdsh -S -f 1024 -w H0,H1 'export KEY=VALUE; cd CWD; <node command with --node-rank %n>'

The pdsh form mirrors DeepSpeed's PDSHRunner: one command for every host, pdsh puts each host's rank for
%n; per-node CUDA_VISIBLE_DEVICES becomes a `case %n in` on that rank.
"""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dsrecipes.launch.remote_env import assignments

if TYPE_CHECKING:  # the hostfile module imports this one: the type only, for annotations
    from dsrecipes.launch.hostfile import Node

DEFAULT_MASTER_PORT = 29500  # torch.distributed's default, DeepSpeed's --master_port default
DEFAULT_RDZV_ID = "dsrecipes"
PDSH_FAN_OUT = 1024  # DeepSpeed's PDSH_MAX_FAN_OUT


def processes_per_node(nodes: Sequence[Node], source: str = "hostfile") -> int:
    """The slot count every node shares; unequal counts are a ValueError naming the hosts and their slots."""
    counts = {len(node.slot_ids) for node in nodes}
    if len(counts) != 1:
        listed = ", ".join(f"{node.host}: {len(node.slot_ids)}" for node in nodes)
        raise ValueError(f"torchrun starts the same number of processes on every node, but the slots of {source} "
                         f"differ ({listed}); make them equal in the hostfile or pick equal slots with --num_gpus N "
                         f"or --include/--exclude")
    return counts.pop()


def rdzv_endpoint(addr: str, port: int) -> str:
    """HOST:PORT, an IPv6 address in brackets."""
    return f"[{addr}]:{port}" if ":" in addr and not addr.startswith("[") else f"{addr}:{port}"


def is_loopback(host: str) -> bool:
    """localhost or a loopback address (no name lookup: the check must not depend on this machine's DNS)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_endpoint(addr: str, nodes: Sequence[Node]) -> None:
    """A loopback rendezvous address where some node is another machine can only hang: refused with a way out.
    (DeepSpeed asks the first host for its address with `hostname -I`; here the first host's name is taken as it is.)"""
    remote = [node.host for node in nodes if not is_loopback(node.host)]
    if is_loopback(addr) and remote:
        raise ValueError(f"the rendezvous address {addr} is this machine's loopback, which {', '.join(remote)} cannot "
                         f"reach; give --master_addr with the first node's address on the network")


@dataclass(frozen=True)
class Launch:
    """Everything the commands are made of.

    torchrun_args: extra torchrun flags (e.g. --max-restarts from launcher.max_restarts, dsrecipes.launch.layout).
    torchrun: the program's words; the CLI gives the torchrun beside its own interpreter, or that interpreter with
    `-m torch.distributed.run` (every node is assumed to have the same installation at the same path, as DeepSpeed
    assumes for its sys.executable).
    """

    nodes: tuple[Node, ...]
    overrides: tuple[str, ...]
    cwd: str
    master_addr: str = ""  # "" = the first node's host
    master_port: int = DEFAULT_MASTER_PORT
    rdzv_id: str = DEFAULT_RDZV_ID
    env: dict[str, str] = field(default_factory=dict)
    torchrun: tuple[str, ...] = ("torchrun",)
    torchrun_args: tuple[str, ...] = ()

    @property
    def addr(self) -> str:
        return self.master_addr or self.nodes[0].host

    @property
    def nproc(self) -> int:
        return processes_per_node(self.nodes)

    def torchrun_argv(self, node_rank: int | str) -> list[str]:
        return [*self.torchrun, "--nnodes", str(len(self.nodes)), "--node-rank", str(node_rank),
                "--nproc-per-node", str(self.nproc), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", rdzv_endpoint(self.addr, self.master_port), "--rdzv-id", self.rdzv_id,
                *self.torchrun_args, "-m", "dsrecipes", *self.overrides]


def visible_devices(node: Node) -> str | None:
    """CUDA_VISIBLE_DEVICES for a node whose slots were narrowed to particular ids; None where it runs on all."""
    return ",".join(map(str, node.slot_ids)) if node.narrowed else None


def node_command(launch: Launch, index: int) -> str:
    """The shell command that starts node `index`'s torchrun agent (run it on that host)."""
    words = assignments(launch.env)
    devices = visible_devices(launch.nodes[index])
    if devices is not None:
        words.append(f"CUDA_VISIBLE_DEVICES={devices}")
    return " ".join([*words, shlex.join(launch.torchrun_argv(index))])


def ssh_argv(launch: Launch, index: int) -> list[str]:
    """ssh HOST 'cd CWD && <node command>' as an argument list (ssh hands the last one to the remote shell)."""
    return ["ssh", launch.nodes[index].host, f"cd {shlex.quote(launch.cwd)} && {node_command(launch, index)}"]


def ssh_command(launch: Launch, index: int) -> str:
    return shlex.join(ssh_argv(launch, index))


def pdsh_remote_command(launch: Launch) -> str:
    """The one command pdsh runs on every host, %n standing for the host's rank (see the module docstring)."""
    parts = [f"export {word};" for word in assignments(launch.env)]
    parts.append(f"cd {shlex.quote(launch.cwd)};")
    cases = [f"{index}) export CUDA_VISIBLE_DEVICES={devices};;" for index, node in enumerate(launch.nodes)
             if (devices := visible_devices(node)) is not None]
    if cases:
        parts.append(f"case %n in {' '.join(cases)} esac;")
    parts.append(shlex.join(launch.torchrun_argv("%n")))
    return " ".join(parts)


def pdsh_argv(launch: Launch) -> list[str]:
    """The pdsh command (run it with PDSH_RCMD_TYPE=ssh in its environment, as DeepSpeed does)."""
    hosts = ",".join(node.host for node in launch.nodes)
    return ["pdsh", "-S", "-f", str(PDSH_FAN_OUT), "-w", hosts, pdsh_remote_command(launch)]


def pdsh_command(launch: Launch) -> str:
    return "PDSH_RCMD_TYPE=ssh " + shlex.join(pdsh_argv(launch))
