"""DeepSpeed's dynamic loss scaler against hand-computed scale sequences."""

import pytest

from dsrecipes.training.config import PrecisionConfig
from dsrecipes.training.loss_scaler import DynamicLossScaler, LossScaleAtMinimumError, StaticLossScaler, build_loss_scaler


def run(scaler, overflows):
    scales = []
    for overflow in overflows:
        scaler.update_scale(overflow)
        scales.append(scaler.loss_scale)
    return scales


def test_growth_after_the_window():
    # DeepSpeed's unit test: initial_scale_power=8, window 2 -> the scale doubles every 2 clean iterations,
    # first on the 3rd update (cur_iter == window).
    scaler = DynamicLossScaler(init_scale=2**8, scale_window=2, delayed_shift=1)
    assert run(scaler, [False] * 6) == [256, 256, 512, 512, 1024, 1024]
    assert scaler.cur_iter == 6


def test_default_window_first_growth_on_update_1001():
    scaler = DynamicLossScaler(init_scale=2**16, scale_window=1000)
    scales = run(scaler, [False] * 1001)
    assert scales[999] == 2**16 and scales[1000] == 2**17


def test_all_overflow_halves_down_to_min_without_hysteresis():
    scaler = DynamicLossScaler(init_scale=2**4, scale_window=2, delayed_shift=1, min_scale=1, raise_error_at_min_scale=False)
    with pytest.warns(UserWarning, match="already at its minimum"):
        assert run(scaler, [True] * 6) == [8, 4, 2, 1, 1, 1]


def test_hysteresis_delays_the_first_halving_only():
    # hysteresis 2: the first overflow only spends hysteresis; later ones halve until the next growth.
    scaler = DynamicLossScaler(init_scale=2**10, scale_window=3, delayed_shift=2)
    assert run(scaler, [True, True, True]) == [1024, 512, 256]
    # growth after 3 clean iterations since the last overflow refills hysteresis ...
    assert run(scaler, [False, False, False, False]) == [256, 256, 256, 512]
    # ... so the next overflow is tolerated again
    assert run(scaler, [True, True]) == [512, 256]


def test_consecutive_hysteresis_refills_on_every_clean_iteration():
    scaler = DynamicLossScaler(init_scale=2**10, scale_window=100, delayed_shift=2, consecutive_hysteresis=True)
    assert run(scaler, [True, False, True, False, True]) == [1024] * 5
    assert run(scaler, [True, True]) == [512, 256]  # hysteresis was left at 1 by the last overflow


def test_growth_counts_from_the_last_overflow():
    scaler = DynamicLossScaler(init_scale=2**10, scale_window=2, delayed_shift=1)
    # overflow at iter 0 -> 512; clean iters 1,2 (stable 0,1); iter 3 stable 2 -> growth
    assert run(scaler, [True, False, False, False, False, False]) == [512, 512, 512, 1024, 1024, 2048]


def test_min_scale_raises_by_default():
    scaler = DynamicLossScaler(init_scale=2, scale_window=10, delayed_shift=1, min_scale=1)
    scaler.update_scale(True)
    assert scaler.loss_scale == 1
    with pytest.raises(LossScaleAtMinimumError, match="minimum"):
        scaler.update_scale(True)


def test_static_scale_never_moves():
    scaler = StaticLossScaler(128.0)
    assert run(scaler, [True, False, True]) == [128.0] * 3


def test_state_dict_round_trip():
    a = DynamicLossScaler(init_scale=2**10, scale_window=2)
    run(a, [True, False, False])
    b = DynamicLossScaler(init_scale=2**10, scale_window=2)
    b.load_state_dict(a.state_dict())
    seq = [False, True, True, False, False, False]
    assert run(a, seq) == run(b, seq)


def test_build_from_config():
    assert build_loss_scaler(PrecisionConfig(dtype="bf16")) is None
    static = build_loss_scaler(PrecisionConfig(dtype="fp16", loss_scale=1024))
    assert isinstance(static, StaticLossScaler) and static.loss_scale == 1024
    dynamic = build_loss_scaler(PrecisionConfig(dtype="fp16", initial_scale_power=12, hysteresis=3))
    assert dynamic.loss_scale == 2**12 and dynamic.delayed_shift == 3 and dynamic.scale_window == 1000
