"""Schemas of the `zero` and `launcher` config groups (DeepSpeed's zero_optimization and launcher).

Each ZeRO stage maps onto PyTorch-native machinery (docs/zero.md, "ZeRO on PyTorch"): stage 0 = DDP,
stage 1 = ZeroRedundancyOptimizer over DDP, stage 2 = replicated parameters with reduce-scattered
gradients and a sharded optimizer (zero2.py; FSDP2 fully_shard(reshard_after_forward=False) when
combined with model/expert parallelism, hybrid sharding or offload), stage 3 = FSDP2 fully_shard.
Keys DeepSpeed has and dsrecipes does not are rejected by the schema.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import ClassVar

from dsrecipes.utils.compatibility_rows import Refusal, Supported
from dsrecipes.utils.config_enum import ConfigEnum, config_enum, enum_values
from dsrecipes.utils.inactive_rules import Inactive
from dsrecipes.utils.ranges import COUNT, POSITIVE_INT, Range, at_least, between, ranged
from dsrecipes.utils.recipe_facts import RecipeFacts

ZERO_STAGES = (0, 1, 2, 3)  # zero.stage stays an int, checked by validate_zero_config


class OffloadDevice(ConfigEnum):
    """zero.offload_optimizer / zero.offload_param: keep on the accelerator (none), offload to the CPU, or
    to NVMe swap files under zero.nvme_path (ZeRO-Infinity; stage 3)."""

    none = "none"
    cpu = "cpu"
    nvme = "nvme"


# parallel.pp_schedule ("1f1b" is no identifier: the functional form names each member by its value)
PPSchedule = config_enum("PPSchedule", ("gpipe", "1f1b", "interleaved_1f1b"), __name__)


class PPPartition(ConfigEnum):
    """parallel.pp_partition: equal block counts per stage, or balanced parameter counts."""

    uniform = "uniform"
    parameters = "parameters"


class LauncherBackend(ConfigEnum):
    """launcher.backend: auto = nccl on CUDA (gloo for CPU tensors), gloo on CPU."""

    auto = "auto"
    nccl = "nccl"
    gloo = "gloo"


class StartMethod(ConfigEnum):
    """launcher.start_method: how the elastic agent starts local workers (torchrun's --start-method).

    spawn (torchrun's default) starts fresh interpreters, safe everywhere. forkserver starts one clean
    server process per launch that imports torch and the trainer once (dsrecipes.launch.workers.FORKSERVER_PRELOAD)
    and forks every worker from it: one import per node instead of one per worker, and as safe as spawn.
    fork copies the launching process itself, so workers skip every import, but the launcher is already
    running the elastic agent's store threads when it forks: a worker forked while one of them holds a libc
    lock (the resolver's, seen under load) waits on it forever at its first connect. It must not be used
    once the launcher has initialised CUDA either.
    """

    spawn = "spawn"
    fork = "fork"
    forkserver = "forkserver"


OFFLOAD_DEVICES = enum_values(OffloadDevice)
PP_SCHEDULES = enum_values(PPSchedule)
PP_PARTITIONS = enum_values(PPPartition)
LAUNCHER_BACKENDS = enum_values(LauncherBackend)


@dataclass
class AioConfig:
    """zero.aio: DeepSpeed's `aio` block (its keys and defaults) for NVMe offload's swap-file I/O
    (dsrecipes.distributed.offload.aio says how each maps onto the thread pool)."""

    block_size: int = ranged(1048576, at_least(4096))  # bytes per block (a multiple of 4096: O_DIRECT's alignment)
    queue_depth: int = ranged(8, between(1, 1024))  # blocks per vectored read/write call
    thread_count: int = ranged(1, at_least(1))  # I/O threads
    single_submit: bool = False  # true: one block per call
    overlap_events: bool = True  # false: wait for every read/write at once (no prefetch, no write-behind)


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


@dataclass
class ZeroConfig:
    """stage 0: replicate; 1: shard optimizer states; 2: + gradients; 3: + parameters.

    offload_optimizer / offload_param = cpu: FSDP2's CPUOffloadPolicy (sharded parameters, their
    gradients and the optimizer step live on the CPU); stages 2-3 only (stage 2 then runs on FSDP2).
    = nvme (ZeRO-Infinity, stage 3; dsrecipes.distributed.offload): as cpu, and the optimizer states /
    the parameter shards live in swap files under nvme_path, streamed through host buffer pools:
    buffer_count (optimizer, DeepSpeed's offload_optimizer.buffer_count) and param_buffer_count
    (offload_param.buffer_count) buffers of buffer_size elements each (offload_param.buffer_size, which
    also bounds the optimizer's swap units); pin_memory pins the pools on CUDA; aio: the I/O engine.
    hybrid_shard_size: shard within groups of this many ranks and replicate across groups (HSDP);
    0 = shard across all data-parallel ranks; `node` = one group per node (the ranks a node runs:
    LOCAL_WORLD_SIZE, or launcher.nproc_per_node when python -m dsrecipes starts them).

    ZeRO++ (DeepSpeed's keys and defaults; FSDP2 custom comms, dsrecipes.distributed.data_parallel.
    quantized_collectives):
    zero_quantized_weights (qwZ, stage 3): blockwise int8 all-gather of the parameter shards.
    zero_quantized_gradients (qgZ, stage 2 or 3): gradient reduce-scatter as a blockwise quantized
        all-to-all (stage 2 then runs on FSDP2); zero_quantized_gradients_bits (dsrecipes' key) picks
        int8 (default) or int4 (packed two per byte; DeepSpeed's qgZ uses int4).
    zero_hpz_partition_size (hpZ, stage 3): after forward, keep a secondary copy of the parameters
        sharded within groups of this many ranks (FSDP2's reshard_after_forward=<int>), so backward's
        all-gathers stay inside the group; 0 or 1 = off, as in DeepSpeed. Must divide the shard size.
        `node` = the ranks of one node (DeepSpeed's advice: hpZ partition size = GPUs per node).
    """

    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        Inactive(lambda root, z: z.stage < 2, lambda root, path: f"zero.stage={root.zero.stage} replicates (hybrid "
                 "sharding is for stages 2 and 3)", keys=("hybrid_shard_size",)),
        Inactive(lambda root, z: not z.zero_quantized_gradients, lambda root, path: "zero.zero_quantized_gradients="
                 "false (the bit width is qgZ's)", keys=("zero_quantized_gradients_bits",)),
    )

    # how the group composes with the layouts and the other groups (dsrecipes.config.compatibility)
    COMPATIBILITY: ClassVar[tuple[Refusal | Supported, ...]] = (
        Refusal("NVMe offload with tp / sp / pp / ep, hybrid sharding, qwZ or hpZ", "not implemented yet (plain "
                "ZeRO-3 data parallelism only); CPU offload composes with them", _nvme_layout),
        Supported("every precision x zero.stage 0-3, dp 2", "supported; fp32 through the CLI at every stage (with ZeRO-3 "
                  "parameter offload and activation checkpointing), and fp32, bf16, bf16_master, fp16 and fp16_autocast "
                  "at every stage through dsrecipes.initialize",
                  ("dp2-zero0", "dp2-zero1", "dp2-zero2", "dp2-zero3", "dp2-zero3-offload_param",
                   "dp2-zero3-activation_checkpointing",
                   "tests/integration/test_precision_matrix.py::test_world_2_matches_one_process")),
    )

    stage: int = ranged(0, Range(choices=(0, 1, 2, 3)))
    offload_optimizer: OffloadDevice = OffloadDevice.none
    offload_param: OffloadDevice = OffloadDevice.none
    hybrid_shard_size: int | str = ranged(0, COUNT)  # or "node" (PER_NODE)
    zero_quantized_weights: bool = False
    zero_quantized_gradients: bool = False
    zero_quantized_gradients_bits: int = ranged(8, Range(choices=(8, 4)))  # 8 | 4 (dsrecipes' key, not DeepSpeed's)
    zero_hpz_partition_size: int | str = ranged(1, COUNT)  # or "node" (PER_NODE)
    nvme_path: str | None = None  # directory for NVMe offload's swap files (scratch: removed at exit)
    buffer_count: int = ranged(4, at_least(1))  # optimizer-state pool buffers (>= 2 x state tensors per parameter to overlap I/O)
    param_buffer_count: int = ranged(5, at_least(1))  # parameter pool buffers
    buffer_size: int = ranged(100_000_000, at_least(1))  # elements per pool buffer (>= the largest parameter shard)
    pin_memory: bool = True  # pinned pools on CUDA (ignored on CPU)
    aio: AioConfig = field(default_factory=AioConfig)

    CHECKED_BY_ENGINE: ClassVar[bool] = True  # dsrecipes.initialize checks it too (validate_engine_config)

    def check(self, facts: RecipeFacts) -> None:
        """The group's own checks, ZeRO++ hpZ's group against the layout, and a stage with nothing to shard."""
        validate_zero_config(self)
        dims = facts.dims
        check_zeropp_layout(self, dims)
        if self.stage > 0 and dims.dp == 1 and not dims.model_parallel and not offloads(self):
            warnings.warn(f"zero.stage={self.stage} with a data-parallel world size of 1: there is nothing to shard, "
                          "the run trains as stage 0", stacklevel=4)


def _pp_sharded_dp(root, dims):
    if dims.pp > 1 and dims.dp > 1 and dims.tp > 1 and root.zero.stage >= 1:
        return (f"parallel.pp={dims.pp} x parallel.tp={dims.tp} with {dims.dp} data-parallel ranks and "
                f"zero.stage={root.zero.stage} is not supported yet (ZeRO of tensor-parallel pipeline stages is "
                "untested); use zero.stage=0")
    return None


def _pp_sp_sharded(root, dims):
    if dims.pp > 1 and dims.sp > 1 and root.zero.stage > 0:
        return (f"parallel.pp={dims.pp} with parallel.sp={dims.sp} needs zero.stage=0 (each stage's gradients are "
                f"averaged over its data- and sequence-parallel ranks; ZeRO sharding of stages is not implemented); "
                f"got zero.stage={root.zero.stage}")
    return None


def _sp_tp_zero1(root, dims):
    if dims.sp > 1 and dims.tp > 1 and root.zero.stage == 1:
        return (f"parallel.sp={dims.sp} with parallel.tp={dims.tp} needs zero.stage 0, 2 or 3: ZeRO-1 wraps the model "
                "in DDP, which cannot take tensor-parallel DTensor parameters (stage 0 all-reduces their local shards "
                "at the boundary, stages 2/3 shard them with FSDP2 over dp x sp); got zero.stage=1")
    return None


def _tp_replicated_dp(root, dims):
    if dims.tp > 1 and dims.dp > 1 and root.zero.stage < 2 and dims.pp == 1:
        return (f"parallel.tp={dims.tp} with {dims.dp} data-parallel ranks needs zero.stage 2 or 3 (FSDP2 composes "
                f"with tensor-parallel DTensors on the data-parallel axis); got zero.stage={root.zero.stage}")
    return None


@dataclass
class ParallelConfig:
    """Model-parallel degrees (the `parallel` group); data parallelism takes what is left:
    dp = world_size / (tp * pp * sp). Batch arithmetic (the batch triple) uses dp.

    tp: tensor parallelism (Megatron column/row sharding of attention and MLP, vocab-parallel
        embedding / LM head) over consecutive ranks; composes with ZeRO-2/3 (FSDP2) on the dp axis.
    tp_sequence_parallel: with tp > 1, split the activations between the sharded layers along the
        sequence (norms, dropout and residuals on seq/tp rows; Megatron-LM's --sequence-parallel);
        false keeps them replicated on every tp rank.
    sp: Ulysses sequence parallelism; pp: pipeline parallelism (see the compatibility matrix in docs/model-parallelism.md).
    """

    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        Inactive(lambda root, p: p.pp == 1, lambda root, path: "parallel.pp=1 (no pipeline)",
                 keys=("pp_schedule", "pp_partition")),
        Inactive(lambda root, p: p.tp == 1, lambda root, path: "parallel.tp=1 (no tensor parallelism)",
                 keys=("tp_sequence_parallel",)),
    )

    # how the group composes with the layouts and the other groups (dsrecipes.config.compatibility)
    COMPATIBILITY: ClassVar[tuple[Refusal | Supported, ...]] = (
        Refusal("pp x tp x dp with zero.stage >= 1", "ZeRO of tensor-parallel pipeline stages is untested (pp x dp "
                "and pp x tp x dp at zero.stage 0 run)", _pp_sharded_dp),
        Refusal("pp x sp with zero.stage > 0", "ZeRO sharding of pipeline stages is not implemented yet", _pp_sp_sharded),
        Refusal("sp x tp with zero.stage 1", "ZeRO-1 wraps the model in DDP, which cannot take tensor-parallel DTensors: "
                "use zero.stage 0 (boundary all-reduce) or 2/3 (FSDP2)", _sp_tp_zero1),
        Refusal("tp x dp with zero.stage 0/1", "FSDP2 composes with tensor-parallel DTensors; DDP does not: use ZeRO-2/3",
                _tp_replicated_dp),
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
    )

    tp: int = ranged(1, POSITIVE_INT)
    tp_sequence_parallel: bool = True
    pp: int = ranged(1, POSITIVE_INT)
    sp: int = ranged(1, POSITIVE_INT)
    pp_schedule: PPSchedule = PPSchedule["1f1b"]  # gpipe | 1f1b | interleaved_1f1b (two stages per rank)
    pp_partition: PPPartition = PPPartition.uniform  # uniform (equal block counts) | parameters (balanced parameter counts)

    def check(self, facts: RecipeFacts) -> None:
        """The degrees against the world size (building the layout), then against the model and the data."""
        from dsrecipes.distributed.parallel_checks import validate_parallel_values

        dims = facts.dims
        validate_parallel_values(facts.root, dims, facts.batch.gradient_accumulation_steps if dims.pp > 1 else 0)


@dataclass
class LauncherConfig:
    """How `python -m dsrecipes` starts its workers (torch's elastic agent, as torchrun does).

    nproc_per_node: auto = one worker per GPU; without GPUs, 2 CPU workers for recipes that shard
    (zero.stage > 0) and 1 otherwise; or a number. Under torchrun / SLURM (RANK and WORLD_SIZE set)
    the processes join instead of spawning.

    Multi-node (torchrun's --nnodes / --node-rank / --rdzv-endpoint / --rdzv-id, on the same elastic
    agent): run `python -m dsrecipes launcher.nnodes=2 launcher.node_rank=R launcher.rdzv_endpoint=HOST:PORT`
    on every node; node_rank 0 hosts the c10d rendezvous at HOST:PORT (HOST: node 0's address). The
    rendezvous orders the nodes' global ranks; rdzv_id names the job (the same on every node).
    """

    nproc_per_node: str = "auto"
    max_restarts: int = ranged(0, COUNT)  # > 0: restart failed workers, which resume from the newest checkpoint
    collective_timeout_s: int = ranged(600, POSITIVE_INT)
    backend: LauncherBackend = LauncherBackend.auto  # auto (nccl on CUDA, gloo on CPU) | nccl | gloo
    # spawn | fork | forkserver (StartMethod). conf/launcher/default.yaml reads the default from the
    # DSRECIPES_START_METHOD environment variable (spawn when unset); the test suite sets forkserver.
    start_method: StartMethod = StartMethod.spawn
    nnodes: int = ranged(1, POSITIVE_INT)
    node_rank: int = ranged(0, COUNT)
    rdzv_endpoint: str = ""  # HOST:PORT of node 0's rendezvous; needed when nnodes > 1
    rdzv_id: str = "dsrecipes"  # the job's rendezvous id, the same on every node
    # how long a node waits at the rendezvous for the others (torch's join_timeout)
    rdzv_timeout_s: int = ranged(600, POSITIVE_INT)

    def check(self, facts: RecipeFacts) -> None:
        """The launcher's keys, and its backend against the run's processes."""
        validate_launcher_config(self)
        check_launcher_backend(self, facts.world)


def validate_zero_config(cfg: ZeroConfig, prefix: str = "zero") -> None:
    if cfg.stage not in ZERO_STAGES:
        raise ValueError(f"{prefix}.stage={cfg.stage} is not valid; choose one of: {', '.join(map(str, ZERO_STAGES))}")
    for key in ("offload_optimizer", "offload_param"):
        if getattr(cfg, key) not in OFFLOAD_DEVICES:
            raise ValueError(f"{prefix}.{key}={getattr(cfg, key)!r} is not valid; choose one of: {', '.join(OFFLOAD_DEVICES)}")
    if cfg.offload_param == "cpu" and cfg.stage < 3:
        raise ValueError(f"{prefix}.offload_param=cpu needs {prefix}.stage=3 (got stage {cfg.stage})")
    if cfg.offload_optimizer == "cpu" and cfg.stage < 2:
        raise ValueError(
            f"{prefix}.offload_optimizer=cpu needs {prefix}.stage 2 or 3 in dsrecipes (FSDP2's CPU offload); "
            f"got stage {cfg.stage}"
        )
    if cfg.hybrid_shard_size < 0:
        raise ValueError(f"{prefix}.hybrid_shard_size={cfg.hybrid_shard_size} must be >= 0")
    validate_zeropp_config(cfg, prefix)
    validate_nvme_keys(cfg, prefix)


PER_NODE = "node"  # zero.hybrid_shard_size / zero.zero_hpz_partition_size: one group per node
NODE_SIZED_KEYS = ("hybrid_shard_size", "zero_hpz_partition_size")


def resolve_node_sized_keys(cfg: ZeroConfig, node_size: int, prefix: str = "zero") -> list[str]:
    """Replace `node` in zero.hybrid_shard_size / zero.zero_hpz_partition_size by the node's rank count.

    Returns what changed ("zero.hybrid_shard_size=node -> 2"), for the run log. Any other string is
    a ValueError naming the key and what it may be.
    """
    changed = []
    for key in NODE_SIZED_KEYS:
        value = getattr(cfg, key)
        if isinstance(value, int):
            continue
        if str(value) != PER_NODE:
            raise ValueError(f"{prefix}.{key}={value!r} is not valid; use a number of ranks or {PER_NODE!r} "
                             f"(one group per node)")
        setattr(cfg, key, node_size)
        changed.append(f"{prefix}.{key}={PER_NODE} -> {node_size} (ranks per node)")
    return changed


def offloads(cfg: ZeroConfig) -> bool:
    """Whether anything is offloaded (to the CPU or NVMe): the run then holds its shards on FSDP2's CPU policy."""
    return cfg.offload_optimizer != "none" or cfg.offload_param != "none"


def uses_nvme(cfg: ZeroConfig) -> bool:
    return "nvme" in (cfg.offload_optimizer, cfg.offload_param)


def validate_nvme_keys(cfg: ZeroConfig, prefix: str = "zero") -> None:
    """NVMe offload's keys on their own (the path and the buffers against the model: offload.plan)."""
    for key in ("offload_optimizer", "offload_param"):
        if getattr(cfg, key) == "nvme" and cfg.stage < 3:
            raise ValueError(f"{prefix}.{key}=nvme needs {prefix}.stage=3 (ZeRO-Infinity offloads the shards of "
                             f"stage 3, as in DeepSpeed); got stage {cfg.stage}")
    if not uses_nvme(cfg):
        return
    if not cfg.nvme_path:
        raise ValueError(f"{prefix}.offload_optimizer/offload_param=nvme needs {prefix}.nvme_path (a directory on a "
                         f"fast local disk for the swap files), e.g. {prefix}.nvme_path=/local_nvme")
    for key, low in (("buffer_count", 1), ("param_buffer_count", 1), ("buffer_size", 1)):
        if getattr(cfg, key) < low:
            raise ValueError(f"{prefix}.{key}={getattr(cfg, key)} must be >= {low}")
    aio = cfg.aio
    if aio.block_size < 4096 or aio.block_size % 4096:
        raise ValueError(f"{prefix}.aio.block_size={aio.block_size} must be a positive multiple of 4096 bytes "
                         "(O_DIRECT's alignment)")
    if not 1 <= aio.queue_depth <= 1024:
        raise ValueError(f"{prefix}.aio.queue_depth={aio.queue_depth} must be in 1..1024 (blocks per call)")
    if aio.thread_count < 1:
        raise ValueError(f"{prefix}.aio.thread_count={aio.thread_count} must be >= 1")


def validate_zeropp_config(cfg: ZeroConfig, prefix: str = "zero") -> None:
    """ZeRO++ keys against the stage (what needs the layout is check_zeropp_layout's)."""
    if cfg.zero_quantized_weights and cfg.stage < 3:
        raise ValueError(f"{prefix}.zero_quantized_weights=true (qwZ) needs {prefix}.stage=3 (it quantizes the "
                         f"all-gather of sharded parameters, as DeepSpeed's); got stage {cfg.stage}")
    if cfg.zero_quantized_gradients and cfg.stage < 2:
        raise ValueError(f"{prefix}.zero_quantized_gradients=true (qgZ) needs {prefix}.stage 2 or 3 (it quantizes the "
                         f"gradient reduce-scatter); got stage {cfg.stage}")
    if cfg.zero_quantized_gradients_bits not in (8, 4):
        raise ValueError(f"{prefix}.zero_quantized_gradients_bits={cfg.zero_quantized_gradients_bits} is not valid; "
                         "choose one of: 8, 4")
    size = cfg.zero_hpz_partition_size
    if size < 0:
        raise ValueError(f"{prefix}.zero_hpz_partition_size={size} must be >= 0 (0 or 1 = off)")
    if size > 1 and cfg.stage < 3:
        raise ValueError(f"{prefix}.zero_hpz_partition_size={size} (hpZ) needs {prefix}.stage=3 (a secondary "
                         f"partition of parameters resharded after forward); got stage {cfg.stage}")
    if size > 1 and cfg.hybrid_shard_size > 0:
        raise ValueError(f"{prefix}.zero_hpz_partition_size={size} and {prefix}.hybrid_shard_size="
                         f"{cfg.hybrid_shard_size} both set: choose one (hybrid_shard_size shards every all-gather "
                         "within groups and replicates across them; hpZ shards over all ranks and keeps only the "
                         "backward all-gather inside groups)")


def check_zeropp_layout(cfg: ZeroConfig, dims, prefix: str = "zero") -> None:
    """hpZ's group must divide FSDP2's shard size (dp_shard x sp), on a mesh FSDP2 can regroup.

    FSDP2 builds the secondary groups by viewing the shard mesh as (-1, size), which creates new
    process groups over those ranks only: with tensor/pipeline/expert parallelism each model-parallel
    slice would create different groups, so hpZ runs with data (and sequence) parallelism only.
    """
    size = cfg.zero_hpz_partition_size
    if size <= 1 or cfg.stage < 3:
        return
    for key, degree in (("parallel.tp", dims.tp), ("parallel.pp", dims.pp), ("moe.ep_size", dims.ep)):
        if degree > 1:
            raise ValueError(f"{prefix}.zero_hpz_partition_size={size} (hpZ) with {key}={degree} is not supported: "
                             f"hpZ needs plain data (or sequence) parallelism; set {prefix}.zero_hpz_partition_size=1 "
                             f"or {key}=1")
    shard = dims.dp_shard * dims.sp
    if shard % size:
        valid = ", ".join(str(d) for d in range(1, shard + 1) if shard % d == 0)
        raise ValueError(f"{prefix}.zero_hpz_partition_size={size} does not divide the {shard} ranks parameters are "
                         f"sharded over; valid sizes: {valid}")


def resolve_nproc(cfg: LauncherConfig, zero: ZeroConfig, gpus: int) -> int:
    """Workers to start on this node; a clear error for nonsense or more GPUs than present."""
    value = str(cfg.nproc_per_node)
    if value == "auto":
        return gpus if gpus > 0 else (2 if zero.stage > 0 else 1)
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"launcher.nproc_per_node={value!r} is not valid; use auto or a positive number")
    n = int(value)
    if gpus and n > gpus:
        raise ValueError(f"launcher.nproc_per_node={n} but only {gpus} GPU(s) are present")
    return n


def validate_launcher_config(cfg: LauncherConfig, prefix: str = "launcher") -> None:
    if cfg.backend not in LAUNCHER_BACKENDS:
        raise ValueError(f"{prefix}.backend={cfg.backend!r} is not valid; choose one of: {', '.join(LAUNCHER_BACKENDS)}")
    if cfg.max_restarts < 0:
        raise ValueError(f"{prefix}.max_restarts={cfg.max_restarts} must be >= 0")
    if cfg.collective_timeout_s <= 0:
        raise ValueError(f"{prefix}.collective_timeout_s={cfg.collective_timeout_s} must be > 0")
    validate_multinode_keys(cfg, prefix)


def validate_multinode_keys(cfg: LauncherConfig, prefix: str = "launcher") -> None:
    """nnodes / node_rank / rdzv_endpoint consistent with each other, before any worker starts."""
    if cfg.nnodes < 1:
        raise ValueError(f"{prefix}.nnodes={cfg.nnodes} must be >= 1")
    if not 0 <= cfg.node_rank < cfg.nnodes:
        raise ValueError(f"{prefix}.node_rank={cfg.node_rank} is not valid with {prefix}.nnodes={cfg.nnodes}; "
                         f"choose one of: {', '.join(map(str, range(cfg.nnodes)))}")
    if cfg.nnodes == 1:
        return
    host, _, port = cfg.rdzv_endpoint.rpartition(":")
    if not cfg.rdzv_endpoint:
        raise ValueError(f"{prefix}.nnodes={cfg.nnodes} needs {prefix}.rdzv_endpoint=HOST:PORT, node 0's address and "
                         f"a free port, the same on every node (e.g. {prefix}.rdzv_endpoint=node0:29500)")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{prefix}.rdzv_endpoint={cfg.rdzv_endpoint!r} is not valid; use HOST:PORT with a port "
                         f"number in 1-65535 (e.g. node0:29500)")
    if not cfg.rdzv_id or any(c.isspace() for c in cfg.rdzv_id):
        raise ValueError(f"{prefix}.rdzv_id={cfg.rdzv_id!r} is not valid; use a name without spaces, the same on every "
                         "node")


def nccl_unavailable_reason() -> str | None:
    """Why NCCL cannot run here (no CUDA device, or a torch build without NCCL); None when it can."""
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        return "no CUDA device is available"
    if not (dist.is_available() and dist.is_nccl_available()):
        return "this torch build has no NCCL"
    return None


def check_launcher_backend(cfg: LauncherConfig, processes: int, prefix: str = "launcher") -> None:
    """launcher.backend=nccl where NCCL cannot run: an error before any worker starts when processes will form a
    group (processes > 1), a warning when there is one process (it forms no group, so the key has no effect)."""
    if cfg.backend != "nccl":
        return
    reason = nccl_unavailable_reason()
    if reason is None:
        return
    if processes > 1:
        raise ValueError(f"{prefix}.backend=nccl needs CUDA GPUs and NCCL, but {reason}; use {prefix}.backend=gloo or "
                         f"auto (auto = nccl on CUDA, gloo on CPU)")
    import warnings

    warnings.warn(f"{prefix}.backend=nccl has no effect with one process (no process group is formed); NCCL could not "
                  f"run here anyway: {reason}", stacklevel=2)
