"""mode=generate for a checkpoint that runs as the Hugging Face module itself (an architecture without a native form:
Gemma 3, Phi-3, OLMo 2, Mixtral, ... — what a `model=hf` run of the transformers path exports).

    python -m dsrecipes mode=generate checkpoint=outputs/<date>/<time>_gpt prompt="Once upon a time"
    python -m dsrecipes mode=generate checkpoint=path/to/save_pretrained_dir prompt="Hi" generate.temperature=0.7

dsrecipes' KV-cache decoder (dsrecipes.inference.engine) computes dsrecipes' blocks; such a model decodes with
transformers' own `generate` and its cache instead, driven by the same `generate` options: greedy at temperature 0,
else sampling with top_k / top_p / repetition_penalty from generate.seed, stopping at generate.stop_tokens (default:
the tokenizer's end of text), prompts left-padded in a batch. The timings are the engine's: time to first token and
the decode rate, read from a streamer's timestamps. What needs dsrecipes' decoder (kernel injection, int8/int4
weights, tensor-parallel inference, CUDA graphs, serve-bench) is refused naming the key.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from dsrecipes.inference.engine import GenerationOutput
from dsrecipes.models.hf_config import NATIVE_MODEL_TYPES


def transformers_checkpoint(checkpoint: str | Path) -> Path | None:
    """The save_pretrained directory of `checkpoint` (itself, or a run directory's export/) when its architecture has
    no native form; None otherwise (dsrecipes' loader reads it)."""
    for directory in (Path(checkpoint), Path(checkpoint) / "export"):
        config = directory / "config.json"
        if config.is_file():
            model_type = json.loads(config.read_text()).get("model_type")
            return directory if model_type and model_type not in NATIVE_MODEL_TYPES else None
    return None


def refuse_decoder_options(g, mode: str, directory: Path) -> None:
    """ValueError naming the first option that needs dsrecipes' own decoder."""
    kind = f"{directory} runs as the Hugging Face module (its model_type has no native form)"
    if mode != "generate":
        raise ValueError(f"mode={mode}: {kind}; serve-bench measures dsrecipes' decoder, use mode=generate")
    for key, value, default in (("kernel_inject", g.kernel_inject, False), ("quant", g.quant, "none"),
                                ("tp_size", g.tp_size, 1), ("cuda_graph", g.cuda_graph, False)):
        if value != default:
            raise ValueError(f"generate.{key}={value}: {kind}, which decodes with transformers' generate; "
                             f"generate.{key} needs dsrecipes' decoder (use generate.{key}={default})")


class _Timestamps:
    """A transformers streamer that records when each batch of new tokens arrives (the first put is the prompt)."""

    def __init__(self, device: torch.device):
        self.device, self.times, self.started = device, [], time.perf_counter()

    def put(self, value) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


class TransformersGenerator:
    """init_inference's engine interface (generate, describe) over AutoModelForCausalLM.generate."""

    def __init__(self, directory: Path, tokenizer, dtype: str, device: torch.device):
        import transformers

        from dsrecipes.inference.engine import _resolve_dtype

        compute_dtype, _ = _resolve_dtype(dtype, device)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=compute_dtype).to(device).eval()
        self.tokenizer, self.device, self.directory = tokenizer, device, directory

    def describe(self) -> list[str]:
        config = self.model.config
        return [f"transformers {type(self.model).__name__} ({config.model_type}), {self.model.dtype}, "
                f"attention {config._attn_implementation}, transformers' generate and cache"]

    def generate(self, prompts, max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, repetition_penalty: float = 1.0, stop_tokens=None, seed: int = 0,
                 stream: bool = False) -> GenerationOutput:
        if stop_tokens is None:
            eos = getattr(self.tokenizer, "eos_id", None)
            stop_tokens = [eos] if eos is not None else []
        encoded = [self.tokenizer.encode(p) for p in prompts]
        longest = max(len(ids) for ids in encoded)
        pad = stop_tokens[0] if stop_tokens else 0
        ids = torch.full((len(encoded), longest), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, tokens in enumerate(encoded):  # left padding: every prompt ends where generation starts
            ids[row, longest - len(tokens):], mask[row, longest - len(tokens):] = torch.tensor(tokens), 1
        sampling = dict(do_sample=True, temperature=temperature, top_k=top_k or None, top_p=top_p) if temperature else \
            dict(do_sample=False, temperature=None, top_k=None, top_p=None)
        torch.manual_seed(seed)
        clock = _Timestamps(self.device)
        with torch.no_grad():
            out = self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                      max_new_tokens=max_new_tokens, repetition_penalty=repetition_penalty,
                                      eos_token_id=list(stop_tokens) or None, pad_token_id=pad, streamer=clock,
                                      **sampling)
        tokens, reasons = [], []
        for row in out[:, longest:].tolist():
            stop_at = next((i for i, t in enumerate(row) if t in stop_tokens), None)
            tokens.append(row[:stop_at] if stop_at is not None else row)
            reasons.append("stop" if stop_at is not None else "length")
        texts = [self.tokenizer.decode(t) for t in tokens]
        if stream and len(prompts) == 1:
            print(texts[0])
        times = [clock.started, *clock.times]  # started, prompt, first new token, ...
        result = GenerationOutput(tokens, reasons, [len(e) for e in encoded], texts=texts)
        if len(times) > 2:
            result.prefill_s = times[2] - times[0]
            result.step_latencies_s = [b - a for a, b in zip(times[2:], times[3:])]
            result.decode_s = sum(result.step_latencies_s)
            result.decode_steps = len(result.step_latencies_s)
        return result
