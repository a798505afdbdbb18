"""DeepSpeed 0.19.6's 1-bit optimizers re-stated in numpy (float64): the reference of tests/unit/test_onebit_algorithms.py.

DeepSpeed shipped OnebitAdam, ZeroOneAdam and OnebitLamb up to 0.19.6 and removed them in 0.19.7 (DeepSpeed
PR #8490, issue #8489); their compressed all-reduce needs NCCL/MPI and cupy, so they cannot run here. This
module re-states each optimizer's step() in its own update order (deepspeed/runtime/fp16/onebit/adam.py,
zoadam.py, lamb.py) and the compressed all-reduce (deepspeed/runtime/comm/nccl.py / compressed.py: each
worker's error-compensated tensor -> scale * sign with scale = ||x|| / sqrt(n), the signs cut into one chunk
per server, each server averages its chunk over the workers, adds its own error and compresses again), every
rank in one object. The engine's part is re-stated too: the gradient is the ranks' average while DeepSpeed's
`enable_backward_allreduce` is on, the rank's own after the optimizer turns it off.

    ref = DSOnebitAdam(params, masks, freeze_step=4, init_call=False, lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    ref.step([grads_of_rank_0, grads_of_rank_1])
"""

from __future__ import annotations

import math

import numpy as np

WORLD = 2  # the simulated world the tests run


# ---------------------------------------------------------------------------------------------------
# DeepSpeed 0.19.6's compressed all-reduce, every rank in one call
# ---------------------------------------------------------------------------------------------------


