"""Distributed training throughput: dsrecipes vs a hand-written PyTorch loop vs DeepSpeed, per ZeRO stage.

    python -m dsrecipes.benchmarks.distributed_throughput --world-size 2 --stage 0 1 2 3 --steps 30
    python -m dsrecipes.benchmarks.distributed_throughput --rounds 3 --frameworks dsrecipes dsrecipes_compile deepspeed
    python -m dsrecipes.benchmarks.distributed_throughput --world-size 8 --stage 2 3 --model gpt2_124m \\
        --seq 1024 --micro-batch 8 --grad-accum 2 --steps 60 --out bench/

The same GPT recipe (model flavor, block length, micro-batch x accumulation x world size, AdamW with
the recipe's hyper-parameters and decay groups, gradient clipping 1.0, fp32, the built-in corpus in
the same order, constant learning rate) is trained, for each --stage, by:

  dsrecipes     the real CLI, `python -m dsrecipes launcher.nproc_per_node=W zero.stage=S ...`, in a
                subprocess; throughput is read from the run's metrics.jsonl.
  dsrecipes_compile  the same with `compile=blocks` (each block torch.compile'd; the first window,
                which holds the compilation, is not counted).
  hand-written  a minimal loop in W processes (torch.multiprocessing, spawn): stage 0 DDP, stage 1
                ZeroRedundancyOptimizer + DDP, stage 2 FSDP2 fully_shard(reshard_after_forward=False)
                per block and at the root, stage 3 fully_shard.
  deepspeed     deepspeed.initialize with zero_optimization.stage=S, when DeepSpeed is installed
                (otherwise the column reads "deepspeed not installed").

Tokens/s is measured the same way for all three: optimizer steps are timed in windows of
--log-interval steps (tokens = steps x global batch x block length) and the median of the windows
after the first (which includes start-up) is reported.

Peak memory per rank: on CUDA, torch.cuda.max_memory_allocated (dsrecipes: its logged mem/peak_gib of
rank 0; the others: the maximum over ranks). On CPU, the peak resident set size: every run is started
from a fresh wrapper process, and the number is that wrapper's RUSAGE_CHILDREN ru_maxrss, i.e. the
largest peak RSS of any single process of the run (ranks, and for dsrecipes also its launching
process), which is the rank's peak for symmetric data-parallel workers. It includes the Python
interpreter, torch and the data, not only model state.

With --rounds R every framework runs R times per stage, interleaved, the order rotating each round
(so none always runs first on a cold or busy machine); tokens/s is the median over rounds (all
rounds are kept in the CSV), peak memory the maximum. On small shared machines single runs vary by
more than the differences measured; use --rounds 3 or more there.

The machine's fp32 matmul peak is measured in the same run (a square torch.mm on all cores, best of
several) and each dsrecipes row reports its model FLOP/s (tokens/s x the GPT's training FLOPs per
token) as a fraction of it.

Prints one table with the ratios dsrecipes/hand-written and dsrecipes/DeepSpeed and writes
distributed_throughput.csv, .json, .md (the table) and .png (tokens/s per stage and framework) to --out.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dsrecipes.benchmarks.results import BarChart, write_rows

FRAMEWORKS = ("dsrecipes", "dsrecipes_compile", "handwritten", "deepspeed")
DEFAULT_FRAMEWORKS = ("dsrecipes", "handwritten", "deepspeed")
OURS = ("dsrecipes", "dsrecipes_compile")
HANDWRITTEN_MECHANISM = {
    0: "DDP",
    1: "ZeroRedundancyOptimizer+DDP",
    2: "fully_shard(reshard_after_forward=False)",
    3: "fully_shard",
}
# The recipe's AdamW (conf/optimizer/adamw.yaml); seed of conf/trainer/default.yaml.
LR, BETAS, EPS, WEIGHT_DECAY, SEED = 1.0e-3, (0.9, 0.95), 1.0e-8, 0.1, 1234


def deepspeed_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("deepspeed") is not None


def child_env() -> dict:
    env = dict(os.environ, WANDB_MODE="offline", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env.pop("WANDB_API_KEY", None)
    return env


def median_tokens_per_s(windows: list[dict]) -> tuple[float, float]:
    """(tokens/s, step time) medians over the windows after the first."""
    windows = windows[1:]
    if not windows:
        raise RuntimeError("too few steps to measure: raise --steps (at least 2 log windows are needed)")
    return (statistics.median(w["tokens_per_s"] for w in windows),
            statistics.median(w["step_time_s"] for w in windows))


# --------------------------------------------------------------------------- (a) dsrecipes
def matmul_peak_gflops(size: int = 1024, repeats: int = 5) -> float:
    """The machine's fp32 matmul GFLOP/s: the best of `repeats` timed [size x size] @ [size x size] torch.mm
    batches on every core torch uses (CUDA: the current device)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    a, b = (torch.randn(size, size, device=device) for _ in range(2))
    best = float("inf")
    for _ in range(repeats + 1):  # the first is a warm-up
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(8):
            torch.mm(a, b)
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / 8)
    return 2 * size**3 / best / 1e9


