"""`python -m dsrecipes mode=generate ...` and `mode=serve-bench ...`: the recipe side of inference.

    python -m dsrecipes mode=generate checkpoint=outputs/<date>/<time>_gpt prompt="Once upon a time"
    python -m dsrecipes mode=generate checkpoint=<run dir> generate.prompts_file=prompts.txt generate.output_file=out.jsonl
    torchrun --nproc-per-node 2 -m dsrecipes mode=generate checkpoint=<run dir> prompt="Hi" generate.tp_size=2
    python -m dsrecipes mode=serve-bench checkpoint=<run dir>          # or model=gpt_1_3b without a checkpoint

Options are the `generate` group (dsrecipes.inference.config). A checkpoint whose architecture dsrecipes' blocks do
not compute (a transformers-path export: Gemma 3, Phi-3, Mixtral, ...) decodes with transformers' own generate
(dsrecipes.inference.hf_generate). Model overrides on the command line
(model=..., model.n_head=...) are checked against the checkpoint's own config: a mismatch is an error.

Where output goes (rank 0 writes it):
* generate prints to the console and, with generate.output_file, writes JSON lines to that path
  (relative to the working directory). A single generate run has no run directory at all
  (dsrecipes.config.run_directory); one that has a directory all the same (hydra.run.dir=PATH, or
  each job of a multirun, `-m generate.temperature=0.5,1.0`) also writes its generations to
  <dir>/generations.jsonl, beside Hydra's .hydra/ record of the job.
* serve-bench writes serve_bench.csv, .json and .md (the printed table) into its run directory.
A job that fails before writing anything removes the run directory Hydra made for it, so no
directory holding only .hydra/ is left behind.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from dsrecipes.inference.config import INFERENCE_MODES, GenerateConfig, validate_generate_config

# torch is imported in the functions that run inference: `python -m dsrecipes` imports this module for
# rewrite_aliases before every run, and `--help` must not import torch.

ALIASES = {"checkpoint": "generate.checkpoint", "prompt": "generate.prompt"}
GENERATIONS_FILE = "generations.jsonl"


def rewrite_aliases(argv: list[str]) -> list[str]:
    """Let `checkpoint=PATH prompt=TEXT` stand for generate.checkpoint / generate.prompt in inference modes."""
    if not any(a in (f"mode={m}" for m in INFERENCE_MODES) for a in argv):
        return argv
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        out.append(f"{ALIASES[key]}={value}" if sep and key in ALIASES else arg)
    return out


def _read_prompts(g: GenerateConfig) -> list[str]:
    if g.prompt is not None:
        return [g.prompt]
    path = Path(g.prompts_file)
    if not path.is_file():
        raise FileNotFoundError(f"generate.prompts_file={g.prompts_file!r} does not exist")
    prompts = [line.rstrip("\n") for line in path.read_text().splitlines() if line.strip()]
    if not prompts:
        raise ValueError(f"generate.prompts_file={g.prompts_file!r} holds no prompts (one per line)")
    return prompts


def _model_overrides(overrides: list[str]) -> bool:
    return any(o.lstrip("+~").split("=")[0].split(".")[0] == "model" for o in overrides)


def _load(cfg: DictConfig, overrides: list[str], device):
    import torch

    from dsrecipes.data.tokenizers import build_tokenizer
    from dsrecipes.inference.loading import load_model
    from dsrecipes.models.config import ModelConfig

    g = cfg.generate
    model_cfg = None
    if _model_overrides(overrides):
        model_cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), cfg.model))
    if g.checkpoint is None:  # serve-bench on random weights of the recipe's model
        from dsrecipes.models import GPT
        from dsrecipes.models.config import padded_vocab_size

        model_cfg = model_cfg or OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), cfg.model))
        tokenizer = build_tokenizer(cfg.data.tokenizer)
        model_cfg.vocab_size = model_cfg.vocab_size or padded_vocab_size(tokenizer.vocab_size)
        torch.manual_seed(0)
        return GPT(model_cfg).eval(), tokenizer, "random weights"
    if model_cfg is not None and model_cfg.vocab_size is None:
        from dsrecipes.inference.loading import read_source

        model_cfg.vocab_size = read_source(g.checkpoint)[0].model_cfg.vocab_size
    model, info = load_model(g.checkpoint, model_cfg, device=device)
    source = f"{info.kind} {info.path}"
    if info.sparse_attention:  # the KV-cache decoder has no block-sparse path: say so rather than imply one
        source += (f" (trained with sparse_attention.mode={info.sparse_attention}; generation attends densely over "
                   "the KV cache, so contexts longer than the layout's local window see more than in training)")
    if info.tokenizer is None:
        raise ValueError(f"generate.checkpoint={g.checkpoint!r} has no tokenizer.json (the fast-tokenizer file dsrecipes "
                         "reads); write one with transformers' AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)")
    return model, build_tokenizer(info.tokenizer), source


def _transformers_engine(g: GenerateConfig, mode: str, directory: Path, device):
    """(TransformersGenerator, source line) for a save_pretrained directory that runs as the Hugging Face module."""
    from dsrecipes.data.tokenizers import build_tokenizer
    from dsrecipes.inference.hf_generate import TransformersGenerator, refuse_decoder_options

    refuse_decoder_options(g, mode, directory)
    if not (directory / "tokenizer.json").is_file():
        raise ValueError(f"generate.checkpoint={g.checkpoint!r} has no tokenizer.json (the fast-tokenizer file dsrecipes "
                         "reads); write one with transformers' AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)")
    engine = TransformersGenerator(directory, build_tokenizer(str(directory / "tokenizer.json")), g.dtype, device)
    return engine, f"transformers checkpoint {directory}"


def run_inference_mode(cfg: DictConfig, run_dir: str, overrides: list[str]) -> dict:
    """Run mode=generate or mode=serve-bench; `run_dir` is the job's output directory (the working directory: none)."""
    from dsrecipes.config.run_directory import is_working_dir, remove_unused_run_dir

    own_dir = None if is_working_dir(run_dir) else Path(run_dir)
    try:
        result = _run(cfg, run_dir, own_dir, overrides)
    except BaseException:
        if own_dir is not None and int(os.environ.get("RANK", "0")) == 0:
            remove_unused_run_dir(own_dir)
        raise
    import torch.distributed as dist

    if dist.is_initialized():  # torchrun's ranks (generate.tp_size > 1): leave the group together, as training does
        from dsrecipes.launch.workers import leave_group

        leave_group()
    return result


