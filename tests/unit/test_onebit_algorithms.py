"""1-bit Adam, 0/1 Adam and 1-bit LAMB held step by step against DeepSpeed 0.19.6's published algorithm.

DeepSpeed shipped OnebitAdam, ZeroOneAdam and OnebitLamb up to 0.19.6 and removed them in 0.19.7 (DeepSpeed
PR #8490, issue #8489); they cannot run here, so the reference is tests/helpers/deepspeed_onebit_reference.py,
DeepSpeed 0.19.6's step() of each optimizer and its compressed all-reduce re-stated in numpy (float64).

dsrecipes' optimizers run in a simulated world of two ranks in this process: one optimizer per rank, each
rank's step() in its own thread, and torch.distributed's collectives replaced (monkeypatch) by a tiny
in-memory exchange (`_FakeWorld`), so dsrecipes' own compressed_allreduce runs unchanged; no process or
process group is started. The two ranks get different gradients (a shared part plus rank noise). The
parameters of every rank are compared with the reference after every step: fp32 against float64, within
RTOL = ATOL = 1e-6. The tests run past the freeze (variance stage, compression, local steps and syncs).

Deliberate differences from DeepSpeed, documented in the optimizers' module docstrings, are applied in the
reference explicitly (each at its use, with a comment):

* the initialisation call (dsrecipes.training.optim.onebit_base): DeepSpeed's first step() only allocates buffers
  and moves no weight, but counts as step 1; here the first call is a real update. The comparisons run the
  reference with `init_call=False` (its counter starts at the first update); for 1-bit Adam and 1-bit LAMB
  the reference with its initialisation call and freeze_step + 1 is checked to give the same trajectory.
  For 0/1 Adam the offset also moves the phase of its interval tests (step % var_interval,
  step % local_step_interval): pinned in test_zero_one_adam_deepspeed_schedule_phase.
* 0/1 Adam's sync (dsrecipes.training.optim.zero_one_adam): DeepSpeed undoes the local moves with p -= acc,
  dsrecipes restarts from the parameters saved at the last sync; equal in exact arithmetic (the float64
  reference does DeepSpeed's), so no change is needed in the reference.

One difference that no docstring lists was found (see test_onebit_lamb_padding_difference): DeepSpeed's
OnebitLamb keeps its fused momentum buffer, whose padding entries (total numel not a multiple of
world * lcm(world, 8)) hold the previous call's compressed result, and feeds them into the next compression;
dsrecipes pads with zeros every call.
"""

from __future__ import annotations

import copy
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
import torch.distributed as dist

from dsrecipes.training.optim.onebit_adam import OneBitAdam
from dsrecipes.training.optim.onebit_lamb import OneBitLamb
from dsrecipes.training.optim.zero_one_adam import ZeroOneAdam
from tests.helpers.deepspeed_onebit_reference import (
    WORLD,
    DSErrors,
    DSOnebitAdam,
    DSOnebitLamb,
    DSZeroOneAdam,
    ds_compressed_allreduce,
    ds_padded_size,
    sign,
)

RTOL = ATOL = 1e-6  # fp32 (dsrecipes) against float64 (the reference), parameters of order 1 after <= 16 steps
SHAPES = [(7, 5), (5,), (3, 2, 2)]  # odd sizes: each padded (1-bit Adam, 0/1 Adam compress per tensor)
KW = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8)




