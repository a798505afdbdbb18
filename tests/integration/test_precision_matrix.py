"""Every precision x every ZeRO stage at world size 2 follows the single-process run (CPU/gloo).

The row that was missing from the equivalence tests: with master weights (bf16_master, fp16) at
stage 0 and 1, DDP used to wrap the model before the fp32 masters were attached, so its hooks sat on
the wrong parameters and gradients were never averaged (ranks drifted apart; under fp16 ZeRO-1 could
deadlock when the ranks disagreed on an overflow). Here every (precision, stage) pair trains the
same model on the same global batches at world 2 and at world 1, through dsrecipes.initialize.

Tolerances: fp32 and the autocast precisions keep fp32 parameters, so world 2 differs from world 1
only in summation order (two half-batch gradients averaged): parameters within 1e-5. With master
weights the bf16/fp16 gradients are rounded from half-batch sums at world 2 and from the whole batch
at world 1 (and autocast runs 16-bit matmuls on half batches): within 5e-3 (as tests/integration/test_zero2.py),
with the weights moving more than 4x that over the 6 steps. Independently of any tolerance, both
ranks must end with bitwise equal weights, and the same skipped steps and loss scale: without the
average each rank steps with its own half-batch gradient and the ranks drift apart.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.helpers.distributed import run_distributed

PRECISIONS = {
    "fp32": {"dtype": "fp32"},
    "bf16": {"dtype": "bf16"},
    "bf16_master": {"dtype": "bf16", "master_weights": True},
    # 2^12 does not overflow by itself; _train makes the first step overflow on purpose (see there)
    "fp16": {"dtype": "fp16", "master_weights": True, "initial_scale_power": 12, "hysteresis": 1},
    "fp16_autocast": {"dtype": "fp16", "initial_scale_power": 12, "hysteresis": 1},
}
STAGES = (0, 1, 2, 3)
STEPS = 6
MASTER_TOLERANCE = 5e-3
FP32_TOLERANCE = 1e-5


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return x + torch.tanh(self.fc(self.norm(x)))


class SmallLM(nn.Module):
    """A tied embedding/head, blocks in an nn.ModuleList (FSDP2 units), odd sizes (11 tokens, width 6)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 6)
        self.blocks = nn.ModuleList(Block(6) for _ in range(2))
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        h = self.emb(ids)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def _batches():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 11, (8, 6), generator=g) for _ in range(2 * STEPS)]  # STEPS x 2 micro-batches


def _engine(stage: int, world: int, precision: dict):
    import dsrecipes

    torch.manual_seed(0)
    cfg = {"zero": {"stage": stage}, "lr_scheduler": {"name": "constant"}, "optimizer": {"lr": 3e-2},
           "precision": precision,
           "trainer": {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 8 // world,
                       "gradient_accumulation_steps": None, "device": "cpu"}}
    engine, *_ = dsrecipes.initialize(model=SmallLM(), config=cfg)
    return engine


def _train(engine, world: int, rank: int) -> None:
    """STEPS optimizer steps of 2 micro-batches. Under fp16 loss scaling the first step's loss is
    scaled by 1e30 on every rank: an overflow in every layout (whether a real overflow near the
    threshold happens depends on the micro-batch size), so the skip-and-halve path runs once."""
    for index, micro in enumerate(_batches()):
        ids = micro.chunk(world)[rank]
        logits = engine(ids[:, :-1])
        loss = nn.functional.cross_entropy(logits.float().reshape(-1, 11), ids[:, 1:].reshape(-1))
        if engine.precision.loss_scaler is not None and index < 2:
            loss = loss * 1e30
        engine.backward(loss)
        engine.step()


def _run_matrix(rank: int, world: int, out: str, cases: list) -> None:
    import torch.distributed as dist

    results = {}
    for name, stage in cases:
        engine = _engine(stage, world, PRECISIONS[name])
        _train(engine, world, rank)
        state = engine.module_state_dict()  # full weights (fp32 masters in 16-bit runs), on rank 0
        gathered = [None] * world
        dist.all_gather_object(gathered, _weights_in_use(engine))  # what each rank computes with
        results[(name, stage)] = {"state": state, "ranks": gathered, "skipped": engine.skipped_steps,
                                  "scale": engine.precision.loss_scale, "strategy": engine.strategy.name}
    if rank == 0:
        torch.save(results, out)