def ds_padded_size(numel: int, world: int) -> int:
    """DeepSpeed's corrected_tensor_size: numel rounded up to a multiple of world * divider,
    divider = world * 8 / gcd(world, 8)."""
    unit = world * (world * 8 // math.gcd(world, 8))
    return -(-numel // unit) * unit


def sign(x: np.ndarray) -> np.ndarray:
    """DeepSpeed's x.sign().add_(1).bool().float().add_(-0.5).mul_(2.0): +1 for x >= 0 (0 included), else -1."""
    return np.where(x >= 0, 1.0, -1.0)


class DSErrors:
    """One compressed tensor's error buffers on every rank: worker (padded size) and server (one chunk)."""

    def __init__(self, padded: int, world: int):
        self.worker = [np.zeros(padded) for _ in range(world)]
        self.server = [np.zeros(padded // world) for _ in range(world)]

    def zero(self) -> None:
        for e in self.worker + self.server:
            e[:] = 0.0


def ds_compressed_allreduce_padded(buffers: list[np.ndarray], errors: DSErrors) -> np.ndarray:
    """NcclBackend.compressed_allreduce on already padded flat buffers (one per rank): the result every rank
    receives (padded). Errors updated as DeepSpeed updates them."""
    world, n = len(buffers), buffers[0].size
    chunk = n // world
    signs, scales = [], []
    for r, buffer in enumerate(buffers):  # worker stage, on each rank
        x = buffer + errors.worker[r]
        scale = np.linalg.norm(x) / np.sqrt(n)
        errors.worker[r][:] = x - scale * sign(x)
        signs.append(sign(x))
        scales.append(scale)
    result = np.empty(n)
    for s in range(world):  # server stage on rank s: chunk s of every rank's signs (all-to-all) and their scales
        part = slice(s * chunk, (s + 1) * chunk)
        y = sum(signs[j][part] * (scales[j] / world) for j in range(world)) + errors.server[s]
        scale = np.linalg.norm(y) / np.sqrt(chunk)
        errors.server[s][:] = y - scale * sign(y)
        result[part] = scale * sign(y)  # all-gathered by every rank
    return result


def ds_compressed_allreduce(tensors: list[np.ndarray], errors: DSErrors) -> np.ndarray:
    """The same on one tensor per rank: zero-padded to the errors' size (torch.cat with zeros), result cut back."""
    n = errors.worker[0].size
    padded = [np.concatenate([t.reshape(-1), np.zeros(n - t.size)]) for t in tensors]
    return ds_compressed_allreduce_padded(padded, errors)[:tensors[0].size].reshape(tensors[0].shape)


# ---------------------------------------------------------------------------------------------------
# DeepSpeed 0.19.6's optimizers, every rank in one object
# ---------------------------------------------------------------------------------------------------


class _DSReference:
    """What the three share: per-rank parameters and moments (float64), the engine's gradient all-reduce flag,
    the step counter and DeepSpeed's initialisation call.

    init_call=True is DeepSpeed: the first step() only allocates the buffers, moves nothing and counts as step 1
    (state['step'] += 1). init_call=False applies the documented difference (dsrecipes.training.optim.onebit_base):
    no initialisation call, the counter starts at the first real update."""

    def __init__(self, params: list[np.ndarray], masks: dict[int, np.ndarray], lr: float, betas, eps: float,
                 weight_decay: float, world: int, init_call: bool):
        self.world = world
        self.p = [[x.astype(np.float64) for x in params] for _ in range(world)]
        self.m = [[np.zeros(x.shape) for x in params] for _ in range(world)]
        self.v = [[np.zeros(x.shape) for x in params] for _ in range(world)]
        self.masks = masks  # tensor index -> exp_avg_mask (DeepSpeed: the mask of the tensor's param group)
        self.lr, (self.beta1, self.beta2), self.eps, self.wd = lr, betas, eps, weight_decay
        self.initialize = not init_call
        self.step_count = 0
        self.backward_allreduce = True  # the engine's enable_backward_allreduce

    def gradients(self, grads: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
        """What the engine hands each rank: the average over the ranks while backward all-reduce is on."""
        if not self.backward_allreduce:
            return [[g.astype(np.float64) for g in rank] for rank in grads]
        mean = [np.mean([rank[i].astype(np.float64) for rank in grads], axis=0) for i in range(len(grads[0]))]
        return [[g.copy() for g in mean] for _ in grads]

    def mask(self, i: int, x: np.ndarray) -> np.ndarray:
        return x * self.masks[i] if i in self.masks else x

    def reload(self) -> None:
        """A checkpoint reload as dsrecipes does it: the compression errors reset (DeepSpeed's load_state_dict
        too), everything else kept. Documented difference (onebit_base, zero_one_adam): DeepSpeed resumes into
        a new optimizer whose first step() is its initialisation call again, and its 0/1 Adam also resets its
        schedule (intervals, counters, lrs, the momentum accumulator); dsrecipes keeps them."""
        for errors in self.errors if isinstance(self.errors, list) else [self.errors]:
            errors.zero()

    def init_step(self) -> bool:
        """DeepSpeed's initialisation call if it is due: the counter moves, nothing else (its compressed
        all-reduce of the zero momenta returns zeros and leaves the errors at zero). True if it was."""
        if self.initialize:
            return False
        self.step_count += 1
        self.initialize = True
        return True


class DSOnebitAdam(_DSReference):
    """deepspeed.runtime.fp16.onebit.adam.OnebitAdam.step (0.19.6). bias_correction is accepted there but
    never applied: the update is m / (sqrt(v) + eps) + wd p."""

    def __init__(self, params, masks, *, freeze_step: int, world: int = WORLD, init_call: bool = True, **kw):
        super().__init__(params, masks, world=world, init_call=init_call, **kw)
        self.freeze_step = freeze_step
        self.freeze_key = False
        self.errors = [DSErrors(ds_padded_size(x.size, world), world) for x in params]

    def step(self, grads) -> None:
        g = self.gradients(grads)
        if self.init_step():
            return
        self.step_count += 1
        b1, b2 = self.beta1, self.beta2
        for i in range(len(self.errors)):
            if not self.freeze_key:  # warm-up: Adam on the averaged gradient
                for r in range(self.world):
                    self.m[r][i] = b1 * self.m[r][i] + (1 - b1) * g[r][i]
                    self.v[r][i] = b2 * self.v[r][i] + (1 - b2) * g[r][i] * g[r][i]
            else:  # compression: each rank's momentum with its own gradient, averaged by the 1-bit all-reduce
                for r in range(self.world):
                    self.m[r][i] = b1 * self.m[r][i] + (1 - b1) * g[r][i]
                if self.world > 1:
                    average = ds_compressed_allreduce([self.m[r][i] for r in range(self.world)], self.errors[i])
                    for r in range(self.world):
                        self.m[r][i] = average
                for r in range(self.world):
                    self.m[r][i] = self.mask(i, self.m[r][i])
            for r in range(self.world):
                update = self.m[r][i] / (np.sqrt(self.v[r][i]) + self.eps)
                if self.wd > 0.0:
                    update = update + self.wd * self.p[r][i]
                self.p[r][i] = self.p[r][i] - self.lr * update
        if not self.freeze_key and self.step_count >= self.freeze_step:
            self.freeze_key = True
            self.backward_allreduce = False


class DSZeroOneAdam(_DSReference):
    """deepspeed.runtime.fp16.onebit.zoadam.ZeroOneAdam.step (0.19.6): per-tensor schedule state, one pair
    of error buffers per tensor (gradients, then the momentum accumulator after they are zeroed at the
    freeze), the momentum accumulator `acc` (DeepSpeed's comm_buffer)."""

    def __init__(self, params, masks, *, var_freeze_step: int, var_update_scaler: int, local_step_scaler: int,
                 local_step_clipper: int, world: int = WORLD, init_call: bool = True, **kw):
        super().__init__(params, masks, world=world, init_call=init_call, **kw)
        self.var_freeze_step, self.var_update_scaler = var_freeze_step, var_update_scaler
        self.local_step_scaler, self.local_step_clipper = local_step_scaler, local_step_clipper
        self.freeze_key = False
        self.reinitial_error_buffer = False
        n = len(params)
        self.var_interval, self.var_counter = [1] * n, [0] * n
        self.local_step_interval, self.local_step_counter, self.lrs = [1] * n, [0] * n, [0.0] * n
        self.acc = [[np.zeros(x.shape) for x in params] for _ in range(self.world)]
        self.errors = [DSErrors(ds_padded_size(x.size, world), world) for x in params]
        self.kinds: list[str] = []  # what each real update did: full / onebit / local / sync

    def step(self, grads) -> None:
        g = self.gradients(grads)
        if self.init_step():
            return
        self.step_count += 1
        s, b1, b2, world = self.step_count, self.beta1, self.beta2, self.world
        for i in range(len(self.errors)):
            if not self.freeze_key:
                if s % self.var_interval[i] == 0:  # the engine all-reduced this gradient (flag set last step)
                    kind = "full"
                    for r in range(world):
                        self.v[r][i] = b2 * self.v[r][i] + (1 - b2) * g[r][i] * g[r][i]
                        self.m[r][i] = b1 * self.m[r][i] + (1 - b1) * g[r][i]
                else:  # the rank's own gradient, averaged by the 1-bit all-reduce
                    kind = "onebit"
                    if world > 1:  # DeepSpeed's guard `if self.size > 1` holds the momentum update too
                        onebit = self.mask(i, ds_compressed_allreduce([g[r][i] for r in range(world)], self.errors[i]))
                        for r in range(world):
                            self.m[r][i] = b1 * self.m[r][i] + (1 - b1) * onebit
            else:  # local step with the rank's own gradient
                kind = "local"
                for r in range(world):
                    self.m[r][i] = b1 * self.m[r][i] + (1 - b1) * g[r][i]
                self.lrs[i] += self.lr
            for r in range(world):
                update = self.m[r][i] / (np.sqrt(self.v[r][i]) + self.eps)
                if self.wd > 0.0:
                    update = update + self.wd * self.p[r][i]
                self.p[r][i] = self.p[r][i] - self.lr * update
                if self.freeze_key:
                    self.acc[r][i] = self.acc[r][i] + (-self.lr * update)
            if s % self.local_step_interval[i] == 0 and self.freeze_key:  # sync
                kind = "sync"
                denom = [np.sqrt(self.v[r][i]) + self.eps for r in range(world)]
                sent = []
                for r in range(world):
                    # DeepSpeed undoes the local moves with p -= acc; dsrecipes restarts from the parameters of
                    # the last sync (documented difference, zero_one_adam): equal in exact arithmetic
                    self.p[r][i] = self.p[r][i] - self.acc[r][i]
                    sent.append(self.acc[r][i] * denom[r])
                # at world 1 DeepSpeed's guard `if self.size > 1` skips the mask with the all-reduce
                average = self.mask(i, ds_compressed_allreduce(sent, self.errors[i])) if world > 1 else sent[0]
                for r in range(world):
                    self.m[r][i] = -(average / self.lrs[i])
                    self.p[r][i] = self.p[r][i] + average / denom[r]
                    self.acc[r][i] = np.zeros_like(self.acc[r][i])
                self.lrs[i] = 0.0
            if not self.freeze_key:
                if s % self.var_interval[i] == 0:
                    self.var_counter[i] += 1
                    if self.var_counter[i] == self.var_update_scaler:
                        self.var_counter[i] = 0
                        self.var_interval[i] *= 2
                self.backward_allreduce = (s + 1) % self.var_interval[i] == 0
            else:
                self.local_step_counter[i] += 1
                if self.local_step_counter[i] == self.local_step_scaler:
                    self.local_step_counter[i] = 0
                    self.local_step_interval[i] = min(self.local_step_clipper, self.local_step_interval[i] * 2)
        self.kinds.append(kind)
        if self.step_count > self.var_freeze_step:
            self.freeze_key = True
            self.backward_allreduce = False
        if self.freeze_key and not self.reinitial_error_buffer:
            for errors in self.errors:  # they will hold the momentum accumulator's errors from now on
                errors.zero()
            self.reinitial_error_buffer = True


class DSOnebitLamb(_DSReference):
    """deepspeed.runtime.fp16.onebit.lamb.OnebitLamb.step (0.19.6). The momenta are views into one fused flat
    buffer per rank (padded to a multiple of world * divider with a dummy tensor), compressed together.

    pad_carries_output=True is DeepSpeed: the dummy padding is never reset, so from the second compressed step
    on it holds the previous compressed result. False: zeros every call (dsrecipes; not documented).

    refresh_scaling=False is DeepSpeed: the scaling coefficients computed once, at the first compressed step,
    from each rank's warm-up momentum. True applies dsrecipes' documented difference (onebit_lamb's "Scaling
    coefficients", its default): recomputed at every compressed step from the momenta about to be compressed,
    rms per tensor averaged over the ranks as mean squares, the compression errors rescaled entry by entry by
    new / old coefficient (the padding's left as they are)."""

    def __init__(self, params, masks, *, freeze_step: int, coeff_beta: float = 0.9, factor_max: float = 4.0,
                 factor_min: float = 0.5, factor_threshold: float = 0.1, max_coeff: float = 10.0,
                 min_coeff: float = 0.01, world: int = WORLD, init_call: bool = True, pad_carries_output: bool = True,
                 refresh_scaling: bool = False, **kw):
        super().__init__(params, masks, world=world, init_call=init_call, **kw)
        self.freeze_step, self.coeff_beta = freeze_step, coeff_beta
        self.factor_max, self.factor_min, self.factor_threshold = factor_max, factor_min, factor_threshold
        self.max_coeff, self.min_coeff = max_coeff, min_coeff
        self.pad_carries_output, self.refresh_scaling = pad_carries_output, refresh_scaling
        self.freeze_key = False
        sizes = [x.size for x in params]
        self.numel = sum(sizes)
        padded = ds_padded_size(self.numel, world)
        self.flat = [np.zeros(padded) for _ in range(world)]
        offsets = np.cumsum([0, *sizes])
        for r in range(world):  # exp_avg = views into the fused buffer, as DeepSpeed's _unflatten_dense_tensors
            self.m[r] = [self.flat[r][offsets[i]:offsets[i + 1]].reshape(x.shape) for i, x in enumerate(params)]
        self.v_fresh = [[np.zeros(x.shape) for x in params] for _ in range(world)]
        self.errors = DSErrors(padded, world)
        n = len(params)
        self.coeff_freeze, self.last_factor = [[0.0] * n for _ in range(world)], [[1.0] * n for _ in range(world)]
        self.scaling_coeff: list[list[float]] | None = None
        self.factor_events: set[str] = set()  # which clamps of the factor the run went through

    def step(self, grads) -> None:
        g = self.gradients(grads)
        if self.init_step():
            return
        b1, b2, world, n = self.beta1, self.beta2, self.world, len(self.m[0])
        if self.freeze_key:
            last = [[m.copy() for m in self.m[r]] for r in range(world)]
            if self.scaling_coeff is None and not self.refresh_scaling:  # the momentum scales ending the warm-up
                self.scaling_coeff = []
                for r in range(world):
                    scales = [np.linalg.norm(m) / np.sqrt(m.size) for m in self.m[r]]
                    united = sum(scales) / len(scales)
                    self.scaling_coeff.append([united / s for s in scales])
        self.step_count += 1
        for r in range(world):
            for i in range(n):
                p, m, v = self.p[r][i], self.m[r][i], self.v[r][i]
                if not self.freeze_key:  # warm-up: LAMB on the averaged gradient
                    m *= b1
                    m += (1 - b1) * g[r][i]
                    v *= b2
                    v += (1 - b2) * g[r][i] * g[r][i]
                    if self.step_count == self.freeze_step:
                        self.v_fresh[r][i] = v.copy()
                    weight_norm = np.linalg.norm(p)
                    update = m / (np.sqrt(v) + self.eps)
                    if self.wd > 0.0:
                        update = update + self.wd * p
                    update_norm = np.linalg.norm(update)
                    coeff = 1.0
                    if weight_norm != 0 and update_norm != 0:
                        coeff = min(max(weight_norm / update_norm, self.min_coeff), self.max_coeff)
                    if coeff != 1.0:
                        self.coeff_freeze[r][i] = self.coeff_beta * self.coeff_freeze[r][i] + (1 - self.coeff_beta) * coeff
                    self.p[r][i] = p - self.lr * coeff * update
                else:  # compression: the rank's own gradient (DeepSpeed scales m right here, below for all)
                    m *= b1
                    m += (1 - b1) * g[r][i]
        if self.freeze_key:
            if self.refresh_scaling:  # documented difference (onebit_lamb): fresh coefficients every step
                self._refresh_scaling_coefficients()
            for r in range(world):  # the momentum scaled for the fused compression
                for i in range(n):
                    self.m[r][i] *= self.scaling_coeff[r][i]
            if not self.pad_carries_output:
                for r in range(world):
                    self.flat[r][self.numel:] = 0.0
            if world > 1:
                average = ds_compressed_allreduce_padded([f.copy() for f in self.flat], self.errors)
                for r in range(world):
                    self.flat[r][:] = average  # in place: the momenta (views) and the dummy padding
            for r in range(world):
                for i in range(n):
                    m = self.m[r][i]
                    m /= self.scaling_coeff[r][i]
                    if i in self.masks:
                        m *= self.masks[i]
                    reconstructed = (m - last[r][i] * b1) / (1 - b1)
                    self.v_fresh[r][i] = b2 * self.v_fresh[r][i] + (1 - b2) * reconstructed * reconstructed
                    denom = np.sqrt(self.v[r][i]) + self.eps
                    prelim = m / denom
                    update = prelim + self.wd * self.p[r][i] if self.wd > 0.0 else prelim
                    update_norm = np.linalg.norm(update)
                    factor = float(np.max(denom / (np.sqrt(self.v_fresh[r][i]) + self.eps)))
                    if self.wd > 0.0:
                        ratio = min(1.0, np.linalg.norm(prelim) / update_norm)
                        factor = factor * ratio + (1.0 - ratio)
                    factor = self._bounded(factor, self.last_factor[r][i])
                    self.last_factor[r][i] = factor
                    self.p[r][i] = self.p[r][i] - self.lr * self.coeff_freeze[r][i] * factor * update
        if not self.freeze_key and self.step_count >= self.freeze_step:
            self.freeze_key = True
            self.backward_allreduce = False

    def _refresh_scaling_coefficients(self) -> None:
        n = len(self.m[0])
        scales = [np.sqrt(np.mean([np.sum(self.m[r][i] ** 2) / self.m[r][i].size for r in range(self.world)]))
                  for i in range(n)]
        united = sum(scales) / n
        new = [united / s if s > 0 else 1.0 for s in scales]
        if self.scaling_coeff is not None:  # the errors are in scaled units: carry them into the new ones
            per_entry = np.concatenate([np.full(m.size, c / was) for m, c, was in zip(self.m[0], new,
                                                                                      self.scaling_coeff[0])])
            chunk = self.errors.server[0].size
            for r in range(self.world):
                self.errors.worker[r][:self.numel] *= per_entry
                mine = per_entry[r * chunk:(r + 1) * chunk]  # rank r's server chunk
                self.errors.server[r][:mine.size] *= mine
        self.scaling_coeff = [list(new) for _ in range(self.world)]

    def reload(self) -> None:
        super().reload()
        for flat in self.flat:  # DeepSpeed's load_state_dict also drops the fused buffer: new padding, zeros
            flat[self.numel:] = 0.0

    def _bounded(self, factor: float, last: float) -> float:
        if factor > self.factor_max:
            factor = self.factor_max
            self.factor_events.add("max")
        if factor < self.factor_min:
            factor = self.factor_min
            self.factor_events.add("min")
        if factor > last * (1.0 + self.factor_threshold):
            factor = last * (1.0 + self.factor_threshold)
            self.factor_events.add("threshold up")
        if factor < last * (1.0 - self.factor_threshold):
            factor = last * (1.0 - self.factor_threshold)
            self.factor_events.add("threshold down")
        return factor
