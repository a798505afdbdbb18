"""DeepSpeed's lr schedules: formulas against hand-computed values, torch scheduler behaviour, per-option schemas.

Expected numbers are worked out by hand from DeepSpeed's formulas (deepspeed/runtime/lr_schedules.py),
with t = the 0-based optimizer step the lr is used for: the value right after construction is t = 0,
after k scheduler.step() calls it is t = k. The step_alignment=deepspeed sequences were checked against
DeepSpeed 0.19.8's own classes (tests/unit/test_deepspeed_parity.py does that where DeepSpeed is installed).
"""

from __future__ import annotations

import io
import math
import re
import warnings
from dataclasses import replace

import pytest
import torch
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, ValidationError

from dsrecipes.config.loading import load_config
from dsrecipes.config.store import compose
from dsrecipes.config.validate import to_root, validate_recipe
from dsrecipes.training.optim.lr_scheduler_config import (
    LR_SCHEDULER_SCHEMAS,
    CustomLRSchedulerConfig,
    LRSchedulerConfig,
    StepAlignment,
    WarmupCosineConfig,
    WarmupType,
)
from dsrecipes.training.optim.lr_schedules import (
    LR_SCHEDULERS,
    STEP_ALIGNMENTS,
    WARMUP_TYPES,
    LRRangeTest,
    OneCycle,
    build_lr_scheduler,
    lr_range_test_lr,
    non_closed_form_target,
    one_cycle_lr,
    one_cycle_momentum,
    one_cycle_scale,
    validate_lr_scheduler_config,
    warmup_cosine_ratio,
    warmup_decay_lr,
    warmup_gamma,
    warmup_lr,
)
from tests.helpers.paths import REPO

CONF_DIR = REPO / "conf" / "lr_scheduler"


def make_optimizer(kind: str = "adamw", lrs=(1.0,)) -> torch.optim.Optimizer:
    """A tiny optimizer with one param group per lr in `lrs`."""
    groups = [{"params": [torch.nn.Parameter(torch.zeros(2))], "lr": lr} for lr in lrs]
    if kind == "adamw":
        return torch.optim.AdamW(groups, lr=lrs[0], betas=(0.9, 0.95))
    if kind == "sgd":
        return torch.optim.SGD(groups, lr=lrs[0], momentum=0.5)
    if kind == "adagrad":
        return torch.optim.Adagrad(groups, lr=lrs[0])
    raise ValueError(kind)


def momentum_of(optimizer: torch.optim.Optimizer, group: int = 0) -> float:
    """beta1 for Adam-family optimizers, `momentum` for SGD."""
    g = optimizer.param_groups[group]
    return float(g["betas"][0]) if "betas" in g else float(g["momentum"])


def trace(scheduler, optimizer, steps: int, group: int = 0) -> tuple[list[float], list[float | None]]:
    """(lr, momentum) in the optimizer for t = 0 .. steps-1, stepping as a training loop does."""
    lrs, moms = [], []
    for _ in range(steps):
        assert scheduler.get_last_lr()[group] == optimizer.param_groups[group]["lr"]
        lrs.append(float(optimizer.param_groups[group]["lr"]))
        moms.append(momentum_of(optimizer, group) if ("betas" in optimizer.defaults or "momentum" in optimizer.defaults)
                    else None)
        optimizer.step()  # no grads: a no-op that keeps torch's "scheduler before optimizer" check quiet
        scheduler.step()
    return lrs, moms


def cfg(option: str, **overrides) -> LRSchedulerConfig:
    """The option's schema with its dataclass defaults (what a dict naming it gets), then overrides."""
    return replace(LR_SCHEDULER_SCHEMAS[option](), **overrides)


def custom(target: str, **arguments) -> CustomLRSchedulerConfig:
    """lr_scheduler=custom with _target_ and the class's own arguments (flat, as on the command line)."""
    c = CustomLRSchedulerConfig(_target_=target)
    for key, value in arguments.items():
        setattr(c, key, value)
    return c


def composed(*overrides: str) -> LRSchedulerConfig:
    return to_root(compose(list(overrides))).lr_scheduler


CLOSED_FORM = ("warmup_lr", "warmup_decay_lr", "warmup_cosine", "one_cycle", "lr_range_test", "constant")


# ---------------------------------------------------------------------------------------------
# Pure formulas
# ---------------------------------------------------------------------------------------------


def test_exported_names():
    assert LR_SCHEDULERS == ("warmup_cosine", "warmup_lr", "warmup_decay_lr", "one_cycle", "lr_range_test", "constant",
                             "torch_step", "custom")  # the default first
    assert WARMUP_TYPES == ("linear", "log")
    assert STEP_ALIGNMENTS == ("dsrecipes", "deepspeed")


def test_warmup_gamma_linear_log_and_the_two_step_floor():
    assert [warmup_gamma(t, 4, "linear") for t in range(6)] == pytest.approx([0, 0.25, 0.5, 0.75, 1, 1])
    # log: log(t+1)/log(4): log2/log4 = 0.5, log3/log4 = 0.792481, log4/log4 = 1
    assert [warmup_gamma(t, 4, "log") for t in range(5)] == pytest.approx([0, 0.5, 0.7924812504, 1, 1])
    # N = max(2, warmup_num_steps): 0 and 1 warm up over two steps like DeepSpeed
    for n in (0, 1, 2):
        assert [warmup_gamma(t, n, "linear") for t in range(3)] == pytest.approx([0, 0.5, 1])
    with pytest.raises(ValueError, match="warmup_type='cubic'"):
        warmup_gamma(0, 4, "cubic")


def test_warmup_lr_formula():
    kw = dict(warmup_min_lr=0.1, warmup_max_lr=1.1, warmup_num_steps=4)
    assert [warmup_lr(t, warmup_type="linear", **kw) for t in (0, 1, 2, 3, 4, 50)] == pytest.approx(
        [0.1, 0.35, 0.6, 0.85, 1.1, 1.1]
    )
    assert [warmup_lr(t, warmup_type="log", **kw) for t in (0, 1, 2, 3, 9)] == pytest.approx(
        [0.1, 0.6, 0.8924812504, 1.1, 1.1]
    )


