"""Curriculum pacing functions and the sequence-length batch hook (dsrecipes.data_efficiency)."""

from __future__ import annotations

import warnings

import pytest
import torch

from dsrecipes.data_efficiency import CurriculumConfig, CurriculumScheduler, SeqlenCurriculum


def linear(**kw) -> CurriculumScheduler:
    base = dict(min_difficulty=8, max_difficulty=1024, schedule_type="fixed_linear",
                total_curriculum_step=100, difficulty_step=8)
    base.update(kw)
    return CurriculumScheduler(CurriculumConfig(**base))


# --------------------------------------------------------------------------- pacing functions


def test_fixed_linear_hand_computed():
    s = linear()
    # d = floor(s/100 * 1016 + 8), rounded down to a multiple of 8, clamped to [8, 1024]
    expected = {0: 8, 1: 16, 50: 512, 99: 1008, 100: 1024, 200: 1024}
    # 1: 18.16 -> 18 -> 16;  50: 516 -> 512;  99: 1013.84 -> 1013 -> 1008;  200: 2040 -> clamp 1024
    assert {step: s.get_difficulty(step) for step in expected} == expected


def test_fixed_linear_lower_bound_is_the_first_multiple_of_difficulty_step_at_or_above_min():
    # DeepSpeed's floor: ceil(min / step) * step. min=5, step=8: 5 -> 0 -> raised to 8 (not 5).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = linear(min_difficulty=5, max_difficulty=100, total_curriculum_step=10)
    assert s.get_difficulty(0) == 8       # 5 -> 0 -> floor 8
    assert s.get_difficulty(1) == 8       # 14.5 -> 14 -> 8
    assert s.get_difficulty(5) == 48      # 52.5 -> 52 -> 48
    assert s.get_difficulty(10) == 96     # 100 -> 96 (max is not a multiple of 8, so not reached at T)
    assert s.get_difficulty(20) == 100    # 195 -> 192 -> cap 100: the cap wins over the multiple
    assert s.get_current_difficulty() == 5  # before the first update: min_difficulty as configured


def test_fixed_linear_min_10_step_8_starts_at_16():
    s = linear(min_difficulty=10, max_difficulty=100, total_curriculum_step=9)
    # d = floor(s/9 * 90 + 10) = 10 s + 10, rounded down to a multiple of 8, at least 16, at most 100
    assert [s.get_difficulty(i) for i in range(11)] == [16, 16, 24, 40, 48, 56, 64, 80, 88, 96, 100]
    assert s.update_difficulty(0) == 16


def test_fixed_linear_floor_above_max_gives_max_everywhere():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = linear(min_difficulty=10, max_difficulty=12, difficulty_step=8, total_curriculum_step=4)
    assert [s.get_difficulty(i) for i in range(6)] == [12] * 6  # floor 16 is capped to 12


def test_fixed_root_lower_bound_and_cap():
    s = linear(schedule_type="fixed_root", root_degree=2, min_difficulty=20, max_difficulty=200,
               difficulty_step=16, total_curriculum_step=100)
    # d = floor(sqrt(s/100) * 180 + 20), rounded down to a multiple of 16, at least 32, at most 200
    assert s.get_difficulty(0) == 32      # 20 -> 16 -> floor 32
    assert s.get_difficulty(1) == 32      # 38 -> 32
    assert s.get_difficulty(4) == 48      # 56 -> 48
    assert s.get_difficulty(81) == 176    # 182 -> 176
    assert s.get_difficulty(100) == 192   # 200 -> 192
    assert s.get_difficulty(121) == 200   # 218 -> 208 -> cap 200


def test_fixed_root_hand_computed():
    s = linear(schedule_type="fixed_root", root_degree=2)
    # d = floor(sqrt(s/100) * 1016 + 8) rounded down to a multiple of 8
    assert s.get_difficulty(0) == 8
    assert s.get_difficulty(1) == 104     # 0.1 -> 109.6 -> 109 -> 104
    assert s.get_difficulty(4) == 208     # 0.2 -> 211.2 -> 211 -> 208
    assert s.get_difficulty(25) == 512    # 0.5 -> 516 -> 512
    assert s.get_difficulty(100) == 1024
    assert s.get_difficulty(400) == 1024  # 2.0 -> 2040 -> clamp
    cube = linear(schedule_type="fixed_root", root_degree=3, total_curriculum_step=1000)
    assert cube.get_difficulty(8) == 208  # 0.008^(1/3) = 0.2 -> 211.2 -> 208
    one = linear(schedule_type="fixed_root", root_degree=1)
    ref = linear()
    assert [one.get_difficulty(i) for i in range(0, 120, 7)] == [ref.get_difficulty(i) for i in range(0, 120, 7)]


def test_fixed_linear_monotone_and_multiple_of_step():
    s = linear(min_difficulty=16, max_difficulty=512, difficulty_step=16, total_curriculum_step=37)
    values = [s.get_difficulty(i) for i in range(60)]
    assert values == sorted(values)
    assert all(v % 16 == 0 and 16 <= v <= 512 for v in values)
    assert values[0] == 16 and values[-1] == 512


