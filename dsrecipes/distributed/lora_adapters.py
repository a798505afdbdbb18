"""The recipe's LoRA step (peft=lora): adapters on the model before any sharding, initialised alike on every rank.

    _lora(model, cfg, applied)                         # parallelize's step: wrap, freeze, initialise (real weights)
    materialize = lora_materialize(materialize, seed)  # a meta model: the checkpoint, then the adapters

dsrecipes.peft.apply_lora wraps the targeted nn.Linear modules and freezes everything else, so the strategies
(DDP, ZeRO-1/2, FSDP2) reduce and the optimizer steps only the adapters (frozen parameters get neither gradients
nor optimizer state). The adapters' values come from one CPU generator seeded with peft.init_seed (else
trainer.seed), drawn whole in the modules' order and then placed into whatever each rank holds (a DTensor shard
included), so a layout starts from exactly the single process's adapters. A checkpoint's base weights load under
their own names (dsrecipes.models.hf_loading.fill_module skips the adapters and reads `x.base_layer.weight` as
`x.weight`).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from dsrecipes.peft import apply_lora, count_trainable, init_lora, lora_modules

log = logging.getLogger("dsrecipes")


def adapter_seed(cfg) -> int:
    """peft.init_seed, else trainer.seed (0 without a trainer section)."""
    seed = cfg.peft.init_seed
    return int(seed) if seed is not None else int(getattr(getattr(cfg, "trainer", None), "seed", 0))


def _refuse_weight_readers(model: nn.Module, wrapped: list[str]) -> None:
    """A fused kernel that reads a Linear's weight directly would compute without its adapter: refuse it."""
    from dsrecipes.models.layers import GeluMLP

    for name, module in model.named_modules():
        if isinstance(module, GeluMLP) and module.bias_gelu_fn is not None and f"{name}.fc_in" in wrapped:
            raise ValueError(f"peft.target_modules adapts {name}.fc_in, whose fused bias+GELU kernel "
                             "(kernels.backend=triton) reads its weight directly; leave fc_in out of "
                             "peft.target_modules or use kernels=torch")


def init_adapters(model: nn.Module, seed: int) -> None:
    """lora_A = kaiming_uniform_(a=sqrt(5)) drawn whole from one generator seeded with `seed`, in module order,
    lora_B = 0, into whatever each rank holds (dsrecipes.peft.init_lora: plain tensors or DTensor shards)."""
    init_lora(model, seed)


def apply_recipe_lora(model: nn.Module, cfg, applied: list[str]) -> None:
    """parallelize's LoRA step (a no-op without peft=lora)."""
    peft = cfg.peft
    if not peft.enabled:
        return
    wrapped = apply_lora(model, peft)
    _refuse_weight_readers(model, wrapped)
    if not any(p.is_meta for p in model.parameters()):
        init_adapters(model, adapter_seed(cfg))
        quantize_recipe_bases(model, peft)
    trainable, total = count_trainable(model)
    leaves = sorted({name.rsplit(".", 1)[-1] for name in wrapped})
    applied.append(f"peft: LoRA r {peft.r}, alpha {peft.alpha:g} on {len(wrapped)} Linear modules "
                   f"({', '.join(leaves)}); {trainable:,} of {total:,} parameters train")
    if str(peft.quantize_base) != "none":
        applied.append(f"peft: the adapted Linears' frozen weights in {peft.quantize_base} (dequantized per call)")


def lora_tensor_parallel_plan(module: nn.Module, plan: dict, sequence_parallel: bool) -> dict:
    """A tensor-parallel plan with every LoRA-wrapped Linear's style moved onto its parts:

    * column-parallel X: X.base_layer as planned, X.lora_B column-parallel too (its rows sharded as the weight's
      output rows), X.lora_A whole on every rank (its output's gradient is summed over the ranks by lora_B's input);
    * row-parallel X: X.base_layer as planned, X.lora_A row-parallel with the same output layout (its input columns
      sharded as the weight's), X.lora_B whole (a replicated DTensor when the output is the sequence shard, so its
      gradient is summed over the ranks' shards).
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    wrapped = lora_modules(module)
    out = {}
    for key, style in plan.items():
        if key not in wrapped:
            out[key] = style
            continue
        out[f"{key}.base_layer"] = style
        if isinstance(style, ColwiseParallel):
            out[f"{key}.lora_B"] = ColwiseParallel()
        elif isinstance(style, RowwiseParallel):
            from torch.distributed.tensor import Shard

            out[f"{key}.lora_A"] = RowwiseParallel(output_layouts=Shard(1)) if sequence_parallel else RowwiseParallel()
            if sequence_parallel:
                out[f"{key}.lora_B"] = SequenceParallel(use_local_output=True)
        else:
            raise ValueError(f"peft.method=lora: no tensor-parallel layout for the adapters of {key} "
                             f"({type(style).__name__})")
    return out


def quantize_recipe_bases(model: nn.Module, peft) -> None:
    """peft.quantize_base: the adapted Linears' frozen weights to int8 / int4 codes (after their values are in)."""
    if str(peft.quantize_base) == "none":
        return
    from dsrecipes.peft.quantized_base import quantize_bases

    bits = 8 if peft.quantize_base == "int8" else 4
    saved = quantize_bases(model, bits, int(peft.quantize_group_size))
    log.info("peft: the adapted Linears' weights quantized to int%d: %s MiB less on this rank", bits,
             f"{saved / 2**20:,.2f}")


def lora_materialize(materialize, seed: int, peft=None):
    """materialize(model, device), then the adapters (a meta model's lora_A/B are not in its checkpoint) and, with
    peft.quantize_base, the quantized bases."""
    def load(target: nn.Module, device: torch.device) -> None:
        materialize(target, device)
        init_adapters(target, seed)
        if peft is not None:
            quantize_recipe_bases(target, peft)

    return load
