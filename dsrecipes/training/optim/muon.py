"""Muon for the hidden matrices, Adam for the rest: one optimizer, two kinds of parameter group.

What: `Muon(param_groups, ...)` steps each group marked ``use_muon`` with MomentUm Orthogonalized by Newton-Schulz
and every other group with Adam (decoupled weight decay), as DeepSpeed 0.19.8's MuonWithAuxAdam does:

    Muon group, per matrix W with gradient G:
        m <- beta m + (1 - beta) G                      (momentum)
        u <- (1 - beta) G + beta m   if nesterov, else m
        O <- orthogonalize(u as rows x cols) * scale    (dsrecipes.training.optim.newton_schulz)
        W <- W (1 - lr wd) - lr O
    Adam group:  the bias-corrected Adam direction m_hat / (sqrt(v_hat) + eps), W <- W (1 - lr wd) - lr direction

`update_scale` picks how O is scaled (rows x cols is the matrix's whole shape, a conv filter's trailing dimensions
flattened into cols; a 3-D parameter is a stack of matrices, dsrecipes' experts [E, in, out], each orthogonalised
on its own):
* ``shape_ratio`` (Keller Jordan's Muon, DeepSpeed's): sqrt(max(1, rows / cols)); lr is in units of spectral norm
  per step, around 0.02.
* ``match_adamw_rms`` (Moonlight, "Muon is Scalable for LLM Training"): rms_target * sqrt(max(rows, cols)), so the
  update's RMS is about rms_target (0.2), AdamW's typical update RMS: AdamW's lr and weight decay carry over.

Distributed: a parameter that is a DTensor (ZeRO-2's row shards, FSDP2's ZeRO-3 shards, tensor-parallel shards, or
any mix on a 2-D mesh) keeps its momentum sharded like itself; its blended update is gathered whole
(`full_tensor()`), orthogonalised on the whole matrix and each rank keeps its own shard of the result
(`distribute_tensor(..., src_data_rank=None)`, no communication). Every rank holding a shard runs the same
iteration on the same matrix, so the shards agree bit for bit. The iteration is never run on a shard as if it
were the matrix: that would orthogonalise each shard's rows separately, a different update. Under ZeRO-1
(ZeroRedundancyOptimizer) each parameter is whole on the one rank that steps it, so the iteration runs there.
Adam's half is elementwise and runs on shards as they are.

Why not DeepSpeed's class: its distributed variant assumes whole parameters and all-gathers them itself; here the
sharding is FSDP2 / DTensor's, and the optimizer must leave the collectives of the data-parallel strategy alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch.distributed.tensor import DTensor, distribute_tensor

from dsrecipes.training.optim.newton_schulz import deepspeed_dtype, orthogonalize

UPDATE_SCALES = ("shape_ratio", "match_adamw_rms")
NS_DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def update_scale(rows: int, cols: int, rule: str, rms_target: float) -> float:
    """The factor the orthogonalised update of a rows x cols matrix is multiplied by (see the module docstring)."""
    if rule == "shape_ratio":
        return math.sqrt(rows / cols) if rows > cols else 1.0
    if rule == "match_adamw_rms":
        return rms_target * math.sqrt(max(rows, cols))
    raise ValueError(f"optimizer.update_scale={rule!r} is not one of {', '.join(UPDATE_SCALES)}")


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _own_part(whole: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`whole` cut the way `like` is sharded (a DTensor like it), or `whole` itself for a plain tensor."""
    if not isinstance(like, DTensor):
        return whole
    return distribute_tensor(whole, like.device_mesh, like.placements, src_data_rank=None)


class Muon(torch.optim.Optimizer):
    """Muon on the groups with ``use_muon`` true, Adam on the others (see the module docstring).

    A group without ``use_muon`` takes the constructor's (None: Muon for every parameter of two or more
    dimensions, which a group must then hold only of). Muon groups read lr, momentum, nesterov, ns_steps,
    ns_method, ns_dtype, update_scale, rms_target and weight_decay; Adam groups read lr, betas, eps and
    weight_decay. State: ``momentum_buffer`` for a Muon parameter, ``exp_avg``, ``exp_avg_sq`` and ``step`` (a
    CPU float tensor, torch's convention) for an Adam one; each like its parameter (sharded with it).
    """

    def __init__(self, params: Iterable[Any], lr: float = 0.02, momentum: float = 0.95, nesterov: bool = True,
                 ns_steps: int = 5, ns_method: str = "gram", ns_dtype: str = "float32",
                 update_scale: str = "shape_ratio", rms_target: float = 0.2, betas: tuple[float, float] = (0.9, 0.95),
                 eps: float = 1e-8, weight_decay: float = 0.0, use_muon: bool | None = None):
        ns_method, ns_dtype, update_scale = str(ns_method), str(ns_dtype), str(update_scale)  # config enums too
        if ns_dtype not in NS_DTYPES:
            raise ValueError(f"optimizer.ns_dtype={ns_dtype!r} is not one of {', '.join(NS_DTYPES)}")
        if update_scale not in UPDATE_SCALES:
            raise ValueError(f"optimizer.update_scale={update_scale!r} is not one of {', '.join(UPDATE_SCALES)}")
        defaults = dict(lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps, ns_method=ns_method,
                        ns_dtype=ns_dtype, update_scale=update_scale, rms_target=rms_target, betas=tuple(betas),
                        eps=eps, weight_decay=weight_decay, use_muon=use_muon)
        super().__init__(params, defaults)

    def _uses_muon(self, group: dict) -> bool:
        if group["use_muon"] is not None:
            return bool(group["use_muon"])
        return all(p.ndim >= 2 for p in group["params"])

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if self._uses_muon(group):
                self._muon_step(group, params)
            else:
                self._adam_step(group, params)
        return loss

    def _muon_step(self, group: dict, params: list[torch.Tensor]) -> None:
        lr, beta, decay = group["lr"], group["momentum"], group["weight_decay"]
        for p in params:
            if p.ndim < 2:
                raise ValueError(f"Muon steps matrices; a parameter of shape {tuple(p.shape)} is in a use_muon group "
                                 "(route it to Adam: optimizer.adam_params)")
            state = self.state[p]
            if not state:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            momentum = state["momentum_buffer"]
            momentum.lerp_(p.grad, 1 - beta)
            blended = p.grad.lerp(momentum, beta) if group["nesterov"] else momentum
            whole = _whole(blended)
            matrices = whole if whole.ndim == 3 else whole.reshape(whole.size(0), -1)
            rows, cols = matrices.shape[-2:]
            dtype = NS_DTYPES[group["ns_dtype"]] or deepspeed_dtype(group["ns_method"], whole.device)
            update = orthogonalize(matrices, group["ns_steps"], group["ns_method"], dtype)
            update = (update * update_scale(rows, cols, group["update_scale"], group["rms_target"])).to(p.dtype)
            if decay:
                p.mul_(1 - lr * decay)
            p.add_(_own_part(update.reshape(whole.shape), p), alpha=-lr)

    def _adam_step(self, group: dict, params: list[torch.Tensor]) -> None:
        lr, (beta1, beta2), eps, decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        for p in params:
            state = self.state[p]
            if not state:
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] += 1
            step = int(state["step"].item())
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            exp_avg.lerp_(p.grad, 1 - beta1)
            exp_avg_sq.lerp_(p.grad.square(), 1 - beta2)
            direction = (exp_avg / (1 - beta1 ** step)) / ((exp_avg_sq / (1 - beta2 ** step)).sqrt() + eps)
            if decay:
                p.mul_(1 - lr * decay)
            p.add_(direction, alpha=-lr)
