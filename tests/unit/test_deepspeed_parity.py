"""dsrecipes against DeepSpeed's own functions, where DeepSpeed is installed (the optional `parity` oracle).

Issue 17's behaviours, each compared with the DeepSpeed code that defines it:

* MoE top-1 gating without random token selection: `deepspeed.moe.sharded_moe.top1gating(use_rts=False)`
  keeps the tokens torch.topk picks among tied candidates; the kept tokens, their slots and weights must
  be the same (the whole [S, E, C] combine tensor, exactly).
* Curriculum pacing: `deepspeed.runtime.data_pipeline.curriculum_scheduler.CurriculumScheduler` at every
  step, fixed_linear / fixed_root / fixed_discrete (the lower bound ceil(min / step) * step arrived in
  DeepSpeed 0.19.7; older releases are skipped).
* Compression-training weight quantizers: `deepspeed.compression.utils.SymQuantizer` / `AsymQuantizer`
  bit for bit. DeepSpeed 0.19.7 removed its compression library: with deepspeed<=0.19.6 installed the
  tests call it, otherwise they compare with what 0.19.6 returned for the same cases
  (tests/data/deepspeed_0_19_6_quantizers.pt, written by tests/helpers/record_deepspeed_quantizers.py);
  the symmetric grid is also checked against 0.19.8's surviving copy of the same formula,
  `deepspeed.module_inject.replace_module.GroupQuantizer` (codes and scales).
* LR schedules: every schedule's lr (and OneCycle's momentum) over 30 steps from DeepSpeed's classes
  (`deepspeed.runtime.lr_schedules`: placeholder at construction, step() after each optimizer step)
  equals dsrecipes' with lr_scheduler.step_alignment=deepspeed; the default is one step ahead. The
  deliberate differences (OneCycle's beta2 / SGD momentum, WarmupDecayLR's 0.001) and the validation
  both ways are checked against DeepSpeed's behaviour, so a DeepSpeed change shows up here.
* The batch triple: `deepspeed.runtime.config.DeepSpeedConfig`'s derivation over a grid of given /
  absent keys at dp 1, 2, 4 equals dsrecipes.training.batch's (no key at all: dsrecipes' default).
* Training through `deepspeed.initialize` and `dsrecipes.initialize` side by side, in one world-2
  gloo spawn for everything (DeepSpeed joins the harness's process group with
  `deepspeed.init_distributed(dist_backend="gloo")`; its CPU accelerator is chosen with
  DS_ACCELERATOR=cpu, set below): a plain nn.Module under ZeRO 0-3, fp32, gradient accumulation 2,
  clipping on, two parameter groups (model_parameters) and a WarmupLR schedule stepped by each
  engine: the same losses (within 1e-6, see there) and lrs; fp16 with injected overflows: the same
  loss scale, skipped steps and lrs per step at ZeRO 1-3, and at ZeRO-0 DeepSpeed's simpler rules
  (no hysteresis, backward without the loss scale) that dsrecipes deliberately does not copy.

Runs on CPU in well under a minute on 2 cores, DeepSpeed's import and one world-2 spawn included.
Without DeepSpeed the module is skipped; the same behaviours are held without it by hard-coded cases
in test_moe.py, test_curriculum.py, test_compression*.py, test_lr_schedules.py, test_batch_sizes.py,
test_param_groups.py and test_loss_scaler / test_precision*.py.
"""

from __future__ import annotations

import importlib
import os
import warnings

import pytest
import torch

# DeepSpeed picks its accelerator at first use: CUDA when it sees one, else CPU with a warning. These
# comparisons run on CPU tensors over gloo, so ask for the CPU accelerator (an explicit choice wins).
os.environ.setdefault("DS_ACCELERATOR", "cpu")
deepspeed = pytest.importorskip("deepspeed")
# deepspeed.init_distributed (and deepspeed.initialize without it) JIT-builds a shared-memory all-reduce op on a CPU
# (deepspeed_shm_comm: about 50 s of g++ on a fresh machine) that only its inference_all_reduce uses; training, and
# every oracle here, reduces through torch.distributed (gloo). Not built: the ranks forked from a test process that
# imported this module inherit the patch.
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # (deepspeed.comm.torch is torch itself)

from packaging.version import Version  # noqa: E402  (a DeepSpeed dependency)

