"""The compatibility matrix: which combinations of config groups run, which are refused, and why.

One table of data. `check_compatibility` (called by validate_recipe before any worker starts) raises
the first refusal a recipe hits, as a ValueError naming the keys and their values; the compatibility
matrix in docs/model-parallelism.md is `matrix_markdown()` (tests/unit/test_compatibility.py holds the two together).
Per-group value checks (a degree that does not divide the heads, a schedule name that does not
exist) stay with each group's validation; this table is about groups that do not go together.

A row that becomes supported moves from REFUSED to SUPPORTED, naming what shows it: a row of the suite's
layout-equivalence table (tests/integration/equivalence/table.py), where a new layout is added as a row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


def _compression_enabled(root) -> list[str]:
    return [k for k, v in vars(root.compression).items() if getattr(v, "enabled", False)]


def _pruning_enabled(root) -> list[str]:
    return [k for k in ("sparse_pruning", "row_pruning", "head_pruning", "channel_pruning")
            if getattr(root.compression, k).enabled]


def _random_ltd(root) -> bool:
    return bool(root.data_efficiency.random_ltd.enabled)


def _seqlen_curriculum(root) -> bool:
    cl = root.data_efficiency.curriculum_learning
    return bool(cl.enabled and cl.metric == "seqlen")


@dataclass(frozen=True)
class Refusal:
    """A combination dsrecipes does not run: `message(root, dims)` is the error, None when the recipe is clear."""

    combination: str  # the matrix's row (docs/model-parallelism.md)
    reason: str  # why, for the docs
    message: Callable  # (root: RootConfig, dims: ParallelDims) -> str | None


@dataclass(frozen=True)
class Supported:
    combination: str
    status: str  # what runs
    tests: tuple[str, ...]  # what shows it: layout-equivalence table rows, or tests' path::name


def _pp(cond: Callable, key: str) -> Callable:
    """A pipeline refusal: parallel.pp > 1 together with `key`."""
    def message(root, dims):
        if dims.pp > 1 and cond(root):
            return f"parallel.pp={dims.pp} with {key} is not supported yet"
        return None
    return message


def _pp_sharded_dp(root, dims):
    if dims.pp > 1 and dims.dp > 1 and dims.tp > 1 and root.zero.stage >= 1:
        return (f"parallel.pp={dims.pp} x parallel.tp={dims.tp} with {dims.dp} data-parallel ranks and "
                f"zero.stage={root.zero.stage} is not supported yet (ZeRO of tensor-parallel pipeline stages is "
                "untested); use zero.stage=0")
    return None


def _sp_random_ltd(root, dims):
    if dims.sp > 1 and _random_ltd(root):
        return (f"data_efficiency.random_ltd.enabled=true is not supported with parallel.sp={dims.sp}: token "
                "dropping would drop different tokens in each sequence chunk; use parallel.sp=1 or disable random-LTD")
    return None


def _sp_seqlen(root, dims):
    if dims.sp > 1 and _seqlen_curriculum(root):
        return (f"data_efficiency.curriculum_learning.metric=seqlen is not supported with parallel.sp={dims.sp}: it "
                "changes the sequence length per step, which must stay divisible by parallel.sp; use parallel.sp=1")
    return None


def _sp_tp_zero1(root, dims):
    if dims.sp > 1 and dims.tp > 1 and root.zero.stage == 1:
        return (f"parallel.sp={dims.sp} with parallel.tp={dims.tp} needs zero.stage 0, 2 or 3: ZeRO-1 wraps the model "
                "in DDP, which cannot take tensor-parallel DTensor parameters (stage 0 all-reduces their local shards "
                "at the boundary, stages 2/3 shard them with FSDP2 over dp x sp); got zero.stage=1")
    return None


def _pp_sp_sharded(root, dims):
    if dims.pp > 1 and dims.sp > 1 and root.zero.stage > 0:
        return (f"parallel.pp={dims.pp} with parallel.sp={dims.sp} needs zero.stage=0 (each stage's gradients are "
                f"averaged over its data- and sequence-parallel ranks; ZeRO sharding of stages is not implemented); "
                f"got zero.stage={root.zero.stage}")
    return None


def _sp_moe(root, dims):
    if dims.sp > 1 and root.moe.enabled:
        return f"parallel.sp={dims.sp} with moe.num_experts={root.moe.num_experts} is not supported yet"
    return None


def _tp_replicated_dp(root, dims):
    if dims.tp > 1 and dims.dp > 1 and root.zero.stage < 2 and dims.pp == 1:
        return (f"parallel.tp={dims.tp} with {dims.dp} data-parallel ranks needs zero.stage 2 or 3 (FSDP2 composes "
                f"with tensor-parallel DTensors on the data-parallel axis); got zero.stage={root.zero.stage}")
    return None


def _tp_masters(root, dims):
    if dims.tp > 1 and root.precision.master_weights and dims.dp == 1:
        return (f"parallel.tp={dims.tp} with precision.master_weights=true is not supported; use precision=bf16 "
                "(autocast over fp32 parameters)")
    return None


def _tp_foreach(root, dims):
    impl = str(root.optimizer.impl)
    if dims.tp > 1 and impl in ("fused", "foreach"):
        return (f"parallel.tp={dims.tp} with optimizer.impl={impl}: tensor-parallel and replicated parameters "
                "cannot share one fused/foreach kernel; use optimizer.impl auto or for_loop")
    return None


def _tp_compression(root, dims):
    comp = root.compression
    for key in ("activation_quantization", "layer_reduction"):
        if dims.tp > 1 and getattr(comp, key).enabled:
            return (f"parallel.tp={dims.tp} with compression.{key}.enabled=true is not supported yet (activation "
                    "ranges would be read from a row-parallel layer's input shard; the distillation loss from "
                    "vocab-parallel logits); weight quantization and pruning run under tp")
    return None


def _tp_random_ltd(root, dims):
    if dims.tp > 1 and _random_ltd(root):
        return f"parallel.tp={dims.tp} with data_efficiency.random_ltd.enabled=true is not supported yet"
    return None


    return None


_ONEBIT = ("onebitadam", "zerooneadam", "onebitlamb")


def _onebit_zero(root, dims):
    if root.optimizer.name in _ONEBIT and root.zero.stage >= 1:
        return (f"optimizer={root.optimizer.name} with zero.stage={root.zero.stage} is not supported: the 1-bit "
                "optimizers average the whole momentum themselves, which ZeRO's sharded optimizer states and "
                "gradients cannot give them (DeepSpeed refuses it too); use zero.stage=0")
    return None


def _onebit_model_parallel(root, dims):
    if root.optimizer.name not in _ONEBIT:
        return None
    for key, degree in (("parallel.tp", dims.tp), ("parallel.pp", dims.pp), ("parallel.sp", dims.sp),
                        ("moe.ep_size", dims.ep)):
        if degree > 1:
            return (f"optimizer={root.optimizer.name} with {key}={degree} is not supported yet: the onebit strategy "
                    "compresses plain data-parallel momentum only (untested with model-parallel layouts); use "
                    f"{key}=1 or optimizer=adam / lamb")
    return None


def _compile_full_parallel(root, dims):
    if root.compile.scope != "full":
        return None
    for key, degree in (("data parallel (world size / model-parallel degrees)", dims.dp_replicate * dims.dp_shard),
                        ("parallel.tp", dims.tp), ("parallel.pp", dims.pp), ("parallel.sp", dims.sp),
                        ("moe.ep_size", dims.ep)):
        if degree > 1:
            return (f"compile=full with {key}={degree} is not supported: a whole-model graph would trace the "
                    "parallel layout's hooks and collectives; use compile=blocks (each block compiled on its own, "
                    "composes with every layout)")
    return None


def _fp8_tp(root, dims):
    if root.fp8.enabled and dims.tp > 1:
        return (f"fp8={root.fp8.recipe} with parallel.tp={dims.tp} is not supported: tensor-parallel float8 needs "
                "torchao's Float8ColwiseParallel / Float8RowwiseParallel styles, which "
                "dsrecipes.distributed.tensor_parallel does not use; use parallel.tp=1 or fp8=none")
    return None


def _fp8_compression(root, dims):
    enabled = _compression_enabled(root)
    if root.fp8.enabled and enabled:
        return (f"fp8={root.fp8.recipe} with compression.{enabled[0]}.enabled=true is not supported: compression "
                "quantizes and masks the same linear layers through hooks and module swaps that the Float8Linear "
                "swap would drop; use fp8=none for compression recipes")
    return None


def _nvme_layout(root, dims):
    zero = root.zero
    nvme = [key for key in ("offload_optimizer", "offload_param") if getattr(zero, key) == "nvme"]
    if not nvme:
        return None
    for key, on in (("parallel.tp", dims.tp > 1), ("parallel.sp", dims.sp > 1), ("parallel.pp", dims.pp > 1),
                    ("moe.ep_size", dims.ep > 1), ("zero.hybrid_shard_size", dims.dp_replicate > 1),
                    ("zero.zero_quantized_weights", zero.zero_quantized_weights),
                    ("zero.zero_hpz_partition_size", zero.zero_hpz_partition_size > 1)):
        if on:
            return (f"zero.{nvme[0]}=nvme with {key} is not supported yet: NVMe offload swaps the shards of plain "
                    "ZeRO-3 data parallelism (one FSDP2 mesh axis, FSDP2's own all-gather); use "
                    f"zero.{nvme[0]}=cpu with this layout")
    return None


REFUSED: tuple[Refusal, ...] = (
    Refusal("pp with compression", "not implemented yet", _pp(lambda r: bool(_compression_enabled(r)), "compression")),
    Refusal("pp x tp x dp with zero.stage >= 1", "ZeRO of tensor-parallel pipeline stages is untested (pp x dp "
            "and pp x tp x dp at zero.stage 0 run)", _pp_sharded_dp),
    Refusal("sp with random-LTD", "each sequence chunk would drop different tokens", _sp_random_ltd),
    Refusal("sp with the sequence-length curriculum", "the length must stay divisible by sp", _sp_seqlen),
    Refusal("pp x sp with zero.stage > 0", "ZeRO sharding of pipeline stages is not implemented yet", _pp_sp_sharded),
    Refusal("sp x tp with zero.stage 1", "ZeRO-1 wraps the model in DDP, which cannot take tensor-parallel DTensors: "
            "use zero.stage 0 (boundary all-reduce) or 2/3 (FSDP2)", _sp_tp_zero1),
    Refusal("sp with MoE", "not implemented yet", _sp_moe),
    Refusal("tp x dp with zero.stage 0/1", "FSDP2 composes with tensor-parallel DTensors; DDP does not: use ZeRO-2/3",
            _tp_replicated_dp),
    Refusal("tp with fp32 master weights at dp 1", "not implemented yet (use precision=bf16)", _tp_masters),
    Refusal("tp with optimizer.impl fused/foreach", "DTensor and plain parameters cannot share one kernel; tp runs "
            "the optimizer's for-loop implementation", _tp_foreach),
    Refusal("tp with activation quantization or layer reduction", "not implemented yet (activation ranges would "
            "come from a row-parallel input shard; KD from vocab-parallel logits)", _tp_compression),
    Refusal("tp with random-LTD", "not implemented yet", _tp_random_ltd),
    Refusal("1-bit optimizers with zero.stage >= 1", "they average the whole momentum themselves (DeepSpeed refuses "
            "it too)", _onebit_zero),
    Refusal("1-bit optimizers with tp / pp / sp / ep", "not implemented yet (plain data parallelism only)",
            _onebit_model_parallel),
    Refusal("compile=full with any parallel layout (dp, tp, pp, sp, ep > 1)", "one whole-model graph would trace "
            "the layout's hooks; compile=blocks composes with every layout", _compile_full_parallel),
    Refusal("fp8 with tp", "tensor-parallel float8 needs torchao's float8 TP styles (not wired in yet)", _fp8_tp),
    Refusal("NVMe offload with tp / sp / pp / ep, hybrid sharding, qwZ or hpZ", "not implemented yet (plain "
            "ZeRO-3 data parallelism only); CPU offload composes with them", _nvme_layout),
    Refusal("fp8 with compression", "compression's hooks and module swaps sit on the linears Float8Linear replaces",
            _fp8_compression),
)

# Each supported row names what shows it: rows of the suite's layout-equivalence table (tests/integration/equivalence/
# table.py, each one run through the CLI against one process), or a test's path::name. tests/unit/
# test_compatibility.py fails when a row names none, or names a row or test that does not exist.
SUPPORTED: tuple[Supported, ...] = (
    Supported("every precision x zero.stage 0-3, dp 2", "supported; fp32 through the CLI at every stage (with ZeRO-3 "
              "parameter offload and activation checkpointing), and fp32, bf16, bf16_master, fp16 and fp16_autocast "
              "at every stage through dsrecipes.initialize",
              ("dp2-zero0", "dp2-zero1", "dp2-zero2", "dp2-zero3", "dp2-zero3-offload_param",
               "dp2-zero3-activation_checkpointing",
               "tests/integration/test_precision_matrix.py::test_world_2_matches_one_process")),
    Supported("tp x dp, zero.stage 2/3", "supported (FSDP2 on dp, TP on tp)", ("dp2xtp2-zero3",)),
    Supported("tp with dp = 1", "supported, any zero.stage (nothing to shard)", ("tp2",)),
    Supported("sp x dp, any zero.stage", "supported (gradients reduced over dp x sp)", ("sp2", "sp2-zero3")),
    Supported("sp x tp, zero.stage 0/2/3 (x dp: 2/3)", "supported: Ulysses splits each tensor-parallel rank's heads over "
              "sp (stage 0: boundary all-reduce of the local shards over dp x sp; 2/3: FSDP2 over dp x sp), with "
              "sequence-parallel or replicated tp activations", ("sp2xtp2-zero0", "sp2xtp2-zero3-replicated_tp")),
    Supported("pp x dp, zero.stage 0", "supported; every schedule, both partitions",
              ("pp2-gpipe", "pp2-1f1b", "pp2-interleaved_1f1b", "dp2xpp2")),
    Supported("pp x dp, zero.stage 2/3", "supported: FSDP2 on each stage module (blocks, then the stage as root); "
              "the schedule defers the gradient reduce-scatter to the last micro-batch (torchtitan's PP + FSDP)",
              ("dp2xpp2-zero2", "dp2xpp2-zero3")),
    Supported("pp x dp, zero.stage 1", "supported (zero1_boundary: optimizer state partitioned over dp, DCP "
              "checkpoints)", ("dp2xpp2-zero1",)),
    Supported("pp with fp16 loss scaling / fp32 master weights", "supported (the schedule's loss is scaled; masters "
              "beside the stage modules, DCP checkpoints of every stage's masters)",
              ("pp2-fp16", "dp2xpp2-zero1-bf16_master")),
    Supported("pp x tp (x dp)", "supported: tensor-parallel stages, vocab-parallel loss on the last one; the layout of "
              "`+experiment=gpt_3d`", ("dp2xtp2xpp2",)),
    Supported("pp x sp (x tp, x dp), zero.stage 0", "supported: every stage runs this rank's sequence chunk at its "
              "positions, gradients averaged over dp x sp (gpt2, and Llama with GQA)",
              ("sp2xpp2", "sp2xpp2-llama_gqa", "sp2xtp2xpp2")),
    Supported("moe.ep_size > 1 x dp, any zero.stage", "supported (stage 1: zero1_boundary, experts partitioned "
              "over their expert-data-parallel group)", ("ep2-zero0", "ep2-zero1", "ep2-zero3", "ep2-ungrouped",
                                                          "dp2xep2")),
    Supported("moe.ep_size > 1 with fp32 master weights at zero.stage 0", "supported: full-state checkpoints and "
              "exports gather every rank's experts (fp32 masters and optimizer moments)", ("ep2-bf16_master",)),
    Supported("tp with MoE (dp = 1, or tp x dp at zero.stage 2/3, ep over dp)", "supported: expert-tensor parallelism "
              "(each expert's hidden width sliced over tp, ep groups within one tp rank)",
              ("tp2-moe", "dp2xtp2xep2-moe")),
    Supported("pp with MoE (any moe.ep_size, with or without tp)", "supported: each stage adds its MoE layers' "
              "auxiliary-loss gradients where they arise; expert groups within each stage; the layout of "
              "`+experiment=gpt_3d_moe`", ("pp2-moe", "dp2xpp2xep2-moe", "gpt_3d_moe")),
    Supported("compile=blocks with any layout (and compile=full in one process)", "supported: each block compiled on "
              "its own (eager names in checkpoints and exports), with DDP, ZeRO-3, tp, activation checkpointing, MoE",
              ("compile-blocks", "compile-full", "compile-blocks-activation_checkpointing", "compile-blocks-dp2-zero0",
               "compile-blocks-dp2-zero3", "compile-blocks-tp2", "compile-blocks-moe")),
    Supported("pruning / QAT with zero.stage 2/3 at dp > 1", "supported: masks and scales from whole weights, masks "
              "applied to every copy the strategy holds (ZeRO-2 master shards, FSDP2 shards)",
              ("compression-dp2-zero2", "compression-dp2-zero3",
               "tests/integration/test_compression_sharded.py::test_dp2_zero2_bf16_master_keeps_pruned_weights_zero")),
    Supported("tp with weight quantization / pruning", "supported: fake-quant groups and masks of the whole weight, "
              "each rank masking its shard", ("compression-tp2", "compression-dp2xtp2-zero3")),
    Supported("pp with random-LTD and the sequence-length curriculum", "supported: per-layer random-LTD draws (the "
              "schedule's shape inference takes none), one pipeline schedule per batch shape", ("pp2-data_efficiency",)),
)


def check_compatibility(root, dims) -> None:
    """Raise the first REFUSED combination `root` (a RootConfig at layout `dims`) hits, naming its keys."""
    for refusal in REFUSED:
        message = refusal.message(root, dims)
        if message is not None:
            raise ValueError(message)


def _shown_by(test: str) -> str:
    """A table row as `row`, a test by its function name."""
    return f"`{test.rsplit('::', 1)[-1]}`" if "::" in test else f"`{test}`"


def matrix_markdown() -> str:
    """The compatibility matrix of docs/model-parallelism.md, generated from SUPPORTED and REFUSED."""
    rows = ["| combination | status | shown by |", "|---|---|---|"]
    rows += [f"| {s.combination} | {s.status} | {', '.join(_shown_by(t) for t in s.tests)} |" for s in SUPPORTED]
    rows += [f"| {r.combination} | refused: {r.reason} | |" for r in REFUSED]
    return "\n".join(rows)