def test_reference_allreduce_against_its_definition():
    """The reference all-reduce at world 2 by hand on 16 entries: worker and server stages, errors fed back."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(16), rng.standard_normal(16)
    errors = DSErrors(16, 2)
    got = ds_compressed_allreduce([a, b], errors)
    ca, cb = np.linalg.norm(a) / 4 * sign(a), np.linalg.norm(b) / 4 * sign(b)
    mean = (ca + cb) / 2
    halves = [mean[:8], mean[8:]]
    expected = np.concatenate([np.linalg.norm(h) / np.sqrt(8) * sign(h) for h in halves])
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    np.testing.assert_allclose(errors.worker[1], b - cb, rtol=1e-12)
    np.testing.assert_allclose(errors.server[0] + expected[:8], halves[0], rtol=1e-12)
    got2 = ds_compressed_allreduce([a, b], errors)  # error feedback: two calls average closer to the exact mean
    assert np.linalg.norm((got + got2) / 2 - (a + b) / 2) < np.linalg.norm(got - (a + b) / 2)
    assert ds_padded_size(13, 2) == 16 and ds_padded_size(13, 3) == 72 and ds_padded_size(33, 4) == 64




# ---------------------------------------------------------------------------------------------------
# dsrecipes' optimizers in a simulated world: one optimizer per rank, one thread per rank
# ---------------------------------------------------------------------------------------------------


class _FakeWorld:
    """torch.distributed's calls that dsrecipes' compressed all-reduce makes, between threads of one process:
    each thread is a rank (`local.rank`); a collective puts the rank's tensor in a slot and reads the others'."""

    def __init__(self, world: int):
        self.world = world
        self.barrier = threading.Barrier(world, timeout=30)
        self.slots: list[torch.Tensor | None] = [None] * world
        self.local = threading.local()

    def _share(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        self.slots[self.local.rank] = tensor.detach().clone()
        self.barrier.wait()
        got = list(self.slots)
        self.barrier.wait()  # everyone has read before a slot is written again
        return got

    def all_to_all_single(self, output, input, group=None, **_):
        got = self._share(input)
        rank = self.local.rank
        out = output.view(self.world, -1)
        for j, tensor in enumerate(got):
            out[j].copy_(tensor.view(self.world, -1)[rank])

    def all_reduce(self, tensor, op=dist.ReduceOp.SUM, group=None, **_):
        assert op == dist.ReduceOp.SUM
        tensor.copy_(torch.stack(self._share(tensor)).sum(dim=0))

    def all_gather_into_tensor(self, output, input, group=None, **_):
        output.copy_(torch.cat([t.reshape(-1) for t in self._share(input)]).view_as(output))

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(dist, "is_initialized", lambda: True)
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: self.world)
        monkeypatch.setattr(dist, "get_rank", lambda group=None: self.local.rank)
        monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
        monkeypatch.setattr(dist, "all_to_all_single", self.all_to_all_single)
        monkeypatch.setattr(dist, "all_gather_into_tensor", self.all_gather_into_tensor)
        monkeypatch.setattr(dist, "all_reduce", self.all_reduce)
        monkeypatch.setattr(dist, "all_gather_single", self.all_gather_into_tensor, raising=False)

    def run(self, pool: ThreadPoolExecutor, fns) -> None:
        """fns[r]() on rank r's thread, all at once; an exception in one breaks the barrier for the others."""
        def on_rank(r):
            self.local.rank = r
            try:
                fns[r]()
            except BaseException:
                self.barrier.abort()
                raise
        for future in [pool.submit(on_rank, r) for r in range(self.world)]:
            future.result()


@pytest.fixture
def fake_world(monkeypatch):
    world = _FakeWorld(WORLD)
    world.install(monkeypatch)
    return world


def _problem(seed: int, steps: int, shapes=SHAPES, scales=()):
    """Initial parameters (float32) and each step's gradient on each rank: a shared part plus rank noise,
    multiplied by scales[k] at step k (1 past the end of `scales`)."""
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = []
    for k in range(steps):
        scale = scales[k] if k < len(scales) else 1.0
        shared = [rng.standard_normal(s) for s in shapes]
        grads.append([[(scale * (c + 0.7 * rng.standard_normal(c.shape))).astype(np.float32) for c in shared]
                      for _ in range(WORLD)])
    mask = np.ones(shapes[0], dtype=np.float32)
    mask.reshape(-1)[-9:] = 0.0  # exp_avg_mask on the first tensor (its own param group)
    return params, grads, {0: mask}