def model_flops_per_token(args) -> float:
    """Training FLOPs per token (forward + backward) of the benchmarked GPT at --seq, from its config."""
    from omegaconf import OmegaConf

    from dsrecipes.config.store import compose
    from dsrecipes.models.gpt import GPT

    root = OmegaConf.to_object(compose([f"model={args.model}", f"model.max_seq_len={args.seq}"]))
    root.model.vocab_size = root.model.vocab_size or 256  # the byte tokenizer's vocabulary
    import torch

    with torch.device("meta"):
        return GPT(root.model).flops_per_token(args.seq)


def dsrecipes_command(args, stage: int, run_dir: Path, compiled: bool = False) -> list[str]:
    overrides = [
        f"model={args.model}", f"model.max_seq_len={args.seq}", f"trainer.max_steps={args.steps}",
        f"trainer.train_micro_batch_size_per_gpu={args.micro_batch}",
        f"trainer.gradient_accumulation_steps={args.grad_accum}", f"trainer.log_interval={args.log_interval}",
        f"launcher.nproc_per_node={args.world_size}", f"zero.stage={stage}",
        "lr_scheduler=constant", "logger=jsonl", "trainer.eval_interval=0", "trainer.sample_tokens=0",
        "trainer.progress_bar=false",
        "checkpoint.save_final=false", "checkpoint.export_safetensors=false", f"hydra.run.dir={run_dir}",
    ]
    if args.max_bytes:
        overrides.append(f"data.max_bytes={args.max_bytes}")
    if args.cache_dir:
        overrides.append(f"data.cache_dir={args.cache_dir}")
    if compiled:
        overrides.append("compile=blocks")
    return [sys.executable, "-m", "dsrecipes", *overrides, *args.extra]


def read_dsrecipes_run(run_dir: Path) -> dict:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    logged = [json.loads(line) for line in lines]
    logged = [m for m in logged if "perf/tokens_per_s" in m and "train/tokens" not in m]  # not the summary
    windows = [{"tokens_per_s": m["perf/tokens_per_s"], "step_time_s": m["perf/step_time_s"]} for m in logged]
    tokens_per_s, step_time = median_tokens_per_s(windows)
    peak = max((m.get("mem/peak_gib", 0.0) for m in logged), default=0.0)
    return {"tokens_per_s": tokens_per_s, "step_time_s": step_time, "final_loss": logged[-1].get("train/loss"),
            "cuda_peak_mb": peak * 1024 if peak else None}


