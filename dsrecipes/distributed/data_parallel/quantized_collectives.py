"""ZeRO++'s quantized collectives (qwZ, qgZ) as FSDP2 custom comms.

FSDP2 (torch >= 2.13) lets a module replace its all-gather and reduce-scatter:
`FSDPModule.set_custom_all_gather(AllGather)` / `set_custom_reduce_scatter(ReduceScatter)`
(interfaces in torch.distributed.fsdp._fully_shard._fsdp_api). FSDP2 calls them with one flat
tensor per FSDP unit, synchronously in its all-gather / reduce-scatter stream (it records an event
after the call and waits on it), so both classes issue blocking collectives and return None.

* `QuantizedAllGather` (qwZ, DeepSpeed's zero_quantized_weights): FSDP2's all-gather input is this
  rank's flat shard (a view into the output buffer) in the parameter dtype. It is cut into blocks of
  `WEIGHT_BLOCK` elements (DeepSpeed's qwZ targets ~4k-element groups), quantized to int8
  symmetrically (one fp32 scale per block: scale = max|x| / 127), the int8 payload and the scales
  are all-gathered, and every rank's shard is dequantized into the output in the parameter dtype.
  Every rank, its own shard included, then sees the same (quantized) weights. Error per element:
  at most half a quantization step, max|block| / 254.
* `QuantizedReduceScatter` (qgZ, zero_quantized_gradients): FSDP2's reduce-scatter input is the
  full flat gradient (world x shard elements, fp32). Each destination's chunk is quantized blockwise
  (int8, or int4 packed two per byte), the chunks are exchanged with one all-to-all (gloo and NCCL
  both implement all_to_all_single), and each rank dequantizes the `world` chunks it received and
  sums them in fp32 into its output shard. The reduce op FSDP2 passes is honoured: SUM, or AVG
  (divide by the group size); FSDP2 picks AVG for fp32 gradients without a custom divide factor and
  SUM with its own pre/post division otherwise. PREMUL_SUM (a custom gradient divide factor, which
  dsrecipes never sets) is refused. Under hybrid sharding the reduce-scatter over the shard group is
  quantized and FSDP2's all-reduce across replicas stays fp32.
  When the shard group spans nodes with several members on each (ParallelDims.shard_node_split:
  N nodes x L members, from LOCAL_WORLD_SIZE), the reduce-scatter takes DeepSpeed's 2-hop form
  instead: an all-to-all inside each node hands local member l the chunks of every destination
  (m, l), which it dequantizes and sums over the node; the partial sums are requantized and an
  all-to-all across nodes (the members with the same l) completes the sum. The bytes that cross
  nodes fall L-fold, at the price of a second quantization of partial sums (error bound: see
  `two_hop_bound`). One node, or one member per node: the 1-hop form.

Quantization uses dsrecipes.kernels' int8 kernels (`quantize_int8` / `dequantize_int8`,
granularity "group") on CUDA and their torch references elsewhere; int4 is plain torch (there is
no int4 kernel). A flat tensor whose length is not a multiple of the block is zero-padded (blocks
never exceed the tensor, so a small unit is one block of its own size). The collectives go through
torch.distributed's Python API (all_gather_single, all_to_all_single), so the comms logger sees
them with their real int8 / uint8 byte sizes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from dsrecipes.kernels.quantization import (
    dequantize_int8,
    dequantize_int8_reference,
    quantize_int8,
    quantize_int8_reference,
)

WEIGHT_BLOCK = 4096  # qwZ block (elements per scale): DeepSpeed's "optimal 4k" group size
GRADIENT_BLOCK = {8: 4096, 4: 512}  # qgZ block per bit width: int4's coarser grid gets smaller blocks
GRADIENT_BITS = (8, 4)


def _block(numel: int, block: int, even: bool = False) -> int:
    """The block actually used for a tensor of `numel` elements: `block`, or the tensor itself if smaller."""
    size = max(1, min(block, numel))
    return size + (size % 2) if even else size


def _pad_rows(rows: torch.Tensor, block: int) -> torch.Tensor:
    """[R, n] -> [R, n rounded up to a multiple of block], zero-padded."""
    pad = -rows.shape[1] % block
    return torch.nn.functional.pad(rows, (0, pad)) if pad else rows


def quantize_int8_blocks(rows: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per block of `block` elements along each row of a padded [R, n] tensor.

    Returns (q int8 [R, n], scale fp32 [R, n / block]): the CUDA kernel on CUDA, the reference elsewhere.
    """
    quantize = quantize_int8 if rows.is_cuda else quantize_int8_reference
    q, scale, _ = quantize(rows, "symmetric", "group", block)
    return q, scale