def test_warmup_decay_lr_formula():
    kw = dict(total_num_steps=12, warmup_min_lr=0.0, warmup_max_lr=1.0, warmup_num_steps=4, warmup_type="linear")
    # warmup t/4, then (12 - t) / (12 - 4), floored at 0
    assert [warmup_decay_lr(t, **kw) for t in (0, 2, 4, 6, 8, 10, 12, 15)] == pytest.approx(
        [0, 0.5, 1, 0.75, 0.5, 0.25, 0, 0]
    )
    # the decay ends at warmup_min_lr: 0.2 + 0.8 * 0.5 at t = 8
    assert warmup_decay_lr(8, **(kw | {"warmup_min_lr": 0.2})) == pytest.approx(0.6)
    assert warmup_decay_lr(12, **(kw | {"warmup_min_lr": 0.2})) == pytest.approx(0.2)
    assert warmup_decay_lr(1, **(kw | {"warmup_type": "log"})) == pytest.approx(0.5)


def test_warmup_cosine_ratio_formula():
    kw = dict(total_num_steps=100, warmup_num_steps=10, warmup_min_ratio=0.1, cos_min_ratio=0.01, warmup_type="linear")
    assert warmup_cosine_ratio(0, **kw) == pytest.approx(0.1)
    assert warmup_cosine_ratio(5, **kw) == pytest.approx(0.55)
    # first cosine step: p = 1/90, cos(pi/90) = 0.9993908270
    assert warmup_cosine_ratio(10, **kw) == pytest.approx(0.01 + 0.99 * 0.5 * (1 + 0.9993908270))
    # p = (54 - 10 + 1) / 90 = 0.5: halfway, cos = 0
    assert warmup_cosine_ratio(54, **kw) == pytest.approx(0.505)
    # p reaches 1 at t = T - 1 and is clamped after
    assert warmup_cosine_ratio(99, **kw) == pytest.approx(0.01)
    assert warmup_cosine_ratio(100, **kw) == pytest.approx(0.01)
    assert warmup_cosine_ratio(500, **kw) == pytest.approx(0.01)
    # log warmup: 0.1 + 0.9 * log(5)/log(10) = 0.1 + 0.9 * 0.6989700043
    assert warmup_cosine_ratio(4, **(kw | {"warmup_type": "log"})) == pytest.approx(0.7290730039)


def test_one_cycle_lr_and_momentum_up_down_and_decay():
    kw = dict(cycle_first_step_size=4, decay_step_size=2)
    lr_kw = dict(kw, cycle_min_lr=0.1, cycle_max_lr=1.1, decay_lr_rate=0.5)
    # up: b = t+1 over 4 steps; down: (8 - b)/4; t = 7 ends the cycle at the min; then 0.1 / (1 + 0.5 * t_after / 2)
    expected_lr = [0.35, 0.6, 0.85, 1.1, 0.85, 0.6, 0.35, 0.1, 0.08, 0.1 / 1.5, 0.1 / 1.75, 0.05]
    assert [one_cycle_lr(t, **lr_kw) for t in range(12)] == pytest.approx(expected_lr)
    mom_kw = dict(kw, cycle_min_mom=0.8, cycle_max_mom=0.9)
    expected_mom = [0.875, 0.85, 0.825, 0.8, 0.825, 0.85, 0.875, 0.9, 0.9, 0.9]
    assert [one_cycle_momentum(t, **mom_kw) for t in range(10)] == pytest.approx(expected_mom)
    # DeepSpeed's post-cycle momentum multiplies cycle_max_mom by (1 + rate * t_after / decay_step_size)
    assert one_cycle_momentum(9, **mom_kw, decay_mom_rate=0.05) == pytest.approx(0.9 * 1.05)
    assert one_cycle_momentum(11, **mom_kw, decay_mom_rate=-0.05) == pytest.approx(0.9 * 0.9)
    # no decay without a rate or without a decay_step_size
    assert one_cycle_lr(20, **(lr_kw | {"decay_lr_rate": 0.0})) == pytest.approx(0.1)
    assert one_cycle_lr(20, **(lr_kw | {"decay_step_size": 0})) == pytest.approx(0.1)


def test_one_cycle_asymmetric_halves():
    kw = dict(cycle_first_step_size=2, cycle_second_step_size=6)
    # up 1/2, 2/2; down (8 - b)/6 for b = 3..7; b = 8 closes the cycle
    assert [one_cycle_scale(t, **kw) for t in range(8)] == pytest.approx([0.5, 1, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6, 0])


def test_one_cycle_stairs():
    kw = dict(cycle_first_step_size=4, cycle_first_stair_count=2)
    # 2 stairs per 4-step half: floor(steps_into_half * 2 / 4) / 2
    assert [one_cycle_scale(t, **kw) for t in range(8)] == [0, 0.5, 0.5, 1, 0.5, 0.5, 0, 0]
    lr_kw = dict(kw, cycle_min_lr=0.1, cycle_max_lr=1.1)
    assert [one_cycle_lr(t, **lr_kw) for t in range(8)] == pytest.approx([0.1, 0.6, 0.6, 1.1, 0.6, 0.6, 0.1, 0.1])
    mom_kw = dict(kw, cycle_min_mom=0.8, cycle_max_mom=0.9)
    assert [one_cycle_momentum(t, **mom_kw) for t in range(8)] == pytest.approx(
        [0.9, 0.85, 0.85, 0.8, 0.85, 0.85, 0.9, 0.9]
    )
    # a different stair count for the second half: one stair drops straight back to the min after the peak
    split = dict(cycle_first_step_size=4, cycle_first_stair_count=4, cycle_second_stair_count=1)
    assert [one_cycle_scale(t, **split) for t in range(8)] == [0.25, 0.5, 0.75, 1, 0, 0, 0, 0]