def _run(cfg: DictConfig, run_dir: str, own_dir: Path | None, overrides: list[str]) -> dict:
    import torch
    import torch.distributed as dist

    g: GenerateConfig = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(GenerateConfig), cfg.generate))
    validate_generate_config(g, cfg.mode)
    world = dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))
    if g.tp_size != world:
        raise ValueError(f"generate.tp_size={g.tp_size} needs exactly that many processes, but {world} are running; "
                         f"use torchrun --nproc-per-node {g.tp_size} -m dsrecipes mode={cfg.mode} ...")
    if world > 1 and not dist.is_initialized():
        from dsrecipes.launch.workers import init_distributed

        init_distributed()
    rank = dist.get_rank() if dist.is_initialized() else 0
    device = torch.device(f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu")
    prompts = _read_prompts(g) if cfg.mode == "generate" else []
    say = print if rank == 0 else (lambda *a, **k: None)
    from dsrecipes.inference.hf_generate import transformers_checkpoint

    hf_directory = transformers_checkpoint(g.checkpoint) if g.checkpoint is not None else None
    if hf_directory is not None:  # an architecture dsrecipes' decoder does not compute: transformers' generate
        engine, source = _transformers_engine(g, cfg.mode, hf_directory, device)
    else:
        model, tokenizer, source = _load(cfg, overrides, device)
        if cfg.mode == "serve-bench":
            from dsrecipes.benchmarks.inference import serve_bench

            return serve_bench(model, g, device, run_dir, say, source, rank)

        from dsrecipes.inference.engine import init_inference

        quant = None if g.quant == "none" else {"bits": 8 if g.quant == "int8" else 4,
                                                "group_size": g.quant_group_size or (64 if g.quant == "int4" else 0)}
        engine = init_inference(model, dtype=g.dtype, tensor_parallel=g.tp_size, kernel_inject=g.kernel_inject,
                                quant=quant, tokenizer=tokenizer, device=device,
                                enable_cuda_graph=g.cuda_graph)
    say(f"dsrecipes generate: {source}")
    for line in engine.describe():
        say(f"  {line}")
    records = []
    for first in range(0, len(prompts), g.batch_size):
        batch = prompts[first:first + g.batch_size]
        stream = g.stream and len(batch) == 1
        if stream:
            say(batch[0], end="", flush=True)
        out = engine.generate(batch, max_new_tokens=g.max_new_tokens, temperature=g.temperature, top_k=g.top_k,
                              top_p=g.top_p, repetition_penalty=g.repetition_penalty, stop_tokens=g.stop_tokens,
                              seed=g.seed, stream=stream)
        for prompt, text, reason in zip(batch, out.texts, out.finish_reasons):
            if not stream:
                say(f"--- {prompt!r}\n{prompt}{text}")
            records.append({"prompt": prompt, "completion": text, "finish_reason": reason})
        n_new = out.new_token_count
        decode_rate = (n_new - len(batch)) / out.decode_s if out.decode_s else float("nan")
        say(f"[{len(batch)} prompt(s): {n_new} new tokens, time to first token {out.prefill_s * 1e3:.1f} ms, "
            f"decode {decode_rate:.1f} tokens/s]")
    if rank == 0:
        if own_dir is not None:
            own_dir.mkdir(parents=True, exist_ok=True)
        for path in ([g.output_file] if g.output_file else []) + ([own_dir / GENERATIONS_FILE] if own_dir else []):
            with open(path, "w") as f:
                for record in records:
                    f.write(json.dumps(record) + "\n")
            say(f"wrote {path}")
    return {"generations": records}