def test_fixed_discrete_boundaries():
    s = CurriculumScheduler(CurriculumConfig(min_difficulty=1, max_difficulty=3, schedule_type="fixed_discrete",
                                             difficulty=[1, 2, 3], max_step=[5, 10]))
    got = {i: s.get_difficulty(i) for i in (0, 5, 6, 10, 11, 1000)}
    assert got == {0: 1, 5: 1, 6: 2, 10: 2, 11: 3, 1000: 3}


def test_fixed_discrete_values_are_used_as_given():
    # DeepSpeed neither rounds nor clamps fixed_discrete difficulties to [min, max]
    s = CurriculumScheduler(CurriculumConfig(min_difficulty=4, max_difficulty=8, schedule_type="fixed_discrete",
                                             difficulty=[3, 7, 9], max_step=[2, 4]))
    assert [s.get_difficulty(i) for i in range(7)] == [3, 3, 3, 7, 7, 9, 9]


def test_update_difficulty_only_advances_below_max():
    s = CurriculumScheduler(CurriculumConfig(min_difficulty=1, max_difficulty=3, schedule_type="fixed_discrete",
                                             difficulty=[1, 2, 3], max_step=[5, 10]))
    assert s.get_current_difficulty() == 1
    assert s.update_difficulty(6) == 2
    assert s.update_difficulty(0) == 1          # below max: recomputed, even backwards
    assert s.update_difficulty(11) == 3
    assert s.update_difficulty(0) == 3          # at max: frozen (DeepSpeed semantics)
    assert s.get_difficulty(0) == 1             # get_difficulty stays pure


def _double(step):
    return 2 * step + 1


def test_custom_callable_and_import_path(tmp_path, monkeypatch):
    cfg = CurriculumConfig(min_difficulty=0, max_difficulty=100, schedule_type="custom", custom_fn=_double)
    s = CurriculumScheduler(cfg)
    assert [s.get_difficulty(i) for i in (0, 3, 10)] == [1, 7, 21]
    assert s.update_difficulty(4) == 9

    s = CurriculumScheduler(CurriculumConfig(min_difficulty=0, max_difficulty=100, schedule_type="custom",
                                             custom_fn="math:isqrt"))
    assert [s.get_difficulty(i) for i in (0, 15, 16, 99)] == [0, 3, 4, 9]

    (tmp_path / "my_curriculum_mod.py").write_text("def pace(step):\n    return 8 * step\n\n"
                                                    "class Sched:\n    pace = staticmethod(pace)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for path in ("my_curriculum_mod:Sched.pace", "my_curriculum_mod:pace", "my_curriculum_mod.pace"):
        s = CurriculumScheduler(CurriculumConfig(min_difficulty=0, max_difficulty=64, schedule_type="custom",
                                                 custom_fn=path))
        assert s.get_difficulty(3) == 24

    s.set_custom_get_difficulty(lambda step: 5)
    assert s.get_difficulty(123) == 5


def test_from_dict_accepts_deepspeed_nested_block():
    block = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 8, "max_difficulty": 1024,
             "schedule_type": "fixed_root",
             "schedule_config": {"total_curriculum_step": 100, "difficulty_step": 8, "root_degree": 2}}
    s = CurriculumScheduler(block)
    assert s.cfg.root_degree == 2 and s.get_difficulty(25) == 512
    with pytest.raises(ValueError, match="bogus"):
        CurriculumConfig.from_dict({**block, "bogus": 1})


# --------------------------------------------------------------------------- state


def test_state_dict_round_trip_continues_identically():
    a = linear(schedule_type="fixed_root", root_degree=2, total_curriculum_step=60)
    for step in range(1, 21):
        a.update_difficulty(step)
    state = a.state_dict()
    assert state["current_difficulty"] == a.get_current_difficulty() and state["step"] == 20

    b = linear(schedule_type="fixed_root", root_degree=2, total_curriculum_step=60)
    b.load_state_dict(state)
    assert b.get_current_difficulty() == a.get_current_difficulty() and b.step == 20
    assert [a.update_difficulty(i) for i in range(21, 80)] == [b.update_difficulty(i) for i in range(21, 80)]

    # A checkpoint taken at max difficulty stays frozen after loading.
    frozen = linear()
    frozen.load_state_dict({"current_difficulty": 1024, "step": 500})
    assert frozen.update_difficulty(1) == 1024


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("kw, needle", [
    (dict(schedule_type="cosine"), r"schedule_type='cosine'.*fixed_linear.*fixed_root.*fixed_discrete.*custom"),
    (dict(min_difficulty=2048), r"min_difficulty=2048.*max_difficulty=1024"),
    (dict(total_curriculum_step=None), r"total_curriculum_step=None: required"),
    (dict(total_curriculum_step=0), r"total_curriculum_step=0"),
    (dict(difficulty_step=0), r"difficulty_step=0"),
    (dict(difficulty_step=None), r"difficulty_step=None: required"),
    (dict(schedule_type="fixed_root"), r"root_degree=None: required"),
    (dict(schedule_type="fixed_root", root_degree=0), r"root_degree=0"),
    (dict(schedule_type="fixed_discrete", difficulty=[1, 2], max_step=[5, 10]), r"len\(difficulty\)"),
    (dict(schedule_type="fixed_discrete", difficulty=[1, 2, 3], max_step=[10, 5]), r"max_step=\[10, 5\]"),
    (dict(schedule_type="fixed_discrete", difficulty=[], max_step=[]), r"difficulty=\[\]"),
    (dict(schedule_type="fixed_discrete", max_step=[5]), r"difficulty=None: required"),
    (dict(schedule_type="custom"), r"custom_fn=None: required"),
    (dict(schedule_type="custom", custom_fn="no_such_module_xyz:fn"), r"no_such_module_xyz"),
    (dict(schedule_type="custom", custom_fn="math:no_such_fn"), r"no_such_fn"),
    (dict(schedule_type="custom", custom_fn="math:pi"), r"not callable"),
    (dict(min_difficulty=8.5), r"min_difficulty=8.5"),
])
def test_validation_errors(kw, needle):
    with pytest.raises(ValueError, match=needle):
        linear(**kw)


