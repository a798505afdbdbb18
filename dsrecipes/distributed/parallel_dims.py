"""ParallelDims: the run's parallel layout, validated once, and the one place DeviceMeshes are built.

    dims = ParallelDims.from_config(cfg, world_size)      # arithmetic only; raises ValueError naming keys
    dims.get_mesh("tp")                                    # meshes are built on first use, then cached

world = pp x dp_replicate x dp_shard x sp x tp, tensor parallelism innermost (consecutive ranks form
a TP group, so its collectives stay inside a node), then sequence parallelism, then data
parallelism (dp = dp_replicate x dp_shard, split by the ZeRO stage and zero.hybrid_shard_size),
pipeline stages outermost. Expert parallelism (moe.ep_size) views the same ranks as edp x ep with
consecutive ranks in one expert-parallel group (DeepSpeed's layout); with tp > 1 it is edp x ep x etp,
an expert-parallel group holding ranks of one tp rank and each expert's hidden width sliced over etp
(the tp ranks).

Mesh names for `get_mesh`:

| name | ranks | used by |
|---|---|---|
| pp, dp_replicate, dp_shard, sp, tp | one axis of the world mesh | pipeline, HSDP, FSDP2, Ulysses, TP |
| dp | dp_replicate x dp_shard | data sharding |
| dp_sp | dp x sp | gradient reduction and loss averaging (sequence-parallel ranks hold other tokens of the same samples) |
| dp_shard_sp | dp_shard x sp | FSDP2's shard axis |
| fsdp | dp_shard_sp, or (dp_replicate, dp_shard_sp) under hybrid sharding | FSDP2 |
| ep, edp, expert | expert-parallel groups, their data-parallel peers, and the (edp, ep) mesh; (edp, ep, etp) when tp > 1 | MoE |
| etp | with tp > 1: the tp ranks as the expert mesh's innermost axis (expert-tensor parallelism) | MoE |

Nodes: `node_size` is the number of ranks per node (LOCAL_WORLD_SIZE, as torchrun, srun and the
elastic agent set it; one node when unknown). Global ranks fill nodes in order, so the innermost axes
stay inside a node: `crossing_axes()` names the axes whose groups span nodes (tp or sp there means
their per-layer collectives leave the node: a warning), and `zero.hybrid_shard_size=node` /
`zero.zero_hpz_partition_size=node` size the shard groups to one node.

Nothing else in dsrecipes calls init_device_mesh: the meshes (and their process groups) are made
here, once per ParallelDims object, and the object is passed down from where the run is assembled.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

WORLD_DIMS = ("pp", "dp_replicate", "dp_shard", "sp", "tp")
_FLATTENED = {"dp": ("dp_replicate", "dp_shard"), "dp_sp": ("dp_replicate", "dp_shard", "sp"),
              "dp_shard_sp": ("dp_shard", "sp")}
_EXPERT_DIMS = ("edp", "ep")


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def ranks_per_node(world_size: int) -> int:
    """Ranks on each node: LOCAL_WORLD_SIZE where a launcher set it (and it divides the world), else all of them."""
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if local.isdigit() and 0 < int(local) <= world_size and world_size % int(local) == 0:
        return int(local)
    return world_size


@dataclass(frozen=True)
class ParallelDims:
    world_size: int
    dp_replicate: int
    dp_shard: int
    tp: int = 1
    sp: int = 1
    pp: int = 1
    ep: int = 1
    device_type: str = "cpu"
    node_size: int = 0  # ranks per node; 0 = the whole world is one node
    _meshes: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    # ------------------------------------------------------------------ construction and validation
    @classmethod
    def from_config(cls, cfg, world_size: int, device_type: str = "cpu", node_size: int | None = None) -> ParallelDims:
        """The layout of a recipe (its zero, parallel and moe groups) at `world_size` processes, `node_size`
        of them per node (default: LOCAL_WORLD_SIZE, else one node)."""
        par, moe = cfg.parallel, cfg.moe
        dims = cls.from_degrees(world_size, zero_stage=cfg.zero.stage, hybrid_shard_size=cfg.zero.hybrid_shard_size,
                                tp=par.tp, sp=par.sp, pp=par.pp, ep=moe.ep_size if moe.enabled else 1,
                                device_type=device_type)
        return dims.on_nodes(node_size or ranks_per_node(world_size))

    def on_nodes(self, node_size: int) -> ParallelDims:
        """The same layout, told that each node runs `node_size` consecutive ranks."""
        if node_size < 1 or self.world_size % node_size:
            raise ValueError(f"{node_size} ranks per node do not divide the world size {self.world_size}")
        return dataclasses.replace(self, node_size=0 if node_size == self.world_size else node_size, _meshes={})

    @classmethod
    def from_degrees(cls, world_size: int, zero_stage: int = 0, hybrid_shard_size: int = 0, tp: int = 1, sp: int = 1,
                     pp: int = 1, ep: int = 1, device_type: str = "cpu") -> ParallelDims:
        """dp = world / (tp*sp*pp); ZeRO stages 0-1 replicate across dp, 2-3 shard (within groups of
        zero.hybrid_shard_size data-parallel ranks if set). ValueError naming the keys otherwise."""
        if world_size < 1:
            raise ValueError(f"world size must be >= 1, got {world_size}")
        for key, value in (("parallel.tp", tp), ("parallel.sp", sp), ("parallel.pp", pp), ("moe.ep_size", ep)):
            if value < 1:
                raise ValueError(f"{key}={value} must be >= 1")
        model_parallel = tp * sp * pp
        if world_size % model_parallel:
            raise ValueError(
                f"parallel.tp={tp} x parallel.sp={sp} x parallel.pp={pp} = {model_parallel} does not divide the "
                f"world size {world_size}; the product must be one of: {_divisors(world_size)}"
            )
        if world_size % ep:
            raise ValueError(f"moe.ep_size={ep} must divide the world size {world_size} (valid: {_divisors(world_size)})")
        dp = world_size // model_parallel
        if ep > 1 and model_parallel > 1 and dp % ep:
            raise ValueError(f"moe.ep_size={ep} must divide the data-parallel size {dp} (= world / parallel.tp; "
                             f"expert-parallel groups hold ranks of one tp rank); valid: {_divisors(dp)}")
        if zero_stage < 2:
            return cls(world_size, dp, 1, tp, sp, pp, ep, device_type)
        shard = hybrid_shard_size or dp
        if dp % shard:
            what = "world size" if dp == world_size else "data-parallel size"
            raise ValueError(
                f"zero.hybrid_shard_size={hybrid_shard_size} does not divide the {what} {dp}; valid sizes: {_divisors(dp)}"
            )
        return cls(world_size, dp // shard, shard, tp, sp, pp, ep, device_type)

    # ------------------------------------------------------------------ arithmetic
    @property
    def dp(self) -> int:
        """Data-parallel degree: how many different micro-batches one step sees (the batch triple's W)."""
        return self.dp_replicate * self.dp_shard

    @property
    def dp_sp(self) -> int:
        """Ranks over which gradients are averaged: data parallelism x sequence parallelism."""
        return self.dp * self.sp

    @property
    def model_parallel(self) -> bool:
        return self.tp * self.sp * self.pp > 1

    @property
    def mixes_parameter_kinds(self) -> bool:
        """Whether a rank may hold tensor-parallel DTensor parameters beside plain replicated ones (tp > 1). torch's
        foreach and fused optimizer kernels take one kind per call: such a rank's optimizer steps parameters one by one
        (optimizer.impl for_loop)."""
        return self.tp > 1

    @property
    def plain_data_parallel(self) -> bool:
        """No tensor, pipeline, sequence or expert parallelism: every rank holds the whole model."""
        return self.tp == self.pp == self.sp == self.ep == 1

    def model_parallel_coordinates(self, rank: int) -> tuple[int, int]:
        """(pp_rank, tp_rank) of a global rank (world = pp x dp x sp x tp, tp innermost, pp outermost): the
        coordinates that decide which parameters it holds."""
        return rank // (self.world_size // self.pp), rank % self.tp

    def dp_rank(self, rank: int) -> int:
        """This global rank's index along the data-parallel axis (which data shard it reads)."""
        return (rank % (self.world_size // self.pp)) // (self.sp * self.tp)

    def describe_degrees(self) -> str:
        """world 8 = pp 2 x dp 2 x sp 1 x tp 2, ep 1"""
        return f"world {self.world_size} = pp {self.pp} x dp {self.dp} x sp {self.sp} x tp {self.tp}, ep {self.ep}"

    def describe(self) -> str:
        """world 8 = pp 2 x dp 2 (replicate 1 x shard 2) x sp 1 x tp 2, ep 1[; 2 nodes x 4 ranks: pp crosses nodes]."""
        text = (f"world {self.world_size} = pp {self.pp} x dp {self.dp} (replicate {self.dp_replicate} x shard "
                f"{self.dp_shard}) x sp {self.sp} x tp {self.tp}, ep {self.ep}")
        return f"{text}; {self.describe_nodes()}" if self.nodes > 1 else text

    # ------------------------------------------------------------------ nodes
    @property
    def nodes(self) -> int:
        return self.world_size // self.node_size if self.node_size else 1

    def crossing_axes(self) -> list[str]:
        """The world-mesh axes (and `ep`) whose process groups hold ranks of more than one node."""
        if not self.node_size:
            return []
        node = torch.arange(self.world_size) // self.node_size
        shape = (self.pp, self.dp_replicate, self.dp_shard, self.sp, self.tp)
        crossing = []
        for index, axis in enumerate(WORLD_DIMS):
            groups = node.reshape(shape).movedim(index, -1).reshape(-1, shape[index])
            if shape[index] > 1 and bool((groups != groups[:, :1]).any()):
                crossing.append(axis)
        ep_groups = node.reshape(-1, self.ep, self.tp).transpose(1, 2).reshape(-1, self.ep)
        if self.ep > 1 and bool((ep_groups != ep_groups[:, :1]).any()):
            crossing.append("ep")
        return crossing

    def describe_nodes(self) -> str:
        """2 nodes x 4 ranks: dp_shard crosses nodes, tp inside a node (or: one node)."""
        if self.nodes == 1:
            return "one node"
        crossing = self.crossing_axes()
        inside = [axis for axis in (*WORLD_DIMS, "ep") if getattr(self, axis) > 1 and axis not in crossing]
        text = f"{self.nodes} nodes x {self.node_size} ranks: "
        text += f"{', '.join(crossing)} cross{'es' if len(crossing) == 1 else ''} nodes" if crossing else \
            "no axis crosses nodes"
        return text + (f", {', '.join(inside)} inside a node" if inside else "")

    def shard_node_split(self) -> tuple[int, int] | None:
        """(nodes, members per node) of the FSDP shard axis (dp_shard x sp) when its groups span several nodes
        with several members on each, in equal consecutive blocks (the layout of 2-hop collectives); else None."""
        if not self.node_size:
            return None
        size = self.dp_shard * self.sp
        node = (torch.arange(self.world_size) // self.node_size).reshape(
            self.pp, self.dp_replicate, self.dp_shard * self.sp, self.tp).movedim(2, -1).reshape(-1, size)
        local = int((node[0] == node[0, 0]).sum())
        if local in (1, size) or size % local:
            return None
        blocks = node.reshape(node.shape[0], size // local, local)
        if bool((blocks != blocks[..., :1]).any()):
            return None
        return size // local, local

    def shard_node_groups(self) -> tuple[dist.ProcessGroup, dist.ProcessGroup] | None:
        """(inside a node, across nodes) process groups splitting this rank's FSDP shard group, for qgZ's 2-hop
        reduce-scatter; None where shard_node_split is None. Collective: every rank calls it, once."""
        split = self.shard_node_split()
        if split is None:
            return None
        if "shard_nodes" not in self._meshes:
            self._meshes["shard_nodes"] = self.get_mesh("dp_shard_sp")._unflatten(
                0, split, ("shard_node", "shard_local"))
        mesh = self._meshes["shard_nodes"]
        return mesh.get_group("shard_local"), mesh.get_group("shard_node")

    def node_warnings(self) -> list[str]:
        """tp / sp / ep groups that span nodes: their collectives run in every layer, over the slower links between nodes."""
        crossing = self.crossing_axes()
        limits = {"tp": (f"parallel.tp={self.tp}", "parallel.tp", "tensor-parallel collectives"),
                  "sp": (f"parallel.sp={self.sp} x parallel.tp={self.tp}", "parallel.sp x parallel.tp",
                         "Ulysses all-to-alls"),
                  "ep": (f"moe.ep_size={self.ep}", "moe.ep_size", "expert all-to-alls")}
        return [f"{given} spans nodes ({self.node_size} ranks per node): its {what} run in every layer over the links "
                f"between nodes; keep {keys} <= {self.node_size}"
                for axis, (given, keys, what) in limits.items() if axis in crossing]

    # ------------------------------------------------------------------ meshes
    @property
    def world_mesh(self) -> DeviceMesh:
        """The (pp, dp_replicate, dp_shard, sp, tp) mesh over every rank (built on first use)."""
        if "world" not in self._meshes:
            if self.world_size == 1 and not dist.is_initialized():
                # a single process that still needs a mesh (FSDP2 at one rank: CPU / NVMe offload) gets its
                # own one-rank group, with no launcher or environment variables
                backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
                dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
            shape = (self.pp, self.dp_replicate, self.dp_shard, self.sp, self.tp)
            self._meshes["world"] = init_device_mesh(self.device_type, shape, mesh_dim_names=WORLD_DIMS)
        return self._meshes["world"]

    def get_mesh(self, name: str) -> DeviceMesh:
        """The named mesh (see the module docstring), built once and cached; needs a process group."""
        if name in self._meshes:
            return self._meshes[name]
        if name in WORLD_DIMS:
            mesh = self.world_mesh[name]
        elif name in _FLATTENED:
            mesh = self._flattened(name)
        elif name == "fsdp":
            mesh = self._fsdp_mesh()
        elif name == "expert":
            mesh = self._expert_mesh()
        elif name in _EXPERT_DIMS or name == "etp":
            mesh = self.get_mesh("expert")[name]
        else:
            valid = (*WORLD_DIMS, *_FLATTENED, "fsdp", "expert", *_EXPERT_DIMS, "etp")
            raise KeyError(f"no mesh named {name!r}; valid names: {', '.join(valid)}")
        self._meshes[name] = mesh
        return mesh

    def _expert_mesh(self) -> DeviceMesh:
        """(edp, ep) over consecutive ranks; with tp > 1, (edp, ep, etp): ep groups hold ranks of one tp
        rank (the tp axis is innermost), so they exchange tokens between data-parallel ranks only. Under
        pipeline parallelism each stage's ranks form their own such mesh (stages hold different layers'
        experts): this rank's stage's is returned."""
        names = (*_EXPERT_DIMS, "etp") if self.tp > 1 else _EXPERT_DIMS
        shape = (self.world_size // (self.pp * self.ep * self.tp), self.ep) + ((self.tp,) if self.tp > 1 else ())
        if self.pp == 1:
            return init_device_mesh(self.device_type, shape, mesh_dim_names=names)
        stages = init_device_mesh(self.device_type, (self.pp, *shape), mesh_dim_names=("stage", *names))
        return stages[names]

    def _flattened(self, name: str) -> DeviceMesh:
        """Several world axes as one; when at most one of them is larger than 1, that axis itself
        (no extra process group)."""
        axes = _FLATTENED[name]
        wide = [axis for axis in axes if getattr(self, axis) > 1]
        if len(wide) <= 1:
            return self.world_mesh[wide[0] if wide else axes[0]]
        return self.world_mesh[axes]._flatten(name)

    def _fsdp_mesh(self) -> DeviceMesh:
        shard = self.get_mesh("dp_shard_sp")
        if self.dp_replicate == 1:
            return shard
        with warnings.catch_warnings():  # torch >= 2.11 warns that slicing a flattened dim will change
            warnings.filterwarnings("ignore", message="Slicing a flattened dim")
            return self.world_mesh["dp_replicate", shard.mesh_dim_names[0]]


def device_type_of(device: torch.device) -> str:
    return "cuda" if device.type == "cuda" else "cpu"