def _groups(params: list[torch.nn.Parameter], masks: dict[int, np.ndarray]) -> list[dict]:
    """The first tensor in a group with its exp_avg_mask, the rest in another (DeepSpeed's masks are per group)."""
    return [{"params": [params[0]], "exp_avg_mask": torch.from_numpy(masks[0].copy())}, {"params": params[1:]}]


class _Ranks:
    """One dsrecipes optimizer per rank, stepped together in the fake world, the engine's gradient sync
    re-stated as dsrecipes' onebit strategy does it: the ranks' average while needs_gradient_allreduce()."""

    def __init__(self, world: _FakeWorld, make, params: list[np.ndarray], masks):
        self.world = world
        self.params = [[torch.nn.Parameter(torch.from_numpy(p.copy())) for p in params] for _ in range(WORLD)]
        self.opts = [make(_groups(ps, masks)) for ps in self.params]
        for opt in self.opts:
            opt.set_process_group(object())  # a stand-in group: the fake world answers for it
        self.allreduce: list[bool] = []

    def step(self, pool, grads) -> None:
        flags = {opt.needs_gradient_allreduce() for opt in self.opts}
        assert len(flags) == 1, "the ranks disagree on the gradient all-reduce"
        averaged = flags.pop()
        self.allreduce.append(averaged)
        for r, ps in enumerate(self.params):
            for i, p in enumerate(ps):
                g = np.mean([grads[q][i].astype(np.float64) for q in range(WORLD)], axis=0) if averaged \
                    else grads[r][i]
                p.grad = torch.tensor(np.asarray(g, dtype=np.float32))  # a copy: the reference reads grads after
        self.world.run(pool, [opt.step for opt in self.opts])

    def reload(self, make, masks) -> None:
        """A checkpoint round trip: every rank's state_dict (a deep copy) loaded into a new optimizer."""
        states = [copy.deepcopy(opt.state_dict()) for opt in self.opts]
        self.opts = [make(_groups(ps, masks)) for ps in self.params]
        for opt, state in zip(self.opts, states):
            opt.set_process_group(object())
            opt.load_state_dict(state)

    def weights(self) -> list[list[np.ndarray]]:
        return [[p.detach().numpy().astype(np.float64) for p in ps] for ps in self.params]


def _assert_close(got: list[list[np.ndarray]], expected: list[list[np.ndarray]], what: str) -> None:
    for r, (g_rank, e_rank) in enumerate(zip(got, expected)):
        for i, (g, e) in enumerate(zip(g_rank, e_rank)):
            np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL, err_msg=f"{what}, rank {r}, tensor {i}")


def _compare(fake_world, make, reference, steps: int, seed: int, shapes=SHAPES, init_call_grads: bool = False,
             scales=(), reload_after: int | None = None):
    """Step dsrecipes and the reference together; parameters compared after every step. With
    init_call_grads the reference first takes DeepSpeed's initialisation call (the first step's gradients,
    which it does not use) and its trajectory is compared from its second call. reload_after=k: after step k
    dsrecipes' optimizers go through a checkpoint round trip and the reference resets its compression errors."""
    params, grads, masks = _problem(seed, steps, shapes, scales)
    ranks = _Ranks(fake_world, make, params, masks)
    if init_call_grads:
        reference.step(grads[0])
        assert all(np.array_equal(p, q) for p, q in zip(reference.p[0], params))  # it moved nothing
    backward_allreduce = []
    with ThreadPoolExecutor(WORLD) as pool:
        for k in range(steps):
            backward_allreduce.append(reference.backward_allreduce)
            ranks.step(pool, grads[k])
            reference.step(grads[k])
            _assert_close(ranks.weights(), reference.p, f"parameters after step {k + 1}")
            if k + 1 == reload_after:
                ranks.reload(make, masks)
                reference.reload()
    assert ranks.allreduce == backward_allreduce  # the same steps read the ranks' averaged gradient
    return ranks


