"""Fused AdamW step as a Triton kernel: one pass over param, grad and both moments per tensor.

What: for every (param, grad, exp_avg, exp_avg_sq) the kernel applies exactly the update of
torch.optim.AdamW's single-tensor path (foreach=False, amsgrad=False):

    p  <- p * (1 - lr * weight_decay)                    (decoupled weight decay)
    m  <- m + (1 - beta1) * (g - m)                      (exp_avg.lerp_(g, 1 - beta1))
    v  <- v * beta2 + (1 - beta2) * g * g
    p  <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

with the bias corrections and the step size computed on the host in Python floats (as torch does),
and optionally writes the updated weight, rounded to the model copy's dtype (bf16/fp16/fp32), into
a second tensor in the same pass: fp32 master weights -> low-precision model weights without a
separate cast kernel.

Why: the unfused optimizer reads/writes each tensor several times (one kernel per elementwise op);
here param, grad and the moments are read once and written once.

Layout: one launch per tensor (a 1-D grid over its elements). The master param and both moments
must be fp32 (grads may be fp32/bf16/fp16 and are upcast in registers). Tensors that are not
contiguous are updated through a contiguous copy that is copied back.

Public: `fused_adamw_step` (Triton when it can run, else `fused_adamw_reference` with a one-time
warning), `fused_adamw_reference`, and the optimizer `FusedAdamW`, a drop-in for
torch.optim.AdamW(amsgrad=False) whose per-parameter state (`step` as a float32 scalar tensor,
`exp_avg`, `exp_avg_sq`) and param groups match torch's, so state dicts load either way.
"""

from __future__ import annotations

import math

import torch

from dsrecipes.kernels._utils import GPU_DTYPES, check_float_dtype, jit, tl, triton, use_triton

OP = "fused_adamw"

_BLOCK_GPU = 1024
_BLOCK_CPU = 4096  # under the interpreter each program costs Python time: fewer, wider programs


# --------------------------------------------------------------------------------------------------
# Triton kernel
# --------------------------------------------------------------------------------------------------


