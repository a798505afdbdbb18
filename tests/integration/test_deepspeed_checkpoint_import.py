"""DeepSpeed 0.19.x checkpoints resumed by dsrecipes: the losses after the resume are DeepSpeed's own continuation.

DeepSpeed trains the parity tests' two-group model (tests/integration/test_deepspeed_parity.py: AdamW, WarmupLR,
clipping, accumulation 2) for SAVED_AT steps under ZeRO 0-3, fp32 and bf16, at world 1 and 2, saves, and goes
on for CONTINUE steps; dsrecipes loads each checkpoint through `Engine.load_checkpoint` (the DeepSpeed folder
itself, and once through `python -m dsrecipes.convert_ds_checkpoint`) at the same world size and trains the same
CONTINUE steps. All DeepSpeed runs happen in one launch per world size (module fixtures), all dsrecipes resumes of
a world size in one more.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from tests.integration.test_deepspeed_parity import GAS, _micro_batch, _net_and_groups, deepspeed_config, recipe_config
from tests.unit.test_deepspeed_parity import deepspeed  # noqa: F401  (skips the module without DeepSpeed)

os.environ.setdefault("DS_ACCELERATOR", "cpu")

SAVED_AT, CONTINUE = 3, 3
CASES = [(precision, stage) for precision in ("fp32", "bf16") for stage in (0, 1, 2, 3)]
FP32_TOLERANCE = 1e-6  # the fp32 parity tests' (test_fp32_training_matches_deepspeed)
# bf16: equal at world 1 and at ZeRO 0-1; at ZeRO 2-3 over 2 ranks DeepSpeed reduces bf16 gradients in its own
# bucket order and the losses part by bf16 rounding (5.9e-4 seen)
BF16_TOLERANCE = 3e-3


def _steps(engine, optimizer, rank, world, first, count, bf16_inputs):
    record = {"loss": [], "lr": []}
    for step in range(first, first + count):
        record["lr"].append([float(g["lr"]) for g in optimizer.param_groups])
        for micro in range(GAS):
            x, y = _micro_batch(step, micro, rank, world)
            loss = torch.nn.functional.mse_loss(engine(x.bfloat16() if bf16_inputs else x).float(), y)
            record["loss"].append(loss.item())
            engine.backward(loss)
            engine.step()
    return record


def _deepspeed_side(rank, world, folder):
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    out = {}
    for precision, stage in CASES:
        net, groups = _net_and_groups()
        cfg = deepspeed_config(stage)
        if precision == "bf16":
            cfg["bf16"] = {"enabled": True}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            engine, optimizer, _, _ = deepspeed.initialize(model=net, model_parameters=groups, config=cfg)
        _steps(engine, optimizer, rank, world, 0, SAVED_AT, precision == "bf16")
        engine.save_checkpoint(os.path.join(folder, f"{precision}_zero{stage}"))
        out[precision, stage] = _steps(engine, optimizer, rank, world, SAVED_AT, CONTINUE, precision == "bf16")
        engine.destroy()
    torch.save(out, os.path.join(folder, f"deepspeed_rank{rank}.pt"))


def _dsrecipes_side(rank, world, folder, converted):
    import dsrecipes

    out = {}
    for precision, stage in CASES:
        net, groups = _net_and_groups()
        cfg = recipe_config(stage)
        if precision == "bf16":
            cfg["precision"] = {"dtype": "bf16", "master_weights": True}
        engine, optimizer, _, _ = dsrecipes.initialize(model=net, config=cfg, model_parameters=groups)
        source = converted.get((precision, stage)) or os.path.join(folder, f"{precision}_zero{stage}")
        engine.load_checkpoint(source)
        record = _steps(engine, optimizer, rank, world, SAVED_AT, CONTINUE, False)
        record["global_steps"] = engine.global_steps
        out[precision, stage] = record
    torch.save(out, os.path.join(folder, f"dsrecipes_rank{rank}.pt"))


@pytest.fixture(scope="module", params=[1, 2], ids=["world1", "world2"])
def resumed(request, tmp_path_factory):
    """{'deepspeed': ..., 'dsrecipes': ...} per rank, and the checkpoint folder, for one world size."""
    from dsrecipes.convert_ds_checkpoint import main as convert
    from tests.helpers.distributed import run_distributed

    world = request.param
    folder = tmp_path_factory.mktemp(f"deepspeed_checkpoints_world{world}")
    run_distributed(_deepspeed_side, world, str(folder), timeout_s=240)
    # one case goes through the converter: its dsrecipes folder is what the resume reads
    converted = {("fp32", 2): str(folder / "converted_fp32_zero2")}
    assert convert([str(folder / "fp32_zero2"), converted["fp32", 2]]) == 0
    run_distributed(_dsrecipes_side, world, str(folder), converted, timeout_s=240)
    runs = [{"deepspeed": torch.load(folder / f"deepspeed_rank{r}.pt"), "dsrecipes": torch.load(folder / f"dsrecipes_rank{r}.pt")}
            for r in range(world)]
    return world, folder, runs


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("precision,stage", CASES, ids=[f"{p}-zero{s}" for p, s in CASES])
def test_resumed_losses_continue_deepspeeds(resumed, precision, stage):
    """Every micro-batch loss of the CONTINUE steps after the resume, on every rank, and the lrs they used."""
    world, _, runs = resumed
    tolerance = FP32_TOLERANCE if precision == "fp32" else BF16_TOLERANCE
    for rank, run in enumerate(runs):
        ours, theirs = run["dsrecipes"][precision, stage], run["deepspeed"][precision, stage]
        diff = max(abs(a - b) for a, b in zip(ours["loss"], theirs["loss"]))
        print(f"world {world} {precision} zero{stage} rank {rank}: max |loss diff| {diff:.3g}")
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=0, abs=tolerance), f"rank {rank}"
        assert [lr for step in ours["lr"] for lr in step] == pytest.approx([lr for step in theirs["lr"] for lr in step],
                                                                           rel=1e-12, abs=0)
        assert ours["global_steps"] == SAVED_AT + CONTINUE


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_weights_equal_deepspeeds_own_consolidation(resumed, stage):
    """The reassembled fp32 weights equal DeepSpeed's zero_to_fp32 bit for bit (its own reader of the partitions)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from dsrecipes.training.checkpointing.deepspeed_checkpoint import read_deepspeed_checkpoint

    _, folder, _ = resumed
    for precision in ("fp32", "bf16"):
        ours = read_deepspeed_checkpoint(folder / f"{precision}_zero{stage}")
        theirs = get_fp32_state_dict_from_zero_checkpoint(str(folder / f"{precision}_zero{stage}"))
        assert set(ours.weights) == set(theirs)
        for name, value in theirs.items():
            assert torch.equal(ours.weights[name], value.float()), name
        assert ours.zero_stage == stage and ours.global_steps == SAVED_AT
        assert ours.lr_scheduler == {"last_batch_iteration": SAVED_AT - 1}


@pytest.mark.slow
def test_safetensors_conversion(resumed, tmp_path):
    """--safetensors writes the fp32 weights by name, readable without dsrecipes or DeepSpeed."""
    from safetensors.torch import load_file

    from dsrecipes.convert_ds_checkpoint import main as convert
    from dsrecipes.training.checkpointing.deepspeed_checkpoint import read_deepspeed_checkpoint

    _, folder, _ = resumed
    out = tmp_path / "model.safetensors"
    assert convert([str(folder / "bf16_zero3"), str(out), "--safetensors"]) == 0
    loaded, expected = load_file(str(out)), read_deepspeed_checkpoint(folder / "bf16_zero3").weights
    net, _ = _net_and_groups()
    assert set(loaded) == set(net.state_dict())
    for name, value in expected.items():
        assert loaded[name].dtype == torch.float32 and torch.equal(loaded[name], value)
