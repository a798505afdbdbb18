"""dsrecipes against DeepSpeed's own functions, where DeepSpeed is installed (the optional `parity` oracle).

Three behaviours of issue 17, each compared with the DeepSpeed function that defines it:

* MoE top-1 gating without random token selection: `deepspeed.moe.sharded_moe.top1gating(use_rts=False)`
  keeps the tokens torch.topk picks among tied candidates; the kept tokens, their slots and weights must
  be the same (the whole [S, E, C] combine tensor, exactly).
* Curriculum pacing: `deepspeed.runtime.data_pipeline.curriculum_scheduler.CurriculumScheduler` at every
  step, fixed_linear / fixed_root / fixed_discrete (the lower bound ceil(min / step) * step arrived in
  DeepSpeed 0.19.7; older releases are skipped).
* Compression-training weight quantizers: `deepspeed.compression.utils.SymQuantizer` / `AsymQuantizer`
  bit for bit. DeepSpeed 0.19.7 removed its compression library, so those two tests run only with
  deepspeed<=0.19.6 installed; the symmetric grid is also checked against 0.19.8's surviving copy of the
  same formula, `deepspeed.module_inject.replace_module.GroupQuantizer` (codes and scales).

Runs on CPU in a few seconds, most of it DeepSpeed's import. Without DeepSpeed the module is skipped;
the same behaviours are held without it by hard-coded cases in test_moe.py, test_curriculum.py and
test_compression*.py.
"""

from __future__ import annotations

import warnings

import pytest
import torch

deepspeed = pytest.importorskip("deepspeed")

from dsrecipes.compression import fake_quantize, quantize_codes  # noqa: E402
from dsrecipes.data_efficiency import CurriculumConfig, CurriculumScheduler  # noqa: E402
from packaging.version import Version  # noqa: E402  (a DeepSpeed dependency)

from dsrecipes.models.moe_dispatch import combine_weights  # noqa: E402
from dsrecipes.models.moe_gating import top1_gating  # noqa: E402

DS_VERSION = Version(deepspeed.__version__)


# ------------------------------------------------------------------------------------- top-1 gating


def _gating_cases():
    """(S, E, capacity_factor, min_capacity, logits kind): capacities 1..S, both of torch.topk's CPU
    regimes (nth_element when 64 * capacity > S, partial sort otherwise), balanced and skewed routing."""
    cases = []
    for num_tokens in (4, 8, 16, 33, 64, 256):
        for num_experts in (2, 4, 8):
            for capacity_factor in (0.0625, 0.25, 0.5, 1.0, 2.0):
                for kind in ("random", "skewed"):
                    cases.append((num_tokens, num_experts, capacity_factor, 1, kind))
    return cases


def _router_logits(num_tokens, num_experts, kind, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_tokens, num_experts, generator=g)
    if kind == "skewed":  # most tokens prefer expert 0: long queues of tied candidates
        logits[:, 0] += 2.0
    return logits


def test_top1_without_rts_keeps_deepspeeds_tokens():
    from deepspeed.moe.sharded_moe import top1gating

    cases = _gating_cases()
    dropping = partial_sort = 0
    for i, (num_tokens, num_experts, factor, min_cap, kind) in enumerate(cases):
        logits = _router_logits(num_tokens, num_experts, kind, seed=i)
        aux, ds_combine, _, ds_counts = top1gating(logits.clone(), factor, min_cap, use_rts=False)
        ours = top1_gating(logits.clone(), factor, min_cap, drop_tokens=True, use_rts=False)
        where = f"S={num_tokens} E={num_experts} capacity_factor={factor} {kind}"
        assert ours.capacity == ds_combine.shape[-1], where
        assert torch.equal(combine_weights(ours), ds_combine), where
        assert torch.equal(ours.expert_counts, ds_counts), where
        torch.testing.assert_close(ours.aux_loss, aux, rtol=0, atol=0, msg=where)
        dropping += int(ours.dropped) > 0
        partial_sort += 64 * ours.capacity <= num_tokens
    assert len(cases) >= 100 and dropping >= len(cases) // 3  # the capacity limit really bites
    assert partial_sort >= 4


# ------------------------------------------------------------------------------------- curriculum


def _ds_curriculum(cfg: dict):
    from deepspeed.runtime.data_pipeline.curriculum_scheduler import CurriculumScheduler as DSCurriculum

    schedule = {k: v for k, v in cfg.items() if k not in ("min_difficulty", "max_difficulty", "schedule_type")}
    return DSCurriculum({"min_difficulty": cfg["min_difficulty"], "max_difficulty": cfg["max_difficulty"],
                         "schedule_type": cfg["schedule_type"], "schedule_config": schedule})