@jit
def _adamw_kernel(
    P, G, M, V, LP, n,
    decay, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, bc2_sqrt,
    HAS_LP: tl.constexpr, MAXIMIZE: tl.constexpr, BLOCK: tl.constexpr,
):
    """One program updates BLOCK contiguous elements (masked past n); all math in fp32.

    The scalars arrive precomputed in double on the host (decay = 1 - lr * weight_decay, 1 - beta1,
    1 - beta2, lr / bias_correction1, sqrt(bias_correction2)) and are rounded once to fp32, as torch's
    Python-scalar arguments are; division and sqrt are the IEEE-rounded ones (not the GPU's fast
    approximations) so the update matches torch's to the last bit or two.
    """
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    p = tl.load(P + offs, mask=mask, other=0.0)
    g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(M + offs, mask=mask, other=0.0)
    v = tl.load(V + offs, mask=mask, other=0.0)
    if MAXIMIZE:
        g = -g
    p = p * decay
    m = m + one_minus_beta1 * (g - m)
    v = v * beta2 + one_minus_beta2 * (g * g)
    denom = tl.math.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps
    p = p - step_size * tl.math.div_rn(m, denom)
    tl.store(P + offs, p, mask=mask)
    tl.store(M + offs, m, mask=mask)
    tl.store(V + offs, v, mask=mask)
    if HAS_LP:
        tl.store(LP + offs, p.to(LP.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------------


def _hyper(step, lr, beta1, beta2):
    """Python-float bias corrections as torch.optim.AdamW computes them: (step_size, sqrt(bc2))."""
    step = float(step)
    bc1 = 1 - beta1 ** step
    bc2 = 1 - beta2 ** step
    return lr / bc1, math.sqrt(bc2)


def _launch_one(p, g, m, v, lp, lr, beta1, beta2, eps, weight_decay, step_size, bc2_sqrt, maximize):
    n = p.numel()
    if n == 0:
        return
    written = [p, m, v] + ([lp] if lp is not None else [])
    work = [t if t.is_contiguous() else t.contiguous() for t in written]
    g = g if g.is_contiguous() else g.contiguous()
    wp, wm, wv = work[:3]
    wlp = work[3] if lp is not None else None
    block = _BLOCK_GPU if p.is_cuda else _BLOCK_CPU
    grid = (triton.cdiv(n, block),)
    _adamw_kernel[grid](
        wp, g, wm, wv, wlp if wlp is not None else wp, n,
        1.0 - lr * weight_decay, 1.0 - beta1, beta2, 1.0 - beta2, eps, step_size, bc2_sqrt,
        HAS_LP=lp is not None, MAXIMIZE=bool(maximize), BLOCK=block, num_warps=4,
    )
    for orig, w in zip(written, work):
        if w is not orig:
            orig.copy_(w)


def fused_adamw_reference(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay,
                          model_params=None, maximize: bool = False):
    """Pure-torch AdamW step, in place, op for op as torch.optim.AdamW(foreach=False, amsgrad=False).

    `step` is the step number *after* this update's increment (1 for the first step). With
    `model_params`, each updated param is also copied (rounded) into its model copy.
    """
    step_size, bc2_sqrt = _hyper(step, lr, beta1, beta2)
    with torch.no_grad():
        for i, (p, g, m, v) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs)):
            g = g.to(p.dtype)
            if maximize:
                g = -g
            p.mul_(1 - lr * weight_decay)
            m.lerp_(g, 1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (v.sqrt() / bc2_sqrt).add_(eps)
            p.addcdiv_(m, denom, value=-step_size)
            if model_params is not None and model_params[i] is not None:
                model_params[i].copy_(p)


def _check(params, grads, exp_avgs, exp_avg_sqs, model_params, beta1, beta2, lr, eps, weight_decay, step):
    n = len(params)
    if not (len(grads) == len(exp_avgs) == len(exp_avg_sqs) == n):
        raise ValueError(f"{OP}: params, grads, exp_avgs and exp_avg_sqs must have the same length, got "
                         f"{n}, {len(grads)}, {len(exp_avgs)}, {len(exp_avg_sqs)}")
    if model_params is not None and len(model_params) != n:
        raise ValueError(f"{OP}: model_params must have one entry per param, got {len(model_params)} for {n}")
    if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
        raise ValueError(f"{OP}: betas must be in [0, 1), got ({beta1}, {beta2})")
    if lr < 0 or eps < 0 or weight_decay < 0:
        raise ValueError(f"{OP}: lr, eps and weight_decay must be >= 0, got {lr}, {eps}, {weight_decay}")
    if step < 1:
        raise ValueError(f"{OP}: step must be >= 1 (the count after this update), got {step}")
    for i in range(n):
        p, g, m, v = params[i], grads[i], exp_avgs[i], exp_avg_sqs[i]
        check_float_dtype(OP, p, m, v, allowed=(torch.float32,))
        check_float_dtype(OP, g, allowed=GPU_DTYPES)
        shapes = {tuple(t.shape) for t in (p, g, m, v)}
        if len(shapes) != 1:
            raise ValueError(f"{OP}: param {i}: param, grad, exp_avg and exp_avg_sq shapes differ: "
                             f"{tuple(p.shape)}, {tuple(g.shape)}, {tuple(m.shape)}, {tuple(v.shape)}")
        if model_params is not None and model_params[i] is not None:
            lp = model_params[i]
            check_float_dtype(OP, lp, allowed=GPU_DTYPES)
            if lp.shape != p.shape:
                raise ValueError(f"{OP}: param {i}: model copy shape {tuple(lp.shape)} != param shape {tuple(p.shape)}")


def fused_adamw_step(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay,
                     model_params=None, maximize: bool = False):
    """One AdamW step over lists of tensors, in place (torch.optim.AdamW(foreach=False) semantics).

    Args:
        params: fp32 master params (updated in place).
        grads: their gradients (fp32/bf16/fp16; read only).
        exp_avgs, exp_avg_sqs: fp32 first/second moments (updated in place).
        step: the step count after this update's increment (1 on the first step), shared by all tensors.
        lr, beta1, beta2, eps, weight_decay: AdamW hyper-parameters (decoupled weight decay).
        model_params: optional list (entries may be None) of bf16/fp16/fp32 tensors shaped like the
            params; each receives the updated param rounded to its dtype, in the same pass.
        maximize: ascend instead of descend (as torch's `maximize`).
    Raises:
        ValueError: mismatched lengths/shapes, unsupported dtypes, bad hyper-parameters.
    """
    params, grads, exp_avgs, exp_avg_sqs = list(params), list(grads), list(exp_avgs), list(exp_avg_sqs)
    model_params = list(model_params) if model_params is not None else None
    lr, beta1, beta2, eps, weight_decay = float(lr), float(beta1), float(beta2), float(eps), float(weight_decay)
    step = float(step.item() if isinstance(step, torch.Tensor) else step)
    _check(params, grads, exp_avgs, exp_avg_sqs, model_params, beta1, beta2, lr, eps, weight_decay, step)
    if not params:
        return
    step_size, bc2_sqrt = _hyper(step, lr, beta1, beta2)
    with torch.no_grad():
        for i in range(len(params)):
            lp = model_params[i] if model_params is not None else None
            tensors = (params[i], grads[i], exp_avgs[i], exp_avg_sqs[i], lp)
            if use_triton(OP, _adamw_kernel, *tensors):
                _launch_one(*tensors, lr, beta1, beta2, eps, weight_decay, step_size, bc2_sqrt, maximize)
            else:
                fused_adamw_reference([params[i]], [grads[i]], [exp_avgs[i]], [exp_avg_sqs[i]], step, lr, beta1,
                                      beta2, eps, weight_decay, None if lp is None else [lp], maximize)


class FusedAdamW(torch.optim.Optimizer):
    """torch.optim.AdamW (amsgrad=False) on the fused kernel; fp32 params, state dicts interchangeable.

    Per-parameter state: `step` (float32 scalar tensor), `exp_avg`, `exp_avg_sq` (fp32, like the
    param), exactly torch.optim.AdamW's keys, and the param groups carry the same hyper-parameter
    keys, so `load_state_dict` accepts a torch AdamW state dict and vice versa.

    Mixed precision: `link_model_param(master, model)` registers a low-precision model copy that
    every step refreshes from the updated fp32 master in the same kernel pass (not part of the state
    dict).
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                 amsgrad: bool = False, *, maximize: bool = False):
        if amsgrad:
            raise ValueError(f"{OP}: amsgrad=True is not supported")
        if not 0.0 <= float(lr):
            raise ValueError(f"{OP}: invalid learning rate {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"{OP}: invalid eps {eps}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"{OP}: invalid betas {betas}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"{OP}: invalid weight_decay {weight_decay}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize)
        super().__init__(params, defaults)
        self._model_copies: dict[int, torch.Tensor] = {}

    def link_model_param(self, master: torch.Tensor, model: torch.Tensor) -> None:
        """After each step, write `master` (a param of this optimizer) rounded to `model`'s dtype into `model`."""
        if not any(master is p for g in self.param_groups for p in g["params"]):
            raise ValueError(f"{OP}: link_model_param: master is not a parameter of this optimizer")
        check_float_dtype(OP, model, allowed=GPU_DTYPES)
        if model.shape != master.shape:
            raise ValueError(f"{OP}: link_model_param: model shape {tuple(model.shape)} != master shape "
                             f"{tuple(master.shape)}")
        self._model_copies[id(master)] = model

    def __setstate__(self, state):
        super().__setstate__(state)
        self.__dict__.setdefault("_model_copies", {})
        for group in self.param_groups:
            group.setdefault("amsgrad", False)
            group.setdefault("maximize", False)

    @torch.no_grad()
    def step(self, closure=None):
        """One AdamW step for every param with a grad; returns closure() when given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group.get("amsgrad", False):
                raise ValueError(f"{OP}: amsgrad=True is not supported")
            if group.get("differentiable", False):
                raise ValueError(f"{OP}: differentiable=True is not supported")
            beta1, beta2 = group["betas"]
            by_step: dict[float, list] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise ValueError(f"{OP}: sparse gradients are not supported")
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = torch.tensor(0.0, dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                by_step.setdefault(float(state["step"].item()), []).append(p)
            for step, ps in by_step.items():
                lp = [self._model_copies.get(id(p)) for p in ps]
                fused_adamw_step(
                    ps, [p.grad for p in ps], [self.state[p]["exp_avg"] for p in ps],
                    [self.state[p]["exp_avg_sq"] for p in ps], step, group["lr"], beta1, beta2, group["eps"],
                    group["weight_decay"], model_params=lp if any(t is not None for t in lp) else None,
                    maximize=group.get("maximize", False),
                )
        return loss
