"""Per-rank model-state memory of a recipe for every ZeRO stage, next to DeepSpeed's own estimator.

    python -m dsrecipes.estimate model=llama_7b zero.stage=3 world_size=64
    python -m dsrecipes.estimate model=gpt_1_3b precision=bf16_master world_size=8 vocab_size=50304
    python -m dsrecipes.estimate model=gpt2_124m zero.stage=3 zero.offload_optimizer=nvme zero.offload_param=nvme \
        zero.buffer_size=20000000 world_size=2
    python -m dsrecipes.estimate model=gpt_debug parallel.tp=2 parallel.pp=2 zero.stage=0 world_size=8
    python -m dsrecipes.estimate model=gpt2_124m moe.num_experts=8 moe.ep_size=4 zero.stage=3 world_size=8

With tensor, pipeline, sequence or expert parallelism (parallel.tp / pp / sp, moe.ep_size) the table
is per rank of that layout, for the configured zero.stage: one row per pipeline rank (its largest
tensor-parallel shard), the heaviest marked, worked out from the parameter shapes
(dsrecipes.distributed.parameter_placement: what each rank holds; dsrecipes.profiling.layout_memory: its
bytes). A layout that does not fit world_size, or that training refuses, is refused with the training CLI's message.

With zero.offload_optimizer / offload_param set (cpu or nvme, stage 3) a second table places the
ZeRO-3 model states per rank on the device, in host memory and on NVMe (swap files and buffer pools,
as ZeRO-Infinity's estimator does; dsrecipes.distributed.offload.plan).

The plain data-parallel table sets DeepSpeed's estimate beside dsrecipes' figures
(estimate_zero2/3_model_states_mem_needs, re-stated in dsrecipes.profiling.memory_estimator): per GPU and
per node's host memory, world_size / ranks_per_node nodes, zero.offload_optimizer / offload_param = cpu as
its cpu_offload / cpu_offload_params; "n/a" where DeepSpeed has no estimate (stages 0 and 1, NVMe offload),
with the reason under the table. Sizes are in the binary unit that suits each value (KiB ... TiB).

Takes the recipe's overrides (the model is built on the meta device: instant, no memory) plus
world_size=N (default 1), ranks_per_node=G (what `node` means in zero.zero_hpz_partition_size and the
node size of DeepSpeed's estimate; default min(world_size, 8)) and vocab_size=V (when the model's is
null; default 50304).
"""

from __future__ import annotations

import sys

import torch
from omegaconf import OmegaConf
from rich.table import Table

from dsrecipes.cli_help import print_help_and_exit, wants_help
from dsrecipes.config.store import compose
from dsrecipes.distributed.config import resolve_node_sized_keys
from dsrecipes.models import GPT
from dsrecipes.profiling.layout_memory import LayoutEstimate, estimate_layout
from dsrecipes.profiling.memory_estimator import (
    MemoryEstimate,
    deepspeed_gap,
    deepspeed_model_states,
    estimate_model_states,
    largest_layer_params,
)
from dsrecipes.training.optim.state_bytes import optimizer_state_of
from dsrecipes.training.precision import steps_bf16_masters
from dsrecipes.utils.console import make_console, print_table

GIB = 2**30
_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(size: float) -> str:
    """`size` bytes in the binary unit that suits it ("1.28 GiB", "3.17 MiB", "512 B"), so small models do
    not print 0.00 GiB; each unit is a power of 1024 and says so (MiB, never MB)."""
    index = 0
    while abs(size) >= 1024 and index < len(_BINARY_UNITS) - 1:
        size, index = size / 1024, index + 1
    return f"{size:.0f} B" if index == 0 else f"{size:.2f} {_BINARY_UNITS[index]}"


def format_params(num_params: int) -> str:
    """The exact parameter count and a rounded one: "124,439,808 parameters (124.4M)"."""
    rounded = f"{num_params / 1e9:.2f}B" if num_params >= 1e9 else f"{num_params / 1e6:.1f}M"
    return f"{num_params:,} parameters ({rounded})"


