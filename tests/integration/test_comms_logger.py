"""The comms logger (dsrecipes.distributed.comms_logger, comms_logger group): byte counts against the model's
parameter bytes at world 2 on gloo (DDP, FSDP2, the recipe Trainer), DeepSpeed's bandwidth formulas by hand,
nothing wrapped when off or after stop (an error included), the DeepSpeed import, bad prof_ops refused."""

from __future__ import annotations

import csv
import json
import warnings

import pytest
import torch
import torch.distributed as dist
from torch import nn

from dsrecipes.config import validate_recipe
from dsrecipes.config.store import compose
from dsrecipes.distributed.comms_logger import CommsLogger
from tests.helpers.distributed import run_distributed
from tests.unit.test_comms_logger import _unwrapped


def _mlp() -> nn.Module:
    torch.manual_seed(0)  # every dim even: FSDP2 shards each parameter in two halves without padding
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


# ------------------------------------------------------------------------------------ world 2 on gloo


def _ddp_and_fsdp2_steps(rank: int, world: int) -> None:
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    model = _mlp()
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    ddp = DistributedDataParallel(model)
    with CommsLogger() as comms:
        assert comms.attach(ddp) == 1  # DDP's C++ buckets now go through dist.all_reduce
        reference = [p.detach().clone() for p in model.parameters()]
        ddp(torch.randn(3, 8) + rank).sum().backward()
        step = comms.step_boundary()
    # the gradient is the mean over ranks, as DDP's own reducer makes it
    grads = [p.grad.clone() for p in model.parameters()]
    for g in grads:
        total = g.clone()
        dist.all_reduce(total)
        assert torch.allclose(total / world, g)
    assert all(torch.equal(a, b) for a, b in zip(reference, model.parameters()))
    assert step["bytes"] == param_bytes and step["ops"] >= 1
    assert {r.op for r in comms.summary()} == {"all_reduce"}

    sharded = _mlp()
    fully_shard(sharded)  # the root alone: one all-gather in forward (kept for backward), one reduce-scatter
    with CommsLogger() as comms:
        sharded(torch.randn(3, 8)).sum().backward()
        step = comms.step_boundary()
    by_op = {r.op: r for r in comms.summary()}
    assert by_op["all_gather_into_tensor"].total_bytes == param_bytes // world  # this rank's shard in
    assert by_op["reduce_scatter_tensor"].total_bytes == param_bytes  # the whole gradient in
    assert step["bytes"] == param_bytes + param_bytes // world
    assert all(r.group_size == world and r.count == 1 and r.total_latency_s > 0 for r in by_op.values())
    assert [(g.ranks, g.link, g.ops) for g in comms.groups()] == [(tuple(range(world)), "intra-node", 2)]
    assert _unwrapped()

    # one rank per node (LOCAL_WORLD_SIZE=1, as two single-rank nodes): the world's all-reduce crosses nodes, each
    # rank's own group stays inside its node
    import os

    own = [dist.new_group([r]) for r in range(world)][rank]
    os.environ["LOCAL_WORLD_SIZE"] = "1"
    with CommsLogger() as comms:
        dist.all_reduce(torch.ones(4))
        dist.all_reduce(torch.ones(2), group=own)
    assert [(g.ranks, g.link, g.bytes) for g in comms.groups()] == [(tuple(range(world)), "inter-node", 16),
                                                                   ((rank,), "intra-node", 8)]
    os.environ["LOCAL_WORLD_SIZE"] = str(world)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ddp_step_bytes_equal_the_gradient_bytes_and_fsdp2_the_parameter_bytes():
    """The issue's test: the byte count of a DDP step equals the model's gradient bytes; FSDP2's all-gather
    takes the parameter shard in and its reduce-scatter the whole gradient."""
    run_distributed(_ddp_and_fsdp2_steps, 2, timeout_s=100)


def _recipe_at_world_2(rank: int, world: int, run_dir: str, overrides: list[str]) -> None:
    from dsrecipes.training.trainer import Trainer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        root, batch = validate_recipe(compose(overrides), dp_world_size=world)
    trainer = Trainer(root, run_dir, batch, rank=rank)
    summary = trainer.fit()
    assert _unwrapped() and not trainer.engine.phases.observed
    params = sum(p.numel() * p.element_size() for p in trainer.engine.module.parameters())
    comms = json.loads((trainer.run_dir / "comms.json").read_text()) if rank == 0 else None
    if rank == 0:
        # zero.stage=0: DDP's bucket all-reduce through the hook, the whole fp32 gradient every step
        steps = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
        logged = [s["comm/bytes_per_step"] for s in steps if "comm/bytes_per_step" in s]
        assert logged == [params] * 3 and comms["bytes_per_step"] == params == summary["comms"]["bytes_per_step"]
        assert comms["world_total_bytes"] >= 2 * comms["total_bytes"] - 64  # ranks differ only by logging
        assert comms["by_op"]["all_reduce"]["bytes"] == comms["total_bytes"]
        assert comms["groups"] == [{"ranks": [0, 1], "link": "intra-node", "ops": comms["total_ops"],
                                    "bytes": comms["total_bytes"]}]
        assert comms["bytes_by_link"] == {"intra-node": comms["total_bytes"], "inter-node": 0}
        rows = list(csv.DictReader(open(trainer.run_dir / "comms.csv")))
        assert sum(int(r["total_bytes"]) for r in rows) == comms["total_bytes"] and rows[0]["op"] == "all_reduce"


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_recipe_logs_comm_metrics_every_step_and_writes_comms_json(tmp_path, fast_overrides):
    overrides = fast_overrides + [
        "comms_logger=enabled", "zero.stage=0", "trainer.max_steps=3", "trainer.log_interval=3",
        "trainer.eval_interval=0", "trainer.sample_tokens=0", "trainer.train_micro_batch_size_per_gpu=4",
        "checkpoint.save_final=false", "checkpoint.export_safetensors=false", "logger=jsonl",
        "trainer.progress_bar=false",
    ]
    run_distributed(_recipe_at_world_2, 2, str(tmp_path / "run"), overrides, timeout_s=140)