from dsrecipes.compression import fake_quantize, quantize_codes  # noqa: E402
from dsrecipes.data_efficiency import CurriculumConfig, CurriculumScheduler  # noqa: E402
from dsrecipes.models.moe_dispatch import combine_weights  # noqa: E402
from dsrecipes.models.moe_gating import top1_gating  # noqa: E402
from tests.helpers.deepspeed_batch import deepspeed_batch  # noqa: E402
from tests.helpers.paths import TEST_DATA  # noqa: E402

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


SYM_SHIFTS = (0.0, 0.02)
ASYM_SHIFTS = (0.0, 0.02, -0.3)  # ranges across 0, mostly positive, wholly negative
QUANTIZER_RECORD = TEST_DATA / "deepspeed_0_19_6_quantizers.pt"


def sym_weight(bits: int, groups: int, shift: float) -> torch.Tensor:
    return _weight(bits * groups, shift)


def asym_weight(bits: int, groups: int, shift: float) -> torch.Tensor:
    return _weight(bits * groups + 1, shift)


def _deepspeed_quantizer(kind: str):
    """DeepSpeed's SymQuantizer / AsymQuantizer as f(weight, bits, groups, shift): live where its compression
    library is installed (deepspeed<=0.19.6), else what 0.19.6 returned for these exact cases
    (tests/helpers/record_deepspeed_quantizers.py wrote the record)."""
    try:
        from deepspeed.compression import utils
    except ImportError:
        record = torch.load(QUANTIZER_RECORD, weights_only=True)
        return lambda w, bits, groups, shift: record[kind][(bits, groups, shift)]
    quantizer = utils.SymQuantizer if kind == "sym" else utils.AsymQuantizer
    return lambda w, bits, groups, shift: quantizer.apply(w.clone(), bits, None, None, groups)


@pytest.mark.parametrize("bits,groups", QUANT_CASES)
def test_symmetric_quantizer_matches_deepspeed_sym_quantizer(bits, groups):
    theirs = _deepspeed_quantizer("sym")
    for shift in SYM_SHIFTS:
        w = sym_weight(bits, groups, shift)
        assert torch.equal(fake_quantize(w, bits, True, groups), theirs(w, bits, groups, shift))


@pytest.mark.parametrize("bits,groups", QUANT_CASES)
def test_asymmetric_quantizer_matches_deepspeed_asym_quantizer(bits, groups):
    theirs = _deepspeed_quantizer("asym")
    for shift in ASYM_SHIFTS:
        w = asym_weight(bits, groups, shift)
        assert torch.equal(fake_quantize(w, bits, False, groups), theirs(w, bits, groups, shift))


# ------------------------------------------------------------------------------------- lr schedules

SCHEDULE_STEPS = 30


def _two_group_optimizer(kind: str = "adamw", beta2: float = 0.99) -> torch.optim.Optimizer:
    """Two param groups with different lrs (per-group schedules are DeepSpeed's too)."""
    groups = [{"params": [torch.nn.Parameter(torch.zeros(2))], "lr": lr} for lr in (0.1, 0.03)]
    if kind == "sgd":
        return torch.optim.SGD(groups, lr=0.1, momentum=0.9)
    return torch.optim.AdamW(groups, lr=0.1, betas=(0.9, beta2))


def _momentum(group: dict) -> float:
    return float(group["betas"][0]) if "betas" in group else float(group["momentum"])


def _lr_trace(scheduler, optimizer, steps: int = SCHEDULE_STEPS) -> list[list[tuple[float, float]]]:
    """(lr, momentum) of every group as each optimizer step sees it: construction, then step() after each step."""
    out = []
    for _ in range(steps):
        out.append([(float(g["lr"]), _momentum(g)) for g in optimizer.param_groups])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch: "lr_scheduler.step() before optimizer.step()"
            scheduler.step()
    return out


