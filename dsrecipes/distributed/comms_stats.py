"""Bandwidth formulas and the per-op / per-message-size summary of the comms logger (dsrecipes.distributed.comms_logger).

algbw and busbw follow DeepSpeed's calc_bw_log (deepspeed/utils/comms_logging.py), which follows
nccl-tests' PERFORMANCE.md, in Gbit/s (bytes x 8 / 1e9 / seconds). With S the op's message size
(see comms_logger.OP_TABLE), t its latency and n the size of the group it ran over:

| op | algbw | busbw |
|---|---|---|
| all_reduce, all_reduce_coalesced | 2 S / t | S / t x 2 (n-1) / n |
| all_gather, all_gather_into_tensor (S: this rank's input) | n S / t | n S / t x (n-1) / n |
| reduce_scatter, reduce_scatter_tensor (S: the whole input) | S / t | S / t x (n-1) / n |
| all_to_all_single, all_to_all | S / t | S / t x (n-1) / n |
| broadcast, reduce, gather, scatter, barrier | S / t | S / t |

Two deliberate differences from DeepSpeed: reduce-scatter's message is already the whole input, so it
is not multiplied by n again (DeepSpeed does, which overstates its bandwidth n-fold; nccl-tests' S is
the whole input), and all_to_all (the list form, which DeepSpeed's formula does not know) is
all_to_all_single's. n is the op's group's size (DeepSpeed takes the world size). Per-size means of
latency and bandwidth are DeepSpeed's 10% trimmed means.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

_ALL_REDUCE = frozenset({"all_reduce", "all_reduce_coalesced"})
_GATHER_LIKE = frozenset({"all_gather", "all_gather_into_tensor"})
_SCATTER_REDUCE = frozenset({"reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single"})
_ROOTED = frozenset({"broadcast", "reduce", "gather", "scatter", "barrier"})


def bandwidth_gbps(op: str, size_bytes: int, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in Gbit/s of one `op` moving `size_bytes` in `seconds` over a group of `n` ranks."""
    if seconds <= 0 or n < 1:
        return 0.0, 0.0
    rate = size_bytes / seconds
    if op in _ALL_REDUCE:
        alg, bus = 2 * rate, rate * 2 * (n - 1) / n
    elif op in _GATHER_LIKE:
        alg = rate * n
        bus = alg * (n - 1) / n
    elif op in _SCATTER_REDUCE:
        alg, bus = rate, rate * (n - 1) / n
    elif op in _ROOTED:
        alg = bus = rate
    else:
        raise ValueError(f"no bandwidth formula for op {op!r}")
    return alg * 8 / 1e9, bus * 8 / 1e9


