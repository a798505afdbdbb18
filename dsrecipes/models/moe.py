"""Mixture-of-Experts MLP for the GPT blocks (DeepSpeed-MoE's MoE layer, on a sparse dispatch).

    layer = MoELayer(model_cfg, MoEConfig(num_experts=8, k=2))
    y = layer(x)                 # [B, T, M] -> [B, T, M]
    layer.aux_loss, layer.z_loss # this forward's load-balancing and router z losses (scalars)

Forward: fp32 router (gate Linear without bias, autocast off; multiplicative jitter on its input
under noisy_gate_policy=jitter) -> gating (dsrecipes.models.moe_gating) -> tokens permuted into
[E, C, M] capacity buffers -> with expert parallelism an all_to_all sends each expert's buffer to
the rank holding it -> the local experts run as batched matmuls -> all_to_all back -> weighted
combine. Residual MoE (PR-MoE) mixes the result with a dense MLP by a learned softmax coefficient.

Expert weights are stacked ([E, M, F] ...) so each rank keeps a contiguous slice of experts under
expert parallelism (`Experts.keep_local`), and they are initialised from the global expert
index, so an EP=2 model starts from exactly the EP=1 model's weights.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dsrecipes.models.config import ModelConfig
from dsrecipes.models.layers import make_mlp
from dsrecipes.models.moe_config import MoEConfig
from dsrecipes.models.moe_dispatch import combine, dispatch, einsum_combine, einsum_dispatch
from dsrecipes.models.moe_gating import Routing, top1_gating, top2_gating, topk_gating

JITTER_EPS = 1e-2


class Experts(nn.Module):
    """num_experts MLPs of the model's style with stacked weights, applied as batched matmuls.

    gpt2 style: fc_out(gelu_tanh(x @ w_in + b_in)); llama style: (silu(x @ w_gate) * (x @ w_up)) @ w_out.
    """

    def __init__(self, model_cfg: ModelConfig, num_experts: int, d_ff: int):
        super().__init__()
        self.num_experts = num_experts  # experts held here (num_local after keep_local)
        self.global_experts = num_experts
        self.first_expert = 0
        self.d_ff = d_ff  # every expert's hidden width (this rank holds [hidden_lo, hidden_hi) of it)
        self.hidden_lo, self.hidden_hi = 0, d_ff
        self.tp_size, self.tp_group = 1, None  # expert-tensor parallelism: set by keep_hidden_slice (None: the default group)
        self.swiglu = model_cfg.style == "llama"
        self.init_std = model_cfg.init_std
        self.out_std = model_cfg.init_std / math.sqrt(2 * model_cfg.n_layer)
        d_model = model_cfg.d_model
        shapes = {"w_in": (d_model, d_ff), "w_out": (d_ff, d_model)}
        if self.swiglu:
            shapes = {"w_gate": (d_model, d_ff), "w_in": (d_model, d_ff), "w_out": (d_ff, d_model)}
        for name, shape in shapes.items():
            self.register_parameter(name, nn.Parameter(torch.empty(num_experts, *shape)))
        if model_cfg.bias and not self.swiglu:
            self.b_in = nn.Parameter(torch.empty(num_experts, 1, d_ff))
            self.b_out = nn.Parameter(torch.empty(num_experts, 1, d_model))
        else:
            self.b_in = self.b_out = None
        if not any(p.is_meta for p in self.parameters()):
            self.reset_parameters()

    def weight_names(self) -> list[str]:
        return [name for name, _ in self.named_parameters(recurse=False)]

    def hidden_dim(self, name: str) -> int | None:
        """The dim of parameter `name` that runs over the expert's hidden width (None: b_out)."""
        return {"w_gate": 2, "w_in": 2, "b_in": 2, "w_out": 1}.get(name)

    @torch.no_grad()
    def reset_parameters(self, draw_device: torch.device | None = None) -> None:
        """Draw every global expert's weights (same RNG use at any EP / TP degree), keep this rank's slice.

        Meta parameters (held by another pipeline rank) draw on `draw_device` (default CPU) and keep nothing,
        so the random stream advances as if they were materialised."""
        lo, hi = self.first_expert, self.first_expert + self.num_experts
        for name, param in self.named_parameters(recurse=False):
            if name.startswith("b_"):
                param.zero_()
                continue
            std = self.out_std if name == "w_out" else self.init_std
            shape = list(param.shape[1:])
            shape[self.hidden_dim(name) - 1] = self.d_ff
            device = (draw_device or torch.device("cpu")) if param.is_meta else param.device
            full = torch.empty(self.global_experts, *shape, device=device, dtype=param.dtype).normal_(0.0, std)
            if not param.is_meta:
                param.copy_(full[lo:hi].narrow(self.hidden_dim(name), self.hidden_lo, self.hidden_hi - self.hidden_lo))

    @torch.no_grad()
    def keep_local(self, rank: int, world: int) -> None:
        """Keep experts [rank * E/world, (rank+1) * E/world) (expert parallelism)."""
        per_rank = self.global_experts // world
        self.first_expert, self.num_experts = rank * per_rank, per_rank
        for name, param in list(self.named_parameters(recurse=False)):
            local = param[rank * per_rank:(rank + 1) * per_rank].clone()
            setattr(self, name, nn.Parameter(local, requires_grad=param.requires_grad))

    @torch.no_grad()
    def keep_hidden_slice(self, rank: int, world: int, group) -> None:
        """Expert-tensor parallelism (DeepSpeed-MoE's enable_expert_tensor_parallelism): keep hidden
        units [rank * F/world, (rank+1) * F/world) of every expert; `group` (the tp ranks, which see the
        same tokens) sums the partial outputs. b_out stays whole, added once after the sum."""
        if self.d_ff % world:
            raise ValueError(f"the experts' hidden width {self.d_ff} (moe.d_ff or the model's ffn width) is not "
                             f"divisible by parallel.tp={world}")
        width = self.d_ff // world
        self.hidden_lo, self.hidden_hi, self.tp_size, self.tp_group = rank * width, (rank + 1) * width, world, group
        for name, param in list(self.named_parameters(recurse=False)):
            dim = self.hidden_dim(name)
            if dim is not None:
                local = param.narrow(dim, rank * width, width).clone()
                setattr(self, name, nn.Parameter(local, requires_grad=param.requires_grad))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [E_local, N, M] -> [E_local, N, M]."""
        dtype = x.dtype

        def w(param):
            return param if param.dtype == dtype or torch.is_autocast_enabled() else param.to(dtype)

        if self.tp_size > 1:  # Megatron's f: the same x on every tp rank, input gradients summed
            x = _CopyToGroup.apply(x, self.tp_group)
        if self.swiglu:
            hidden = F.silu(torch.bmm(x, w(self.w_gate))) * torch.bmm(x, w(self.w_in))
        else:
            hidden = torch.bmm(x, w(self.w_in)) if self.b_in is None else torch.baddbmm(w(self.b_in), x, w(self.w_in))
            hidden = F.gelu(hidden, approximate="tanh")
        if self.tp_size == 1:
            return torch.bmm(hidden, w(self.w_out)) if self.b_out is None else torch.baddbmm(w(self.b_out), hidden, w(self.w_out))
        out = _SumOverGroup.apply(torch.bmm(hidden, w(self.w_out)), self.tp_group)  # Megatron's g
        return out if self.b_out is None else out + w(self.b_out)


class _CopyToGroup(torch.autograd.Function):
    """Identity forward; the backward sums the gradient over the group (each rank's hidden slice gives a part)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _SumOverGroup(torch.autograd.Function):
    """All-reduce forward (partial outputs of the hidden slices); identity backward (the gradient is the same on every rank)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


class _AllToAll(torch.autograd.Function):
    """Differentiable equal-split all_to_all over dim 0 (its backward is the same exchange)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        x = x.contiguous()
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _AllToAll.apply(grad, ctx.group), None


def all_to_all(x: torch.Tensor, group) -> torch.Tensor:
    return _AllToAll.apply(x, group)


_STATS_PAUSED = False


@contextlib.contextmanager
def routing_stats_paused():
    """Forwards that are not training passes (a pipeline schedule's shape inference, on uninitialised
    activations) leave the routing statistics alone."""
    global _STATS_PAUSED
    previous, _STATS_PAUSED = _STATS_PAUSED, True
    try:
        yield
    finally:
        _STATS_PAUSED = previous


class MoELayer(nn.Module):
    """Drop-in replacement for a block's MLP: [B, T, M] -> [B, T, M]."""

    def __init__(self, model_cfg: ModelConfig, cfg: MoEConfig):
        super().__init__()
        self.cfg = cfg
        self.num_experts = cfg.num_experts
        self.gate = nn.Linear(model_cfg.d_model, cfg.num_experts, bias=False)
        self.experts = Experts(model_cfg, cfg.num_experts, cfg.d_ff or model_cfg.ffn_dim)
        if cfg.use_residual:
            self.residual_mlp = make_mlp(model_cfg)
            self.residual_coef = nn.Linear(model_cfg.d_model, 2)
        self.ep_group = None  # set by dsrecipes.distributed.expert_parallel
        self.ep_size = 1
        self.aux_loss: torch.Tensor | None = None
        self.z_loss: torch.Tensor | None = None
        self.reset_stats()

    # ------------------------------------------------------------------ statistics
    def reset_stats(self) -> None:
        """Zero the routing counters the metrics callback reads (per-expert load, drops)."""
        self.stat_expert_load: torch.Tensor | None = None  # [E] routes per expert (device tensor)
        self.stat_dropped: torch.Tensor | None = None  # routes dropped by the capacity limit
        self.stat_routes = 0  # routes gated (tokens x k)

    def _record(self, routing: Routing) -> None:
        if torch._C._current_graph_task_id() != -1 or _STATS_PAUSED:  # checkpoint recomputation, shape inference
            return
        counts, dropped = routing.expert_counts.detach().float(), routing.dropped.detach().float()
        if self.stat_expert_load is None:  # kept on the device: no host sync per forward
            self.stat_expert_load, self.stat_dropped = counts, dropped
        else:
            self.stat_expert_load, self.stat_dropped = self.stat_expert_load + counts, self.stat_dropped + dropped
        self.stat_routes += routing.expert.numel()

    # ------------------------------------------------------------------ forward
    def route(self, tokens: torch.Tensor) -> Routing:
        cfg, training = self.cfg, self.training
        with torch.autocast(tokens.device.type, enabled=False):
            x = tokens.float()
            if training and cfg.noisy_gate_policy == "jitter":
                x = x * torch.empty_like(x).uniform_(1.0 - JITTER_EPS, 1.0 + JITTER_EPS)
            logits = F.linear(x, self.gate.weight.float())
            factor = cfg.capacity_factor if training else cfg.eval_capacity_factor
            max_reduce = self._max_over_ep if self.ep_size > 1 else None
            if cfg.k == 1:
                return top1_gating(logits, factor, cfg.min_capacity, cfg.drop_tokens, cfg.use_rts,
                                   rsample=training and cfg.noisy_gate_policy == "rsample", max_reduce=max_reduce)
            if cfg.k == 2:
                return top2_gating(logits, factor, cfg.min_capacity, cfg.drop_tokens,
                                   second_expert_sampling=training and cfg.top2_2nd_expert_sampling, max_reduce=max_reduce)
            return topk_gating(logits, cfg.k, factor, cfg.min_capacity, cfg.drop_tokens, cfg.drop_policy, max_reduce=max_reduce)

    def _max_over_ep(self, value: torch.Tensor) -> torch.Tensor:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.ep_group)
        return value

    def _run_experts(self, buffer: torch.Tensor) -> torch.Tensor:
        """[E, C, M] buffers of this rank's tokens -> expert outputs, exchanging them under EP."""
        if self.ep_size == 1:
            return self.experts(buffer)
        num_experts, capacity, d_model = buffer.shape
        local = num_experts // self.ep_size
        # [ep (owner), local, C, M] -> exchange -> [ep (source rank), local, C, M]
        received = all_to_all(buffer.view(self.ep_size, local, capacity, d_model), self.ep_group)
        batched = received.transpose(0, 1).reshape(local, self.ep_size * capacity, d_model)
        out = self.experts(batched).view(local, self.ep_size, capacity, d_model).transpose(0, 1)
        return all_to_all(out, self.ep_group).view(num_experts, capacity, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        routing = self.route(tokens)
        self.aux_loss, self.z_loss = routing.aux_loss, routing.z_loss
        if self.training:
            self._record(routing)
        backend = self.cfg.dispatch
        if backend == "einsum":
            out = einsum_combine(self._run_experts(einsum_dispatch(tokens, routing)), routing)
        else:
            out = combine(self._run_experts(dispatch(tokens, routing, backend)), routing, backend)
        if self.cfg.use_residual:
            coef = F.softmax(self.residual_coef(tokens), dim=-1)
            out = out * coef[:, :1] + self.residual_mlp(tokens) * coef[:, 1:]
        return out.view(shape)


def moe_layers(model: nn.Module) -> list[MoELayer]:
    return [m for m in model.modules() if isinstance(m, MoELayer)]