# (DeepSpeed class name, its params, dsrecipes option): shapes that reach every branch within 30 steps
SCHEDULES = [
    ("WarmupLR", dict(warmup_min_lr=0.01, warmup_num_steps=7, warmup_type="linear"), "warmup_lr"),
    ("WarmupLR", dict(warmup_num_steps=9), "warmup_lr"),  # log warmup, warmup_max_lr = each group's lr
    ("WarmupDecayLR", dict(total_num_steps=20, warmup_min_lr=0.001, warmup_max_lr=0.2, warmup_num_steps=5), "warmup_decay_lr"),
    ("WarmupDecayLR", dict(total_num_steps=18, warmup_max_lr=0.05, warmup_num_steps=6, warmup_type="linear"), "warmup_decay_lr"),
    ("WarmupCosineLR", dict(total_num_steps=25, warmup_min_ratio=0.1, warmup_num_steps=6, cos_min_ratio=0.05,
                            warmup_type="linear"), "warmup_cosine"),
    ("WarmupCosineLR", dict(total_num_steps=22, warmup_num_steps=4), "warmup_cosine"),
    ("OneCycle", dict(cycle_min_lr=0.01, cycle_max_lr=0.1, decay_lr_rate=0.5, cycle_first_step_size=6,
                      cycle_second_step_size=4, decay_step_size=3, cycle_min_mom=0.8, cycle_max_mom=0.95,
                      decay_mom_rate=0.001), "one_cycle"),
    ("OneCycle", dict(cycle_min_lr=0.02, cycle_max_lr=0.2, cycle_first_step_size=8, cycle_first_stair_count=3,
                      cycle_second_stair_count=2, decay_step_size=2, decay_lr_rate=0.1), "one_cycle"),
    ("OneCycle", dict(cycle_min_lr=0.01, cycle_max_lr=0.1, cycle_first_step_size=5, cycle_second_step_size=0), "one_cycle"),
    ("LRRangeTest", dict(lr_range_test_min_lr=0.01, lr_range_test_step_size=4, lr_range_test_step_rate=0.5), "lr_range_test"),
    ("LRRangeTest", dict(lr_range_test_min_lr=0.02, lr_range_test_step_size=3, lr_range_test_step_rate=2.0,
                         lr_range_test_staircase=True), "lr_range_test"),
]


def _ours(option: str, params: dict, alignment: str):
    from dsrecipes.training.optim.lr_scheduler_config import LR_SCHEDULER_SCHEMAS, StepAlignment
    from dsrecipes.training.optim.lr_schedules import build_lr_scheduler

    cfg = LR_SCHEDULER_SCHEMAS[option](**params, step_alignment=StepAlignment(alignment))
    return lambda optimizer: build_lr_scheduler(cfg, optimizer, max_steps=SCHEDULE_STEPS + 1)


def _close(a, b) -> bool:
    """Equal up to float rounding: DeepSpeed places OneCycle's triangle by (t+1)/total in floating point,
    dsrecipes from the integer step (1e-16 apart where they are not bitwise equal)."""
    return all(abs(x - y) <= 1e-12 * max(1.0, abs(y)) for ra, rb in zip(a, b) for ga, gb in zip(ra, rb)
               for x, y in zip(ga, gb)) and len(a) == len(b)


@pytest.mark.parametrize("ds_name, params, option", SCHEDULES,
                         ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(SCHEDULES)])
def test_lr_schedule_with_deepspeed_alignment_is_deepspeeds_and_the_default_one_step_ahead(ds_name, params, option):
    from deepspeed.runtime import lr_schedules as ds_schedules

    ds_optimizer = _two_group_optimizer()  # beta2 0.99: the value DeepSpeed's OneCycle writes
    theirs = _lr_trace(getattr(ds_schedules, ds_name)(ds_optimizer, **params), ds_optimizer)
    optimizer = _two_group_optimizer()
    aligned = _lr_trace(_ours(option, params, "deepspeed")(optimizer), optimizer)
    assert _close(aligned, theirs)
    assert [tuple(g["betas"]) for g in optimizer.param_groups] == [tuple(g["betas"]) for g in ds_optimizer.param_groups]
    optimizer = _two_group_optimizer()
    default = _lr_trace(_ours(option, params, "dsrecipes")(optimizer), optimizer, SCHEDULE_STEPS + 1)
    assert _close(default[:-1], theirs[1:] + [default[-2]])  # f(k) at step k: DeepSpeed's step k + 1
    assert not _close(default[:-1], theirs)  # the shift is real


