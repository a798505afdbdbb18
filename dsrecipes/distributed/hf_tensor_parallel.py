"""Tensor parallelism of a Hugging Face module from its own plan: `base_model_tp_plan` onto DTensor styles.

    plan = tp_plan(hf_model)                        # {"model.layers.*.self_attn.q_proj": "colwise", ...} or {}
    check_tp_plan(hf_model, tp)                     # ValueError naming parallel.tp when it cannot shard the model
    apply_hf_tensor_parallel(hf_model, mesh["tp"])  # in place, on the meta or the real model

Every transformers architecture that supports tensor parallelism declares how: its config's `base_model_tp_plan`
(module name patterns of the base model -> a style name) and its model class's `_tp_plan` (the LM head), which
is also what DeepSpeed's AutoTP and `from_pretrained(tp_plan="auto")` read. dsrecipes maps the style names onto
torch.distributed.tensor.parallel's styles and calls parallelize_module:

    colwise                         ColwiseParallel(): weight rows sharded, output sharded (this rank's heads)
    rowwise                         RowwiseParallel(): weight columns sharded, partial outputs all-reduced
    colwise_gather_output / _rep    ColwiseParallel(output_layouts=Replicate()): the output gathered whole
    rowwise_split_input / _rep      RowwiseParallel(input_layouts=Replicate()): a whole input cut to this rank's part
    embedding_rowwise               RowwiseParallel(input_layouts=Replicate()) on nn.Embedding: vocabulary rows
    replicated_with_grad_allreduce  a per-head norm (Qwen3 / Gemma 3 q_norm, k_norm): its input holds this rank's
                                    heads, its shared weight a replicated DTensor whose gradient sums over tp

Another style (packed experts, MLA, sequence-parallel norms) is refused by name. The LM head is sharded by its
colwise_gather_output entry unless it is tied to the embedding (then both stay whole); the logits reach the loss
whole, so the loss is dsrecipes' ordinary cross-entropy. The attention modules reshape their projections with -1
heads, so each rank runs attention over its own n_head/tp query and n_kv_head/tp key/value heads.
"""

from __future__ import annotations

import fnmatch

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from dsrecipes.distributed.tensor_parallel import head_sharded_norm
from dsrecipes.models.decoder_layers import text_config

COLWISE = ("colwise",)
GATHERED = ("colwise_gather_output", "colwise_rep")
ROWWISE = ("rowwise",)
SPLIT_INPUT = ("rowwise_split_input", "rowwise_rep")
STYLES = (*COLWISE, *GATHERED, *ROWWISE, *SPLIT_INPUT, "embedding_rowwise", "replicated_with_grad_allreduce")


def _style(name: str):
    if name in COLWISE:
        return ColwiseParallel()
    if name in GATHERED:
        return ColwiseParallel(output_layouts=Replicate())
    if name in ROWWISE:
        return RowwiseParallel()
    if name in SPLIT_INPUT or name == "embedding_rowwise":
        return RowwiseParallel(input_layouts=Replicate())
    return head_sharded_norm()


def tp_plan(hf_model: nn.Module) -> dict[str, str]:
    """The model's plan with module paths from `hf_model` (base-model patterns under its base_model_prefix, the
    class's own entries as they are); {} when the architecture declares none."""
    base = getattr(getattr(hf_model, "config", None), "base_model_tp_plan", None) or {}
    prefix = getattr(hf_model, "base_model_prefix", "")
    plan = {f"{prefix}.{pattern}" if prefix and hasattr(hf_model, prefix) else pattern: style
            for pattern, style in base.items()}
    for pattern, style in (getattr(type(hf_model), "_tp_plan", None) or {}).items():
        plan.setdefault(pattern, style)
    return plan


def _tied_head(hf_model: nn.Module) -> bool:
    head = hf_model.get_output_embeddings() if hasattr(hf_model, "get_output_embeddings") else None
    inputs = hf_model.get_input_embeddings() if hasattr(hf_model, "get_input_embeddings") else None
    return head is not None and inputs is not None and head.weight is inputs.weight


def module_plan(hf_model: nn.Module) -> dict[str, str]:
    """Each module the plan shards, by its full name, with its style name (a tied LM head left whole)."""
    plan = tp_plan(hf_model)
    tied = _tied_head(hf_model)
    head = hf_model.get_output_embeddings() if tied else None
    out = {}
    for name, module in hf_model.named_modules():
        for pattern, style in plan.items():
            if fnmatch.fnmatchcase(name, pattern) and not (tied and module is head):
                out[name] = style
                break
    return out


def _sharded_size(module: nn.Module, style: str) -> tuple[str, int] | None:
    """(what is split, its size) for a sharded layer; None for a style that splits nothing by tp."""
    if style in (*COLWISE, *GATHERED) and hasattr(module, "out_features"):
        return "output features", module.out_features
    if style in (*ROWWISE, *SPLIT_INPUT) and hasattr(module, "in_features"):
        return "input features", module.in_features
    if style == "embedding_rowwise" and hasattr(module, "num_embeddings"):
        return "vocabulary rows", module.num_embeddings
    return None


def check_tp_plan(hf_model: nn.Module, tp: int) -> None:
    """ValueError naming parallel.tp when the architecture has no plan, a style dsrecipes does not map, heads that
    do not divide, or a layer whose sharded size does not divide."""
    kind = type(hf_model).__name__
    plan = tp_plan(hf_model)
    if not plan:
        raise ValueError(f"parallel.tp={tp}: {kind} declares no tensor-parallel plan (base_model_tp_plan); use "
                         "parallel.tp=1 (ZeRO-3 shards it over the data-parallel ranks instead)")
    unknown = sorted({style for style in plan.values() if style not in STYLES})
    if unknown:
        raise ValueError(f"parallel.tp={tp}: {kind}'s plan uses style {unknown[0]!r}, which dsrecipes does not map "
                         f"(it maps {', '.join(STYLES)}); use parallel.tp=1")
    config = text_config(hf_model)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    shards_heads = any(style in COLWISE for style in plan.values())
    for key, count in (("num_attention_heads", heads), ("num_key_value_heads", kv_heads)):
        if shards_heads and count and count % tp:
            valid = [d for d in range(1, (heads or 1) + 1) if heads % d == 0 and kv_heads % d == 0]
            raise ValueError(f"parallel.tp={tp} does not divide {kind}'s {key}={count}: each tp rank holds whole "
                             f"heads; valid parallel.tp values: {', '.join(map(str, valid))}")
    modules = dict(hf_model.named_modules())
    for name, style in module_plan(hf_model).items():
        size = _sharded_size(modules[name], style)
        if size is not None and size[1] % tp:
            raise ValueError(f"parallel.tp={tp} does not divide the {size[0]} of {name} ({size[1]}); use a "
                             "parallel.tp that divides it")


def apply_hf_tensor_parallel(hf_model: nn.Module, tp_mesh: DeviceMesh) -> int:
    """Shard `hf_model` over `tp_mesh` in place by its own plan; returns how many modules were sharded."""
    check_tp_plan(hf_model, tp_mesh.size())
    plan = {name: _style(style) for name, style in module_plan(hf_model).items()}
    parallelize_module(hf_model, tp_mesh, plan)
    return len(plan)
