"""Fine-tuning: what LoRA saves in optimizer state, and what document packing gains in useful tokens per second.

    python -m dsrecipes.benchmarks.fine_tuning                          # both parts, CPU or GPU
    python -m dsrecipes.benchmarks.fine_tuning --parts packing --steps 20 --out bench/
    python -m dsrecipes.benchmarks.fine_tuning --parts lora --model gpt2_124m

lora: the --model recipe (gpt2_124m: GPT-2 small's shape, 124 M parameters) takes one AdamW step with every
  parameter training, and one with peft=lora (rank --rank on every projection, the rest frozen); the optimizer
  state each holds afterwards is measured (the bytes of every tensor in optimizer.state), with the trainable
  parameter counts; the ratio LoRA / full (target <= 0.05).
packing: the built-in chat tasks (length-skewed: one sample in five carries a long passage) rendered by the plain
  template into rows of --block tokens, once with data.packing=none (one conversation per padded row) and once with
  data.packing=documents (whole conversations packed, a causal block each), then --steps AdamW steps of the same
  model (a gpt_tiny-shaped GPT) at --micro rows per step for each, interleaved over --rounds rounds; reported per
  packing: rows, the share of row tokens that are real tokens (not padding), steps/s, tokens/s over all row tokens
  and useful tokens/s (real tokens only), and the ratio documents / none of useful tokens/s (target >= 2).
Writes fine_tuning.json and fine_tuning_lora.md / fine_tuning_packing.md (the printed tables) to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from rich.table import Table

from dsrecipes.training.optim.state_bytes import held_state_bytes
from dsrecipes.utils.console import make_console, print_table
from dsrecipes.utils.tables import write_table

LORA_TARGET, PACKING_TARGET = 0.05, 2.0


def _model_cfg(name: str):
    from omegaconf import OmegaConf

    from dsrecipes.config.store import compose

    cfg = OmegaConf.to_object(compose([f"model={name}"]))
    cfg.model.vocab_size = cfg.model.vocab_size or 50304
    return cfg


def lora_part(model_name: str, rank: int) -> dict:
    """Optimizer-state bytes after one AdamW step: full fine-tuning vs peft=lora."""
    from dsrecipes.models.gpt import GPT
    from dsrecipes.peft import PeftConfig, apply_lora, count_trainable

    cfg = _model_cfg(model_name)
    out = {}
    for way in ("full", "lora"):
        torch.manual_seed(0)
        model = GPT(cfg.model)
        if way == "lora":
            apply_lora(model, PeftConfig(method="lora", r=rank, alpha=2.0 * rank))
        trainable, total = count_trainable(model)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        ids = torch.randint(0, cfg.model.vocab_size, (1, 32))
        model(ids, labels=ids).loss.backward()
        optimizer.step()
        out[way] = {"parameters": total, "trainable": trainable, "optimizer_state_bytes": held_state_bytes(optimizer)}
        del model, optimizer
    out["ratio"] = out["lora"]["optimizer_state_bytes"] / out["full"]["optimizer_state_bytes"]
    out["model"], out["rank"] = model_name, rank
    return out


def _packed(packing: str, block: int, cache: str):
    from dsrecipes.data import DataConfig, prepare_data

    return prepare_data(DataConfig(format="chat", chat_template="plain", packing=packing, block_size=block,
                                   cache_dir=cache))


def _real_tokens(batch: dict, pad_id: int, packing: str) -> int:
    """Tokens that are not padding: under none the padding is every input after the last label; under documents the
    padding is the last document of a row when it holds no label."""
    labels = batch["labels"]
    if packing == "none":
        last = torch.where(labels != -100, torch.arange(labels.shape[1]), -1).max(dim=1).values
        return int((last + 1).sum())
    from dsrecipes.models.document_attention import document_ids

    docs = document_ids(batch["position_ids"])
    real = 0
    for row in range(labels.shape[0]):
        last_doc = docs[row, -1]
        pad = (docs[row] == last_doc) & ~(labels[row][docs[row] == last_doc] != -100).any()
        real += int(labels.shape[1] - pad.sum())
    return real


def packing_part(steps: int, rounds: int, block: int, micro: int, model_name: str) -> dict:
    """Useful tokens/s of packing=documents vs packing=none on the built-in chat tasks."""
    from dsrecipes.data import BatchIterator
    from dsrecipes.models.gpt import GPT

    cfg = _model_cfg(model_name)
    cfg.model.vocab_size, cfg.model.max_seq_len = 320, block
    with tempfile.TemporaryDirectory() as cache:
        data = {p: _packed(p, block, cache) for p in ("none", "documents")}
        windows: dict[str, list[dict]] = {p: [] for p in data}
        for _ in range(rounds):
            for packing, prepared in data.items():
                torch.manual_seed(0)
                model = GPT(cfg.model)
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
                batches = BatchIterator(prepared.train, micro, seed=0)
                pad_id = prepared.tokenizer.eos_id
                real = total = 0
                start = None
                for step in range(steps + 1):  # step 0 warms up and is not timed
                    batch = next(batches)
                    extra = {"position_ids": batch["position_ids"]} if "position_ids" in batch else {}
                    loss = model(batch["input_ids"], labels=batch["labels"], **extra).loss
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    if step == 0:
                        start = time.perf_counter()
                        continue
                    real += _real_tokens(batch, pad_id, packing)
                    total += batch["input_ids"].numel()
                seconds = time.perf_counter() - start
                windows[packing].append({"steps_per_s": steps / seconds, "tokens_per_s": total / seconds,
                                         "useful_tokens_per_s": real / seconds, "real_share": real / total})
        out = {}
        for packing, prepared in data.items():
            runs = windows[packing]
            out[packing] = {"rows": len(prepared.train), **{key: statistics.median(r[key] for r in runs)
                                                           for key in runs[0]}}
    out["ratio"] = out["documents"]["useful_tokens_per_s"] / out["none"]["useful_tokens_per_s"]
    out.update(block=block, micro=micro, steps=steps, rounds=rounds, model=model_name)
    return out


def lora_table(result: dict) -> Table:
    table = Table(title=f"optimizer state after one AdamW step: {result['model']}, full vs LoRA rank {result['rank']}")
    for column in ("fine-tuning", "parameters", "trainable", "optimizer state MiB"):
        table.add_column(column, justify="right")
    for way in ("full", "lora"):
        row = result[way]
        table.add_row(way, f"{row['parameters']:,}", f"{row['trainable']:,}",
                      f"{row['optimizer_state_bytes'] / 2**20:,.2f}")
    table.caption = f"LoRA / full optimizer state: {result['ratio']:.4f} (target <= {LORA_TARGET})"
    return table


def packing_table(result: dict) -> Table:
    table = Table(title=f"built-in chat tasks in rows of {result['block']}, micro-batch {result['micro']}, "
                        f"{result['steps']} steps x {result['rounds']} round(s), {result['model']} shape")
    for column in ("data.packing", "rows", "real tokens", "steps/s", "tokens/s", "useful tokens/s"):
        table.add_column(column, justify="right")
    for packing in ("none", "documents"):
        row = result[packing]
        table.add_row(packing, f"{row['rows']:,}", f"{row['real_share']:.0%}", f"{row['steps_per_s']:.2f}",
                      f"{row['tokens_per_s']:,.0f}", f"{row['useful_tokens_per_s']:,.0f}")
    table.caption = (f"documents / none useful tokens/s: {result['ratio']:.2f}x (target >= {PACKING_TARGET}); "
                     "real tokens = row tokens that are not padding")
    return table


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m dsrecipes.benchmarks.fine_tuning",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="lora,packing", help="comma-separated: lora, packing")
    parser.add_argument("--model", default="gpt2_124m", help="the lora part's model recipe")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--packing-model", default="gpt_tiny", help="the packing part's model recipe")
    parser.add_argument("--block", type=int, default=512)
    parser.add_argument("--micro", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=None, help="folder for fine_tuning.json and the tables")
    args = parser.parse_args(argv)
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    unknown = parts - {"lora", "packing"}
    if unknown:
        parser.error(f"--parts: unknown {', '.join(sorted(unknown))}; choose from lora, packing")
    console = make_console()
    results, tables = {}, {}
    if "lora" in parts:
        results["lora"] = lora_part(args.model, args.rank)
        tables["lora"] = lora_table(results["lora"])
    if "packing" in parts:
        results["packing"] = packing_part(args.steps, args.rounds, args.block, args.micro, args.packing_model)
        tables["packing"] = packing_table(results["packing"])
    results["device"] = "cpu" if not torch.cuda.is_available() else torch.cuda.get_device_name()
    for table in tables.values():
        print_table(console, table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "fine_tuning.json").write_text(json.dumps(results, indent=2))
        for name, table in tables.items():
            write_table(table, out / f"fine_tuning_{name}.md")
    return results


if __name__ == "__main__":
    main()