# --------------------------------------------------------------------------- (b), (c) workers
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, kind: str, stage: int, spec: dict, port: int, result_path: str) -> None:
    """One rank of the hand-written loop or of the DeepSpeed engine; rank 0 writes the result file."""
    import torch
    import torch.distributed as dist

    world = spec["world_size"]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:  # as dsrecipes does: share the cores between the workers of this node
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        device = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    try:
        windows, final_loss = _train(kind, stage, spec, device, rank, world)
        peak = {"rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "cuda_mb": torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None}
        peaks = [None] * world
        dist.all_gather_object(peaks, peak)
        if rank == 0:
            Path(result_path).write_text(json.dumps({"windows": windows, "final_loss": final_loss, "peaks": peaks}))
        gc.collect()  # drop the DDP / ZeroRedundancyOptimizer objects before their process group goes
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _build_model_and_data(spec: dict, device, rank: int, world: int):
    import torch

    from dsrecipes.data import BatchIterator, DataConfig, prepare_data
    from dsrecipes.models import GPT, load_flavor
    from dsrecipes.models.config import padded_vocab_size
    from dsrecipes.utils.seed import seed_everything

    seed_everything(SEED)
    data_cfg = DataConfig(block_size=spec["seq"], max_bytes=spec["max_bytes"], cache_dir=spec["cache_dir"])
    if rank == 0:  # rank 0 fills the datasets cache, the others then read it
        data = prepare_data(data_cfg)
    torch.distributed.barrier()
    if rank != 0:
        data = prepare_data(data_cfg)
    batches = BatchIterator(data.train, spec["micro_batch"], seed=SEED, rank=rank, world_size=world)
    model_cfg = load_flavor(spec["model"], max_seq_len=spec["seq"],
                            vocab_size=padded_vocab_size(data.tokenizer.vocab_size))
    with torch.device(device):
        model = GPT(model_cfg)
    return model, batches


def _param_groups(model) -> list[dict]:
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}]


def _train(kind: str, stage: int, spec: dict, device, rank: int, world: int) -> tuple[list[dict], float]:
    import torch
    import torch.distributed as dist

    model, batches = _build_model_and_data(spec, device, rank, world)
    gas = spec["grad_accum"]
    if kind == "handwritten":
        step_fn = _handwritten_step_fn(model, stage, device, gas)
    else:
        step_fn = _deepspeed_step_fn(model, stage, spec, gas)

    tokens_per_step = spec["micro_batch"] * gas * world * spec["seq"]
    windows, window_steps = [], 0
    cuda = device.type == "cuda"
    window_start = time.perf_counter()
    loss = None
    for step in range(1, spec["steps"] + 1):
        micro_batches = [{k: v.to(device, non_blocking=True) for k, v in next(batches).items()} for _ in range(gas)]
        loss = step_fn(micro_batches)
        window_steps += 1
        if step % spec["log_interval"] == 0 or step == spec["steps"]:
            if cuda:
                torch.cuda.synchronize(device)
            now = time.perf_counter()
            seconds = now - window_start
            windows.append({"tokens_per_s": window_steps * tokens_per_step / max(seconds, 1e-9),
                            "step_time_s": seconds / window_steps})
            window_start, window_steps = now, 0
    final = loss.detach().float().clone()
    dist.all_reduce(final)
    return windows, float(final) / world


