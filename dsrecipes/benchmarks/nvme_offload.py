"""ZeRO-Infinity NVMe offload vs CPU offload: peak host memory, throughput and the I/O bandwidth achieved.

    python -m dsrecipes.benchmarks.nvme_offload --world-size 1 2 --model gpt2_124m --steps 6 --out bench/nvme
    python -m dsrecipes.benchmarks.nvme_offload --nvme-path /local_nvme --cache-dir /tmp/ds_cache
    python -m dsrecipes.benchmarks.nvme_offload --smoke            # gpt_debug, world 1, 2 steps (seconds)

For every --world-size W the same ZeRO-3 recipe (model flavor --model, block length --seq, micro-batch x
accumulation x W, AdamW, fp32, the built-in corpus, constant learning rate) is trained by the real CLI,
`python -m dsrecipes launcher.nproc_per_node=W zero.stage=3 ...`, twice:

  cpu   zero.offload_optimizer=cpu zero.offload_param=cpu (FSDP2's CPUOffloadPolicy: every shard and
        optimizer state in host memory);
  nvme  zero.offload_optimizer=nvme zero.offload_param=nvme zero.nvme_path=--nvme-path (parameter shards
        and optimizer states in swap files, streamed through zero.buffer_count / param_buffer_count host
        buffers of zero.buffer_size elements).

Figures per run:

  peak RSS   each run is started from a fresh wrapper process (distributed_throughput.measure); the figure
             is that wrapper's RUSAGE_CHILDREN ru_maxrss: the largest peak RSS of any single process of the
             run (a rank, or the launching process). It includes the interpreter, torch and the data.
  tokens/s   optimizer steps are timed in windows of --log-interval steps (default 1: every step) and the
             median of the windows after the first (which holds start-up and the first step's state
             allocation) is reported, read from the run's metrics.jsonl. The summary's perf/tokens_per_s
             (all steps, the first included) is kept in the CSV as summary_tokens_per_s.
  NVMe I/O   from rank 0's summary.json: nvme/read_gib, nvme/written_gib (rank 0's bytes, the final
             evaluation's parameter reads included), nvme/io_busy_s (wall time with at least one transfer
             in flight) and nvme/io_gib_per_s = (read + written) / io_busy_s.

The disk's own sequential bandwidth is measured in the same benchmark run on the same --nvme-path, with
the same I/O engine and zero.aio settings: a --seq-mib scratch file (swap_file.SwapFile: preallocated,
unlinked, O_DIRECT where the file system allows it) is written then read in --seq-chunk-mib requests
(aio.AsyncIO from aio.aligned_buffer buffers, two requests in flight), timed by wall clock, best of
--seq-repeats passes. The run's achieved bandwidth is compared with the sequential bandwidth at the
run's own read/write mix, (R + W) / (R / read_bw + W / write_bw), as a percentage; the target is 70%.

NVMe rows also carry the ratios NVMe / CPU of peak RSS and tokens/s at the same world size. Prints one
rich table and writes nvme_offload.csv, .json, .md and .png (tokens/s per run) to --out. A run that
fails prints its stderr tail and its row reads the error; the others still run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dsrecipes.benchmarks.distributed_throughput import measure
from dsrecipes.benchmarks.results import BarChart, write_rows

MODES = ("cpu", "nvme")
TARGET_PCT = 70.0
GIB = 2**30


# --------------------------------------------------------------------------- the disk's sequential bandwidth
def sequential_bandwidth(path: str, total_mib: int, chunk_mib: int, aio_cfg, repeats: int = 2) -> dict:
    """Write then read a total_mib scratch file under `path` in chunk_mib requests through AsyncIO (two in
    flight, each split by aio_cfg as the swappers' requests are); best GiB/s of `repeats` passes each."""
    from dsrecipes.distributed.offload.aio import AsyncIO, aligned_buffer
    from dsrecipes.distributed.offload.swap_file import SwapFile

    chunk = chunk_mib * 2**20
    total = max(1, total_mib // chunk_mib) * chunk
    swap = SwapFile(path, f"dsrecipes-seq-bench-{os.getpid()}.swp", total)
    aio = AsyncIO(aio_cfg)
    buffers = [aligned_buffer(chunk) for _ in range(2)]
    for b in buffers:
        b.random_(0, 256)  # not zeros: nothing below may shortcut them

    def one_pass(write: bool) -> float:
        pending = []
        start = time.perf_counter()
        for i, offset in enumerate(range(0, total, chunk)):
            if len(pending) == 2:
                pending.pop(0).wait()
            op = aio.write if write else aio.read
            pending.append(op(swap.fd, buffers[i % 2], offset))
        for request in pending:
            request.wait()
        if write and not swap.direct:
            os.fsync(swap.fd)
        return total / GIB / (time.perf_counter() - start)

    try:
        write_bw = read_bw = 0.0
        for _ in range(max(1, repeats)):
            write_bw = max(write_bw, one_pass(write=True))
            read_bw = max(read_bw, one_pass(write=False))
    finally:
        aio.close()
        swap.close()
    return {"seq_write_gib_per_s": write_bw, "seq_read_gib_per_s": read_bw, "seq_file_mib": total / 2**20,
            "seq_chunk_mib": chunk_mib, "o_direct": swap.direct}


def mixed_bandwidth(seq: dict, read_gib: float, written_gib: float) -> float | None:
    """The sequential bandwidth at a run's read/write mix: (R + W) / (R / read_bw + W / write_bw)."""
    rb, wb = seq.get("seq_read_gib_per_s"), seq.get("seq_write_gib_per_s")
    if not rb or not wb or read_gib + written_gib <= 0:
        return None
    return (read_gib + written_gib) / (read_gib / rb + written_gib / wb)


# --------------------------------------------------------------------------- sizes
def largest_shard(model: str, seq: int) -> int:
    """Elements of the largest parameter shard at world size 1 (the whole largest parameter, byte vocabulary)."""
    import torch
    from omegaconf import OmegaConf

    from dsrecipes.config.store import compose
    from dsrecipes.distributed.offload.plan import shard_numels
    from dsrecipes.models.config import padded_vocab_size
    from dsrecipes.models.gpt import GPT

    root = OmegaConf.to_object(compose([f"model={model}", f"model.max_seq_len={seq}"]))
    root.model.vocab_size = root.model.vocab_size or padded_vocab_size(256)  # the byte tokenizer's vocabulary
    with torch.device("meta"):
        shapes = [tuple(p.shape) for p in GPT(root.model).parameters()]
    return max(shard_numels(shapes, 1)[1])


def auto_buffer_size(model: str, seq: int) -> int:
    """zero.buffer_size for the benchmark: the largest shard rounded up to a million elements, at least 4e6."""
    return max(4_000_000, -(-largest_shard(model, seq) // 1_000_000) * 1_000_000)


# --------------------------------------------------------------------------- one run
def run_args(args, world: int, mode: str) -> argparse.Namespace:
    """The Namespace distributed_throughput.dsrecipes_command / measure read, for one (world, mode) run."""
    extra = [f"zero.offload_optimizer={mode}", f"zero.offload_param={mode}", "checkpoint.interval=0",
             f"trainer.eval_batches={args.eval_batches}", f"launcher.start_method={args.start_method}"]
    if mode == "nvme":
        extra += [f"zero.nvme_path={args.nvme_path}", f"zero.buffer_size={args.buffer_size}",
                  f"zero.buffer_count={args.buffer_count}", f"zero.param_buffer_count={args.param_buffer_count}",
                  *(f"zero.aio.{k}={v}" for k, v in aio_overrides(args).items())]
    return argparse.Namespace(world_size=world, model=args.model, seq=args.seq, micro_batch=args.micro_batch,
                              grad_accum=args.grad_accum, steps=args.steps, log_interval=args.log_interval,
                              max_bytes=args.max_bytes, cache_dir=args.cache_dir, timeout=args.timeout,
                              extra=[*extra, *args.extra])


def aio_overrides(args) -> dict:
    return {"block_size": args.aio_block_size, "queue_depth": args.aio_queue_depth,
            "thread_count": args.aio_thread_count, "single_submit": str(args.aio_single_submit).lower(),
            "overlap_events": str(args.aio_overlap_events).lower()}


def aio_config(args):
    from dsrecipes.distributed.config import AioConfig

    return AioConfig(block_size=args.aio_block_size, queue_depth=args.aio_queue_depth,
                     thread_count=args.aio_thread_count, single_submit=args.aio_single_submit,
                     overlap_events=args.aio_overlap_events)


def run_one(args, world: int, mode: str, out: Path) -> dict:
    """One measured run (a fresh wrapper process, distributed_throughput.measure) plus its summary.json."""
    workdir = out / f"world{world}_{mode}"
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    try:
        result = measure("dsrecipes", 3, run_args(args, world, mode), workdir)
    except subprocess.TimeoutExpired:
        print(f"[world {world} {mode}] timed out after {args.timeout} s", file=sys.stderr)
        return {"error": f"timed out after {args.timeout} s"}
    except Exception as error:  # noqa: BLE001 - one failing run must not end the benchmark
        print(f"[world {world} {mode}] failed: {type(error).__name__}: {error}", file=sys.stderr)
        return {"error": f"{type(error).__name__}: {error}"}
    if "error" in result:
        return result
    summary = workdir / "dsrecipes_stage3_round0" / "summary.json"
    metrics = json.loads(summary.read_text()).get("metrics", {}) if summary.exists() else {}
    result["summary_tokens_per_s"] = metrics.get("perf/tokens_per_s")
    result["nvme"] = {k.split("/", 1)[1]: v for k, v in metrics.items() if k.startswith("nvme/")}
    return result


# --------------------------------------------------------------------------- report
def make_row(args, world: int, mode: str, result: dict, seq: dict, cpu_row: dict | None) -> dict:
    nv = result.get("nvme", {}) if mode == "nvme" else {}
    row = {"world_size": world, "offload": mode, "model": args.model, "seq": args.seq,
           "micro_batch": args.micro_batch, "grad_accum": args.grad_accum, "steps": args.steps,
           "buffer_size": args.buffer_size if mode == "nvme" else None,
           "tokens_per_s": result.get("tokens_per_s"), "summary_tokens_per_s": result.get("summary_tokens_per_s"),
           "step_time_s": result.get("step_time_s"), "final_loss": result.get("final_loss"),
           "peak_rss_mb": result.get("children_peak_rss_mb"),
           "read_gib": nv.get("read_gib"), "written_gib": nv.get("written_gib"), "io_busy_s": nv.get("io_busy_s"),
           "io_gib_per_s": nv.get("io_gib_per_s"), "optimizer_file_mib": nv.get("optimizer_file_mib"),
           "param_file_mib": nv.get("param_file_mib"), "optimizer_pool_mib": nv.get("optimizer_pool_mib"),
           "param_pool_mib": nv.get("param_pool_mib"),
           "seq_read_gib_per_s": seq.get("seq_read_gib_per_s") if mode == "nvme" else None,
           "seq_write_gib_per_s": seq.get("seq_write_gib_per_s") if mode == "nvme" else None,
           "seq_mixed_gib_per_s": None, "pct_of_sequential": None, "meets_target": None,
           "rss_vs_cpu": None, "tokens_per_s_vs_cpu": None, "error": result.get("error")}
    if mode == "nvme" and row["read_gib"] is not None:
        mixed = mixed_bandwidth(seq, row["read_gib"], row["written_gib"])
        row["seq_mixed_gib_per_s"] = mixed
        if mixed and row["io_gib_per_s"]:
            row["pct_of_sequential"] = 100 * row["io_gib_per_s"] / mixed
            row["meets_target"] = row["pct_of_sequential"] >= TARGET_PCT
    if mode == "nvme" and cpu_row is not None:
        for key, ratio in (("peak_rss_mb", "rss_vs_cpu"), ("tokens_per_s", "tokens_per_s_vs_cpu")):
            if row[key] and cpu_row.get(key):
                row[ratio] = row[key] / cpu_row[key]
    return row


def print_table(rows: list[dict], args, seq: dict):
    from rich.table import Table

    from dsrecipes.utils.console import make_console
    from dsrecipes.utils.console import print_table as print_uncut

    seq_text = (f"sequential on {args.nvme_path}: write {seq['seq_write_gib_per_s']:.2f} / read "
                f"{seq['seq_read_gib_per_s']:.2f} GiB/s ({seq['seq_file_mib']:.0f} MiB, "
                f"{seq['seq_chunk_mib']} MiB requests, O_DIRECT {'on' if seq['o_direct'] else 'off'})"
                if "seq_read_gib_per_s" in seq else f"sequential bandwidth: {seq.get('error', '-')}")
    table = Table(title=f"ZeRO-3 offload, {args.model}, {args.micro_batch}x{args.grad_accum}xW x {args.seq} tokens/step, "
                        f"{args.steps} steps", caption=seq_text)
    columns = ["world", "offload", "tok/s", "peak RSS MB", "read GiB", "written GiB", "I/O busy s", "I/O GiB/s",
               "seq GiB/s (mix)", "% of seq (target 70)", "RSS x cpu", "tok/s x cpu", "error"]
    for column in columns:
        table.add_column(column, justify="left" if column in ("offload", "error") else "right")

    def num(value, fmt):
        return format(value, fmt) if value is not None else "-"

    for r in rows:
        pct = num(r["pct_of_sequential"], ".0f")
        if r["meets_target"] is not None:
            pct += " ok" if r["meets_target"] else " below"
        table.add_row(str(r["world_size"]), r["offload"], num(r["tokens_per_s"], ",.1f"), num(r["peak_rss_mb"], ",.0f"),
                      num(r["read_gib"], ".2f"), num(r["written_gib"], ".2f"), num(r["io_busy_s"], ".2f"),
                      num(r["io_gib_per_s"], ".2f"), num(r["seq_mixed_gib_per_s"], ".2f"), pct,
                      num(r["rss_vs_cpu"], ".2f"), num(r["tokens_per_s_vs_cpu"], ".2f"), (r["error"] or "")[:60])
    print_uncut(make_console(), table)
    return table


# --------------------------------------------------------------------------- entry point
def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true",
                        help="a seconds-long check: gpt_debug, world 1, 2 steps, seq 64, tiny buffers, 32 MiB file")
    parser.add_argument("--world-size", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--model", default="gpt2_124m", help="flavor name of conf/model")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--log-interval", type=int, default=1, help="steps per timed window")
    parser.add_argument("--eval-batches", type=int, default=1, help="batches of the final evaluation")
    parser.add_argument("--nvme-path", default=None, help="zero.nvme_path (default: a fresh folder under /tmp)")
    parser.add_argument("--buffer-size", type=int, default=None,
                        help="zero.buffer_size (default: the largest parameter rounded up to 1e6, at least 4e6)")
    parser.add_argument("--buffer-count", type=int, default=4, help="zero.buffer_count")
    parser.add_argument("--param-buffer-count", type=int, default=5, help="zero.param_buffer_count")
    parser.add_argument("--aio-block-size", type=int, default=1048576)
    parser.add_argument("--aio-queue-depth", type=int, default=8)
    parser.add_argument("--aio-thread-count", type=int, default=1)
    parser.add_argument("--aio-single-submit", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--aio-overlap-events", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--seq-mib", type=int, default=512, help="size of the sequential-bandwidth scratch file")
    parser.add_argument("--seq-chunk-mib", type=int, default=64, help="bytes per sequential request")
    parser.add_argument("--seq-repeats", type=int, default=2, help="write+read passes (the best of each counts)")
    parser.add_argument("--max-bytes", type=int, default=2_000_000, help="cap on the corpus (data.max_bytes)")
    parser.add_argument("--cache-dir", default=None, help="datasets cache (data.cache_dir)")
    parser.add_argument("--start-method", default="fork", choices=["fork", "spawn", "forkserver"],
                        help="launcher.start_method of the runs (fork: workers start faster; CPU only)")
    parser.add_argument("--timeout", type=int, default=1200, help="seconds allowed per run")
    parser.add_argument("--extra", nargs="*", default=[], help="extra overrides for every run")
    parser.add_argument("--out", default=None, help="folder for the CSV/JSON/Markdown (default: a temporary folder)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.world_size, args.steps, args.seq, args.micro_batch = "gpt_debug", [1], 2, 64, 2
        args.max_bytes, args.seq_mib, args.seq_chunk_mib, args.seq_repeats = 300_000, 32, 8, 1
        args.buffer_size = args.buffer_size or 131072
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="dsrecipes_nvme_bench_")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    own_nvme = args.nvme_path is None
    args.nvme_path = str(Path(args.nvme_path or tempfile.mkdtemp(prefix="dsrecipes_nvme_", dir="/tmp")).resolve())
    os.makedirs(args.nvme_path, exist_ok=True)
    if args.buffer_size is None:
        args.buffer_size = auto_buffer_size(args.model, args.seq)
    print(f"NVMe path {args.nvme_path}; zero.buffer_size={args.buffer_size:,} elements", flush=True)
    try:
        seq = sequential_bandwidth(args.nvme_path, args.seq_mib, args.seq_chunk_mib, aio_config(args),
                                   args.seq_repeats)
        print(f"sequential bandwidth: write {seq['seq_write_gib_per_s']:.2f} GiB/s, read "
              f"{seq['seq_read_gib_per_s']:.2f} GiB/s (O_DIRECT {seq['o_direct']})", flush=True)
    except Exception as error:  # noqa: BLE001 - the training comparison still runs
        seq = {"error": f"{type(error).__name__}: {error}"}
        print(f"sequential bandwidth failed: {seq['error']}", file=sys.stderr, flush=True)

    rows = []
    try:
        for world in args.world_size:
            cpu_row = None
            for mode in MODES:
                print(f"world {world}: ZeRO-3 {mode} offload ...", flush=True)
                started = time.perf_counter()
                result = run_one(args, world, mode, out)
                row = make_row(args, world, mode, result, seq, cpu_row)
                row["wall_s"] = time.perf_counter() - started
                rows.append(row)
                if mode == "cpu":
                    cpu_row = row
    finally:
        if own_nvme:
            shutil.rmtree(args.nvme_path, ignore_errors=True)
    for row in rows:  # the same columns in every row
        row.update(seq_file_mib=seq.get("seq_file_mib"), seq_chunk_mib=seq.get("seq_chunk_mib"),
                   o_direct=seq.get("o_direct"), seq_error=seq.get("error"))
    table = print_table(rows, args, seq)
    chart = BarChart(f"ZeRO-3 offload, {args.model}", "tokens/s", {"tokens_per_s": ""},
                     labels=("world_size", "offload"))
    print(f"wrote {write_rows(out, 'nvme_offload', rows, table, chart)}")
    return rows


if __name__ == "__main__":
    main()