def _weights_in_use(engine) -> dict:
    """This rank's module parameters (whole tensors) and, where kept beside the module, its fp32 masters."""
    from torch.distributed.tensor import DTensor

    def whole(t):
        return (t.full_tensor() if isinstance(t, DTensor) else t).detach().float().cpu().clone()

    weights = {f"module.{n}": whole(p) for n, p in engine.strategy.unwrapped.named_parameters()}
    if engine.masters is not None:
        weights.update({f"master.{n}": whole(p) for n, p in engine.masters.view().named_parameters()})
    return weights


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    folder = tmp_path_factory.mktemp("precision_matrix")
    sharded, single = folder / "world2.pt", folder / "world1.pt"
    run_distributed(_run_matrix, 2, str(sharded), [(p, s) for p in PRECISIONS for s in STAGES], timeout_s=280)
    run_distributed(_run_matrix, 1, str(single), [(p, 0) for p in PRECISIONS], timeout_s=120)
    return torch.load(sharded), torch.load(single)


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_world_2_matches_one_process(matrix, precision, stage):
    sharded, single = matrix
    run, reference = sharded[(precision, stage)], single[(precision, 0)]
    assert run["strategy"] == {0: "ddp", 1: "zero1", 2: "zero2", 3: "fsdp2"}[stage]
    rank0, rank1 = run["ranks"]
    assert rank0.keys() == rank1.keys()
    for name, value in rank0.items():  # the ranks agree exactly: gradients were averaged, steps skipped together
        assert torch.equal(value, rank1[name]), name
    assert (run["skipped"], run["scale"]) == (reference["skipped"], reference["scale"])
    if precision.startswith("fp16"):
        assert run["skipped"] == 1 and run["scale"] == 2.0**11  # the overflow path ran: skipped, scale halved
    tolerance = MASTER_TOLERANCE if PRECISIONS[precision].get("master_weights") else FP32_TOLERANCE
    if precision in ("bf16", "fp16_autocast"):  # autocast: 16-bit matmuls on half batches vs the whole batch
        tolerance = MASTER_TOLERANCE
    want, got = reference["state"], run["state"]
    moved = max(float((want[k] - v).abs().max()) for k, v in _start_state().items())
    assert moved > 4 * MASTER_TOLERANCE  # training moved the weights well beyond the tolerance
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert got[name].dtype == torch.float32
        torch.testing.assert_close(got[name], value, rtol=0, atol=tolerance, msg=name)


def _start_state() -> dict:
    torch.manual_seed(0)
    return {k: v.detach().clone() for k, v in SmallLM().state_dict().items()}


def _disagreeing_overflow(rank: int, world: int) -> None:
    """fp16 + ZeRO-1: only rank 0's micro-batch overflows; the averaged gradient overflows on both ranks,
    so both skip the step together (before the fix the ranks disagreed and ZeRO-1's parameter sync hung)."""
    engine = _engine(1, world, {"dtype": "fp16", "master_weights": True, "initial_scale_power": 8})
    for step in range(2):
        for micro in range(2):
            ids = torch.randint(0, 11, (4, 6), generator=torch.Generator().manual_seed(10 * step + micro))
            logits = engine(ids[:, :-1])
            loss = nn.functional.cross_entropy(logits.float().reshape(-1, 11), ids[:, 1:].reshape(-1))
            if rank == 0 and step == 0:
                loss = loss * 1e30  # inf in fp16 on this rank only
            engine.backward(loss)
            engine.step()
    assert engine.skipped_steps == 1 and engine.global_steps == 2


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_fp16_zero1_ranks_agree_on_an_overflow_of_one_rank_instead_of_hanging():
    run_distributed(_disagreeing_overflow, 2, timeout_s=90)