def _handwritten_step_fn(model, stage: int, device, gas: int):
    """The minimal PyTorch loop for `stage`: returns step(micro_batches) -> mean loss of the last micro-batch."""
    import torch
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    opt_kwargs = dict(lr=LR, betas=BETAS, eps=EPS)
    impl = {"fused": True} if device.type == "cuda" else {"foreach": True}
    if stage <= 1:
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        groups = _param_groups(model)
        if stage == 0:
            optimizer = torch.optim.AdamW(groups, **opt_kwargs, **impl)
        else:
            optimizer = ZeroRedundancyOptimizer(groups[0]["params"], optimizer_class=torch.optim.AdamW,
                                                weight_decay=WEIGHT_DECAY, **opt_kwargs, **impl)
            optimizer.add_param_group(groups[1])
        wrapped = ddp
    else:
        for block in model.blocks:  # per transformer block, then the root (embeddings, head)
            fully_shard(block, reshard_after_forward=stage == 3)
        fully_shard(model, reshard_after_forward=stage == 3)
        optimizer = torch.optim.AdamW(_param_groups(model), **opt_kwargs, **impl)
        wrapped = model

    def step(micro_batches):
        for i, batch in enumerate(micro_batches):
            last = i == len(micro_batches) - 1
            if stage <= 1:
                wrapped.require_backward_grad_sync = last
            else:
                wrapped.set_requires_gradient_sync(last)
            loss = wrapped(batch["input_ids"], labels=batch["labels"]).loss
            (loss / gas).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def _deepspeed_step_fn(model, stage: int, spec: dict, gas: int):
    import deepspeed
    import torch

    config = {
        "train_micro_batch_size_per_gpu": spec["micro_batch"],
        "gradient_accumulation_steps": gas,
        "train_batch_size": spec["micro_batch"] * gas * spec["world_size"],
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": stage},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if torch.cuda.is_available():
        config["optimizer"] = {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "eps": EPS,
                                                           "weight_decay": WEIGHT_DECAY}}
        engine, *_ = deepspeed.initialize(model=model, model_parameters=_param_groups(model), config=config)
    else:  # no fused CUDA Adam: hand DeepSpeed torch's AdamW
        optimizer = torch.optim.AdamW(_param_groups(model), lr=LR, betas=BETAS, eps=EPS, foreach=True)
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)

    def step(micro_batches):
        for batch in micro_batches:
            loss = engine(batch["input_ids"], labels=batch["labels"]).loss
            engine.backward(loss)
            engine.step()
        return loss

    return step