def test_torch_schedulers_step_the_same_in_both():
    """DeepSpeed steps a torch scheduler (scheduler.type naming a torch.optim.lr_scheduler class) with torch's own
    convention, f(0) at construction: dsrecipes' default, so step_alignment changes nothing for them."""
    from dsrecipes.training.optim.lr_scheduler_config import StepAlignment, TorchStepConfig
    from dsrecipes.training.optim.lr_schedules import build_lr_scheduler

    ds_optimizer = _two_group_optimizer()
    theirs = _lr_trace(torch.optim.lr_scheduler.StepLR(ds_optimizer, step_size=4, gamma=0.5), ds_optimizer)
    for alignment in StepAlignment:
        optimizer = _two_group_optimizer()
        cfg = TorchStepConfig(step_size=4, gamma=0.5, step_alignment=alignment)
        assert _lr_trace(build_lr_scheduler(cfg, optimizer, SCHEDULE_STEPS), optimizer) == theirs


def test_one_cycle_differences_from_deepspeed_are_the_documented_ones():
    from deepspeed.runtime.lr_schedules import OneCycle as DSOneCycle

    params = dict(cycle_min_lr=0.01, cycle_max_lr=0.1, cycle_first_step_size=4, cycle_min_mom=0.8, cycle_max_mom=0.9)
    # Adam family: DeepSpeed replaces beta2 with 0.99 for the whole run, dsrecipes keeps the optimizer's
    ds_optimizer, optimizer = _two_group_optimizer(beta2=0.95), _two_group_optimizer(beta2=0.95)
    theirs = _lr_trace(DSOneCycle(ds_optimizer, **params), ds_optimizer, 5)
    assert _lr_trace(_ours("one_cycle", params, "deepspeed")(optimizer), optimizer, 5) == theirs  # lr and beta1
    assert {g["betas"][1] for g in ds_optimizer.param_groups} == {0.99}
    assert {g["betas"][1] for g in optimizer.param_groups} == {0.95}
    # SGD: DeepSpeed does not cycle `momentum` (it looks for betas only), dsrecipes does unless cycle_momentum=false
    ds_sgd = _two_group_optimizer("sgd")
    theirs = _lr_trace(DSOneCycle(ds_sgd, **params), ds_sgd, 8)
    assert {m for step in theirs for _, m in step} == {0.9}  # the optimizer's own momentum, untouched
    sgd = _two_group_optimizer("sgd")
    cycled = _lr_trace(_ours("one_cycle", params, "deepspeed")(sgd), sgd, 8)
    assert [step[0][1] for step in cycled] == pytest.approx([0.8, 0.875, 0.85, 0.825, 0.8, 0.825, 0.85, 0.875])
    sgd = _two_group_optimizer("sgd")
    assert _lr_trace(_ours("one_cycle", params | dict(cycle_momentum=False), "deepspeed")(sgd), sgd, 8) == theirs


def test_warmup_decay_lr_without_warmup_max_lr_differs_as_documented():
    """DeepSpeed 0.19.8's WarmupDecayLR signature defaults warmup_max_lr to 0.001 (the fallback its PR #7360 removed
    from WarmupLR as a bug); dsrecipes reads a null warmup_max_lr as each group's lr in both. Explicit 0.001: equal."""
    from deepspeed.runtime.lr_schedules import WarmupDecayLR, WarmupLR

    params = dict(total_num_steps=12, warmup_num_steps=4, warmup_type="linear")
    ds_optimizer = _two_group_optimizer()
    theirs = _lr_trace(WarmupDecayLR(ds_optimizer, **params), ds_optimizer, 8)
    assert max(lr for step in theirs for lr, _ in step) == pytest.approx(0.001)
    optimizer = _two_group_optimizer()
    ours = _lr_trace(_ours("warmup_decay_lr", params, "deepspeed")(optimizer), optimizer, 8)
    assert [max(step[g][0] for step in ours) for g in (0, 1)] == pytest.approx([0.1, 0.03])  # each group's lr
    optimizer = _two_group_optimizer()
    explicit = _lr_trace(_ours("warmup_decay_lr", params | dict(warmup_max_lr=0.001), "deepspeed")(optimizer), optimizer, 8)
    assert _close(explicit, theirs)
    ds_optimizer = _two_group_optimizer()  # WarmupLR itself: each group's lr in DeepSpeed too
    theirs = _lr_trace(WarmupLR(ds_optimizer, warmup_num_steps=4, warmup_type="linear"), ds_optimizer, 8)
    optimizer = _two_group_optimizer()
    assert _close(_lr_trace(_ours("warmup_lr", dict(warmup_num_steps=4, warmup_type="linear"), "deepspeed")(optimizer),
                            optimizer, 8), theirs)


