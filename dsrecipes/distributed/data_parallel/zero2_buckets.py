"""ZeRO stage 2 as DeepSpeed lays it out: replicated parameters, sharded gradients and optimizer states.

Every rank keeps the whole model (forward and backward run with no communication and no wrapper),
but only its shard of the gradients and of the optimizer state:

* backward: as soon as a bucket of parameters (about 25 MB, in reverse registration order, the
  order backward produces them) has its gradients, they are packed rank-major and
  reduce-scattered asynchronously (in fp32; on gloo all-reduced, which is faster there), and the
  full-size gradients are freed. The bucket's
  rank-local result is averaged and accumulated into a persistent fp32 shard buffer, every
  micro-batch (as DeepSpeed's stage 2 does);
* the optimizer steps one shard per parameter: rows [r*c, (r+1)*c) of dim 0, c = ceil(rows/N),
  exactly a DTensor `Shard(0)` placement, so optimizer states, checkpoints (torch.distributed.
  checkpoint) and gradient-norm code are the ones FSDP2 uses, and a stage-2 checkpoint resumes
  under any stage or world size;
* after the step the updated shards are all-gathered back into every rank's full parameters.

In fp32 (or autocast bf16/fp16) the shards are views of the parameters themselves, so parameter
memory is Ψ once; with precision.master_weights the model is cast to bf16/fp16 and the shards are
separate fp32 master copies (DeepSpeed's 2Ψ + 14Ψ/N).

Why not FSDP2 with reshard_after_forward=False: FSDP2 keeps the parameters sharded between steps,
so it all-gathers them block by block in every forward and pays its hooks and DTensor bookkeeping
per block; here the forward is a plain module and each step all-gathers once, in buckets.
FSDP2 still serves stage 2 where this path does not apply (tensor/sequence parallelism, expert
parallelism, hybrid sharding, CPU offload): see the choice table in dsrecipes.distributed.data_parallel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from dsrecipes.utils.modules import broadcast_module, cast_float_buffers, module_view

BUCKET_BYTES = 25 * 2**20  # DDP's default bucket size
# torch >= 2.10 names the flat-tensor collectives *_single (the *_tensor names are deprecated there); looked
# up on torch.distributed at every call, so that a wrapper put there later (the comms logger) sees them


def _reduce_scatter(*args, **kwargs):
    collective = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return collective(*args, **kwargs)


def _all_gather(*args, **kwargs):
    collective = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return collective(*args, **kwargs)


@dataclass
class _ParamShard:
    """One parameter's place in its bucket: rows per rank (padded), this rank's rows, its master shard."""

    param: nn.Parameter
    rows: int  # dim-0 size
    row_numel: int
    chunk_rows: int  # ceil(rows / N): every rank's padded row count
    lo: int  # this rank's rows [lo, hi)
    hi: int
    offset: int  # start of this parameter's padded chunk within a rank's section of the bucket
    master: nn.Parameter = None  # DTensor Shard(0): a view of the parameter's rows, or an fp32 copy

    @property
    def padded_numel(self) -> int:
        return self.chunk_rows * self.row_numel

    @property
    def local_numel(self) -> int:
        return (self.hi - self.lo) * self.row_numel


@dataclass
class _Bucket:
    shards: list[_ParamShard]
    section: int  # numel of one rank's section (sum of padded chunks)
    ready: int = 0
    grad_shard: torch.Tensor | None = None  # fp32 [section]: this rank's accumulated gradient shard
    grads: list | None = None  # the masters' gradients: DTensor views of grad_shard
    pending: tuple | None = None  # (work, receive buffer, send buffer) of an in-flight reduce-scatter
    even: bool = False  # every parameter's rows divide evenly over the ranks: no padding (fast paths)


class ZeroStage2:
    """Installs gradient hooks on `module` (already on its device, identical on every rank after the
    rank-0 broadcast done here) and owns the sharded masters the optimizer steps.

        zero2 = ZeroStage2(model, dp_mesh, low_precision=None)
        optimizer = zero2.shard_optimizer(build_optimizer(cfg, model))
        loss.backward()          # buckets reduce-scattered; masters' .grad = averaged shard
        optimizer.step(); zero2.gather_params()
    """

    def __init__(self, module: nn.Module, mesh: DeviceMesh, low_precision: torch.dtype | None = None,
                 bucket_bytes: int = BUCKET_BYTES, keep_dtype: bool = False):
        # keep_dtype (precision.master_dtype=bf16): a bf16 parameter's shard stays bf16, as do its gradients (the
        # optimizer steps bf16 weights, DeepSpeed's bf16_master_weights_and_grads); else every shard is fp32
        self.keep_dtype = keep_dtype
        if mesh.ndim != 1:
            raise ValueError(f"ZeroStage2 needs a 1-D data-parallel mesh, got {mesh.ndim} dimensions")
        self.module = module
        self.mesh = mesh
        self.group = mesh.get_group()
        self.world = mesh.size()
        self.rank = mesh.get_local_rank()
        # gloo's reduce-scatter is slower than its all-reduce of the same buffer (measured at 2 and 4 CPU
        # ranks, 8 MB: 8.3-9.3 vs 6.8-7.1 ms and 16.0 vs 12.9 ms), so on gloo the gradients are all-reduced
        self._all_reduce_instead = dist.get_backend(self.group) == "gloo"
        params = [p for p in module.parameters() if p.requires_grad]  # unique: tied weights once
        for name, p in module.named_parameters():
            if p.requires_grad and p.dim() == 0:
                raise ValueError(f"zero.stage=2 shards parameters along dim 0; {name} is a scalar")
            if isinstance(p, DTensor):
                raise ValueError(f"zero.stage=2 (replicated parameters) cannot take the DTensor parameter {name}")
        broadcast_module(module, self.group)  # every rank starts from rank 0's weights, as DDP does
        self.shards: dict[int, _ParamShard] = {}
        self._bucket_of: dict[int, _Bucket] = {}
        self.buckets = self._make_buckets(params, bucket_bytes)
        for bucket in self.buckets:
            for shard in bucket.shards:
                shard.master = self._make_master(shard, low_precision is not None)
        if low_precision is not None:  # the model computes in bf16/fp16; the shards are its fp32 masters
            _cast_module(module, low_precision)
        self.shadow = module_view(module, self.masters())  # the model's names holding the sharded masters
        self._next_bucket = 0
        self._callback_queued = False
        for p in params:
            p.register_post_accumulate_grad_hook(self._on_grad)

    # ------------------------------------------------------------------ layout
    def _make_buckets(self, params: list[nn.Parameter], bucket_bytes: int) -> list[_Bucket]:
        buckets, current, size = [], [], 0
        for p in reversed(params):  # backward produces the last layers' gradients first
            if current and (size + p.numel() * 4 > bucket_bytes or p.dtype != current[-1].dtype):
                buckets.append(self._bucket(current))
                current, size = [], 0
            current.append(p)
            size += p.numel() * 4
        if current:
            buckets.append(self._bucket(current))
        return buckets

    def _bucket(self, params: list[nn.Parameter]) -> _Bucket:
        shards, offset = [], 0
        for p in params:
            rows = p.shape[0]
            chunk = -(-rows // self.world)
            lo, hi = min(rows, self.rank * chunk), min(rows, (self.rank + 1) * chunk)
            shard = _ParamShard(p, rows, p[0].numel() if rows else 0, chunk, lo, hi, offset)
            offset += shard.padded_numel
            shards.append(shard)
            self.shards[id(p)] = shard
        bucket = _Bucket(shards, offset, even=all(
            s.chunk_rows * self.world == s.rows and s.param.is_contiguous() for s in shards))
        for shard in shards:
            self._bucket_of[id(shard.param)] = bucket
        return bucket

    def _make_master(self, shard: _ParamShard, separate: bool) -> nn.Parameter:
        p = shard.param
        local = p.detach()[shard.lo:shard.hi]
        if separate or not p.is_contiguous() or (p.dtype != torch.float32 and not self.keep_dtype):
            local = (local if self.keep_dtype else local.float()).clone()
        dtensor = DTensor.from_local(local, self.mesh, [Shard(0)], run_check=False, shape=p.shape, stride=p.stride())
        return nn.Parameter(dtensor, requires_grad=True)

    def masters(self) -> dict[int, nn.Parameter]:
        """id(model parameter) -> its sharded master (the tensor the optimizer steps)."""
        return {key: shard.master for key, shard in self.shards.items()}

    def shard_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Point an optimizer built over the model's parameters at their sharded masters (same groups,
        same hyperparameters); frozen parameters, which it should not hold, are refused."""
        if optimizer.state:
            raise ValueError("zero.stage=2 must take the optimizer before its first step (its state is not empty)")
        masters = self.masters()
        for group in optimizer.param_groups:
            missing = [p for p in group["params"] if id(p) not in masters]
            if missing:
                raise ValueError(f"the optimizer holds {len(missing)} tensor(s) that are not trainable parameters "
                                 "of the model; zero.stage=2 can only shard the model's own parameters")
            group["params"] = [masters[id(p)] for p in group["params"]]
        return optimizer

    # ------------------------------------------------------------------ backward: reduce-scatter
    def _on_grad(self, param: torch.Tensor) -> None:
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
        bucket = self._bucket_of[id(param)]
        bucket.ready += 1
        if bucket.ready > len(bucket.shards):  # a gradient arrived after its bucket was reduced
            raise RuntimeError("zero.stage=2 saw a parameter's gradient twice in one backward pass (reentrant "
                               "activation checkpointing?); use torch.utils.checkpoint with use_reentrant=False")
        self._launch_ready()

    def _launch_ready(self, force: bool = False) -> None:
        """Start reduce-scatters strictly in bucket order (so every rank issues the same collectives)."""
        while self._next_bucket < len(self.buckets):
            bucket = self.buckets[self._next_bucket]
            if not force and bucket.ready < len(bucket.shards):
                return
            self._reduce_scatter(bucket)
            self._next_bucket += 1

    def _reduce_scatter(self, bucket: _Bucket) -> None:
        grads, used = [], []
        for shard in bucket.shards:  # a parameter unused by this forward contributes zeros
            p = shard.param
            used.append(p.grad is not None)
            grads.append(p.grad if p.grad is not None else torch.zeros_like(p))
            p.grad = None
        # each rank's section ends with one count per parameter of the ranks that produced a gradient for it:
        # a parameter no rank used keeps grad None, so the optimizer skips it as in one process
        flags = torch.tensor(used, dtype=grads[0].dtype, device=grads[0].device).expand(self.world, -1)
        send = torch._chunk_cat(grads + [flags], dim=0, num_chunks=self.world).view(-1)  # rank-major chunks
        del grads
        if send.dtype != torch.float32:
            send = send.float()  # reduce in fp32, as FSDP2's reduce_dtype
        if self._all_reduce_instead:  # every rank gets the whole sum and keeps its section
            work = dist.all_reduce(send, group=self.group, async_op=True)
            receive = send.view(self.world, -1)[self.rank]
        else:
            receive = torch.empty(bucket.section + len(bucket.shards), dtype=torch.float32, device=send.device)
            work = _reduce_scatter(receive, send, group=self.group, async_op=True)
        bucket.pending = (work, receive, send)

    def _finish_backward(self) -> None:
        """End of backward: launch what is left, wait, average, accumulate into the shard buffers."""
        self._launch_ready(force=True)
        used_flags = []
        for bucket in self.buckets:
            work, receive, _ = bucket.pending
            work.wait()
            data = receive[:bucket.section]
            used_flags.append(receive[bucket.section:] > 0)
            if bucket.grad_shard is None:  # first backward: this buffer and its gradient views stay for the run
                # fp32, or with keep_dtype the masters' own dtype (reduced in fp32, accumulated in it)
                bucket.grad_shard = torch.zeros_like(data, dtype=bucket.shards[0].master.dtype)
                bucket.grads = [self._grad_view(bucket, shard) for shard in bucket.shards]
            if all(shard.master.grad is None for shard in bucket.shards):  # first micro-batch since zero_grad
                torch.div(data, self.world, out=bucket.grad_shard)
            else:
                bucket.grad_shard.add_(data, alpha=1.0 / self.world)
            bucket.pending = None
            bucket.ready = 0
        used = iter(torch.cat(used_flags).tolist())  # one device sync for all buckets
        for bucket in self.buckets:
            for shard, grad in zip(bucket.shards, bucket.grads):
                if next(used):
                    shard.master.grad = grad
        self._next_bucket = 0
        self._callback_queued = False

    def _grad_view(self, bucket: _Bucket, shard: _ParamShard) -> DTensor:
        """The master's gradient: its rows of the bucket's shard buffer, as a DTensor like the master."""
        local = bucket.grad_shard[shard.offset:shard.offset + shard.local_numel]
        local = local.view(shard.hi - shard.lo, *shard.param.shape[1:])
        return DTensor.from_local(local, self.mesh, [Shard(0)], run_check=False,
                                  shape=shard.param.shape, stride=shard.param.stride())

    # ------------------------------------------------------------------ after the step: all-gather
    @torch.no_grad()
    def gather_params(self) -> None:
        """Copy every rank's updated shard into every rank's full parameters (two buckets in flight)."""
        in_flight = []
        for bucket in self.buckets:
            in_flight.append((bucket, self._all_gather(bucket)))
            if len(in_flight) == 2:
                self._copy_out(*in_flight.pop(0))
        for args in in_flight:
            self._copy_out(*args)

    def _all_gather(self, bucket: _Bucket):
        dtype = bucket.shards[0].param.dtype
        locals_ = [shard.master.to_local().reshape(-1) for shard in bucket.shards]
        if bucket.even:  # no padding anywhere: one concatenation
            send = torch.cat(locals_).to(dtype)
        else:
            send = torch.zeros(bucket.section, dtype=dtype, device=bucket.shards[0].param.device)
            for shard, local in zip(bucket.shards, locals_):
                send[shard.offset:shard.offset + shard.local_numel].copy_(local)
        receive = torch.empty(self.world * bucket.section, dtype=dtype, device=send.device)
        work = _all_gather(receive, send, group=self.group, async_op=True)
        return work, receive, send

    def _copy_out(self, bucket: _Bucket, pending) -> None:
        work, receive, _ = pending
        work.wait()
        sections = receive.view(self.world, bucket.section)
        for shard in bucket.shards:
            p = shard.param.detach()
            full = sections[:, shard.offset:shard.offset + shard.padded_numel]
            if bucket.even:  # the parameter is a [N, rows/N * row] view of itself: one strided copy
                p.view(self.world, shard.padded_numel).copy_(full)
            else:
                p.copy_(full.reshape(self.world * shard.chunk_rows, *p.shape[1:])[:shard.rows])

    # ------------------------------------------------------------------ gradient norm and clipping
    def grad_norm(self) -> torch.Tensor:
        """L2 norm of the whole averaged gradient, the same on every rank: the shard buffers' squared
        sums (padding holds zeros) added over the ranks in one all-reduce."""
        device = self.buckets[0].shards[0].param.device
        squares = [b.grad_shard.pow(2).sum() for b in self.buckets if b.grad_shard is not None]
        total = torch.stack(squares).sum().reshape(1) if squares else torch.zeros(1, device=device)
        dist.all_reduce(total, group=self.group)
        return total[0].sqrt()

    def scale_grads(self, factor: float) -> None:
        torch._foreach_mul_([b.grad_shard for b in self.buckets if b.grad_shard is not None], factor)


@torch.no_grad()
def _cast_module(module: nn.Module, dtype: torch.dtype) -> None:
    """Parameters (in place, so hooks and ties survive) and floating buffers to the compute dtype."""
    for p in module.parameters():
        p.data = p.data.to(dtype)
    cast_float_buffers(module, dtype)
