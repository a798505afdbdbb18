"""The memory estimator against the bytes the running engine really holds, per rank, every ZeRO stage."""

import pytest
import torch

from dsrecipes.profiling.memory_estimator import deepspeed_model_state_bytes, estimate_model_states
from tests.helpers.distributed import run_distributed


def _measure_all_stages(rank: int, world_size: int) -> None:
    import dsrecipes
    from dsrecipes.models import GPT, load_flavor
    from dsrecipes.profiling.memory_estimator import measure_model_states

    for stage in range(4):
        torch.manual_seed(0)
        model = GPT(load_flavor("gpt_debug", vocab_size=320))
        num_params = model.num_params()
        engine, optimizer, _, _ = dsrecipes.initialize(model=model, config={
            "zero": {"stage": stage}, "lr_scheduler": {"name": "constant"},
            "trainer": {"train_micro_batch_size_per_gpu": 2, "device": "cpu"}})
        ids = torch.randint(0, 257, (2, 32))
        for _ in range(2):  # a step creates the optimizer state; the second backward leaves gradients
            engine.backward(engine(ids, labels=ids).loss)
            if _ == 0:
                engine.step()
        measured = measure_model_states(engine.module, engine.optimizer)
        expected = estimate_model_states(num_params, world_size, stage)
        for key in ("parameters", "gradients", "optimizer_states"):
            want = getattr(expected, key)
            assert abs(measured[key] - want) <= 0.10 * want, (stage, rank, key, measured[key], want)


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("world_size", [2, 4])
def test_estimate_matches_what_the_engine_holds(world_size):
    run_distributed(_measure_all_stages, world_size, timeout_s=300)


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