# ---------------------------------------------------------------------------------------------------
# the comparisons
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_onebit_adam_follows_deepspeed(fake_world, weight_decay):
    """1-bit Adam, freeze_step=4, 10 steps: 4 Adam updates on the averaged gradient, then 6 compressed ones
    (frozen variance, each rank's momentum averaged by the 1-bit all-reduce with error feedback, the mask
    applied after it). Parameters of both ranks after every step, momentum and variance at the end."""
    kw = dict(KW, weight_decay=weight_decay)
    params, _, masks = _problem(1, 0)
    # documented difference (onebit_base): no initialisation call, so the reference's counter starts at the
    # first update and freeze_step means the same count of uncompressed updates
    reference = DSOnebitAdam(params, masks, freeze_step=4, init_call=False, **kw)
    ranks = _compare(fake_world, lambda groups: OneBitAdam(groups, freeze_step=4, **kw), reference, 10, seed=1)
    assert ranks.allreduce == [True] * 4 + [False] * 6
    for r, opt in enumerate(ranks.opts):
        for i, p in enumerate(ranks.params[r]):
            np.testing.assert_allclose(opt.state[p]["exp_avg"].numpy(), reference.m[r][i], rtol=RTOL, atol=ATOL)
            np.testing.assert_allclose(opt.state[p]["exp_avg_sq"].numpy(), reference.v[r][i], rtol=RTOL, atol=ATOL)
    assert np.all(reference.m[0][0].reshape(-1)[-9:] == 0)  # the mask held
    _assert_close(ranks.weights()[1:], ranks.weights()[:1], "ranks")  # the replicas stay identical


def test_onebit_adam_deepspeed_freeze_step_is_one_more(fake_world):
    """DeepSpeed as it is (its initialisation call first) with freeze_step=5 gives dsrecipes' trajectory with
    freeze_step=4: the counter offset is the whole difference for 1-bit Adam (its update reads no counter)."""
    params, _, masks = _problem(2, 0)
    reference = DSOnebitAdam(params, masks, freeze_step=5, init_call=True, **KW, weight_decay=0.1)
    _compare(fake_world, lambda groups: OneBitAdam(groups, freeze_step=4, **KW, weight_decay=0.1), reference, 9,
             seed=2, init_call_grads=True)


ZO_SCHEDULE = dict(var_freeze_step=6, var_update_scaler=2, local_step_scaler=2, local_step_clipper=4)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_zero_one_adam_follows_deepspeed(fake_world, weight_decay):
    """0/1 Adam, 16 steps: variance updates (averaged gradient) at 1, 2, 4, 6, 1-bit compressed gradients at 3,
    5, 7 (own error buffers), the variance frozen from step 8, local steps with momentum syncs at 8, 9, 10, 12
    and 16 (interval 1, 2, then clipped at 4; the errors zeroed at the freeze, the accumulated moves scaled by
    the denominator, compressed, masked, the momentum rebuilt from them). Parameters of each rank (they
    differ between syncs) after every step; momentum, variance, and the identical replicas after the last sync."""
    kw = dict(KW, weight_decay=weight_decay)
    params, _, masks = _problem(3, 0)
    # documented difference (onebit_base, zero_one_adam): no initialisation call, so the reference's counter,
    # its interval tests (step % var_interval, step % local_step_interval) and var_freeze_step see dsrecipes' t
    reference = DSZeroOneAdam(params, masks, init_call=False, **ZO_SCHEDULE, **kw)
    ranks = _compare(fake_world, lambda groups: ZeroOneAdam(groups, **ZO_SCHEDULE, **kw), reference, 16, seed=3)
    expected = ["full", "full", "onebit", "full", "onebit", "full", "onebit", "sync", "sync", "sync", "local",
                "sync", "local", "local", "local", "sync"]
    assert reference.kinds == expected
    assert ranks.allreduce == [kind == "full" for kind in expected]
    for r, opt in enumerate(ranks.opts):
        for i, p in enumerate(ranks.params[r]):
            np.testing.assert_allclose(opt.state[p]["exp_avg"].numpy(), reference.m[r][i], rtol=RTOL, atol=ATOL)
            np.testing.assert_allclose(opt.state[p]["exp_avg_sq"].numpy(), reference.v[r][i], rtol=RTOL, atol=ATOL)
    _assert_close(ranks.weights()[1:], ranks.weights()[:1], "ranks after the last sync")


