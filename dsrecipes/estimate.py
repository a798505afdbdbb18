"""Per-rank model-state memory of a recipe for every ZeRO stage, next to DeepSpeed's formula.

    python -m dsrecipes.estimate model=llama_7b zero.stage=3 world_size=64
    python -m dsrecipes.estimate model=gpt_1_3b precision=bf16_master world_size=8 vocab_size=50304
    python -m dsrecipes.estimate model=gpt2_124m zero.stage=3 zero.offload_optimizer=nvme zero.offload_param=nvme \
        zero.buffer_size=20000000 world_size=2
    python -m dsrecipes.estimate model=gpt_debug parallel.tp=2 parallel.pp=2 zero.stage=0 world_size=8
    python -m dsrecipes.estimate model=gpt2_124m moe.num_experts=8 moe.ep_size=4 zero.stage=3 world_size=8

With tensor, pipeline, sequence or expert parallelism (parallel.tp / pp / sp, moe.ep_size) the table
is per rank of that layout, for the configured zero.stage: one row per pipeline rank (its largest
tensor-parallel shard), the heaviest marked, worked out from the parameter shapes
(dsrecipes.profiling.layout_memory). A layout that does not fit world_size, or that training refuses,
is refused with the training CLI's message.

With zero.offload_optimizer / offload_param set (cpu or nvme, stage 3) a second table places the
ZeRO-3 model states per rank on the device, in host memory and on NVMe (swap files and buffer pools,
as ZeRO-Infinity's estimator does; dsrecipes.distributed.offload.plan).

Takes the recipe's overrides (the model is built on the meta device: instant, no memory) plus
world_size=N (default 1), ranks_per_node=G (what `node` means in zero.zero_hpz_partition_size; default
min(world_size, 8)) and vocab_size=V (when the model's is null; default 50304).
"""

from __future__ import annotations

import sys

import torch
from omegaconf import OmegaConf
from rich.table import Table

from dsrecipes.config.store import compose
from dsrecipes.distributed.config import resolve_node_sized_keys
from dsrecipes.models import GPT
from dsrecipes.profiling.layout_memory import LayoutEstimate, estimate_layout, is_plain_data_parallel
from dsrecipes.profiling.memory_estimator import estimate_model_states
from dsrecipes.utils.console import make_console, print_table

GIB = 2**30


def main(argv: list[str] | None = None) -> list:
    args = list(sys.argv[1:] if argv is None else argv)
    world_size, vocab_size, per_node, overrides = 1, 50304, 0, []
    for arg in args:
        if arg.startswith("world_size="):
            world_size = int(arg.split("=", 1)[1])
        elif arg.startswith("ranks_per_node="):
            per_node = int(arg.split("=", 1)[1])
        elif arg.startswith("vocab_size="):
            vocab_size = int(arg.split("=", 1)[1])
        else:
            overrides.append(arg)
    if world_size < 1:
        raise SystemExit(f"world_size={world_size} must be >= 1")
    cfg = OmegaConf.to_object(compose(overrides))
    resolve_node_sized_keys(cfg.zero, per_node or min(world_size, 8))
    model_cfg = cfg.model
    model_cfg.vocab_size = model_cfg.vocab_size or vocab_size
    dims = layout_dims(cfg, world_size)
    with torch.device("meta"):
        gpt = GPT(model_cfg, cfg.moe)
    num_params = gpt.num_params()
    if not is_plain_data_parallel(dims):
        layout = _refusing(estimate_layout, gpt, cfg, dims)
        print_table(make_console(), layout_table(layout, cfg, num_params))
        return list(layout.ranks)
    rows = [
        estimate_model_states(
            num_params, world_size, stage, cfg.precision.dtype, cfg.precision.master_weights,
            cfg.optimizer.name, getattr(cfg.optimizer, "momentum", 0.0),
            hpz_partition_size=cfg.zero.zero_hpz_partition_size,
        )
        for stage in range(4)
    ]
    table = Table(title=f"model states per rank: {model_cfg.name}, {num_params / 1e9:.3f}B parameters, "
                        f"{world_size} rank(s), {cfg.precision.dtype}, {cfg.optimizer.name}")
    for column in ("zero.stage", "parameters GiB", "gradients GiB", "optimizer GiB", "dsrecipes total GiB",
                   "DeepSpeed formula GiB"):
        table.add_column(column, justify="right")
    for row in rows:
        mark = " <" if row.stage == cfg.zero.stage else ""
        table.add_row(
            f"{row.stage}{mark}", f"{row.parameters / GIB:.2f}", f"{row.gradients / GIB:.2f}",
            f"{row.optimizer_states / GIB:.2f}", f"{row.total / GIB:.2f}", f"{row.deepspeed_total / GIB:.2f}",
        )
    print_table(make_console(), table)
    if {str(cfg.zero.offload_optimizer), str(cfg.zero.offload_param)} != {"none"}:
        print_table(make_console(), offload_table(gpt, cfg, world_size))
    return rows