def main(argv: list[str] | None = None) -> list:
    args = list(sys.argv[1:] if argv is None else argv)
    if wants_help(args):
        print_help_and_exit(f"usage: python -m dsrecipes.estimate [OVERRIDES ...] [world_size=N] [ranks_per_node=G] "
                            f"[vocab_size=V]\n\n{__doc__.strip()}\n")
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
    trainable = None
    if cfg.peft.enabled:  # LoRA: the adapters are all that trains (gradients, optimizer states, masters)
        from dsrecipes.peft import apply_lora, count_trainable

        apply_lora(gpt, cfg.peft)
        trainable, num_params = count_trainable(gpt)
    if not dims.plain_data_parallel:
        layout = _refusing(estimate_layout, gpt, cfg, dims)
        print_table(make_console(), layout_table(layout, cfg, num_params))
        return list(layout.ranks)
    rows = [
        estimate_model_states(
            num_params, world_size, stage, cfg.precision.dtype, cfg.precision.master_weights,
            cfg.optimizer.name, getattr(cfg.optimizer, "momentum", 0.0),
            hpz_partition_size=cfg.zero.zero_hpz_partition_size, trainable_params=trainable,
            state_bytes=optimizer_state_of(cfg.optimizer, gpt).per_param,
            bf16_masters=steps_bf16_masters(cfg.precision),
        )
        for stage in range(4)
    ]
    table = stages_table(rows, cfg, num_params, largest_layer_params(gpt), per_node or min(world_size, 8))
    if trainable is not None:
        table.caption = (f"peft=lora r {cfg.peft.r}: {trainable:,} of {num_params:,} parameters train "
                         f"({trainable / num_params:.2%}); gradients and optimizer states are theirs only (DeepSpeed's "
                         "columns assume every parameter trains). "
                         + (f"peft.quantize_base={cfg.peft.quantize_base}: the adapted Linears' frozen weights take "
                            "fewer bytes in the run than counted here (at the model dtype). "
                            if str(cfg.peft.quantize_base) != "none" else "") + (table.caption or ""))
    print_table(make_console(), table)
    if {str(cfg.zero.offload_optimizer), str(cfg.zero.offload_param)} != {"none"}:
        print_table(make_console(), offload_table(gpt, cfg, world_size))
    return rows


def stages_table(rows: list[MemoryEstimate], cfg, num_params: int, largest_layer: int, per_node: int) -> Table:
    """One row per ZeRO stage: what dsrecipes' engine holds per rank, and DeepSpeed's estimate (per GPU, and
    host memory per node) or "n/a" where DeepSpeed has none; the caption says what DeepSpeed's figures assume."""
    world_size = rows[0].world_size
    zero = cfg.zero
    nodes_gap = None if world_size % per_node == 0 else \
        f"world_size={world_size} is not a whole number of nodes of ranks_per_node={per_node}"
    table = Table(title=f"model states per rank: {cfg.model.name}, {format_params(num_params)}, "
                        f"{world_size} rank(s), {cfg.precision.dtype}, {cfg.optimizer.name}")
    for column in ("zero.stage", "parameters", "gradients", "optimizer states", "dsrecipes total",
                   "DeepSpeed per GPU", "DeepSpeed CPU per node"):
        table.add_column(column, justify="right")
    gaps, figures = [nodes_gap] if nodes_gap else [], 0
    for row in rows:
        deepspeed = None if nodes_gap else deepspeed_model_states(
            row.stage, num_params, largest_layer, per_node, world_size // per_node,
            zero.offload_optimizer, zero.offload_param)
        gap = nodes_gap or deepspeed_gap(row.stage, zero.offload_optimizer, zero.offload_param)
        if gap and gap not in gaps:
            gaps.append(gap)
        figures += deepspeed is not None
        mark = " <" if row.stage == zero.stage else ""
        table.add_row(f"{row.stage}{mark}", format_bytes(row.parameters), format_bytes(row.gradients),
                      format_bytes(row.optimizer_states), format_bytes(row.total),
                      *((format_bytes(deepspeed.gpu), format_bytes(deepspeed.cpu)) if deepspeed else ("n/a", "n/a")))
    table.caption = _deepspeed_caption(cfg.zero, world_size, per_node, largest_layer, gaps, figures > 0)
    table.caption_justify = "left"
    return table