def test_zero_one_adam_deepspeed_schedule_phase():
    """DeepSpeed as it is: its initialisation call counts as step 1, so its interval tests see update t as
    t + 1. With var_freeze_step=7 (6 + 1) it freezes at the same update as dsrecipes with 6, but within the
    doubling intervals its variance updates and syncs fall one update earlier: variance updates at 1, 2, 3,
    5, 7 (dsrecipes: 1, 2, 4, 6), syncs at 8, 9, 11, 15 (dsrecipes: 8, 9, 10, 12, 16)."""
    params, grads, masks = _problem(4, 17)
    reference = DSZeroOneAdam(params, masks, init_call=True, **dict(ZO_SCHEDULE, var_freeze_step=7), **KW,
                              weight_decay=0.0)
    for g in grads:
        reference.step(g)
    assert reference.kinds == ["full", "full", "full", "onebit", "full", "onebit", "full", "sync", "sync", "local",
                               "sync", "local", "local", "local", "sync", "local"]


LAMB_SHAPES = [(7, 5), (5,), (3, 2, 2), (3, 4)]  # 64 entries: the fused buffer needs no padding at world 2
# factor_max 1.5 (4 by default) and gradients 4x larger, then 10x smaller after the freeze with beta2 0.8: every
# bound of the factor is reached in 10 steps (factor_max, factor_min, the threshold up and down)
LAMB_KW = dict(factor_max=1.5, factor_min=0.5, factor_threshold=0.1, coeff_beta=0.9, max_coeff=10.0, min_coeff=0.01,
               lr=1e-2, betas=(0.9, 0.8), eps=1e-8)
LAMB_SCALES = (1, 1, 1, 4, 4, 4, 0.1, 0.1, 0.1, 0.1)


