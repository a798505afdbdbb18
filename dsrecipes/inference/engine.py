"""`init_inference`: DeepSpeed-Inference's entry point for a dsrecipes GPT.

    import dsrecipes.inference as dsi
    engine = dsi.init_inference(model, dtype="bf16", kernel_inject=True, quant="int8")
    out = engine.generate("Once upon a time", max_new_tokens=64, temperature=0.8, top_p=0.95, seed=1)
    print(out.texts[0])
    # tensor parallel, under torchrun --nproc-per-node 2 (gloo on CPU, NCCL on CUDA):
    engine = dsi.init_inference(model, tensor_parallel={"tp_size": 2})       # or mp_size=2

Arguments (DeepSpeed's names where they exist, see InferenceEngine.__init__):
  dtype            fp32 | bf16 | fp16 | int8 (= fp16/bf16 activations + int8 weights, as DeepSpeed) or a torch.dtype
  tensor_parallel  int or {"tp_size": n} (mp_size: the deprecated alias); needs n processes in the default group
  kernel_inject    fused norms (dsrecipes.models.kernel_injection), flash attention for prefill, the decode
                   attention kernel over the KV cache, fused bias+GELU / SwiGLU (dsrecipes.inference.decoder)
  quant            None | "int8" | "int4" | {"bits": 8, "group_size": 0} weight-only quantization
  max_out_tokens   KV-cache capacity kept between calls (default: model.max_seq_len)
  enable_cuda_graph  capture the decode step in a CUDA graph per batch size and replay it (CUDA,
                   tensor_parallel 1, dense models; dsrecipes.inference.cuda_graphs). Off by default, as in DeepSpeed

The model is changed in place (as DeepSpeed does): sharded, cast, quantized, kernels swapped. Steps run
in that order so each rank quantizes only its own shard. Every argument is checked before any of it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from dsrecipes.inference.decoder import CachedDecoder, InferenceKernels
from dsrecipes.inference.generation import GenerationResult, TokenCallback, check_prompts, generate
from dsrecipes.inference.kv_cache import KVCache
from dsrecipes.inference.logits_processing import SamplingParams
from dsrecipes.inference.quantized import QuantConfig, QuantReport, module_bytes, quantize_linears
from dsrecipes.inference.tensor_parallel import check_tp_size, shard_for_inference
from dsrecipes.utils.dtypes import DTYPE_ALIASES, DTYPES, dtype_from_name


def _resolve_dtype(dtype, device: torch.device) -> tuple[torch.dtype, bool]:
    """(compute dtype, int8 requested through dtype)."""
    if isinstance(dtype, torch.dtype):
        if dtype == torch.int8:
            return (torch.float16 if device.type == "cuda" else torch.float32), True
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"dtype={dtype} is not valid; choose one of: fp32, bf16, fp16, int8")
        return dtype, False
    name = str(dtype).lower()
    if name == "int8":
        return (torch.float16 if device.type == "cuda" else torch.float32), True
    if DTYPE_ALIASES.get(name, name) not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not valid; choose one of: fp32, bf16, fp16, int8")
    return dtype_from_name(name), False


def _resolve_tp(tensor_parallel, mp_size) -> int:
    if tensor_parallel is None:
        return int(mp_size or 1)
    if isinstance(tensor_parallel, int):
        return tensor_parallel
    if isinstance(tensor_parallel, dict):
        unknown = set(tensor_parallel) - {"tp_size", "enabled"}
        if unknown:
            raise ValueError(f"tensor_parallel has unknown keys {sorted(unknown)}; valid keys: tp_size, enabled")
        return int(tensor_parallel.get("tp_size", 1)) if tensor_parallel.get("enabled", True) else 1
    raise ValueError(f"tensor_parallel={tensor_parallel!r} must be an int or a dict like {{'tp_size': 2}}")


def _resolve_quant(quant, int8_dtype: bool) -> QuantConfig:
    if quant is None or quant is False:
        cfg = QuantConfig(enabled=int8_dtype)
    elif isinstance(quant, QuantConfig):
        cfg = quant
    elif isinstance(quant, str):
        if quant not in ("int8", "int4"):
            raise ValueError(f"quant={quant!r} is not valid; choose one of: int8, int4 (or a dict)")
        cfg = QuantConfig(enabled=True, bits=8 if quant == "int8" else 4, group_size=0 if quant == "int8" else 64)
    elif isinstance(quant, dict):
        unknown = set(quant) - {"enabled", "bits", "group_size"}
        if unknown:
            raise ValueError(f"quant has unknown keys {sorted(unknown)}; valid keys: enabled, bits, group_size")
        cfg = QuantConfig(enabled=quant.get("enabled", True), bits=quant.get("bits", 8), group_size=quant.get("group_size", 0))
    else:
        raise ValueError(f"quant={quant!r} must be None, 'int8', 'int4' or a dict")
    cfg.validate()
    return cfg


@dataclass
class GenerationOutput(GenerationResult):
    texts: list[str] | None = None  # decoded new text per prompt, when the engine has a tokenizer


class InferenceEngine:
    """A model prepared for generation; build it with `init_inference`."""

    def __init__(self, model: nn.Module, dtype="fp32", tensor_parallel=None, mp_size: int | None = None,
                 kernel_inject: bool = False, quant=None, max_out_tokens: int | None = None,
                 device: str | torch.device | None = None, tokenizer=None, tp_group=None,
                 enable_cuda_graph: bool = False):
        if not hasattr(model, "cfg") or not hasattr(model, "blocks"):
            raise ValueError("init_inference: model must be a dsrecipes GPT (dsrecipes.models.GPT)")
        device = torch.device(device) if device is not None else next(model.parameters()).device
        compute_dtype, int8_dtype = _resolve_dtype(dtype, device)
        tp_size = _resolve_tp(tensor_parallel, mp_size)
        world = dist.get_world_size(tp_group) if dist.is_available() and dist.is_initialized() else 1
        check_tp_size(model.cfg, tp_size, world if tp_size > 1 else None)
        quant_cfg = _resolve_quant(quant, int8_dtype)
        capacity = max_out_tokens or model.cfg.max_seq_len
        if enable_cuda_graph:
            if device.type != "cuda":
                raise ValueError(f"enable_cuda_graph=true needs a CUDA device; the model is on {device}")
            if tp_size > 1 or getattr(model, "moe_cfg", None) is not None:
                raise ValueError("enable_cuda_graph=true supports single-device dense models; got "
                                 f"tensor_parallel={tp_size}" + (" and MoE layers" if getattr(model, "moe_cfg", None) else ""))
        if capacity < 1:
            raise ValueError(f"max_out_tokens={max_out_tokens} must be >= 1")

        model.eval()
        self.cfg = model.cfg
        self.tokenizer = tokenizer
        self.tp_group = tp_group if tp_size > 1 else None
        self.tp_size = tp_size
        self.dense_bytes = module_bytes(model)
        model.to(device)
        if tp_size > 1:
            shard_for_inference(model, tp_group)
        model.to(compute_dtype)
        self.quant_report: QuantReport | None = quantize_linears(model, quant_cfg) if quant_cfg.enabled else None
        self.injected: list[str] = []
        kernels = InferenceKernels()
        if kernel_inject:
            from dsrecipes.models.kernel_injection import inject_kernels

            self.injected = [line for line in inject_kernels(model, "triton") if "Norm" in line]
            kernels = InferenceKernels.triton(model.cfg.head_dim)
            self.injected += kernels.describe()
        for p in model.parameters():
            p.requires_grad_(False)
        self.model = model
        self.device = device
        self.dtype = compute_dtype
        self.decoder = CachedDecoder(model, kernels, decode_mode="cuda_graph" if enable_cuda_graph else "eager")
        self.capacity = capacity
        self._cache: KVCache | None = None

    # ------------------------------------------------------------------ inputs
    def _encode(self, prompts) -> tuple[list[list[int]], bool]:
        """(token id lists, whether the input was a single prompt)."""
        if isinstance(prompts, str):
            prompts, single = [prompts], True
        elif prompts and isinstance(prompts[0], int):
            prompts, single = [list(prompts)], True
        else:
            single = False
        encoded = []
        for p in prompts:
            if isinstance(p, str):
                if self.tokenizer is None:
                    raise ValueError("generate: text prompts need a tokenizer; pass tokenizer= to init_inference or token ids")
                encoded.append(self.tokenizer.encode(p))
            else:
                encoded.append([int(t) for t in p])
        return encoded, single

    def _cache_for(self, batch: int, capacity: int) -> KVCache:
        need = max(capacity, self.capacity)
        c = self._cache
        attn = self.model.blocks[0].attn
        if c is None or not c.fits(self.cfg.n_layer, batch, attn.n_kv_head, capacity, attn.head_dim, self.dtype, self.device):
            self.decoder.drop_graphs()
            self._cache = self.decoder.allocate_cache(max(batch, c.batch if c is not None else 0), need)
        return self._cache

    # ------------------------------------------------------------------ generation
    def generate(self, prompts, max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, repetition_penalty: float = 1.0, stop_tokens: Sequence[int] | None = None,
                 seed: int = 0, on_token: TokenCallback | None = None, stream: bool = False) -> GenerationOutput:
        """Continue each prompt (text, token ids, or a list of either); see dsrecipes.inference.generation.

        stop_tokens default to the tokenizer's eos id; stream=True prints a single prompt's text as it
        is produced (rank 0 only).
        """
        ids, _ = self._encode(prompts)
        params = SamplingParams(temperature, top_k, top_p, repetition_penalty)
        if stop_tokens is None:
            eos = getattr(self.tokenizer, "eos_id", None)
            stop_tokens = [eos] if eos is not None else []
        if stream and self.tokenizer is not None and (not dist.is_initialized() or dist.get_rank() == 0):
            on_token = ConsoleStreamer(self.tokenizer, len(ids), on_token)
        longest = max((len(p) for p in ids), default=0)
        cache = self._cache_for(len(ids), longest + max_new_tokens)
        result = generate(self.decoder, ids, max_new_tokens, params, stop_tokens, seed, pad_id=0,
                          on_token=on_token, cache=cache, tp_group=self.tp_group)
        if isinstance(on_token, ConsoleStreamer):
            on_token.close()
        texts = [self.tokenizer.decode(t) for t in result.tokens] if self.tokenizer is not None else None
        return GenerationOutput(**vars(result), texts=texts)

    @torch.no_grad()
    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, V] of unpadded ids [B, T] through the inference path (a fresh cache)."""
        check_prompts(ids.tolist(), self.cfg.vocab_size, self.cfg.max_seq_len, key="ids")
        cache = self.decoder.allocate_cache(ids.shape[0], ids.shape[1])
        return self.decoder.forward(ids.to(self.device), cache, all_logits=True)

    def weight_bytes(self) -> int:
        return module_bytes(self.model)

    def describe(self) -> list[str]:
        lines = [f"dtype {str(self.dtype).replace('torch.', '')}, tensor parallel {self.tp_size}, "
                 f"weights {self.weight_bytes() / 2**20:.2f} MiB (dense fp32 {self.dense_bytes / 2**20:.2f} MiB)"]
        if self.quant_report is not None:
            lines.append(self.quant_report.describe())
        lines += [f"kernel injection: {line}" for line in self.injected]
        return lines