def test_difficulty_step_not_multiple_of_8_warns_only():
    with pytest.warns(UserWarning, match="difficulty_step=5"):
        s = linear(difficulty_step=5)
    assert s.get_difficulty(50) == 515   # 516 -> 515
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        linear(difficulty_step=16)
        # no warning for discrete/custom schedules either
        CurriculumScheduler(CurriculumConfig(min_difficulty=1, max_difficulty=3, schedule_type="fixed_discrete",
                                             difficulty=[1, 3], max_step=[2]))


def test_negative_step_rejected():
    with pytest.raises(ValueError, match="step=-1"):
        linear().get_difficulty(-1)


# --------------------------------------------------------------------------- seqlen hook


def _batch(b=2, t=16):
    ids = torch.arange(b * t).reshape(b, t)
    return {"input_ids": ids, "labels": ids + 1000, "attention_mask": torch.ones(b, t), "meta": "keep-me"}


@pytest.mark.filterwarnings("ignore:difficulty_step=4")
def test_seqlen_hook_truncates_and_counts_tokens():
    sched = linear(min_difficulty=4, max_difficulty=16, total_curriculum_step=4, difficulty_step=4)
    hook = SeqlenCurriculum(sched)
    batch = _batch()
    expected = {0: 4, 1: 4, 2: 8, 3: 12, 4: 16}   # 0.25*12+4 = 7 -> 4; 10 -> 8; 13 -> 12; 16
    kept = saved = 0
    for step, length in expected.items():
        out = hook(batch, step)
        assert out["input_ids"].shape == (2, length) and out["labels"].shape == (2, length)
        assert torch.equal(out["input_ids"], batch["input_ids"][:, :length])
        assert torch.equal(out["labels"], batch["labels"][:, :length])
        assert out["input_ids"].is_contiguous()
        assert out["attention_mask"] is batch["attention_mask"] and out["meta"] == "keep-me"
        kept += 2 * length
        saved += 2 * (16 - length)
        assert hook.metrics() == {"data/difficulty": length, "data/kept_tokens": kept, "data/tokens_saved": saved}
    assert (kept, saved) == (88, 72)
    assert batch["input_ids"].shape == (2, 16)     # input batch not modified in place


def test_seqlen_hook_short_batch_and_custom_keys():
    sched = linear(min_difficulty=8, max_difficulty=32, total_curriculum_step=10, difficulty_step=8)
    hook = SeqlenCurriculum(sched, keys=("input_ids", "labels", "attention_mask"))
    out = hook(_batch(b=3, t=6), 0)          # difficulty 8 >= T=6: nothing cut
    assert out["input_ids"].shape == (3, 6)
    assert hook.metrics() == {"data/difficulty": 8, "data/kept_tokens": 18, "data/tokens_saved": 0}
    out = hook(_batch(b=1, t=32), 0)
    assert out["attention_mask"].shape == (1, 8)
    assert hook.metrics()["data/tokens_saved"] == 24


@pytest.mark.filterwarnings("ignore:difficulty_step=4")
def test_seqlen_hook_state_and_errors():
    make = lambda: SeqlenCurriculum(linear(min_difficulty=4, max_difficulty=16, total_curriculum_step=4,  # noqa: E731
                                           difficulty_step=4))
    a = make()
    a(_batch(), 1)
    a(_batch(), 2)
    b = make()
    b.load_state_dict(a.state_dict())
    assert b.metrics() == a.metrics()
    assert b(_batch(), 3)["input_ids"].shape == a(_batch(), 3)["input_ids"].shape
    assert b.metrics() == a.metrics()

    with pytest.raises(ValueError, match=r"mode='pad'.*truncate"):
        SeqlenCurriculum(linear(), mode="pad")
    with pytest.raises(ValueError, match="input_ids"):
        make()({"input_ids": torch.zeros(2, 3, 4)}, 0)
    with pytest.raises(ValueError, match="labels"):
        make()({"input_ids": torch.zeros(2, 8), "labels": torch.zeros(2, 7)}, 0)
