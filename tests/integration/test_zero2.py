"""ZeRO-2 with replicated parameters (dsrecipes.distributed.data_parallel.zero2_buckets) against one process, on CPU/gloo.

Tolerances: with SGD + momentum the sharded run differs from one process only in fp32 summation
order (gradients of half batches averaged), ~1e-7, so parameters must agree within 1e-6. Adam
amplifies that order difference for gradients near zero, which is why the engine-level checks use
losses (1e-5) rather than parameters.
"""

import pytest
import torch
from torch import nn

from tests.helpers.distributed import run_distributed


class TiedNet(nn.Module):
    """Odd shapes on purpose: a tied embedding / head, a bias with fewer rows than ranks, an unused layer."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 6)
        self.mid = nn.Linear(6, 6)
        self.tiny = nn.Parameter(torch.randn(1, 6))
        self.unused = nn.Linear(6, 3)  # never in the forward: its gradient is zero on every rank
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        h = torch.tanh(self.mid(self.emb(ids)) + self.tiny)
        return self.head(h)


def _loss(model, ids):
    logits = model(ids[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, 11), ids[:, 1:].reshape(-1))


def _batches():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 11, (12, 5), generator=g) for _ in range(8)]  # 4 steps x 2 micro-batches


def _reference_params():
    torch.manual_seed(0)
    model = TiedNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    batches = _batches()
    for step in range(4):
        for micro in batches[2 * step:2 * step + 2]:
            (_loss(model, micro) / 2).backward()
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _compare_with_reference(rank, world, bucket_bytes):
    torch.manual_seed(0)
    reference_start = TiedNet().state_dict()
    model = _sharded_run_from(rank, world, bucket_bytes, reference_start)
    want = _reference_params()
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, want[name], rtol=0, atol=1e-6, msg=name)
    assert model.head.weight is model.emb.weight


def _sharded_run_from(rank, world, bucket_bytes, start):
    from torch.distributed.device_mesh import init_device_mesh

    from dsrecipes.distributed.data_parallel.zero2_buckets import ZeroStage2

    model = TiedNet()
    if rank == 0:
        model.load_state_dict(start)  # the other ranks start elsewhere: the broadcast must align them
    zero2 = ZeroStage2(model, init_device_mesh("cpu", (world,)), bucket_bytes=bucket_bytes)
    assert len(zero2.buckets) > 1
    opt = zero2.shard_optimizer(torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9))
    batches = _batches()
    for step in range(4):
        for micro in batches[2 * step:2 * step + 2]:
            (_loss(model, micro.chunk(world)[rank]) / 2).backward()
            assert all(p.grad is None for p in model.parameters())  # full-size gradients freed per bucket
        opt.step()
        zero2.gather_params()
        opt.zero_grad()
    return model


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [2, 3])
def test_sharded_gradients_reproduce_one_process(world_size):
    """Tied weights, an unused layer, rows < ranks, several buckets, gradient accumulation 2."""
    run_distributed(_compare_with_reference, world_size, 64, timeout_s=100)


def _master_weights(rank, world):
    from torch.distributed.device_mesh import init_device_mesh

    from dsrecipes.distributed.data_parallel.zero2_buckets import ZeroStage2

    torch.manual_seed(0)
    model = TiedNet()
    zero2 = ZeroStage2(model, init_device_mesh("cpu", (world,)), low_precision=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    masters = list(zero2.masters().values())
    assert all(m.dtype == torch.float32 for m in masters)
    opt = zero2.shard_optimizer(torch.optim.AdamW(model.parameters(), lr=1e-2))
    losses = []
    for micro in _batches():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = _loss(model, micro.chunk(world)[rank])
        loss.backward()
        opt.step()
        zero2.gather_params()
        opt.zero_grad()
        losses.append(float(loss))
    for shard in zero2.shards.values():  # the model holds the rounded fp32 masters
        torch.testing.assert_close(shard.param, shard.master.full_tensor().to(torch.bfloat16), rtol=0, atol=0)
    assert losses[-1] < losses[0]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_master_weights_are_fp32_shards_of_a_bf16_model():
    run_distributed(_master_weights, 2, timeout_s=100)


def _refusals(rank, world):
    from torch.distributed.device_mesh import init_device_mesh

    from dsrecipes.distributed.data_parallel.zero2_buckets import ZeroStage2

    mesh = init_device_mesh("cpu", (world,))
    model = TiedNet()
    model.scale = nn.Parameter(torch.tensor(1.0))
    with pytest.raises(ValueError, match="scale is a scalar"):
        ZeroStage2(model, mesh)
    model = TiedNet()
    zero2 = ZeroStage2(model, mesh)
    stray = nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="not trainable parameters of the model"):
        zero2.shard_optimizer(torch.optim.SGD([*model.parameters(), stray], lr=0.1))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_scalars_and_foreign_optimizer_tensors_are_refused():
    run_distributed(_refusals, 2, timeout_s=100)


def _engine(stage, world, rank, precision=None):
    import dsrecipes

    torch.manual_seed(0)
    model = TiedNet()
    cfg = {"zero": {"stage": stage}, "lr_scheduler": {"name": "constant"}, "optimizer": {"lr": 1e-2},
           "precision": precision or {"dtype": "fp32"},
           "trainer": {"train_batch_size": 24, "train_micro_batch_size_per_gpu": 12 // world,
                       "gradient_accumulation_steps": None, "device": "cpu"}}
    engine, *_ = dsrecipes.initialize(model=model, config=cfg)
    return engine


def _train(engine, world, rank, steps):
    batches = _batches()
    losses = []
    for step in steps:
        for micro in batches[2 * step:2 * step + 2]:
            loss = _loss(engine, micro.chunk(world)[rank])
            engine.backward(loss)
            engine.step()
        losses.append(float(loss))
    return losses


def _save_and_continue(rank, world, folder, results):
    engine = _engine(2, world, rank)
    assert engine.strategy.name == "zero2"  # plain data parallelism at stage 2 runs on the replicated layout
    assert engine.strategy.describe().startswith("ZeRO-2: parameters replicated")
    _train(engine, world, rank, range(2))
    engine.save_checkpoint(folder)
    continued = _train(engine, world, rank, range(2, 4))
    resumed = _engine(2, world, rank)
    resumed.load_checkpoint(folder)
    again = _train(resumed, world, rank, range(2, 4))
    assert again == pytest.approx(continued, abs=1e-6)
    state = engine.module_state_dict()
    if rank == 0:
        torch.save({"losses": continued, "state": state}, results)


def _resume_in_one_process(rank, world, folder, results):
    engine = _engine(0, world, rank)
    engine.load_checkpoint(folder)
    torch.save({"losses": _train(engine, world, rank, range(2, 4)), "state": engine.module_state_dict()}, results)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_stage2_checkpoint_resumes_at_world_2_and_in_one_process(tmp_path):
    """A stage-2 checkpoint (DCP, FSDP2's layout) resumes in a fresh stage-2 engine and in a stage-0 single
    process (a different world size, whose micro-batch sums the two half batches) with the same losses."""
    folder, sharded, single = tmp_path / "ckpt", tmp_path / "sharded.pt", tmp_path / "single.pt"
    run_distributed(_save_and_continue, 2, str(folder), str(sharded), timeout_s=150)
    run_distributed(_resume_in_one_process, 1, str(folder), str(single), timeout_s=100)
    sharded, single = torch.load(sharded), torch.load(single)
    # the logged micro-batch loss is rank 0's half at world 2 and the whole batch at world 1: compare
    # parameters, which the same global batches produced
    for name, value in single["state"].items():
        torch.testing.assert_close(sharded["state"][name], value, rtol=0, atol=1e-5, msg=name)


def _mixed_precision_run(rank, world, stage, precision, results):
    engine = _engine(stage, world, rank, precision)
    _train(engine, world, rank, range(4))
    state = engine.module_state_dict()
    if rank == 0:
        torch.save({"state": state, "skipped": engine.skipped_steps, "scale": engine.precision.loss_scale}, results)


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("precision", [
    {"dtype": "fp16", "initial_scale_power": 20},  # dynamic loss scaling; 2^20 overflows at first
    {"dtype": "bf16", "master_weights": True},
], ids=["fp16_loss_scaling", "bf16_master_weights"])
def test_mixed_precision_matches_one_process(tmp_path, precision):
    """fp16 (overflow -> skipped steps and scale backoff, agreed by both ranks) and bf16 model with fp32
    master shards follow the single-process run: same skipped steps and scale; fp32 weights within
    5e-3 (16-bit gradients are rounded from half-batch sums at world 2 and from the whole batch at 1)."""
    sharded, single = tmp_path / "sharded.pt", tmp_path / "single.pt"
    run_distributed(_mixed_precision_run, 2, 2, precision, str(sharded), timeout_s=150)
    run_distributed(_mixed_precision_run, 1, 0, precision, str(single), timeout_s=100)
    sharded, single = torch.load(sharded), torch.load(single)
    assert (sharded["skipped"], sharded["scale"]) == (single["skipped"], single["scale"])
    for name, value in single["state"].items():
        assert sharded["state"][name].dtype == torch.float32
        torch.testing.assert_close(sharded["state"][name], value, rtol=0, atol=5e-3, msg=name)