class ConsoleStreamer:
    """on_token callback that prints a single prompt's new text as it arrives (whole UTF-8 characters)."""

    def __init__(self, tokenizer, batch: int, then: TokenCallback | None = None, file=None):
        self.tokenizer, self.batch, self.then = tokenizer, batch, then
        self.file = file or sys.stdout
        self.ids: list[int] = []
        self.printed = ""

    def __call__(self, step: int, ids: torch.Tensor, finished: torch.Tensor) -> None:
        if self.batch == 1 and not bool(finished[0]):
            self.ids.append(int(ids[0]))
            text = self.tokenizer.decode(self.ids)
            if not text.endswith("\ufffd"):  # wait for the rest of a multi-byte character
                self.file.write(text[len(self.printed):])
                self.file.flush()
                self.printed = text
        if self.then is not None:
            self.then(step, ids, finished)

    def close(self) -> None:
        if self.batch == 1:
            self.file.write("\n")
            self.file.flush()


def init_inference(model: nn.Module, config: dict | None = None, **kwargs) -> InferenceEngine:
    """DeepSpeed's `init_inference(model, config=None, **kwargs)`: kwargs override the config dict."""
    merged = dict(config or {})
    merged.update(kwargs)
    if "replace_with_kernel_inject" in merged:
        merged["kernel_inject"] = merged.pop("replace_with_kernel_inject")
    if "tp" in merged:
        merged["tensor_parallel"] = merged.pop("tp")
    if "max_tokens" in merged:
        merged["max_out_tokens"] = merged.pop("max_tokens")
    return InferenceEngine(model, **merged)