# --------------------------------------------------------------------------- one measured run
def run_child(kind: str, stage: int, spec: dict, result_path: str) -> None:
    """Body of the wrapper process of one run: start it, wait, add the children's peak RSS to the result."""
    if kind == "dsrecipes":
        run_dir = Path(spec["run_dir"])
        proc = subprocess.run(spec["command"], cwd=spec["cwd"], env=child_env(), capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"dsrecipes run failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        result = read_dsrecipes_run(run_dir)
    else:
        import torch.multiprocessing as mp

        from dsrecipes.benchmarks.distributed_throughput import _worker  # picklable by module path

        if kind == "deepspeed" and not os.environ.get("DS_ACCELERATOR"):
            import torch

            if not torch.cuda.is_available():
                os.environ["DS_ACCELERATOR"] = "cpu"
        worker_out = result_path + ".workers"
        exit_error = None
        try:
            mp.start_processes(_worker, args=(kind, stage, spec, _free_port(), worker_out),
                               nprocs=spec["world_size"], start_method="spawn")
        except Exception as error:  # noqa: BLE001 - a crash at teardown, after the results were written
            if not Path(worker_out).exists():
                raise
            exit_error = f"{type(error).__name__}: {error}"
            print(f"warning: {kind} stage {stage} workers exited abnormally after measuring: {exit_error}",
                  file=sys.stderr)
        raw = json.loads(Path(worker_out).read_text())
        tokens_per_s, step_time = median_tokens_per_s(raw["windows"])
        cuda = [p["cuda_mb"] for p in raw["peaks"] if p["cuda_mb"] is not None]
        result = {"tokens_per_s": tokens_per_s, "step_time_s": step_time, "final_loss": raw["final_loss"],
                  "cuda_peak_mb": max(cuda) if cuda else None, "rank_rss_mb": [p["rss_mb"] for p in raw["peaks"]],
                  "exit_warning": exit_error}
    result["children_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    Path(result_path).write_text(json.dumps(result))


def measure(kind: str, stage: int, args, workdir: Path, round_index: int = 0) -> dict:
    """Run one (framework, stage) in a fresh wrapper process so that its peak RSS is its own."""
    spec = {"world_size": args.world_size, "model": args.model, "seq": args.seq, "micro_batch": args.micro_batch,
            "grad_accum": args.grad_accum, "steps": args.steps, "log_interval": args.log_interval,
            "max_bytes": args.max_bytes, "cache_dir": args.cache_dir}
    if kind in OURS:
        run_dir = workdir / f"{kind}_stage{stage}_round{round_index}"
        command = dsrecipes_command(args, stage, run_dir, compiled=kind == "dsrecipes_compile")
        spec.update(run_dir=str(run_dir), cwd=str(workdir), command=command)
    result_path = workdir / f"{kind}_stage{stage}_round{round_index}.json"
    proc = subprocess.run(
        [sys.executable, "-m", "dsrecipes.benchmarks.distributed_throughput", "--_child", kind, str(stage),
         json.dumps(spec), str(result_path)],
        cwd=workdir, env=child_env(), capture_output=True, text=True, timeout=args.timeout,
    )
    if proc.returncode != 0 or not result_path.exists():
        tail = (proc.stderr or proc.stdout)[-3000:]
        print(f"[{kind} stage {stage}] failed (exit {proc.returncode}):\n{tail}", file=sys.stderr)
        return {"error": f"failed (exit {proc.returncode})"}
    return json.loads(result_path.read_text())


def combine_rounds(results: list[dict]) -> dict:
    """One framework's rounds: median tokens/s (each round's figure kept), maximum peak memory."""
    good = [r for r in results if "error" not in r]
    if not good:
        return results[0] if results else {"error": "not run"}
    combined = dict(good[0])
    combined["tokens_per_s"] = statistics.median(r["tokens_per_s"] for r in good)
    combined["rounds"] = [round(r["tokens_per_s"], 1) for r in good]
    for key in ("cuda_peak_mb", "children_peak_rss_mb"):
        values = [r[key] for r in good if r.get(key) is not None]
        if values:
            combined[key] = max(values)
    return combined


# --------------------------------------------------------------------------- report
def peak_mb(result: dict) -> float | None:
    if "error" in result:
        return None
    return result.get("cuda_peak_mb") or result.get("children_peak_rss_mb")


def main(argv: list[str] | None = None) -> list[dict]:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--_child"]:  # internal: the wrapper process of one measured run
        _, kind, stage, spec, result_path = argv
        run_child(kind, int(stage), json.loads(spec), result_path)
        return []

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--stage", type=int, nargs="+", default=[0, 1, 2, 3], choices=[0, 1, 2, 3])
    parser.add_argument("--model", default="gpt_tiny")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--log-interval", type=int, default=5)
    parser.add_argument("--frameworks", nargs="+", default=list(DEFAULT_FRAMEWORKS), choices=FRAMEWORKS)
    parser.add_argument("--max-bytes", type=int, default=None, help="cap on the corpus (data.max_bytes)")
    parser.add_argument("--cache-dir", default=None, help="datasets cache (data.cache_dir)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds allowed per run")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every framework this many times, interleaved (the order rotates each round); "
                             "tokens/s is the median over rounds, peak memory the maximum")
    parser.add_argument("--extra", nargs="*", default=[], help="extra overrides for the dsrecipes runs only")
    parser.add_argument("--out", default=None, help="folder for the CSV/JSON/Markdown (default: a temporary folder)")
    args = parser.parse_args(argv)

    out = Path(args.out or tempfile.mkdtemp(prefix="dsrecipes_dist_bench_")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    have_deepspeed = deepspeed_available()
    peak_gflops = matmul_peak_gflops()
    flops_per_token = model_flops_per_token(args)
    print(f"fp32 matmul peak of this machine: {peak_gflops:,.1f} GFLOP/s; {flops_per_token / 1e6:.2f} MFLOP per "
          "trained token", flush=True)
    rows = []
    for stage in args.stage:
        runs: dict[str, list[dict]] = {kind: [] for kind in args.frameworks}
        for round_index in range(args.rounds):
            shift = round_index % len(args.frameworks)  # who goes first rotates: no framework always runs cold
            for kind in args.frameworks[shift:] + args.frameworks[:shift]:
                if kind == "deepspeed" and not have_deepspeed:
                    runs[kind] = [{"error": "deepspeed not installed"}]
                    continue
                print(f"stage {stage}: {kind} (round {round_index + 1}/{args.rounds}) ...", flush=True)
                runs[kind].append(measure(kind, stage, args, out, round_index))
        results = {kind: combine_rounds(r) for kind, r in runs.items()}
        row = {"world_size": args.world_size, "stage": stage, "model": args.model, "seq": args.seq,
               "micro_batch": args.micro_batch, "grad_accum": args.grad_accum, "steps": args.steps,
               "handwritten_mechanism": HANDWRITTEN_MECHANISM[stage], "matmul_peak_gflops": peak_gflops}
        for kind in FRAMEWORKS:
            r = results.get(kind, {"error": "not run"})
            row[f"{kind}_tokens_per_s"] = r.get("tokens_per_s")
            row[f"{kind}_tokens_per_s_rounds"] = r.get("rounds")
            row[f"{kind}_peak_mb"] = peak_mb(r)
            row[f"{kind}_final_loss"] = r.get("final_loss")
            row[f"{kind}_error"] = r.get("error")
        for ours_kind, prefix in (("dsrecipes", ""), ("dsrecipes_compile", "compile_")):
            ours = row[f"{ours_kind}_tokens_per_s"]
            for kind, key in (("handwritten", "vs_handwritten"), ("deepspeed", "vs_deepspeed")):
                theirs = row[f"{kind}_tokens_per_s"]
                row[prefix + key] = ours / theirs if ours and theirs else None
            row[f"{prefix}pct_of_matmul_peak"] = (100 * ours * flops_per_token / (peak_gflops * 1e9)) if ours else None
        rows.append(row)

    table = print_table(rows, args)
    chart = BarChart(f"training throughput, {args.model}, world size {args.world_size}", "tokens/s",
                     {f"{kind}_tokens_per_s": kind for kind in args.frameworks}, labels=("stage",))
    print(f"wrote {write_rows(out, 'distributed_throughput', rows, table, chart)}")
    return rows


def print_table(rows: list[dict], args):
    """The comparison as a rich Table, printed uncut (dsrecipes.utils.console); returns the table."""
    from rich.table import Table

    from dsrecipes.utils.console import make_console
    from dsrecipes.utils.console import print_table as print_uncut

    unit = "peak MB/rank (" + ("CUDA alloc" if rows and _on_cuda() else "RSS") + ")"
    table = Table(title=f"{args.model}, world {args.world_size}, {args.micro_batch}x{args.grad_accum}x"
                        f"{args.world_size} x {args.seq} tokens/step, {args.steps} steps")
    compiled = "dsrecipes_compile" in args.frameworks
    columns = ["stage", "dsrecipes tok/s", "hand tok/s", "DeepSpeed tok/s", f"dsrecipes {unit}", "hand MB",
               "DeepSpeed MB", "x hand", "x DeepSpeed", "% fp32 peak"]
    if compiled:
        columns += ["compile tok/s", "compile x DeepSpeed", "compile % fp32 peak"]
    for column in columns:
        table.add_column(column, justify="right")

    def num(value, fmt):
        return format(value, fmt) if value is not None else "-"

    for r in rows:
        ds_tps = num(r["deepspeed_tokens_per_s"], ",.0f") if r["deepspeed_tokens_per_s"] else (r["deepspeed_error"] or "-")
        table.add_row(
            str(r["stage"]), num(r["dsrecipes_tokens_per_s"], ",.0f"), num(r["handwritten_tokens_per_s"], ",.0f"),
            ds_tps, num(r["dsrecipes_peak_mb"], ",.0f"), num(r["handwritten_peak_mb"], ",.0f"),
            num(r["deepspeed_peak_mb"], ",.0f"), num(r["vs_handwritten"], ".3f"), num(r["vs_deepspeed"], ".3f"),
            num(r["pct_of_matmul_peak"], ".1f"),
            *([num(r["dsrecipes_compile_tokens_per_s"], ",.0f"), num(r["compile_vs_deepspeed"], ".3f"),
               num(r["compile_pct_of_matmul_peak"], ".1f")] if compiled else []),
        )
    print_uncut(make_console(), table)
    return table


def _on_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    main()
