"""Hugging Face checkpoints in the recipe: memory of sharded loading, and the speed of the two ways a model runs.

    python -m dsrecipes.benchmarks.hf_models                          # both parts, world 2, CPU or GPU
    python -m dsrecipes.benchmarks.hf_models --parts loading --params 500 --out bench/
    python -m dsrecipes.benchmarks.hf_models --parts throughput --rounds 3 --steps 30

Both parts make their checkpoints here with save_pretrained (random weights, seeded; nothing is downloaded) in a
temporary folder (or --workdir) and remove them afterwards.

loading: a Gemma-3-shaped checkpoint of about --params million float32 parameters (a transformers-path model) is
  loaded at ZeRO-3 over --world-size gloo/nccl ranks two ways, each in fresh processes:
    sharded   what `model=hf` does: the module built on the meta device, FSDP2-sharded, each rank filling only its
              shards from the safetensors (dsrecipes.models.hf_loading), through the Trainer's own build_engine;
    full      what a script does that calls from_pretrained on every rank: the whole model in each process,
              then the same build_engine shards it.
  Reported per way: each rank's peak resident set size (ru_maxrss, the whole process: interpreter, torch and
  transformers included), its RSS before loading, what it holds afterwards, and the load time (building the engine
  from the checkpoint: model, sharding, weights); the ratio sharded / full of the peak (target <= 0.6 at >= 500 M
  parameters and world 2).
throughput: one Llama-shaped checkpoint (--width, --layers; GQA, Llama 3.1 rope scaling) trained for --steps
  optimizer steps at ZeRO-3 on --world-size ranks through the real CLI, `model.impl=native` (dsrecipes' blocks) against
  `model.impl=transformers` (the Hugging Face module wrapped per decoder layer); tokens/s is the median of the
  logged windows after the first, the median over --rounds interleaved rounds; the ratio transformers / native
  (target >= 0.9).
Writes hf_models.json, hf_models_loading.md and hf_models_throughput.md (the printed tables) to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.table import Table

from dsrecipes.utils.console import make_console, print_table
from dsrecipes.utils.tables import write_table

LOADING_TARGET, THROUGHPUT_TARGET = 0.6, 0.9


# ----------------------------------------------------------------------------------------- checkpoints
def _save(config, path: Path, seed: int = 0) -> Path:
    import torch
    import transformers

    from dsrecipes.models.hf_tokenizer import write_tokenizer_files

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(path)
    write_tokenizer_files("byte", path, model_max_length=config.max_position_embeddings)
    return path


def gemma3_checkpoint(path: Path, million_params: int) -> tuple[Path, int]:
    """A Gemma-3-shaped checkpoint of about `million_params` M parameters (width 1536, layers to fit)."""
    import transformers

    width, inner = 1536, 6144
    per_layer = 4 * width * width * 3 // 4 + 3 * width * inner  # q, o full; k, v at half the heads; gated MLP
    layers = max(1, round(million_params * 1e6 / per_layer))
    config = transformers.Gemma3TextConfig(vocab_size=320, hidden_size=width, intermediate_size=inner,
                                           num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4,
                                           head_dim=width // 8, max_position_embeddings=256, bos_token_id=256,
                                           eos_token_id=256, pad_token_id=None)
    return _save(config, path), layers


def llama_checkpoint(path: Path, width: int, layers: int) -> Path:
    """A Llama-shaped checkpoint (grouped-query attention, Llama 3.1 rope scaling): both ways run it."""
    import transformers

    config = transformers.LlamaConfig(vocab_size=320, hidden_size=width, intermediate_size=3 * width,
                                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=256, bos_token_id=256, eos_token_id=256,
                                      pad_token_id=None, rope_parameters={
                                          "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 64})
    return _save(config, path)


# ----------------------------------------------------------------------------------------- loading
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _load_worker(rank: int, way: str, checkpoint: str, world: int, port: int, out: str) -> None:
    """One rank: load the checkpoint `way` (sharded / full) at ZeRO-3; rank 0 writes every rank's memory."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    try:
        import transformers

        from dsrecipes.config import validate_recipe
        from dsrecipes.config.store import compose
        from dsrecipes.distributed.parallel_dims import ParallelDims, device_type_of
        from dsrecipes.models.hf_module import HFCausalLM, hf_config_of
        from dsrecipes.training.assembly import build_engine
        from dsrecipes.training.recipe_model import build_recipe_model

        root, batch = validate_recipe(compose(["model=hf", f"model.path={checkpoint}", "zero.stage=3",
                                               f"launcher.nproc_per_node={world}", "precision=fp32"]),
                                      dp_world_size=world)
        device = torch.device("cuda", rank) if cuda else torch.device("cpu")
        dims = ParallelDims.from_config(root, world, device_type_of(device))
        before, started = _rss_mb(), time.perf_counter()
        if way == "sharded":
            built = build_recipe_model(root.model, root.moe, dims, root.parallel, device)
            engine = build_engine(built.module, root, batch, dims, materialize=built.materialize,
                                  model_description=built.description)
        else:
            hf = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, config=hf_config_of(root.model),
                                                                   dtype=torch.float32)
            engine = build_engine(HFCausalLM(hf, root.model), root, batch, dims)
            del hf
        import gc

        gc.collect()
        figures = {"load_s": time.perf_counter() - started, "rss_before_mb": before, "peak_rss_mb": _peak_mb(),
                   "rss_after_mb": _rss_mb(),
                   "params": sum(p.numel() for p in engine.module.parameters())}
        gathered = [None] * world
        dist.all_gather_object(gathered, figures)
        if rank == 0:
            Path(out).write_text(json.dumps(gathered))
        del engine
        dist.barrier()
    finally:
        dist.destroy_process_group()