def test_lr_range_test_formula():
    kw = dict(lr_range_test_min_lr=0.01, lr_range_test_step_size=4, lr_range_test_step_rate=2.0)
    # continuous: 0.01 * (1 + 2 * (t+1)/4)
    assert [lr_range_test_lr(t, lr_range_test_staircase=False, **kw) for t in (0, 1, 3, 5)] == pytest.approx(
        [0.015, 0.02, 0.03, 0.04]
    )
    # staircase: 0.01 * (1 + 2 * floor((t+1)/4))
    assert [lr_range_test_lr(t, lr_range_test_staircase=True, **kw) for t in (0, 2, 3, 6, 7)] == pytest.approx(
        [0.01, 0.01, 0.03, 0.03, 0.05]
    )


# ---------------------------------------------------------------------------------------------
# Schedulers driving an optimizer (built from the config, as the engine does)
# ---------------------------------------------------------------------------------------------


def test_every_scheduler_is_a_torch_lr_scheduler():
    configs = [cfg(name) for name in CLOSED_FORM if name != "one_cycle"] + [
        cfg("one_cycle", cycle_min_lr=0.1, cycle_max_lr=1.0), cfg("torch_step", step_size=2),
        custom("torch.optim.lr_scheduler.ExponentialLR", gamma=0.9),
    ]
    for c in configs:
        assert isinstance(build_lr_scheduler(c, make_optimizer(), 2000), torch.optim.lr_scheduler.LRScheduler)


def test_constant_keeps_each_groups_lr():
    opt = make_optimizer(lrs=(1.0, 0.5))
    sched = build_lr_scheduler(cfg("constant"), opt, 10)
    assert trace(sched, opt, 4)[0] == [1.0] * 4
    assert sched.get_last_lr() == [1.0, 0.5]


def test_warmup_lr_scheduler_linear_with_per_group_max():
    opt = make_optimizer(lrs=(1.0, 2.0))
    sched = build_lr_scheduler(cfg("warmup_lr", warmup_num_steps=4, warmup_type="linear", warmup_min_lr=0.0), opt, 10)
    lrs0, _ = trace(sched, opt, 6)
    assert lrs0 == pytest.approx([0, 0.25, 0.5, 0.75, 1, 1])
    assert sched.get_last_lr() == pytest.approx([1.0, 2.0])  # warmup_max_lr null = each group's own lr


def test_warmup_lr_scheduler_log_with_explicit_bounds():
    opt = make_optimizer()
    c = cfg("warmup_lr", warmup_num_steps=4, warmup_type="log", warmup_min_lr=0.1, warmup_max_lr=1.1)
    assert trace(build_lr_scheduler(c, opt, 10), opt, 5)[0] == pytest.approx([0.1, 0.6, 0.8924812504, 1.1, 1.1])


def test_warmup_decay_lr_scheduler_total_defaults_to_max_steps():
    opt = make_optimizer(lrs=(2.0,))
    c = cfg("warmup_decay_lr", warmup_num_steps=4, warmup_type="linear", total_num_steps=None)
    lrs, _ = trace(build_lr_scheduler(c, opt, 12), opt, 16)
    assert lrs[::2] == pytest.approx([0, 1.0, 2.0, 1.5, 1.0, 0.5, 0, 0])
    opt = make_optimizer()
    c = replace(c, total_num_steps=8, warmup_max_lr=0.5)
    assert trace(build_lr_scheduler(c, opt, 1000), opt, 9)[0][4:] == pytest.approx([0.5, 0.375, 0.25, 0.125, 0])


def test_warmup_cosine_scheduler_scales_each_groups_lr():
    opt = make_optimizer(lrs=(1.0, 0.1))
    c = cfg("warmup_cosine", warmup_num_steps=10, warmup_min_ratio=0.1, cos_min_ratio=0.01, warmup_type="linear",
            total_num_steps=100)
    sched = build_lr_scheduler(c, opt, 600)
    lrs, _ = trace(sched, opt, 101)
    assert [lrs[0], lrs[5], lrs[54], lrs[99], lrs[100]] == pytest.approx([0.1, 0.55, 0.505, 0.01, 0.01])
    assert sched.get_last_lr()[1] == pytest.approx(0.001)


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_one_cycle_scheduler_cycles_lr_and_momentum(kind):
    opt = make_optimizer(kind)
    c = cfg("one_cycle", cycle_min_lr=0.1, cycle_max_lr=1.1, cycle_first_step_size=4, decay_step_size=2,
            decay_lr_rate=0.5, cycle_min_mom=0.8, cycle_max_mom=0.9)
    sched = build_lr_scheduler(c, opt, 12)
    lrs, moms = trace(sched, opt, 12)
    assert lrs == pytest.approx([0.35, 0.6, 0.85, 1.1, 0.85, 0.6, 0.35, 0.1, 0.08, 0.1 / 1.5, 0.1 / 1.75, 0.05])
    assert moms == pytest.approx([0.875, 0.85, 0.825, 0.8, 0.825, 0.85, 0.875, 0.9, 0.9, 0.9, 0.9, 0.9])
    assert sched.get_last_momentum() == pytest.approx([0.9])
    if kind == "adamw":
        assert opt.param_groups[0]["betas"][1] == 0.95  # beta2 is the optimizer's own


def test_one_cycle_scheduler_with_stairs_and_momentum_decay():
    opt = make_optimizer("adamw")
    c = cfg("one_cycle", cycle_min_lr=0.1, cycle_max_lr=1.1, cycle_first_step_size=4, cycle_first_stair_count=2,
            decay_step_size=2, decay_mom_rate=0.05, cycle_min_mom=0.8, cycle_max_mom=0.9)
    lrs, moms = trace(build_lr_scheduler(c, opt, 10), opt, 10)
    assert lrs == pytest.approx([0.1, 0.6, 0.6, 1.1, 0.6, 0.6, 0.1, 0.1, 0.1, 0.1])
    assert moms == pytest.approx([0.9, 0.85, 0.85, 0.8, 0.85, 0.85, 0.9, 0.9, 0.9 * 1.025, 0.9 * 1.05])