CURRICULA = [
    dict(schedule_type="fixed_linear", min_difficulty=8, max_difficulty=1024, total_curriculum_step=100,
         difficulty_step=8),
    dict(schedule_type="fixed_linear", min_difficulty=10, max_difficulty=100, total_curriculum_step=37,
         difficulty_step=8),  # min not a multiple of the step: starts at 16
    dict(schedule_type="fixed_linear", min_difficulty=5, max_difficulty=100, total_curriculum_step=10,
         difficulty_step=8),  # max not a multiple of the step either
    dict(schedule_type="fixed_linear", min_difficulty=10, max_difficulty=12, total_curriculum_step=5,
         difficulty_step=8),  # the floor (16) is above max
    dict(schedule_type="fixed_linear", min_difficulty=1, max_difficulty=100, total_curriculum_step=13,
         difficulty_step=1),
    dict(schedule_type="fixed_root", min_difficulty=8, max_difficulty=256, total_curriculum_step=50,
         difficulty_step=8, root_degree=2),
    dict(schedule_type="fixed_root", min_difficulty=20, max_difficulty=2048, total_curriculum_step=300,
         difficulty_step=64, root_degree=3),
    dict(schedule_type="fixed_root", min_difficulty=3, max_difficulty=77, total_curriculum_step=40,
         difficulty_step=16, root_degree=1.5),
    dict(schedule_type="fixed_discrete", min_difficulty=1, max_difficulty=3, difficulty=[1, 2, 3],
         max_step=[5, 10]),
    dict(schedule_type="fixed_discrete", min_difficulty=4, max_difficulty=8, difficulty=[3, 7, 9, 8],
         max_step=[2, 4, 30]),  # values used as given, even outside [min, max]
]


@pytest.mark.skipif(DS_VERSION < Version("0.19.7"), reason="DeepSpeed clamps the curriculum's lower bound "
                    "to ceil(min / step) * step since 0.19.7")
@pytest.mark.parametrize("cfg", CURRICULA, ids=lambda c: f"{c['schedule_type']}-{c['min_difficulty']}-"
                                                         f"{c['max_difficulty']}")
def test_curriculum_difficulty_at_every_step_matches_deepspeed(cfg):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the multiple-of-8 advice
        ours = CurriculumScheduler(CurriculumConfig(**cfg))
        theirs = _ds_curriculum(cfg)
    horizon = cfg.get("total_curriculum_step", max(cfg.get("max_step", [0])))
    steps = range(0, 2 * horizon + 3)
    assert [ours.get_difficulty(s) for s in steps] == [theirs.get_difficulty(s) for s in steps]
    # update_difficulty: advances only while below max, as DeepSpeed's does (a walk with a step back)
    walk = list(steps)[::3] + [0, 1]
    assert [ours.update_difficulty(s) for s in walk] == [theirs.update_difficulty(s) for s in walk]


# ------------------------------------------------------------------------------------- quantizers


QUANT_CASES = [(bits, groups) for bits in (4, 8) for groups in (1, 2, 8, 32)]


def _weight(seed: int, shift: float = 0.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(32, 48, generator=g) * 0.05 + shift


@pytest.mark.parametrize("bits,groups", QUANT_CASES)
def test_symmetric_codes_match_deepspeeds_group_quantizer(bits, groups):
    from deepspeed.module_inject.replace_module import GroupQuantizer

    w = _weight(bits + groups)
    ds_codes = GroupQuantizer(q_int8=True, num_bits=bits, num_groups=groups).quantize(w.clone())
    ds_scale = ds_codes.scale.reshape(-1)[:groups]  # its first `groups` entries are the whole weight's scales
    ours = quantize_codes(w, bits, True, groups)
    assert torch.equal(ours.q.reshape(w.shape).to(torch.int8), ds_codes)
    assert torch.equal(ours.scale.flatten(), ds_scale)
    expect = (ds_codes.float().reshape(groups, -1) * ds_scale[:, None]).reshape(w.shape)
    assert torch.equal(fake_quantize(w, bits, True, groups), expect)


def _compression_utils():
    return pytest.importorskip("deepspeed.compression.utils",
                               reason="DeepSpeed removed its compression library in 0.19.7; install "
                                      "deepspeed==0.19.6 to compare with SymQuantizer / AsymQuantizer")


@pytest.mark.parametrize("bits,groups", QUANT_CASES)
def test_symmetric_quantizer_matches_deepspeed_sym_quantizer(bits, groups):
    utils = _compression_utils()
    for shift in (0.0, 0.02):
        w = _weight(bits * groups, shift)
        assert torch.equal(fake_quantize(w, bits, True, groups), utils.SymQuantizer.apply(w.clone(), bits, None, None,
                                                                                          groups))


@pytest.mark.parametrize("bits,groups", QUANT_CASES)
def test_asymmetric_quantizer_matches_deepspeed_asym_quantizer(bits, groups):
    utils = _compression_utils()
    for shift in (0.0, 0.02, -0.3):  # ranges across 0, mostly positive, wholly negative
        w = _weight(bits * groups + 1, shift)
        assert torch.equal(fake_quantize(w, bits, False, groups), utils.AsymQuantizer.apply(w.clone(), bits, None,
                                                                                            None, groups))