# (dsrecipes option, params, whether DeepSpeed's class accepts them): the validation both ways
VALIDATION = [
    ("warmup_lr", dict(warmup_num_steps=0), False),  # DeepSpeed: "warmup_num_steps must be a positive integer"
    ("warmup_decay_lr", dict(total_num_steps=10, warmup_num_steps=0), False),
    ("warmup_cosine", dict(total_num_steps=10, warmup_num_steps=0), False),
    ("warmup_lr", dict(warmup_num_steps=1), True),
    ("warmup_decay_lr", dict(total_num_steps=5, warmup_num_steps=10), True),  # total < warmup: a warning only
    ("warmup_decay_lr", dict(total_num_steps=10, warmup_num_steps=10), True),
    ("warmup_cosine", dict(total_num_steps=5, warmup_num_steps=10), True),
    ("one_cycle", dict(cycle_min_lr=0.01, cycle_max_lr=0.1, decay_mom_rate=0.01), True),  # no decay_step_size
    ("one_cycle", dict(cycle_min_lr=0.01, cycle_max_lr=0.1, decay_lr_rate=0.1), True),
    ("one_cycle", dict(cycle_min_lr=0.01, cycle_max_lr=0.1, cycle_second_step_size=0), True),
    ("one_cycle", dict(cycle_min_lr=0.01, cycle_max_lr=0.1, cycle_first_step_size=0), False),
    ("lr_range_test", dict(lr_range_test_step_size=0), False),
]
DS_CLASSES = {"warmup_lr": "WarmupLR", "warmup_decay_lr": "WarmupDecayLR", "warmup_cosine": "WarmupCosineLR",
              "one_cycle": "OneCycle", "lr_range_test": "LRRangeTest"}


@pytest.mark.parametrize("option, params, accepted", VALIDATION, ids=[f"{o}-{i}" for i, (o, _, _) in enumerate(VALIDATION)])
def test_lr_schedule_validation_accepts_what_deepspeed_accepts(option, params, accepted):
    from deepspeed.runtime import lr_schedules as ds_schedules

    from dsrecipes.training.optim.lr_scheduler_config import LR_SCHEDULER_SCHEMAS
    from dsrecipes.training.optim.lr_schedules import validate_lr_scheduler_config

    try:
        getattr(ds_schedules, DS_CLASSES[option])(_two_group_optimizer(), **params)
        ds_accepts = True
    except ValueError:
        ds_accepts = False
    assert ds_accepts is accepted  # the fact the row records, from DeepSpeed itself
    cfg = LR_SCHEDULER_SCHEMAS[option](**params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # accepted with a warning where DeepSpeed logs one
        try:
            validate_lr_scheduler_config(cfg, 100)
            ours = True
        except ValueError:
            ours = False
    assert ours is accepted


# ------------------------------------------------------------------------------------- batch triple


def test_batch_triple_table_matches_deepspeed_config(monkeypatch):
    from dsrecipes.training.batch import DEFAULT_MICRO_BATCH_SIZE, resolve_batch_sizes

    checked = derived = refused = 0
    for world in (1, 2, 4):
        for tb in (None, 8, 12, 32, 33):
            for mb in (None, 2, 4, 16, 17):
                for gas in (None, 1, 2, 3):
                    given = {k: v for k, v in (("train_batch_size", tb), ("train_micro_batch_size_per_gpu", mb),
                                               ("gradient_accumulation_steps", gas)) if v is not None}
                    theirs = deepspeed_batch(given, world, monkeypatch)
                    try:
                        b = resolve_batch_sizes(tb, mb, gas, dp_world_size=world)
                        ours = (b.train_batch_size, b.micro_batch_size, b.gradient_accumulation_steps)
                    except ValueError:
                        ours = None
                    where = f"{given} at dp {world}"
                    if not given:  # the one deliberate difference: DeepSpeed asserts, dsrecipes trains 16 x 1
                        assert theirs is None and ours == (DEFAULT_MICRO_BATCH_SIZE * world, DEFAULT_MICRO_BATCH_SIZE, 1)
                        continue
                    assert ours == theirs, where
                    checked += 1
                    derived += ours is not None and len(given) < 3
                    refused += ours is None
    assert checked == 3 * (5 * 5 * 4 - 1) and derived > 40 and refused > 40
