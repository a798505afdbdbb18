"""The run's layout in one line: every parallel axis, the data-parallel mechanism, offload, precision,
kernels, compile and activation checkpointing, as the assembly step actually applied them.

    layout = describe_layout(plan, cfg, precision)
    # world 8 = pp 2 x dp 2 (replicate 2 x shard 1) x sp 1 x tp 2; ep 1 | pipeline: 1f1b, 8 micro-batches | ...

Built once by dsrecipes.training.assembly (so `dsrecipes.initialize` and the Trainer report the same
thing), logged at start, written to TensorBoard / W&B as the `run/layout` text and into summary.json.
Each part comes from the object that does the work (the ParallelDims, the chosen strategy's own
description, the Precision, the kernel-injection lines), not from the config alone, so the line
says what runs rather than what was asked for.
"""

from __future__ import annotations

LAYOUT_KEY = "run/layout"


def describe_layout(plan, cfg, precision, optimizer: str | None = None) -> str:
    """One line for the run log; plan: the ParallelPlan, cfg: the RootConfig, precision: the run's Precision,
    optimizer: what the optimizer holds (dsrecipes.training.optim.state_bytes: the option and its state bytes per
    trained parameter; the part is left out when None)."""
    parts = [_axes(plan.dims)]
    if plan.model_description:
        parts.append(f"model: {plan.model_description}")
    parts += [line for line in plan.applied if line.startswith("peft: ")]  # what LoRA adapts, what trains
    if plan.dims.nodes > 1:
        parts.append(f"nodes: {plan.dims.describe_nodes()}")
    parts += plan.describe_model_parallel(cfg.parallel.tp_sequence_parallel)
    strategy = plan.strategy
    parts.append(f"data parallel: {strategy.name}: {strategy.describe()}")
    if optimizer:
        parts.append(f"optimizer: {optimizer}")
    parts.append(f"offload: {_offload(cfg)}")
    parts.append(f"precision: {_precision(precision)}")
    parts.append(f"kernels: {_kernels(cfg, plan.applied)}")
    parts += plan.layout_parts  # what a step of the plan says of itself (fp8)
    parts.append(f"compile: {_compile(plan.applied)}")
    parts.append(f"activation checkpointing: {_activation_checkpointing(cfg.activation_checkpointing)}")
    if str(cfg.sparse_attention.mode) != "none":
        parts.append(f"sparse attention: {cfg.sparse_attention.mode}")
    return " | ".join(parts)


def _axes(dims) -> str:
    dp = dims.dp_replicate * dims.dp_shard
    return (f"world {dims.world_size} = pp {dims.pp} x dp {dp} (replicate {dims.dp_replicate} x shard "
            f"{dims.dp_shard}) x sp {dims.sp} x tp {dims.tp}; ep {dims.ep}")


def _offload(cfg) -> str:
    zero, ac = cfg.zero, cfg.activation_checkpointing
    places = []
    if str(zero.offload_param) != "none":
        places.append(f"parameters -> {zero.offload_param}")
    if str(zero.offload_optimizer) != "none":
        places.append(f"optimizer -> {zero.offload_optimizer}")
    if str(ac.mode) != "none" and ac.cpu_offload:
        places.append("checkpointed activations -> cpu")
    return ", ".join(places) or "none"


def _precision(precision) -> str:
    name = precision.name
    if name == "fp32":
        text = "fp32 weights and compute"
    elif precision.master_weights:
        text = f"{name} weights and compute, fp32 master weights in the optimizer"
    elif getattr(precision, "bf16_masters", False):
        text = "bf16 weights and compute, stepped in bf16 (no fp32 master copy), bf16 optimizer state"
    else:
        text = f"{name} autocast compute over fp32 weights"
    scaler = precision.loss_scaler
    if scaler is not None:
        kind = "static" if precision.cfg.loss_scale > 0 else "dynamic"
        text += f", {kind} loss scale {precision.loss_scale:g}"
    return text


def _kernels(cfg, applied: list[str]) -> str:
    replaced = [line.removeprefix("kernels: replaced ") for line in applied if line.startswith("kernels: replaced ")]
    if not replaced:
        backend = str(cfg.kernels.backend)
        return "torch" if backend == "torch" else f"torch (kernels.backend={backend} swapped nothing in)"
    return f"triton ({'; '.join(replaced)})"


def _compile(applied: list[str]) -> str:
    compiled = [line.removeprefix("compile: ") for line in applied if line.startswith("compile: ")]
    return "; ".join(compiled) or "off"


def _activation_checkpointing(ac) -> str:
    mode = str(ac.mode)
    if mode == "none":
        return "none"
    return f"every {ac.every_k} blocks" if mode == "every_k" else "every block"