def dequantize_int8_blocks(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of quantize_int8_blocks, in `dtype` (computed in fp32)."""
    dequantize = dequantize_int8 if q.is_cuda else dequantize_int8_reference
    return dequantize(q, scale, dtype=dtype)


def quantize_int4_blocks(rows: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int4 per block (q in [-7, 7], scale = max|x| / 7), packed two per byte.

    rows: [R, n] with n a multiple of the (even) block. Returns (packed uint8 [R, n / 2], scale fp32
    [R, n / block]); element 2i is the low nibble, 2i + 1 the high one, each stored as q + 8.
    """
    r, n = rows.shape
    groups = rows.float().reshape(r, n // block, block)
    scale = groups.abs().amax(-1) / 7.0
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(groups / scale[..., None]).clamp_(-7, 7).to(torch.int16).add_(8).to(torch.uint8).reshape(r, n)
    return q[:, 0::2] | (q[:, 1::2] << 4), scale


def dequantize_int4_blocks(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of quantize_int4_blocks: [R, n / 2] uint8 + [R, groups] scales -> [R, n] in `dtype`."""
    r, half = packed.shape
    q = torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(r, 2 * half).to(torch.float32) - 8.0
    groups = scale.shape[1]
    return (q.reshape(r, groups, -1) * scale[..., None]).reshape(r, 2 * half).to(dtype)


def _empty(size: Sequence[int | torch.SymInt], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(*size, dtype=dtype, device=device)


class QuantizedAllGather(AllGather):
    """qwZ: blockwise int8 all-gather of FSDP2's flat parameter shards, dequantized on arrival."""

    def __init__(self, block: int = WEIGHT_BLOCK) -> None:
        if block < 1:
            raise ValueError(f"QuantizedAllGather: block must be >= 1, got {block}")
        self.block = block

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return _empty(size, dtype, device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 async_op: bool = False) -> dist.Work | None:
        if not input_tensor.is_floating_point():
            # FSDP2 gathers raw bytes (uint8) when a unit mixes parameter dtypes: nothing to quantize
            return dist.all_gather_single(output_tensor, input_tensor, group=group, async_op=async_op)
        world, numel = group.size(), input_tensor.numel()
        block = _block(numel, self.block)
        q, scale = quantize_int8_blocks(_pad_rows(input_tensor.reshape(1, numel), block), block)
        q_all = torch.empty((world, q.shape[1]), dtype=q.dtype, device=q.device)
        scale_all = torch.empty((world, scale.shape[1]), dtype=scale.dtype, device=scale.device)
        dist.all_gather_single(q_all, q, group=group)
        dist.all_gather_single(scale_all, scale, group=group)
        gathered = dequantize_int8_blocks(q_all, scale_all, output_tensor.dtype)
        output_tensor.view(world, numel).copy_(gathered[:, :numel])
        return None  # done: FSDP2's all-gather event, recorded after this call, covers it


class QuantizedReduceScatter(ReduceScatter):
    """qgZ: blockwise int8/int4 quantized gradient reduce-scatter as one all-to-all, summed in fp32."""

    def __init__(self, bits: int = 8, block: int | None = None,
                 node_groups: tuple[dist.ProcessGroup, dist.ProcessGroup] | None = None) -> None:
        """node_groups: (inside a node, across nodes) groups splitting the shard group (ParallelDims.
        shard_node_groups), for the 2-hop form; None: 1-hop."""
        if bits not in GRADIENT_BITS:
            raise ValueError(f"QuantizedReduceScatter: bits must be one of {GRADIENT_BITS}, got {bits}")
        self.bits = bits
        self.block = block or GRADIENT_BLOCK[bits]
        self.node_groups = node_groups

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return _empty(size, dtype, device)

    def quantize(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        """[world, n] chunks -> (payload, scales, n padded): what the all-to-all exchanges."""
        block = _block(rows.shape[1], self.block, even=self.bits == 4)
        padded = _pad_rows(rows, block)
        if self.bits == 8:
            q, scale = quantize_int8_blocks(padded, block)
        else:
            q, scale = quantize_int4_blocks(padded, block)
        return q, scale, padded.shape[1]

    def dequantize(self, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        if self.bits == 8:
            return dequantize_int8_blocks(q, scale, torch.float32)
        return dequantize_int4_blocks(q, scale, torch.float32)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op: dist.ReduceOp, async_op: bool = False) -> dist.Work | None:
        if op == dist.ReduceOp.AVG:
            average = True
        elif op == dist.ReduceOp.SUM:
            average = False
        else:
            raise NotImplementedError(f"zero.zero_quantized_gradients: reduce op {op} is not supported (SUM and AVG "
                                      "are; a custom FSDP2 gradient divide factor uses PREMUL_SUM)")
        world, numel = group.size(), output_tensor.numel()
        if self.node_groups is not None and self.node_groups[0].size() * self.node_groups[1].size() == world:
            reduced = self._two_hops(input_tensor, numel)
        else:
            reduced = self._exchange(input_tensor.reshape(world, numel), group)[:numel]
        if average:
            reduced /= world
        output_tensor.copy_(reduced)
        return None

    def _exchange(self, rows: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        """Row i (quantized) to member i of `group`; the fp32 sum of the rows received (padded length)."""
        q, scale, _ = self.quantize(rows)
        q_recv, scale_recv = torch.empty_like(q), torch.empty_like(scale)
        dist.all_to_all_single(q_recv, q, group=group)  # row i goes to rank i; row j received from rank j
        dist.all_to_all_single(scale_recv, scale, group=group)
        return self.dequantize(q_recv, scale_recv).sum(0)

    def _two_hops(self, input_tensor: torch.Tensor, numel: int) -> torch.Tensor:
        """Shard-group member (n, l) of N nodes x L members: chunks for destinations (m, l') go to local member
        l' first (summed over the node), then to node m (summed over the nodes)."""
        inside, across = self.node_groups
        local, nodes = inside.size(), across.size()
        by_local = input_tensor.reshape(nodes, local, numel).transpose(0, 1).reshape(local, nodes * numel)
        partial = self._exchange(by_local, inside)[:nodes * numel]  # this node's sums for (m, l), m = 0..N-1
        return self._exchange(partial.reshape(nodes, numel), across)[:numel]


def reshard_after_forward(zero) -> bool | int:
    """FSDP2's reshard_after_forward for this ZeRO config: False at stage 2, True at stage 3, or hpZ's
    group size (zero.zero_hpz_partition_size > 1: parameters kept sharded within groups of that many
    ranks between forward and backward; FSDP2 requires it to divide the shard size and treats the
    whole shard size as True)."""
    if zero.stage < 3:
        return False
    return zero.zero_hpz_partition_size if zero.zero_hpz_partition_size > 1 else True


def two_hop_bound(max_abs: float, local: int, nodes: int, bits: int) -> float:
    """Largest error of one element of the 2-hop sum (SUM op) of gradients bounded by max_abs: each of the L
    local chunks is off by at most half a step of its block (max_abs / steps), and each of the N partial sums,
    bounded by L (max_abs + that error), by half a step of its own block."""
    steps = 254 if bits == 8 else 14
    first = local * max_abs / steps
    return nodes * (first + local * max_abs * (1 + 1 / steps) / steps)


def install(module, zero, node_groups=None) -> None:
    """Set qwZ's all-gather and qgZ's reduce-scatter (2-hop over `node_groups` when given) on one FSDPModule."""
    if zero.zero_quantized_weights:
        module.set_custom_all_gather(QuantizedAllGather())
    if zero.zero_quantized_gradients:
        module.set_custom_reduce_scatter(QuantizedReduceScatter(zero.zero_quantized_gradients_bits,
                                                                node_groups=node_groups))


def describe(zero, shard_size: int, node_split: tuple[int, int] | None = None) -> str:
    """The run log's ZeRO++ clause ("" when none of qwZ / qgZ / hpZ is on); node_split: qgZ's 2-hop layout."""
    parts = []
    if zero.zero_quantized_weights:
        parts.append(f"qwZ on (int8 parameter all-gather, blocks of {WEIGHT_BLOCK})")
    if zero.zero_quantized_gradients:
        bits = zero.zero_quantized_gradients_bits
        hops = "1-hop" if node_split is None else \
            f"2-hop: inside each node over {node_split[1]} ranks, then across {node_split[0]} nodes"
        parts.append(f"qgZ on (int{bits} all-to-all gradient reduce-scatter, blocks of {GRADIENT_BLOCK[bits]}, "
                     f"{hops})")
    size = zero.zero_hpz_partition_size
    if zero.stage == 3 and size > 1:
        secondary = ("the whole shard group: no secondary partition" if size >= shard_size
                     else f"backward all-gathers inside groups of {size} of the {shard_size} ranks")
        parts.append(f"hpZ on (secondary partition over {size} ranks: {secondary})")
    return "; ZeRO++: " + ", ".join(parts) if parts else ""


__all__ = ["GRADIENT_BITS", "GRADIENT_BLOCK", "QuantizedAllGather", "QuantizedReduceScatter", "WEIGHT_BLOCK",
           "dequantize_int4_blocks", "dequantize_int8_blocks", "describe", "install", "quantize_int4_blocks",
           "quantize_int8_blocks", "reshard_after_forward", "two_hop_bound"]
