"""DeepSpeed's hostfile and its resource filters, with DeepSpeed 0.19.8's semantics (deepspeed/launcher/runner.py).

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

import os
import re
from dataclasses import dataclass

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