def test_one_cycle_without_momentum_cycling_leaves_momentum_alone():
    opt = make_optimizer("sgd")
    c = cfg("one_cycle", cycle_min_lr=0.1, cycle_max_lr=1.1, cycle_first_step_size=4, cycle_momentum=False)
    sched = build_lr_scheduler(c, opt, 10)
    lrs, moms = trace(sched, opt, 4)
    assert lrs == pytest.approx([0.35, 0.6, 0.85, 1.1]) and moms == [0.5] * 4
    assert sched.get_last_momentum() is None
    # an optimizer with neither betas nor momentum: lr still cycles, nothing else is touched
    opt = make_optimizer("adagrad")
    sched = OneCycle(opt, 0.1, 1.1, cycle_first_step_size=4)
    assert trace(sched, opt, 2)[0] == pytest.approx([0.35, 0.6])
    assert "betas" not in opt.param_groups[0] and "momentum" not in opt.param_groups[0]


@pytest.mark.parametrize("staircase, expected", [(False, [0.015, 0.02, 0.025, 0.03]), (True, [0.01, 0.01, 0.01, 0.03])])
def test_lr_range_test_scheduler(staircase, expected):
    opt = make_optimizer()
    c = cfg("lr_range_test", lr_range_test_min_lr=0.01, lr_range_test_step_size=4, lr_range_test_step_rate=2.0,
            lr_range_test_staircase=staircase)
    assert trace(build_lr_scheduler(c, opt, 10), opt, 4)[0] == pytest.approx(expected)


def test_torch_step_and_custom_targets_build_torch_schedulers_with_flat_arguments():
    opt = make_optimizer()
    sched = build_lr_scheduler(cfg("torch_step", step_size=2, gamma=0.5), opt, 10)
    assert type(sched) is torch.optim.lr_scheduler.StepLR
    assert trace(sched, opt, 5)[0] == pytest.approx([1.0, 1.0, 0.5, 0.5, 0.25])
    # lr_scheduler=custom lr_scheduler._target_=torch.optim.lr_scheduler.MultiStepLR lr_scheduler.milestones=[1,3]
    c = composed("lr_scheduler=custom", "lr_scheduler._target_=torch.optim.lr_scheduler.MultiStepLR",
                 "lr_scheduler.milestones=[1,3]", "+lr_scheduler.gamma=0.1")
    assert type(c) is CustomLRSchedulerConfig and c.extra_arguments == {"milestones": [1, 3], "gamma": 0.1}
    opt = make_optimizer()
    sched = build_lr_scheduler(c, opt, 10)
    assert type(sched) is torch.optim.lr_scheduler.MultiStepLR
    assert trace(sched, opt, 5)[0] == pytest.approx([1.0, 0.1, 0.1, 0.01, 0.01])
    assert non_closed_form_target(c) == "torch.optim.lr_scheduler.MultiStepLR"
    assert non_closed_form_target(cfg("warmup_cosine")) is None


# ---------------------------------------------------------------------------------------------
# step_alignment: dsrecipes (f(k) at optimizer step k) or deepspeed (placeholder, then f(k - 1))
# ---------------------------------------------------------------------------------------------

# option -> (config, the optimizer's lr, steps, lrs with step_alignment=deepspeed, lrs with the default).
# The deepspeed column is what DeepSpeed 0.19.8's class puts into the optimizer at construction and after
# each step() (run once against deepspeed/runtime/lr_schedules.py): its placeholder, then the default
# column one step late.
ALIGNMENT_CASES = {
    "warmup_lr": (dict(warmup_min_lr=0.1, warmup_max_lr=1.1, warmup_num_steps=4, warmup_type="linear"), 1.0, 6,
                  [0.1, 0.1, 0.35, 0.6, 0.85, 1.1], [0.1, 0.35, 0.6, 0.85, 1.1, 1.1]),
    "warmup_decay_lr": (dict(warmup_min_lr=0.0, warmup_max_lr=1.0, warmup_num_steps=4, warmup_type="linear",
                             total_num_steps=8), 1.0, 10,
                        [0, 0, 0.25, 0.5, 0.75, 1.0, 0.75, 0.5, 0.25, 0], [0, 0.25, 0.5, 0.75, 1.0, 0.75, 0.5, 0.25, 0, 0]),
    # the placeholder is 0, not warmup_min_ratio x lr
    "warmup_cosine": (dict(warmup_min_ratio=0.1, warmup_num_steps=4, cos_min_ratio=0.01, warmup_type="linear",
                           total_num_steps=8), 2.0, 10,
                      [0.0, 0.2, 0.65, 1.1, 1.55, 1.7100357134, 1.01, 0.3099642866, 0.02, 0.02],
                      [0.2, 0.65, 1.1, 1.55, 1.7100357134, 1.01, 0.3099642866, 0.02, 0.02, 0.02]),
    "one_cycle": (dict(cycle_min_lr=0.1, cycle_max_lr=1.1, cycle_first_step_size=4, decay_step_size=2, decay_lr_rate=0.5,
                       cycle_min_mom=0.8, cycle_max_mom=0.9), 1.0, 10,
                  [0.1, 0.35, 0.6, 0.85, 1.1, 0.85, 0.6, 0.35, 0.1, 0.08],
                  [0.35, 0.6, 0.85, 1.1, 0.85, 0.6, 0.35, 0.1, 0.08, 0.1 / 1.5]),
    "lr_range_test": (dict(lr_range_test_min_lr=0.01, lr_range_test_step_size=4, lr_range_test_step_rate=2.0), 1.0, 5,
                      [0.01, 0.015, 0.02, 0.025, 0.03], [0.015, 0.02, 0.025, 0.03, 0.035]),
    # no DeepSpeed counterpart / a torch scheduler (DeepSpeed steps it with torch's convention): the same under both
    "constant": (dict(), 0.3, 4, [0.3] * 4, [0.3] * 4),
    "torch_step": (dict(step_size=2, gamma=0.5), 1.0, 5, [1.0, 1.0, 0.5, 0.5, 0.25], [1.0, 1.0, 0.5, 0.5, 0.25]),
}