def _refusing(fn, *args):
    """fn(*args), a ValueError (a key that does not fit the layout) turned into the CLI's exit message."""
    try:
        return fn(*args)
    except ValueError as error:
        raise SystemExit(f"dsrecipes.estimate: {error}") from None


def layout_dims(cfg, world_size: int):
    """The recipe's layout at world_size ranks, checked as the training CLI checks it (the degrees against
    the world size and the model, the compatibility matrix); SystemExit with the same message otherwise."""
    from dsrecipes.config.compatibility import check_compatibility
    from dsrecipes.config.validate import parallel_dims, validate_pipeline_stages, validate_tensor_parallel_values
    from dsrecipes.models.moe_config import validate_moe_config

    def check():
        dims = parallel_dims(cfg, world_size, node_size=world_size)  # nodes do not change what a rank holds
        if dims.tp > 1:
            validate_tensor_parallel_values(cfg, dims.tp)
        if dims.pp > 1:  # the training CLI's stage check (its micro-batch check does not change the model states)
            validate_pipeline_stages(cfg)
        validate_moe_config(cfg.moe, cfg.model, world_size)
        check_compatibility(cfg, dims)
        return dims

    return _refusing(check)


def layout_table(layout: LayoutEstimate, cfg, num_params: int) -> Table:
    """One row per pipeline rank (its largest tensor-parallel shard); the heaviest rank marked."""
    heaviest = layout.heaviest
    sharding = f" over {layout.shard_ranks} ranks" if layout.shard_ranks > 1 else ": replicated over dp"
    table = Table(title=f"model states per rank: {cfg.model.name}, {num_params / 1e9:.3f}B parameters, "
                        f"{layout.title()}, zero.stage={layout.stage} ({layout.strategy}{sharding}), "
                        f"{cfg.precision.dtype}, {cfg.optimizer.name}")
    zero = cfg.zero
    if {str(zero.offload_optimizer), str(zero.offload_param)} != {"none"}:
        table.caption = (f"offload_optimizer={zero.offload_optimizer}, offload_param={zero.offload_param}: what is "
                         "offloaded is counted here, in host memory rather than on the device")
    for column in ("pp rank", "parameters held (M)", "of them experts (M)", "parameters GiB", "gradients GiB",
                   "optimizer GiB", "total GiB"):
        table.add_column(column, justify="right")
    for row in layout.ranks:
        if row.tp_rank != 0:  # tp rank 0 holds the largest shard of every tensor
            continue
        mark = " <" if row is heaviest else ""
        table.add_row(f"{row.pp_rank}{mark}", f"{row.num_params / 1e6:.2f}", f"{row.expert_params / 1e6:.2f}",
                      f"{row.parameters / GIB:.3f}", f"{row.gradients / GIB:.3f}",
                      f"{row.optimizer_states / GIB:.3f}", f"{row.total / GIB:.3f}")
    return table


def offload_table(gpt, cfg, world_size: int) -> Table:
    """ZeRO-3 with CPU / NVMe offload: per-rank bytes on the device, in host memory and on NVMe."""
    from dsrecipes.distributed.offload.plan import plan_offload
    from dsrecipes.profiling.memory_estimator import optimizer_state_bytes
    from dsrecipes.training.optimizers import param_groups

    zero = cfg.zero
    groups = param_groups(gpt, 0.0, bool(getattr(cfg.optimizer, "no_decay_bias_and_norm", True)))
    shapes = [tuple(p.shape) for group in groups for p in group["params"]]
    states = optimizer_state_bytes(cfg.optimizer.name, getattr(cfg.optimizer, "momentum", 0.0)) // 4
    try:
        plan = plan_offload(shapes, world_size, states, str(zero.offload_optimizer), str(zero.offload_param),
                            zero.buffer_count, zero.param_buffer_count, zero.buffer_size)
    except ValueError as error:  # a buffer smaller than a shard: the message names zero.buffer_size
        raise SystemExit(f"dsrecipes.estimate: {error}") from None
    table = Table(title=f"zero.stage=3 with offload_optimizer={zero.offload_optimizer}, "
                        f"offload_param={zero.offload_param}: per rank ({world_size} rank(s))")
    for column in ("device GiB", "host GiB", "NVMe GiB", "optimizer pool MiB", "parameter pool MiB"):
        table.add_column(column, justify="right")
    table.add_row(f"{plan.device / GIB:.3f}", f"{plan.host / GIB:.3f}", f"{plan.nvme / GIB:.3f}",
                  f"{plan.optimizer_pool / 2**20:.1f}", f"{plan.param_pool / 2**20:.1f}")
    return table


if __name__ == "__main__":
    main()
