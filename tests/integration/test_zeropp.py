"""The multi-process, CLI and launcher tests (marked slow) whose in-process twins are tests/unit/test_zeropp.py;
that module's docstring describes both halves.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dsrecipes.distributed.data_parallel.quantized_collectives import (
    QuantizedAllGather,
    QuantizedReduceScatter,
)
from dsrecipes.distributed.parallel_dims import ParallelDims
from tests.helpers.distributed import run_distributed

# ------------------------------------------------------------------------------------------------
# the collectives at world 2 (gloo)
# ------------------------------------------------------------------------------------------------


def _collectives(rank: int, world: int) -> None:
    group = dist.group.WORLD
    g = torch.Generator().manual_seed(10 + rank)
    for numel in (5000, 7, 4096):  # odd length, a unit smaller than a block, exactly one block
        out = torch.empty(world * numel)
        mine = out[rank * numel:(rank + 1) * numel]
        mine.copy_(torch.randn(numel, generator=g))
        exact = torch.empty(world * numel)
        dist.all_gather_single(exact, mine.clone())
        QuantizedAllGather()(out, mine, group)
        bound = exact.abs().max() / 254 * (1 + 1e-6)
        assert (out - exact).abs().max() <= bound, numel
        same = out.clone()
        dist.broadcast(same, 0)
        assert torch.equal(same, out)  # every rank holds the same dequantized weights
    raw = torch.arange(6, dtype=torch.uint8) + 6 * rank  # mixed-dtype units are gathered as bytes, unquantized
    got = torch.empty(6 * world, dtype=torch.uint8)
    QuantizedAllGather()(got, raw, group)
    assert torch.equal(got, torch.arange(6 * world, dtype=torch.uint8))
    for bits, step in ((8, 254), (4, 14)):
        for op in (dist.ReduceOp.AVG, dist.ReduceOp.SUM):
            numel = 3001
            grads = torch.randn(world * numel, generator=g)
            exact = torch.empty(numel)
            dist.reduce_scatter_single(exact, grads.clone(), op=op)
            got = torch.empty(numel)
            QuantizedReduceScatter(bits)(got, grads, group, op)
            bound = torch.tensor(grads.abs().max().item())
            dist.all_reduce(bound, op=dist.ReduceOp.MAX)
            bound = bound / step * (1 if op == dist.ReduceOp.AVG else world) * (1 + 1e-5)
            assert (got - exact).abs().max() <= bound, (bits, op)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_quantized_all_gather_and_reduce_scatter_match_the_exact_collectives_within_the_bound():
    run_distributed(_collectives, 2, timeout_s=100)


def _two_hop_collectives(rank: int, world: int) -> None:
    """World 4 as 2 nodes x 2 ranks: qgZ's 2-hop reduce-scatter against the exact one, and its bytes across nodes."""
    from dsrecipes.distributed.data_parallel.quantized_collectives import two_hop_bound

    dims = ParallelDims.from_degrees(world, zero_stage=3).on_nodes(2)
    assert dims.shard_node_split() == (2, 2)
    inside, across = dims.shard_node_groups()
    assert dist.get_process_group_ranks(inside) == [rank // 2 * 2, rank // 2 * 2 + 1]
    assert dist.get_process_group_ranks(across) == [rank % 2, rank % 2 + 2]
    sent = []  # (group size, payload bytes) of every all-to-all
    exchange = dist.all_to_all_single

    def recording(output, input, group=None, **kwargs):
        sent.append((dist.get_world_size(group), input.numel() * input.element_size()))
        return exchange(output, input, group=group, **kwargs)

    g = torch.Generator().manual_seed(20 + rank)
    numel = 3001
    for bits in (8, 4):
        for op in (dist.ReduceOp.AVG, dist.ReduceOp.SUM):
            grads = torch.randn(world * numel, generator=g)
            exact = torch.empty(numel)
            dist.reduce_scatter_single(exact, grads.clone(), op=op)
            got = torch.empty(numel)
            dist.all_to_all_single, sent[:] = recording, []
            try:
                QuantizedReduceScatter(bits, node_groups=(inside, across))(got, grads, dist.group.WORLD, op)
                two_hop = list(sent)
                sent.clear()
                QuantizedReduceScatter(bits)(torch.empty(numel), grads, dist.group.WORLD, op)
                one_hop = list(sent)
            finally:
                dist.all_to_all_single = exchange
            largest = torch.tensor(grads.abs().max().item())
            dist.all_reduce(largest, op=dist.ReduceOp.MAX)
            bound = two_hop_bound(float(largest), 2, 2, bits) / (world if op == dist.ReduceOp.AVG else 1)
            assert (got - exact).abs().max() <= bound * (1 + 1e-5), (bits, op)
            assert [size for size, _ in two_hop] == [2, 2, 2, 2] and [size for size, _ in one_hop] == [4, 4]
            # bytes leaving the node: 1-hop sends 2 of its 4 rows off-node, 2-hop 1 of the 2 rows of its second hop
            off_node_one_hop = sum(nbytes for _, nbytes in one_hop) / 2
            off_node_two_hop = sum(nbytes for _, nbytes in two_hop[2:]) / 2
            assert off_node_two_hop == pytest.approx(off_node_one_hop / 2, rel=0.02), (bits, op)


@pytest.mark.matrix
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_hop_quantized_reduce_scatter_stays_within_its_bound_and_halves_the_bytes_across_nodes():
    run_distributed(_two_hop_collectives, 4, timeout_s=100)


# ------------------------------------------------------------------------------------------------
# training: gpt_debug under FSDP2 with and without ZeRO++
# ------------------------------------------------------------------------------------------------

STEPS = 8


def _batches(steps: int, micro: int = 4) -> list[torch.Tensor]:
    """One batch of learnable sequences (arithmetic progressions mod 256), every step: the loss falls steadily."""
    g = torch.Generator().manual_seed(5)
    start, stride = torch.randint(0, 256, (micro, 1), generator=g), torch.randint(1, 4, (micro, 1), generator=g)
    return [(start + stride * torch.arange(33)) % 256] * steps


def _engine(world: int, zero: dict):
    import dsrecipes
    from dsrecipes.models import GPT
    from dsrecipes.models.config import ModelConfig

    # gpt_debug (conf/model/gpt_debug.yaml) with the byte vocabulary, no dropout
    model_cfg = ModelConfig(name="gpt_debug", style="gpt2", n_layer=4, n_head=4, d_model=128, max_seq_len=128,
                            bias=True, vocab_size=256, dropout=0.0)
    torch.manual_seed(0)
    model = GPT(model_cfg)
    cfg = {"zero": zero, "lr_scheduler": {"name": "constant"},
           "optimizer": {"name": "sgd", "lr": 0.3, "momentum": 0.9, "weight_decay": 0.0},
           "precision": {"dtype": "fp32"},
           "trainer": {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4 // world,
                       "gradient_accumulation_steps": None, "device": "cpu"}}
    engine, *_ = dsrecipes.initialize(model=model, config=cfg)
    return engine


def _train(rank: int, world: int, zero: dict, steps: int) -> dict:
    engine = _engine(world, zero)
    losses = []
    for batch in _batches(steps):
        ids = batch.chunk(world)[rank]
        loss = engine(ids[:, :-1], labels=ids[:, 1:]).loss
        engine.backward(loss)
        engine.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(float(mean) / world)
    units = [m for m in engine.module.modules() if hasattr(m, "_get_fsdp_state")]
    groups = {g.post_forward_mesh_info.shard_mesh_size if g.post_forward_mesh_info else None
              for m in units for g in m._get_fsdp_state()._fsdp_param_groups}
    return {"losses": losses, "strategy": engine.strategy.name, "describe": engine.strategy.describe(),
            "post_forward_groups": sorted(groups, key=str), "state": engine.module_state_dict()}


def _runs(rank: int, world: int, cases: dict, steps: int, out: str) -> None:
    results = {name: _train(rank, world, zero, steps) for name, zero in cases.items()}
    if rank == 0:
        torch.save(results, out)


QUANTIZED = {
    "zero3": {"stage": 3},
    "qwz": {"stage": 3, "zero_quantized_weights": True},
    "qgz": {"stage": 3, "zero_quantized_gradients": True},
    "stage2_qgz": {"stage": 2, "zero_quantized_gradients": True},
}


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_zero3_with_qwz_or_qgz_tracks_plain_zero3(tmp_path):
    out = tmp_path / "runs.pt"
    run_distributed(_runs, 2, QUANTIZED, STEPS, str(out), timeout_s=180)
    runs = torch.load(out)
    plain = torch.tensor(runs["zero3"]["losses"])
    assert plain[-1] < plain[0] - 0.3  # it trains
    for name, atol in (("qwz", 0.1), ("qgz", 5e-3), ("stage2_qgz", 5e-3)):
        got = torch.tensor(runs[name]["losses"])
        torch.testing.assert_close(got, plain, rtol=0, atol=atol, msg=name)
        assert runs[name]["strategy"] == "fsdp2", name  # stage 2 + qgZ leaves zero2.py's buckets for FSDP2
    assert not torch.equal(torch.tensor(runs["qwz"]["losses"]), plain)  # the quantized path really ran
    assert "qwZ on (int8 parameter all-gather, blocks of 4096)" in runs["qwz"]["describe"]
    assert "qgZ on (int8 all-to-all gradient reduce-scatter" in runs["qgz"]["describe"]
    assert "ZeRO++" not in runs["zero3"]["describe"]


def _runs_on_two_nodes(rank: int, world: int, cases: dict, steps: int, out: str) -> None:
    import os

    os.environ["LOCAL_WORLD_SIZE"] = "2"  # 2 nodes x 2 ranks, as torchrun would tell each worker
    _runs(rank, world, cases, steps, out)


@pytest.mark.matrix
@pytest.mark.slow
@pytest.mark.timeout(200)
def test_qgz_on_two_nodes_takes_two_hops_and_tracks_plain_zero3(tmp_path):
    out = tmp_path / "runs.pt"
    run_distributed(_runs_on_two_nodes, 4, {"zero3": {"stage": 3}, "qgz": {"stage": 3, "zero_quantized_gradients": True}},
                    STEPS, str(out), timeout_s=180)
    runs = torch.load(out)
    plain = torch.tensor(runs["zero3"]["losses"])
    assert plain[-1] < plain[0] - 0.3
    torch.testing.assert_close(torch.tensor(runs["qgz"]["losses"]), plain, rtol=0, atol=5e-3)
    assert "2-hop: inside each node over 2 ranks, then across 2 nodes" in runs["qgz"]["describe"]


@pytest.mark.matrix
@pytest.mark.slow
@pytest.mark.timeout(200)
def test_hpz_at_world_4_in_groups_of_2_equals_plain_zero3(tmp_path):
    out = tmp_path / "runs.pt"
    run_distributed(_runs, 4, {"zero3": {"stage": 3}, "hpz": {"stage": 3, "zero_hpz_partition_size": 2}}, 3, str(out),
                    timeout_s=180)
    runs = torch.load(out)
    assert runs["hpz"]["post_forward_groups"] == [2]  # backward all-gathers within groups of 2
    assert runs["zero3"]["post_forward_groups"] == [4]
    assert "hpZ on (secondary partition over 2 ranks: backward all-gathers inside groups of 2 of the 4 ranks)" \
        in runs["hpz"]["describe"]
    torch.testing.assert_close(torch.tensor(runs["hpz"]["losses"]), torch.tensor(runs["zero3"]["losses"]),
                               rtol=0, atol=1e-5)
    for name, value in runs["zero3"]["state"].items():
        torch.testing.assert_close(runs["hpz"]["state"][name], value, rtol=0, atol=1e-5, msg=name)