@pytest.mark.parametrize("option", list(ALIGNMENT_CASES))
def test_step_alignment_deepspeed_is_deepspeeds_sequence_and_the_default_is_one_step_ahead(option):
    overrides, lr, steps, deepspeed, default = ALIGNMENT_CASES[option]
    for alignment, expected in (("deepspeed", deepspeed), ("dsrecipes", default)):
        opt = make_optimizer(lrs=(lr,))
        c = cfg(option, step_alignment=StepAlignment(alignment), **overrides)
        assert trace(build_lr_scheduler(c, opt, 100), opt, steps)[0] == pytest.approx(expected), alignment


def test_one_cycle_deepspeed_alignment_momentum_starts_at_cycle_min_mom():
    """DeepSpeed's OneCycle writes (cycle_min_mom, 0.99) into betas at construction; then max -> min -> max, one step late."""
    overrides = ALIGNMENT_CASES["one_cycle"][0]
    for kind in ("adamw", "sgd"):  # dsrecipes also cycles SGD's momentum (DeepSpeed does not)
        opt = make_optimizer(kind)
        sched = build_lr_scheduler(cfg("one_cycle", step_alignment=StepAlignment.deepspeed, **overrides), opt, 100)
        assert trace(sched, opt, 10)[1] == pytest.approx([0.8, 0.875, 0.85, 0.825, 0.8, 0.825, 0.85, 0.875, 0.9, 0.9])
    assert opt.param_groups[0]["momentum"] == pytest.approx(0.9)
    adam = make_optimizer("adamw")
    build_lr_scheduler(cfg("one_cycle", step_alignment=StepAlignment.deepspeed, **overrides), adam, 100)
    assert adam.param_groups[0]["betas"] == pytest.approx((0.8, 0.95))  # beta2 stays the optimizer's (DeepSpeed: 0.99)


def test_step_alignment_per_group_and_in_a_custom_option():
    """Each group's own lr under deepspeed alignment; a custom `_target_` naming a dsrecipes schedule gets the key,
    a torch class does not (it would not take it)."""
    opt = make_optimizer(lrs=(1.0, 2.0))
    c = cfg("warmup_lr", warmup_num_steps=2, warmup_type="linear", step_alignment=StepAlignment.deepspeed)
    sched = build_lr_scheduler(c, opt, 10)
    assert [trace(sched, opt, 1, group=1)[0][0], *trace(sched, opt, 3, group=1)[0]] == pytest.approx([0, 0, 1.0, 2.0])
    own = custom("dsrecipes.training.optim.lr_schedules.WarmupLR", warmup_num_steps=4, warmup_type="linear",
                 warmup_min_lr=0.1, warmup_max_lr=1.1)
    own.step_alignment = StepAlignment.deepspeed
    opt = make_optimizer()
    assert trace(build_lr_scheduler(own, opt, 10), opt, 3)[0] == pytest.approx([0.1, 0.1, 0.35])
    foreign = custom("torch.optim.lr_scheduler.ExponentialLR", gamma=0.5)
    foreign.step_alignment = StepAlignment.deepspeed
    opt = make_optimizer()
    assert trace(build_lr_scheduler(foreign, opt, 10), opt, 3)[0] == pytest.approx([1.0, 0.5, 0.25])


@pytest.mark.parametrize("name", sorted(p.stem for p in CONF_DIR.glob("*.yaml")))
def test_step_alignment_is_a_key_of_every_option(name):
    extra = ["lr_scheduler._target_=torch.optim.lr_scheduler.ExponentialLR", "lr_scheduler.gamma=0.99"]
    lr_cfg = composed(f"lr_scheduler={name}", "lr_scheduler.step_alignment=deepspeed", *(extra if name == "custom" else []))
    assert lr_cfg.step_alignment is StepAlignment.deepspeed
    assert composed(f"lr_scheduler={name}", *(extra if name == "custom" else [])).step_alignment is StepAlignment.dsrecipes
    validate_lr_scheduler_config(lr_cfg, 600)


def test_bad_step_alignment_fails_at_composition_naming_the_values():
    with pytest.raises(ConfigCompositionException) as err:
        compose(["lr_scheduler.step_alignment=torch"])
    cause = str(err.value.__cause__)
    assert "Invalid value 'torch', expected one of [dsrecipes, deepspeed]" in cause
    assert "full_key: lr_scheduler.step_alignment" in cause
    root = to_root(load_config({"lr_scheduler": {"name": "warmup_lr", "step_alignment": "deepspeed"}}))
    assert root.lr_scheduler.step_alignment is StepAlignment.deepspeed


@pytest.mark.parametrize(
    "target, arguments, message",
    [
        ("torch.optim.lr_scheduler.NoSuchLR", {}, "lr_scheduler._target_='torch.optim.lr_scheduler.NoSuchLR' cannot be imported"),
        ("no_such_package.schedules.MyLR", {}, "lr_scheduler._target_='no_such_package.schedules.MyLR' cannot be imported"),
        ("StepLR", {}, "lr_scheduler._target_='StepLR' cannot be imported"),
        ("torch.optim.AdamW", {}, "lr_scheduler._target_='torch.optim.AdamW' is not a torch.optim.lr_scheduler"),
        ("torch.optim.lr_scheduler.StepLR", {"stepsize": 2},
         "lr_scheduler.stepsize is not an argument of torch.optim.lr_scheduler.StepLR (lr_scheduler._target_); "
         "it takes: step_size, gamma"),
        ("torch.optim.lr_scheduler.StepLR", {}, "lr_scheduler: torch.optim.lr_scheduler.StepLR cannot be built from "
                                                "these keys: missing a required argument: 'step_size'"),
        ("torch.optim.lr_scheduler.StepLR", {"step_size": 2, "last_epoch": 3}, "lr_scheduler.last_epoch is not allowed"),
    ],
)
def test_bad_target_is_a_clear_error(target, arguments, message):
    c = custom(target, **arguments)
    with pytest.raises(ValueError) as err:
        build_lr_scheduler(c, make_optimizer(), 10)
    assert message in str(err.value)
    with pytest.raises(ValueError, match="lr_scheduler"):
        validate_lr_scheduler_config(c, 10)