def trim_mean(values: Sequence[float], trim: float = 0.1) -> float:
    """DeepSpeed's trimmed mean: drop round(n x trim) values at each end of the sorted list (0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    k = int(round(len(ordered) * trim))
    kept = ordered[k:len(ordered) - k] or ordered
    return sum(kept) / len(kept)


def convert_size(size_bytes: float) -> str:
    """A human size in binary units, two decimals ("1.5 MiB" is 1.5 x 2**20 bytes). DeepSpeed's comms logger
    divides by the same powers of 1024 but labels them KB / MB / GB; the labels here say what the numbers are."""
    if size_bytes <= 0:
        return "0 B"
    names = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    i = min(int(math.floor(math.log(size_bytes, 1024))), len(names) - 1)
    return f"{round(size_bytes / 1024 ** i, 2)} {names[i]}"


@dataclass
class OpSummary:
    """One row of the summary: every logged call of `name` with this message size."""

    name: str  # the record name (the op, with the caller's name under debug)
    op: str  # the op (DeepSpeed's spelling)
    msg_size_bytes: int
    group_size: int
    count: int
    total_bytes: int
    total_latency_s: float
    mean_latency_s: float  # 10% trimmed, as DeepSpeed
    algbw_gbps: float
    busbw_gbps: float

    def as_dict(self) -> dict:
        return asdict(self)


def summarize(records: dict[tuple[str, str, int, int], list[float]]) -> list[OpSummary]:
    """Rows for {(name, op, msg_size, group_size): [latency_s, ...]}, sorted by name then message size."""
    rows = []
    for (name, op, size, n), latencies in sorted(records.items()):
        bandwidths = [bandwidth_gbps(op, size, t, n) for t in latencies]
        rows.append(OpSummary(
            name=name, op=op, msg_size_bytes=size, group_size=n, count=len(latencies),
            total_bytes=size * len(latencies), total_latency_s=sum(latencies),
            mean_latency_s=trim_mean(latencies), algbw_gbps=trim_mean([b[0] for b in bandwidths]),
            busbw_gbps=trim_mean([b[1] for b in bandwidths]),
        ))
    return rows


def totals_by_op(rows: Iterable[OpSummary]) -> dict[str, dict[str, float]]:
    """{op: {"count", "bytes", "latency_s"}} over every message size."""
    totals: dict[str, dict[str, float]] = {}
    for row in rows:
        entry = totals.setdefault(row.op, {"count": 0, "bytes": 0, "latency_s": 0.0})
        entry["count"] += row.count
        entry["bytes"] += row.total_bytes
        entry["latency_s"] += row.total_latency_s
    return totals


INTRA_NODE, INTER_NODE = "intra-node", "inter-node"


def link_of(ranks: Sequence[int], ranks_per_node: int) -> str:
    """Whether a process group's collectives stay inside one node or cross nodes (ranks are numbered node by
    node, ranks_per_node to a node, as torchrun and the elastic agent number them)."""
    return INTRA_NODE if len({rank // max(ranks_per_node, 1) for rank in ranks}) <= 1 else INTER_NODE


@dataclass
class GroupTraffic:
    """This rank's collectives in one process group: the group's global ranks, where its traffic runs, the ops
    and the bytes this rank put in (a message as in OpSummary)."""

    ranks: tuple[int, ...]
    link: str
    ops: int = 0
    bytes: int = 0

    def as_dict(self) -> dict:
        return {"ranks": list(self.ranks), "link": self.link, "ops": self.ops, "bytes": self.bytes}


def bytes_by_link(groups: Iterable[GroupTraffic]) -> dict[str, int]:
    """{"intra-node": bytes, "inter-node": bytes} over every group: what hpZ and hierarchical collectives move off
    the slower links shows up as inter-node bytes going down."""
    totals = {INTRA_NODE: 0, INTER_NODE: 0}
    for group in groups:
        totals[group.link] += group.bytes
    return totals


def group_table(groups: Sequence[GroupTraffic], title: str):
    """A rich Table, one row per process group: its ranks, intra- or inter-node, ops, bytes and share of the bytes."""
    from rich.table import Table

    table = Table(title=title)
    for column in ("process group (ranks)", "link", "ops", "bytes", "share"):
        table.add_column(column, justify="left" if column in ("process group (ranks)", "link") else "right")
    total = max(sum(g.bytes for g in groups), 1)
    for group in groups:
        table.add_row(_ranks_text(group.ranks), group.link, str(group.ops), convert_size(group.bytes),
                      f"{100 * group.bytes / total:.1f}%")
    return table


def _ranks_text(ranks: Sequence[int]) -> str:
    """0-3 for a contiguous run, else the list."""
    ranks = list(ranks)
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(str(r) for r in ranks)


CSV_COLUMNS = ("name", "op", "msg_size_bytes", "group_size", "count", "total_bytes", "total_latency_s",
               "mean_latency_s", "algbw_gbps", "busbw_gbps")


def summary_table(rows: Sequence[OpSummary], title: str):
    """A rich Table, one row per op and message size (DeepSpeed's log_summary, as a table)."""
    from rich.table import Table

    table = Table(title=title)
    for column in ("op", "message size", "count", "total bytes", "total latency (ms)", "mean latency (ms)",
                   "algbw (Gbps)", "busbw (Gbps)"):
        table.add_column(column, justify="left" if column == "op" else "right")
    for row in rows:
        table.add_row(row.name, convert_size(row.msg_size_bytes), str(row.count), convert_size(row.total_bytes),
                      f"{row.total_latency_s * 1e3:.2f}", f"{row.mean_latency_s * 1e3:.3f}", f"{row.algbw_gbps:.3f}",
                      f"{row.busbw_gbps:.3f}")
    return table


def write_comms_files(run_dir, data: dict, rows: Sequence[OpSummary]) -> tuple:
    """<run_dir>/comms.json (`data` with the rows under "ops") and comms.csv (the rows); returns both paths."""
    import csv
    import json
    from pathlib import Path

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    json_path, csv_path = run_dir / "comms.json", run_dir / "comms.csv"
    json_path.write_text(json.dumps({**data, "ops": [row.as_dict() for row in rows]}, indent=2))
    with open(csv_path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow(row.as_dict())
    return json_path, csv_path