def _deepspeed_caption(zero, world_size: int, per_node: int, largest_layer: int, gaps: list[str],
                       any_figure: bool) -> str:
    """What DeepSpeed's figures assume (the arguments its estimator was given), then why a cell is n/a."""
    assumed = (
        f"DeepSpeed: estimate_zero2/3_model_states_mem_needs for 16-bit mixed-precision Adam (whatever the "
        f"recipe's precision and optimizer), {world_size // per_node} node(s) x {per_node} GPU(s), "
        f"offload_optimizer={zero.offload_optimizer}, offload_param={zero.offload_param}, zero_init=0 (the "
        f"model is built whole in every process), additional_buffer_factor=1.5, largest layer "
        f"{largest_layer:,} parameters. ") if any_figure else ""
    return (assumed + "".join(f"n/a: {gap}. " for gap in gaps)).strip()


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
    from dsrecipes.config.validate import parallel_dims
    from dsrecipes.distributed.parallel_checks import validate_model_split
    from dsrecipes.models.moe_config import validate_moe_config

    def check():
        dims = parallel_dims(cfg, world_size, node_size=world_size)  # nodes do not change what a rank holds
        validate_model_split(cfg, dims)  # the training CLI's checks of what each rank holds
        validate_moe_config(cfg.moe, cfg.model, world_size)
        check_compatibility(cfg, dims)
        return dims

    return _refusing(check)


def layout_table(layout: LayoutEstimate, cfg, num_params: int) -> Table:
    """One row per pipeline rank (its largest tensor-parallel shard); the heaviest rank marked."""
    heaviest = layout.heaviest
    sharding = f" over {layout.shard_ranks} ranks" if layout.shard_ranks > 1 else ": replicated over dp"
    table = Table(title=f"model states per rank: {cfg.model.name}, {format_params(num_params)}, "
                        f"{layout.title()}, zero.stage={layout.stage} ({layout.strategy}{sharding}), "
                        f"{cfg.precision.dtype}, {cfg.optimizer.name}")
    zero = cfg.zero
    if {str(zero.offload_optimizer), str(zero.offload_param)} != {"none"}:
        table.caption = (f"offload_optimizer={zero.offload_optimizer}, offload_param={zero.offload_param}: what is "
                         "offloaded is counted here, in host memory rather than on the device")
    for column in ("pp rank", "parameters held (M)", "of them experts (M)", "parameters", "gradients",
                   "optimizer states", "total"):
        table.add_column(column, justify="right")
    for row in layout.ranks:
        if row.tp_rank != 0:  # tp rank 0 holds the largest shard of every tensor
            continue
        mark = " <" if row is heaviest else ""
        table.add_row(f"{row.pp_rank}{mark}", f"{row.num_params / 1e6:.2f}", f"{row.expert_params / 1e6:.2f}",
                      format_bytes(row.parameters), format_bytes(row.gradients),
                      format_bytes(row.optimizer_states), format_bytes(row.total))
    return table


def offload_table(gpt, cfg, world_size: int) -> Table:
    """ZeRO-3 with CPU / NVMe offload: per-rank bytes on the device, in host memory and on NVMe."""
    from dsrecipes.distributed.offload.plan import plan_offload
    from dsrecipes.training.optim.optimizers import param_groups
    from dsrecipes.training.optim.state_bytes import optimizer_state_bytes

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