def test_misspelled_argument_of_a_custom_class_fails_before_training():
    recipe = compose(["lr_scheduler=custom", "lr_scheduler._target_=torch.optim.lr_scheduler.ExponentialLR",
                      "lr_scheduler.gama=0.99"])
    with pytest.raises(ValueError, match=r"lr_scheduler.gama is not an argument of "
                                         r"torch.optim.lr_scheduler.ExponentialLR \(lr_scheduler._target_\); it takes: gamma"):
        validate_recipe(recipe, dp_world_size=1)
    with pytest.raises(ValueError, match=r"lr_scheduler._target_='\?\?\?' must be set"):
        validate_lr_scheduler_config(CustomLRSchedulerConfig(), 10)


# ---------------------------------------------------------------------------------------------
# Per-option schemas: composition and the dict path
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "option, key, value",
    [("warmup_cosine", "warmup_min_lr", 0.0), ("warmup_lr", "total_num_steps", 100), ("warmup_decay_lr", "cos_min_ratio", 0.1),
     ("one_cycle", "warmup_num_steps", 10), ("lr_range_test", "cycle_min_lr", 1e-4), ("constant", "warmup_num_steps", 10),
     ("torch_step", "milestones", [1, 2])],
)
def test_a_key_the_option_does_not_take_fails_at_composition(option, key, value):
    schema = LR_SCHEDULER_SCHEMAS[option].__name__
    with pytest.raises(ConfigCompositionException) as err:
        compose([f"lr_scheduler={option}", f"lr_scheduler.{key}={value}"])
    cause = str(err.value.__cause__)
    assert f"Key '{key}' not in '{schema}'" in cause and f"full_key: lr_scheduler.{key}" in cause
    with pytest.raises(ConfigKeyError) as err:
        load_config({"lr_scheduler": {"name": option, key: value}})
    assert f"Key '{key}' not in '{schema}'" in str(err.value) and f"full_key: lr_scheduler.{key}" in str(err.value)