def measure_loading(checkpoint: Path, way: str, world: int, workdir: Path) -> list[dict]:
    """Every rank's memory figures for one way, its ranks spawned by a fresh interpreter."""
    out = workdir / f"loading_{way}.json"
    code = ("import sys, torch.multiprocessing as mp; from dsrecipes.benchmarks.hf_models import _load_worker; "
            "mp.start_processes(_load_worker, args=(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), "
            "sys.argv[5]), nprocs=int(sys.argv[3]), start_method='spawn')")
    proc = subprocess.run([sys.executable, "-c", code, way, str(checkpoint), str(world), str(_free_port()), str(out)],
                          capture_output=True, text=True, cwd=workdir)
    if proc.returncode != 0 or not out.exists():
        raise SystemExit(f"loading {way} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())


# ----------------------------------------------------------------------------------------- throughput
def train_command(checkpoint: Path, impl: str, args, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "dsrecipes", "model=hf", f"model.path={checkpoint}", f"model.impl={impl}",
            "model.dropout=0.0", f"launcher.nproc_per_node={args.world_size}", "zero.stage=3", "precision=fp32",
            f"data.block_size={args.seq}", f"trainer.train_micro_batch_size_per_gpu={args.micro_batch}",
            "trainer.gradient_accumulation_steps=1", f"trainer.max_steps={args.steps}",
            f"trainer.log_interval={args.log_interval}", "trainer.eval_interval=0", "trainer.progress_bar=false",
            "trainer.sample_tokens=0", "trainer.loss_curve=false", "checkpoint.save_final=false", "logger=jsonl",
            f"data.max_bytes={args.max_bytes}", f"hydra.run.dir={run_dir}"]


def measure_throughput(checkpoint: Path, impl: str, args, run_dir: Path) -> dict:
    proc = subprocess.run(train_command(checkpoint, impl, args, run_dir), capture_output=True, text=True,
                          cwd=run_dir.parent)
    if proc.returncode != 0:
        raise SystemExit(f"training with model.impl={impl} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    windows = [r["perf/tokens_per_s"] for r in records if "perf/tokens_per_s" in r and "train/tokens" not in r][1:]
    layout = json.loads((run_dir / "summary.json").read_text())["layout"]
    model = next(part for part in layout.split(" | ") if part.startswith("model: "))
    return {"tokens_per_s": statistics.median(windows), "model": model}


# ----------------------------------------------------------------------------------------- report
def loading_table(rows: dict[str, list[dict]]) -> Table:
    table = Table(title="sharded loading at ZeRO-3: per-rank memory (MB)")
    for column in ("way", "rank", "load s", "RSS before", "peak RSS", "RSS after", "peak vs full"):
        table.add_column(column, justify="right" if column != "way" else "left")
    for way, ranks in rows.items():
        for rank, r in enumerate(ranks):
            ratio = r["peak_rss_mb"] / rows["full"][rank]["peak_rss_mb"]
            table.add_row(way, str(rank), f"{r['load_s']:.1f}", f"{r['rss_before_mb']:,.0f}", f"{r['peak_rss_mb']:,.0f}",
                          f"{r['rss_after_mb']:,.0f}", f"{ratio:.2f}")
    return table


def throughput_table(rows: dict[str, dict]) -> Table:
    table = Table(title="training throughput at ZeRO-3 (tokens/s, median of rounds)")
    for column in ("model.impl", "runs as", "tokens/s", "rounds", "vs native"):
        table.add_column(column)
    for impl, r in rows.items():
        table.add_row(impl, r["model"], f"{r['tokens_per_s']:,.0f}", ", ".join(f"{t:,.0f}" for t in r["rounds"]),
                      f"{r['tokens_per_s'] / rows['native']['tokens_per_s']:.2f}")
    return table


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", choices=["loading", "throughput"], default=["loading", "throughput"])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--params", type=int, default=520, help="loading: the checkpoint's size, million parameters")
    parser.add_argument("--width", type=int, default=256, help="throughput: the Llama checkpoint's hidden size")
    parser.add_argument("--layers", type=int, default=4, help="throughput: its decoder layers")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--log-interval", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-bytes", type=int, default=2_000_000)
    parser.add_argument("--workdir", type=Path, default=None, help="where the checkpoints go (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=Path("bench_hf_models"))
    args = parser.parse_args(argv)
    console = make_console()
    workdir = Path(tempfile.mkdtemp(prefix="dsrecipes_hf_bench_", dir=args.workdir))
    result: dict = {"world_size": args.world_size}
    tables: dict[str, Table] = {}
    try:
        if "loading" in args.parts:
            checkpoint, layers = gemma3_checkpoint(workdir / "gemma3", args.params)
            rows = {way: measure_loading(checkpoint, way, args.world_size, workdir) for way in ("full", "sharded")}
            ratio = max(s["peak_rss_mb"] / f["peak_rss_mb"] for s, f in zip(rows["sharded"], rows["full"]))
            result["loading"] = {"layers": layers, "params": rows["sharded"][0]["params"], "ranks": rows,
                                 "peak_ratio": ratio, "target": LOADING_TARGET}
            table = loading_table(rows)
            print_table(console, table)
            console.print(f"{rows['sharded'][0]['params'] / 1e6:,.0f} M parameters; worst rank's peak sharded / full "
                          f"= {ratio:.2f} (target <= {LOADING_TARGET})")
            tables["loading"] = table
            shutil.rmtree(checkpoint)
        if "throughput" in args.parts:
            checkpoint = llama_checkpoint(workdir / "llama", args.width, args.layers)
            rounds: dict[str, list[dict]] = {"native": [], "transformers": []}
            for index in range(args.rounds):  # interleaved, the order alternating
                order = ("native", "transformers") if index % 2 == 0 else ("transformers", "native")
                for impl in order:
                    rounds[impl].append(measure_throughput(checkpoint, impl, args, workdir / f"{impl}_{index}"))
            rows = {impl: {"model": runs[0]["model"], "rounds": [r["tokens_per_s"] for r in runs],
                           "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs)}
                    for impl, runs in rounds.items()}
            ratio = rows["transformers"]["tokens_per_s"] / rows["native"]["tokens_per_s"]
            result["throughput"] = {"rows": rows, "ratio": ratio, "target": THROUGHPUT_TARGET}
            table = throughput_table(rows)
            print_table(console, table)
            console.print(f"transformers / native = {ratio:.2f} (target >= {THROUGHPUT_TARGET})")
            tables["throughput"] = table
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hf_models.json").write_text(json.dumps(result, indent=2))
    for part, table in tables.items():
        write_table(table, args.out / f"hf_models_{part}.md")
    console.print(f"wrote {args.out / 'hf_models.json'} and the tables beside it")
    return result


if __name__ == "__main__":
    main()
