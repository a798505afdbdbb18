"""The memory estimator against the bytes the running engine really holds, per rank, every ZeRO stage."""

import pytest
import torch

from dsrecipes.distributed.parallel_dims import ParallelDims
from dsrecipes.profiling.memory_estimator import deepspeed_model_state_bytes, estimate_model_states


def test_formulas():
    n = 1_000_000
    assert deepspeed_model_state_bytes(n, 4, 0) == 16 * n
    assert deepspeed_model_state_bytes(n, 4, 1) == 4 * n + 3 * n
    assert deepspeed_model_state_bytes(n, 4, 3) == 4 * n
    est = estimate_model_states(n, 4, 3)
    assert (est.parameters, est.gradients, est.optimizer_states) == (n, n, 2 * n)
    est2 = estimate_model_states(n, 4, 2)  # replicated fp32 parameters, sharded gradients and states
    assert (est2.parameters, est2.gradients, est2.optimizer_states) == (4 * n, n, 2 * n)
    est2_master = estimate_model_states(n, 4, 2, precision="bf16", master_weights=True)
    assert est2_master.parameters == 2 * n + n  # bf16 model + fp32 master shards: DeepSpeed's 2Ψ + ...
    est1 = estimate_model_states(n, 4, 1)
    assert est1.total == 4 * n + 4 * n + 2 * n
    assert estimate_model_states(n, 1, 3).total == 16 * n  # one process shards nothing
    master = estimate_model_states(n, 1, 0, precision="bf16", master_weights=True)
    assert (master.parameters, master.optimizer_states) == (2 * n + 4 * n, 8 * n)


def test_estimate_cli_prints_every_stage(capsys):
    from dsrecipes.estimate import main

    rows = main(["model=llama_7b", "world_size=64", "vocab_size=32000"])
    assert [r.stage for r in rows] == [0, 1, 2, 3]
    assert rows[3].total == pytest.approx(16 * 6_738_415_616 / 64)
    assert "DeepSpeed" in capsys.readouterr().out


def _layout(overrides: list[str], world_size: int):
    from dsrecipes.config.store import compose
    from dsrecipes.config.validate import to_root
    from dsrecipes.models import GPT
    from dsrecipes.profiling.layout_memory import estimate_layout

    cfg = to_root(compose(["model=gpt_debug", "model.vocab_size=320", *overrides]))
    dims = ParallelDims.from_config(cfg, world_size, node_size=world_size)
    with torch.device("meta"):
        gpt = GPT(cfg.model, cfg.moe)
    return gpt, estimate_layout(gpt, cfg, dims)


def test_layout_arithmetic_follows_the_shapes():
    gpt, single = _layout([], 1)
    n = gpt.num_params()
    assert single.heaviest.num_params == n and single.heaviest.total == 16 * n  # one rank: nothing split
    _, tp = _layout(["parallel.tp=2"], 2)  # tp: everything but norms, position embeddings and row biases halves
    norms_and_replicated = 128 * 128 + 4 * (4 * 128 + 2 * 128) + 2 * 128
    assert tp.heaviest.num_params == (n - norms_and_replicated) // 2 + norms_and_replicated
    _, pp = _layout(["parallel.pp=2"], 2)  # the tied embedding is held by both ends
    assert [r.num_params for r in pp.ranks] == [453888, 437760] and pp.heaviest.pp_rank == 0
    assert sum(r.num_params for r in pp.ranks) == n + 320 * 128
    _, interleaved = _layout(["parallel.pp=2", "parallel.pp_schedule=interleaved_1f1b"], 2)
    assert sum(r.num_params for r in interleaved.ranks) == n + 320 * 128  # stages 0, 2 and 1, 3
    gpt_moe, moe = _layout(["moe.num_experts=4", "moe.ep_size=2", "zero.stage=3"], 4)
    rank = moe.heaviest
    assert rank.expert_params == sum(p.numel() for name, p in gpt_moe.named_parameters() if ".experts." in name) // 2
    assert moe.strategy == "fsdp2" and moe.shard_ranks == 4
    assert rank.parameters == pytest.approx(4 * rank.dense_params / 4 + 4 * rank.expert_params)
    _, sp = _layout(["parallel.sp=2", "zero.stage=3"], 4)  # FSDP2 shards over dp x sp
    assert sp.shard_ranks == 4 and sp.heaviest.parameters == pytest.approx(4 * n / 4)


def test_uneven_tensor_parallel_shards_are_sized_as_dtensor_sizes_them():
    from dsrecipes.profiling.layout_memory import _shard_size

    assert [_shard_size(10, 4, i) for i in range(4)] == [3, 3, 3, 1]
    assert [_shard_size(2, 4, i) for i in range(4)] == [1, 1, 0, 0]
    _, tp = _layout(["model.vocab_size=321", "parallel.tp=2"], 2)
    first, second = tp.ranks
    assert first.num_params - second.num_params == 128 and tp.heaviest is first  # the odd vocabulary row


def test_estimate_cli_prints_the_layout(capsys):
    from dsrecipes.estimate import main

    ranks = main(["model=gpt_debug", "parallel.tp=2", "parallel.pp=2", "zero.stage=0", "world_size=8"])
    out = capsys.readouterr().out
    assert "world 8 = pp 2 x dp 2 x sp 1 x tp 2, ep 1" in " ".join(out.split())
    assert len(ranks) == 4 and "DeepSpeed" not in out  # the formula column is plain data parallelism's
    main(["model=gpt_debug", "moe.num_experts=4", "moe.ep_size=2", "zero.stage=3", "world_size=4"])
    assert "ep 2" in capsys.readouterr().out


@pytest.mark.parametrize("overrides, message", [
    (["parallel.tp=3", "world_size=8"], "parallel.tp=3 x parallel.sp=1 x parallel.pp=1 = 3 does not divide the world size 8"),
    (["moe.num_experts=4", "moe.ep_size=3", "world_size=4"], "moe.ep_size=3 must divide the world size 4"),
    (["parallel.tp=2", "zero.stage=0", "world_size=4"], "parallel.tp=2 with 2 data-parallel ranks needs zero.stage 2 or 3"),
    (["parallel.tp=3", "world_size=3"], "parallel.tp=3 does not divide model.n_head=4"),
    (["parallel.pp=2", "optimizer=onebitadam", "world_size=2"], "optimizer=onebitadam with parallel.pp=2 is not supported"),
    (["parallel.pp=8", "world_size=8"], "parallel.pp=8 with pp_schedule=1f1b makes 8 stages, more than model.n_layer=4"),
])
def test_estimate_cli_refuses_layouts_that_do_not_fit(overrides, message):
    from dsrecipes.estimate import main

    with pytest.raises(SystemExit) as err:
        main(["model=gpt_debug", *overrides])
    assert str(err.value).startswith("dsrecipes.estimate: ") and message in str(err.value)
