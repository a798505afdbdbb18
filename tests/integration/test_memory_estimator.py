"""The memory estimator against the bytes the running engine really holds, per rank, every ZeRO stage."""

import pytest
import torch

from dsrecipes.profiling.memory_estimator import estimate_model_states
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


# ------------------------------------------------------------------------------------------------
# Parallel layouts: the per-rank estimate (dsrecipes.profiling.layout_memory) against every rank's shards
# ------------------------------------------------------------------------------------------------

MOE = {"num_experts": 4, "ep_size": 2, "expert_interval": 2}  # MoE in blocks 1 and 3 of gpt_debug's 4
LAYOUTS = {  # name: (world size, config groups)
    "tp2_stage0": (2, {"parallel": {"tp": 2}, "zero": {"stage": 0}}),
    "dp2_tp2_stage3": (4, {"parallel": {"tp": 2}, "zero": {"stage": 3}}),
    "pp2": (2, {"parallel": {"pp": 2}, "zero": {"stage": 0}, "trainer": {"gradient_accumulation_steps": 2}}),
    "sp2_stage3": (2, {"parallel": {"sp": 2}, "zero": {"stage": 3}}),
    "ep2_stage0": (2, {"moe": MOE, "zero": {"stage": 0}}),
    "ep2_stage3": (2, {"moe": MOE, "zero": {"stage": 3}}),
}


def _layout_config(groups: dict) -> dict:
    trainer = {"train_micro_batch_size_per_gpu": 2, "device": "cpu", **groups.get("trainer", {})}
    return {**groups, "lr_scheduler": {"name": "constant"}, "trainer": trainer}


def _measure_layout(rank: int, world_size: int, groups: dict, record: str | None = None) -> None:
    """One optimizer step (the optimizer state exists), then one more forward and backward (gradients
    present), then this rank's local shards against the estimate for this rank."""
    import json

    import dsrecipes
    from dsrecipes.config.loading import load_config
    from dsrecipes.config.validate import to_root
    from dsrecipes.models import GPT, load_flavor
    from dsrecipes.models.moe_config import MoEConfig
    from dsrecipes.profiling.layout_memory import estimate_layout
    from dsrecipes.profiling.memory_estimator import measure_model_states

    config = _layout_config(groups)
    model_cfg = load_flavor("gpt_debug", vocab_size=320)
    moe = MoEConfig(**groups["moe"]) if "moe" in groups else None
    torch.manual_seed(0)
    engine, optimizer, _, _ = dsrecipes.initialize(model=GPT(model_cfg, moe), config=config)

    def next_batch() -> dict:
        ids = torch.randint(0, 257, (2, 32))
        return {"input_ids": ids, "labels": ids}

    engine.train_batch(next_batch)
    pipeline = engine.plan.pipeline
    if pipeline is not None:  # the schedule runs every micro-batch: forward and backward without the step
        ids = torch.cat([next_batch()["input_ids"] for _ in range(engine.gradient_accumulation_steps)])
        with engine.forward_context():
            pipeline.train_step(ids, ids)
    else:
        batch = engine.runner.prepare(next_batch(), engine.device)
        engine.backward(engine.runner.forward(engine, batch).loss)
    measured = measure_model_states(engine.module, engine.optimizer)
    with torch.device("meta"):
        meta = GPT(model_cfg, moe)
    expected = estimate_layout(meta, to_root(load_config(config)), engine.plan.dims).for_rank(rank)
    if record:
        with open(f"{record}.{rank}", "w") as out:
            json.dump({"rank": rank, "measured": measured, "estimated": {key: getattr(expected, key) for key in
                       ("parameters", "gradients", "optimizer_states")}}, out)
    # 1%, not the plain test's 10%: every gpt_debug dimension divides by these degrees, so the estimate
    # is exact here (measured: 0.0% on every rank); the margin is for FSDP2's uneven last shard elsewhere
    for key in ("parameters", "gradients", "optimizer_states"):
        want = getattr(expected, key)
        assert abs(measured[key] - want) <= 0.01 * want, (groups, rank, key, measured[key], want)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_layout_estimate_matches_every_ranks_shards(layout):
    world_size, groups = LAYOUTS[layout]
    run_distributed(_measure_layout, world_size, groups, timeout_s=110)