@pytest.mark.parametrize("refresh_scaling", [False, True], ids=["deepspeed_scaling", "refresh_scaling"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_onebit_lamb_follows_deepspeed(fake_world, weight_decay, refresh_scaling):
    """1-bit LAMB, freeze_step=3, 10 steps: LAMB with the running trust coefficients on the averaged
    gradient (v copied to v_fresh at step 3), then the scaling coefficients per tensor (DeepSpeed's: fixed at
    the first compressed step; refresh_scaling, dsrecipes' default: recomputed every step, the errors
    rescaled), all momenta scaled and compressed as one fused buffer, divided back, masked, the gradient
    reconstructed into v_fresh, the factor max(d / d') (mixed by the update ratio with weight decay) bounded
    to [factor_min, factor_max] and to +-factor_threshold of the last one, p -= lr coeff factor u.
    Parameters after every step; the coefficients, factors and moments at the end."""
    kw = dict(LAMB_KW, weight_decay=weight_decay)
    params, _, masks = _problem(5, 0, LAMB_SHAPES)
    # documented difference (onebit_base): no initialisation call, the counter starts at the first update;
    # refresh_scaling=True: documented difference (onebit_lamb, "Scaling coefficients") applied in the reference
    reference = DSOnebitLamb(params, masks, freeze_step=3, init_call=False, refresh_scaling=refresh_scaling, **kw)
    ranks = _compare(fake_world, lambda groups: OneBitLamb(groups, freeze_step=3, refresh_scaling=refresh_scaling,
                                                           **kw),
                     reference, 10, seed=5, shapes=LAMB_SHAPES, scales=LAMB_SCALES)
    assert ranks.allreduce == [True] * 3 + [False] * 7
    assert reference.factor_events == {"max", "min", "threshold up", "threshold down"}  # every bound was reached
    for r, opt in enumerate(ranks.opts):
        for i, p in enumerate(ranks.params[r]):
            state = opt.state[p]
            np.testing.assert_allclose(state["exp_avg"].numpy(), reference.m[r][i], rtol=RTOL, atol=ATOL)
            np.testing.assert_allclose(state["exp_avg_sq_fresh"].numpy(), reference.v_fresh[r][i], rtol=1e-5,
                                       atol=ATOL)
            assert state["lamb_coeff_freeze"] == pytest.approx(reference.coeff_freeze[r][i], rel=RTOL)
            assert state["last_factor"] == pytest.approx(reference.last_factor[r][i], rel=RTOL)
            assert state["scaling_coeff"] == pytest.approx(reference.scaling_coeff[r][i], rel=RTOL)
    _assert_close(ranks.weights()[1:], ranks.weights()[:1], "ranks")


def test_onebit_lamb_deepspeed_freeze_step_is_one_more(fake_world):
    """DeepSpeed as it is (initialisation call first) with freeze_step=4 = dsrecipes with freeze_step=3."""
    params, _, masks = _problem(6, 0, LAMB_SHAPES)
    reference = DSOnebitLamb(params, masks, freeze_step=4, init_call=True, **LAMB_KW, weight_decay=0.1)
    _compare(fake_world, lambda groups: OneBitLamb(groups, freeze_step=3, refresh_scaling=False, **LAMB_KW,
                                                   weight_decay=0.1),
             reference, 8, seed=6, shapes=LAMB_SHAPES, init_call_grads=True, scales=LAMB_SCALES)


def test_onebit_lamb_padding_difference(fake_world):
    """Undocumented difference (reported, issue 39): with 52 entries the fused buffer is padded to 64. DeepSpeed
    never resets its padding, so from the second compressed step on the previous result's padding entries enter
    the worker stage (and the scale); dsrecipes pads with zeros each call. The reference with zero padding
    matches dsrecipes step by step; DeepSpeed's own padding moves the parameters away from it."""
    steps, kw = 8, dict(LAMB_KW, weight_decay=0.1)
    params, _, masks = _problem(7, 0)
    zero_pad = DSOnebitLamb(params, masks, freeze_step=3, init_call=False, pad_carries_output=False, **kw)
    ranks = _compare(fake_world, lambda groups: OneBitLamb(groups, freeze_step=3, refresh_scaling=False, **kw),
                     zero_pad, steps, seed=7)
    deepspeed = DSOnebitLamb(params, masks, freeze_step=3, init_call=False, **kw)
    for g in _problem(7, steps)[1]:
        deepspeed.step(g)
    gap = max(np.max(np.abs(a - b)) for a, b in zip(deepspeed.p[0], ranks.weights()[0]))
    assert gap > 1e-4, "DeepSpeed's carried padding made no difference: revisit the report"


@pytest.mark.parametrize("name, reload_after", [("onebitadam", 7), ("zerooneadam", 5), ("zerooneadam", 13),
                                                ("onebitlamb", 6)])
def test_checkpoint_reload_resets_the_errors_only(fake_world, name, reload_after):
    """A checkpoint round trip of every rank's optimizer mid-run (1-bit Adam and 1-bit LAMB while compressing;
    0/1 Adam between 1-bit gradient steps, and between two syncs with local moves pending) equals the
    reference with its compression errors reset at that point, step by step to the end."""
    kw = dict(KW, weight_decay=0.1)
    if name == "onebitadam":
        params, _, masks = _problem(9, 0)
        make = lambda groups: OneBitAdam(groups, freeze_step=4, **kw)  # noqa: E731
        reference, steps, shapes, scales = DSOnebitAdam(params, masks, freeze_step=4, init_call=False, **kw), 12, SHAPES, ()
    elif name == "zerooneadam":
        params, _, masks = _problem(9, 0)
        make = lambda groups: ZeroOneAdam(groups, **ZO_SCHEDULE, **kw)  # noqa: E731
        reference = DSZeroOneAdam(params, masks, init_call=False, **ZO_SCHEDULE, **kw)
        steps, shapes, scales = 16, SHAPES, ()
    else:
        kw = dict(LAMB_KW, weight_decay=0.1)
        params, _, masks = _problem(9, 0, LAMB_SHAPES)
        make = lambda groups: OneBitLamb(groups, freeze_step=3, **kw)  # noqa: E731  (refresh_scaling: the default)
        reference = DSOnebitLamb(params, masks, freeze_step=3, init_call=False, refresh_scaling=True, **kw)
        steps, shapes, scales = 10, LAMB_SHAPES, LAMB_SCALES
    # the references' reload() applies the documented difference (DeepSpeed would restart its schedule)
    ranks = _compare(fake_world, make, reference, steps, seed=9, shapes=shapes, scales=scales,
                     reload_after=reload_after)
    assert all(opt.compression_errors for opt in ranks.opts) or name == "zerooneadam"


def test_world_one_is_deepspeed_without_compression():
    """Without a process group (one rank) nothing is compressed, as DeepSpeed at world size 1 (its all-reduce
    calls sit under `if self.size > 1`): 1-bit Adam and 1-bit LAMB follow the reference step by step. 0/1 Adam
    does not (undocumented difference, reported in issue 39): DeepSpeed's guard also holds the momentum update of
    the steps between variance updates, so at world 1 its momentum stands still there, while dsrecipes updates it
    with the uncompressed gradient (what the all-reduce of one rank is)."""
    params, grads, masks = _problem(8, 10, LAMB_SHAPES, LAMB_SCALES)
    grads = [[rank_grads[0]] for rank_grads in grads]  # rank 0's gradients: a world of one
    cases = [
        (lambda groups: OneBitAdam(groups, freeze_step=4, **KW, weight_decay=0.1),
         DSOnebitAdam(params, masks, freeze_step=4, world=1, init_call=False, **KW, weight_decay=0.1)),
        (lambda groups: OneBitLamb(groups, freeze_step=3, refresh_scaling=False, **LAMB_KW, weight_decay=0.1),
         DSOnebitLamb(params, masks, freeze_step=3, world=1, init_call=False, **LAMB_KW, weight_decay=0.1)),
        (lambda groups: ZeroOneAdam(groups, **ZO_SCHEDULE, **KW, weight_decay=0.1),
         DSZeroOneAdam(params, masks, world=1, init_call=False, **ZO_SCHEDULE, **KW, weight_decay=0.1)),
    ]
    for make, reference in cases:
        ps = [torch.nn.Parameter(torch.from_numpy(p.copy())) for p in params]
        opt = make(_groups(ps, masks))
        for k, g in enumerate(grads):
            for p, grad in zip(ps, g[0]):
                p.grad = torch.tensor(grad)
            kind = opt.schedule_kind() if isinstance(opt, ZeroOneAdam) else None
            m_before = reference.m[0][1].copy()
            opt.step()
            reference.step(g)
            if kind == "onebit":  # the first one (step 3) parts the two
                assert np.array_equal(reference.m[0][1], m_before)
                assert not np.allclose(opt.state[ps[1]]["exp_avg"].numpy(), m_before, rtol=1e-3)
                break
            _assert_close([[p.detach().numpy().astype(np.float64) for p in ps]], reference.p,
                          f"{type(opt).__name__} at world 1, step {k + 1}")
        assert k == (2 if isinstance(opt, ZeroOneAdam) else len(grads) - 1)


@pytest.mark.parametrize("ds_type", ["OneBitAdam", "ZeroOneAdam", "OneBitLamb"])
def test_deepspeed_config_import_says_deepspeed_refuses_it_now(ds_type):
    """A ds_config.json with one of them still translates (DeepSpeed <= 0.19.6's keys), and the translation report
    says that DeepSpeed 0.19.7+ would refuse it."""
    from dsrecipes.config.ds_import import translate
    from dsrecipes.config.ds_import.report import report_lines

    lines = report_lines(translate({"optimizer": {"type": ds_type, "params": {}}}), "ds_config.json")
    line = next(line for line in lines if line.startswith("optimizer.type"))
    assert f"optimizer={ds_type.lower()}" in line and "DeepSpeed <= 0.19.6" in line
    assert "DeepSpeed 0.19.7+ refuses this config" in line