def test_dict_path_picks_the_schema_from_name_and_defaults_to_warmup_cosine():
    root = to_root(load_config({"lr_scheduler": {"name": "one_cycle", "cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3}}))
    assert type(root.lr_scheduler) is LR_SCHEDULER_SCHEMAS["one_cycle"] and root.lr_scheduler.cycle_max_lr == 1e-3
    default = to_root(load_config({"lr_scheduler": {"warmup_num_steps": 7}})).lr_scheduler
    assert type(default) is WarmupCosineConfig and default.warmup_num_steps == 7
    with pytest.raises(ConfigKeyError, match="Key 'cycle_min_lr' not in 'WarmupCosineConfig'"):
        load_config({"lr_scheduler": {"cycle_min_lr": 1e-4}})
    with pytest.raises(MissingMandatoryValue, match="lr_scheduler.step_size"):
        to_root(load_config({"lr_scheduler": {"name": "torch_step"}}))  # StepLR needs its step_size


def test_bad_warmup_type_fails_at_composition_naming_key_and_values():
    with pytest.raises(ConfigCompositionException) as err:
        compose(["lr_scheduler=warmup_lr", "lr_scheduler.warmup_type=cubic"])
    cause = str(err.value.__cause__)
    assert "Invalid value 'cubic', expected one of [linear, log]" in cause and "full_key: lr_scheduler.warmup_type" in cause
    with pytest.raises(ValidationError, match=r"Invalid value 'cubic', expected one of \[linear, log\]"):
        load_config({"lr_scheduler": {"name": "warmup_decay_lr", "warmup_type": "cubic"}})
    assert composed("lr_scheduler.warmup_type=log").warmup_type is WarmupType.log


def test_force_added_key_and_a_mismatched_name_are_rejected():
    with pytest.raises(ValueError, match="lr_scheduler.cycle_min_lr is not a key of lr_scheduler option 'warmup_cosine'"):
        validate_recipe(compose(["+lr_scheduler.cycle_min_lr=0.1"]), dp_world_size=1)
    with pytest.raises(ValueError, match="lr_scheduler.name='one_cycle' does not match the option this config was built "
                                         "from, 'warmup_cosine'"):
        validate_lr_scheduler_config(composed("lr_scheduler.name=one_cycle"), 600)


# ---------------------------------------------------------------------------------------------
# state_dict round trips
# ---------------------------------------------------------------------------------------------

ROUND_TRIP_CONFIGS = {
    "constant": cfg("constant"),
    "warmup_lr": cfg("warmup_lr", warmup_num_steps=8, warmup_type="log"),
    "warmup_decay_lr": cfg("warmup_decay_lr", warmup_num_steps=4, warmup_type="linear", total_num_steps=16),
    "warmup_cosine": cfg("warmup_cosine", warmup_num_steps=4, warmup_type="linear", warmup_min_ratio=0.1,
                         total_num_steps=16),
    "one_cycle": cfg("one_cycle", cycle_min_lr=0.1, cycle_max_lr=1.0, cycle_first_step_size=4,
                     cycle_second_step_size=6, cycle_first_stair_count=2, decay_step_size=2, decay_lr_rate=0.5,
                     decay_mom_rate=0.01),
    "lr_range_test": cfg("lr_range_test", lr_range_test_step_size=3, lr_range_test_staircase=True),
    "torch_step": cfg("torch_step", step_size=3, gamma=0.5),
}


def _checkpoint(obj):
    """torch.save + torch.load(weights_only=True), as a checkpoint would store it."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("alignment", list(StepAlignment))
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
@pytest.mark.parametrize("name", list(ROUND_TRIP_CONFIGS))
def test_state_dict_round_trip_continues_identically(name, kind, alignment):
    c = replace(ROUND_TRIP_CONFIGS[name], step_alignment=alignment)
    opt_a = make_optimizer(kind, lrs=(1.0, 0.5))
    sched_a = build_lr_scheduler(c, opt_a, 20)
    trace(sched_a, opt_a, 7)
    opt_state, sched_state = _checkpoint(opt_a.state_dict()), _checkpoint(sched_a.state_dict())

    opt_b = make_optimizer(kind, lrs=(1.0, 0.5))
    sched_b = build_lr_scheduler(c, opt_b, 20)
    opt_b.load_state_dict(opt_state)
    sched_b.load_state_dict(sched_state)
    for group in (0, 1):
        a = trace(sched_a, opt_a, 10, group=group)
        b = trace(sched_b, opt_b, 10, group=group)
        assert a == b


def test_custom_scheduler_state_loads_with_weights_only():
    # list arguments reach the class as plain lists (never ListConfig), so its state_dict is a checkpoint's
    c = custom("torch.optim.lr_scheduler.MultiStepLR", milestones=[2, 4], gamma=0.5)
    opt = make_optimizer()
    sched = build_lr_scheduler(c, opt, 10)
    trace(sched, opt, 3)
    assert _checkpoint(sched.state_dict())["last_epoch"] == 3


@pytest.mark.parametrize("name", [n for n in ROUND_TRIP_CONFIGS if n != "torch_step"])
def test_scheduler_state_alone_restores_lr_and_momentum(name):
    """This module's schedules are closed-form: scheduler state alone puts step t's lr and momentum back."""
    c = ROUND_TRIP_CONFIGS[name]
    opt_a = make_optimizer("adamw")
    sched_a = build_lr_scheduler(c, opt_a, 20)
    trace(sched_a, opt_a, 9)
    opt_b = make_optimizer("adamw")
    sched_b = build_lr_scheduler(c, opt_b, 20)
    sched_b.load_state_dict(_checkpoint(sched_a.state_dict()))
    assert opt_b.param_groups[0]["lr"] == opt_a.param_groups[0]["lr"]
    assert opt_b.param_groups[0]["betas"] == opt_a.param_groups[0]["betas"]
    assert trace(sched_a, opt_a, 8) == trace(sched_b, opt_b, 8)


def test_resume_takes_the_schedule_shape_from_the_config():
    """Like DeepSpeed, the saved state is the progress; a longer total_num_steps applies on resume."""
    short = cfg("warmup_decay_lr", warmup_num_steps=4, warmup_type="linear", total_num_steps=8)
    opt = make_optimizer()
    sched = build_lr_scheduler(short, opt, 100)
    trace(sched, opt, 6)
    state = sched.state_dict()
    assert "hparams" not in state and "step_alignment" not in state and state["last_epoch"] == 6
    resumed = build_lr_scheduler(replace(short, total_num_steps=12), make_optimizer(), 100)
    resumed.load_state_dict(state)
    assert resumed.get_last_lr() == pytest.approx([0.75])  # (12 - 6) / (12 - 4), not (8 - 6) / 4


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------

ONE_CYCLE = dict(cycle_min_lr=1e-4, cycle_max_lr=1e-3, cycle_first_step_size=100)


@pytest.mark.parametrize(
    "option, overrides, max_steps, message",
    [
        ("warmup_lr", dict(warmup_type="cubic"), 600,
         "lr_scheduler.warmup_type='cubic' is not valid; choose one of: linear, log"),  # only from Python
        ("warmup_cosine", dict(warmup_num_steps=-1), 600, "lr_scheduler.warmup_num_steps=-1 must be >= 1"),
        # DeepSpeed: ValueError "warmup_num_steps must be a positive integer, got 0" in all three warmups
        ("warmup_lr", dict(warmup_num_steps=0), 600, "lr_scheduler.warmup_num_steps=0 must be >= 1"),
        ("warmup_decay_lr", dict(warmup_num_steps=0), 600, "lr_scheduler.warmup_num_steps=0 must be >= 1"),
        ("warmup_cosine", dict(warmup_num_steps=0), 600, "lr_scheduler.warmup_num_steps=0 must be >= 1"),
        ("warmup_lr", dict(step_alignment="torch"), 600,
         "lr_scheduler.step_alignment='torch' is not valid; choose one of: dsrecipes, deepspeed"),  # only from Python
        ("warmup_cosine", dict(total_num_steps=0), 600, "lr_scheduler.total_num_steps=0 must be > 0"),
        ("warmup_cosine", dict(cos_min_ratio=1.5), 600, "lr_scheduler.cos_min_ratio=1.5 must be in [0, 1]"),
        ("warmup_lr", dict(warmup_min_lr=-0.1), 600, "lr_scheduler.warmup_min_lr=-0.1 must be >= 0"),
        ("one_cycle", dict(), 600, "lr_scheduler.cycle_min_lr=None must be set for one_cycle"),
        ("one_cycle", dict(cycle_min_lr=1e-4), 600, "lr_scheduler.cycle_max_lr=None must be set for one_cycle"),
        ("one_cycle", ONE_CYCLE | dict(cycle_first_step_size=0), 600, "lr_scheduler.cycle_first_step_size=0 must be > 0"),
        ("one_cycle", ONE_CYCLE | dict(cycle_second_stair_count=-2), 600,
         "lr_scheduler.cycle_second_stair_count=-2 must be >= 0"),
        ("one_cycle", ONE_CYCLE | dict(cycle_second_step_size=-1), 600,
         "lr_scheduler.cycle_second_step_size=-1 must be >= 0"),
        ("one_cycle", ONE_CYCLE | dict(decay_mom_rate=0.1, decay_step_size=10), 600,
         "lr_scheduler.decay_mom_rate=0.1 takes the momentum to"),
        ("one_cycle", ONE_CYCLE | dict(cycle_max_mom=1.0), 600, "lr_scheduler.cycle_max_mom=1.0 must be in [0, 1)"),
        ("lr_range_test", dict(lr_range_test_step_size=0), 600, "lr_scheduler.lr_range_test_step_size=0 must be > 0"),
        ("constant", dict(name="foo"), 600,
         "lr_scheduler.name='foo' does not match the option this config was built from, 'constant' (ConstantConfig); "
         "the options are: warmup_cosine, warmup_lr, warmup_decay_lr, one_cycle, lr_range_test, constant, "
         "torch_step, custom"),
    ],
)
def test_validation_errors_name_key_value_and_choices(option, overrides, max_steps, message):
    c = cfg(option, **overrides)
    with pytest.raises(ValueError) as err:
        validate_lr_scheduler_config(c, max_steps)
    assert message in str(err.value)
    with pytest.raises(ValueError) as err:
        build_lr_scheduler(c, make_optimizer(), max_steps)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "option, overrides, max_steps, message",
    [
        # DeepSpeed logs "total_num_steps 30 is less than warmup_num_steps 50" and runs
        ("warmup_decay_lr", dict(warmup_num_steps=50), 30,
         "lr_scheduler.total_num_steps=None (null = max_steps=30) is less than lr_scheduler.warmup_num_steps=50"),
        # DeepSpeed skips the post-cycle decay when decay_step_size is 0
        ("one_cycle", ONE_CYCLE | dict(decay_lr_rate=0.1), 600,
         "lr_scheduler.decay_lr_rate=0.1 is ignored with lr_scheduler.decay_step_size=0"),
        ("one_cycle", ONE_CYCLE | dict(decay_mom_rate=0.01), 600,
         "lr_scheduler.decay_mom_rate=0.01 is ignored with lr_scheduler.decay_step_size=0"),
    ],
)
def test_what_deepspeed_accepts_is_accepted_with_a_warning(option, overrides, max_steps, message):
    c = cfg(option, **overrides)
    with pytest.warns(UserWarning, match=re.escape(message)):
        validate_lr_scheduler_config(c, max_steps)
    with pytest.warns(UserWarning):
        build_lr_scheduler(c, make_optimizer(), max_steps)


def test_warmup_decay_lr_total_below_warmup_runs_like_deepspeed():
    """T=3 < N=5: the linear warmup, then straight to warmup_min_lr (DeepSpeed 0.19.8: [0, 0.2, ..., 0.8, 0, 0])."""
    opt = make_optimizer()
    c = cfg("warmup_decay_lr", warmup_num_steps=5, warmup_type="linear", warmup_max_lr=1.0, total_num_steps=3)
    with pytest.warns(UserWarning, match="less than"):
        sched = build_lr_scheduler(c, opt, 100)
    assert trace(sched, opt, 7)[0] == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8, 0.0, 0.0])
    # total == warmup (rejected before, as DeepSpeed silent): no warning, the lr is at the floor from t = N on
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        validate_lr_scheduler_config(replace(c, total_num_steps=5), 100)


def test_one_cycle_second_step_size_zero_is_accepted_like_deepspeed():
    """DeepSpeed 0.19.8 validates cycle_second_step_size >= 0: with 0 the lr climbs, then drops straight back."""
    opt = make_optimizer()
    c = cfg("one_cycle", cycle_min_lr=0.1, cycle_max_lr=1.1, cycle_first_step_size=4, cycle_second_step_size=0,
            cycle_momentum=False)
    validate_lr_scheduler_config(c, 100)
    assert trace(build_lr_scheduler(c, opt, 100), opt, 6)[0] == pytest.approx([0.35, 0.6, 0.85, 0.1, 0.1, 0.1])


def test_validation_prefix_and_valid_configs():
    with pytest.raises(ValueError, match=r"engine\.lr_scheduler\.warmup_num_steps=-1"):
        validate_lr_scheduler_config(cfg("warmup_lr", warmup_num_steps=-1), 600, prefix="engine.lr_scheduler")
    for name in ("warmup_cosine", "warmup_lr", "lr_range_test", "constant"):
        validate_lr_scheduler_config(cfg(name), 600)  # the schemas' defaults are valid
    validate_lr_scheduler_config(cfg("one_cycle", **ONE_CYCLE, decay_mom_rate=-0.01, decay_step_size=100), 600)  # shrinks
    validate_lr_scheduler_config(cfg("warmup_lr", warmup_num_steps=1), 600)  # 1 is DeepSpeed's smallest (acts as 2)
    validate_lr_scheduler_config(cfg("warmup_cosine", warmup_num_steps=50, total_num_steps=10), 600)  # as DeepSpeed
    validate_lr_scheduler_config(custom("torch.optim.lr_scheduler.StepLR", step_size=5), 600)


# ---------------------------------------------------------------------------------------------
# conf/lr_scheduler/*.yaml
# ---------------------------------------------------------------------------------------------


def test_option_files_exist():
    names = {p.stem for p in CONF_DIR.glob("*.yaml")}
    assert names == set(LR_SCHEDULERS)
    for path in CONF_DIR.glob("*.yaml"):
        text = path.read_text()
        assert text.startswith("# "), f"{path.name} should open with a comment saying what it is"
        assert f"- {path.stem}_schema" in text, f"{path.name} should extend {path.stem}_schema in its defaults list"


@pytest.mark.parametrize("name", sorted(p.stem for p in CONF_DIR.glob("*.yaml")))
def test_every_option_file_composes_and_builds(name):
    extra = ["lr_scheduler._target_=torch.optim.lr_scheduler.ExponentialLR", "lr_scheduler.gamma=0.99"]
    lr_cfg = composed(f"lr_scheduler={name}", *(extra if name == "custom" else []))
    assert type(lr_cfg) is LR_SCHEDULER_SCHEMAS[name]
    validate_lr_scheduler_config(lr_cfg, 600)
    opt = make_optimizer()
    sched = build_lr_scheduler(lr_cfg, opt, 600)
    lrs, moms = trace(sched, opt, 600)
    assert all(math.isfinite(lr) and lr >= 0 for lr in lrs)
    assert all(0 <= m < 1 for m in moms)


def test_default_recipe_keeps_warmup_cosine():
    lr_cfg = composed()
    assert (lr_cfg.name, lr_cfg.warmup_num_steps, lr_cfg.warmup_type, lr_cfg.cos_min_ratio) == (
        "warmup_cosine", 50, "linear", 0.1
    )


def test_lr_range_test_class_directly():
    opt = make_optimizer()
    sched = LRRangeTest(opt, lr_range_test_min_lr=0.01, lr_range_test_step_size=4, lr_range_test_step_rate=2.0)
    assert sched.get_last_lr() == pytest.approx([0.015])
