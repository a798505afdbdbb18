"""fp16 loss scaling, master weights, overflow skipping and non-finite handling in the Engine."""

import math

import pytest
import torch
from torch import nn

import dsrecipes


def make_engine(precision: dict, optimizer: dict | None = None, clipping: float = 0.0, scheduler: dict | None = None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    config = {
        "trainer": {"train_micro_batch_size_per_gpu": 8, "device": "cpu", "gradient_clipping": clipping},
        "optimizer": optimizer or {"lr": 1e-2, "weight_decay": 0.0},
        "lr_scheduler": scheduler or {"name": "constant"},
        "precision": precision,
    }
    return dsrecipes.initialize(model=model, config=config)[0]


def train_step(engine, x, y, poison=False):
    loss = nn.functional.mse_loss(engine(x).float(), y)
    if poison:
        loss = loss * float("inf")
    engine.backward(loss)
    engine.step()
    return loss


def test_fp16_injected_overflow_skips_exactly_that_step_and_the_schedule_waits():
    engine = make_engine(
        {"dtype": "fp16", "master_weights": True, "initial_scale_power": 10, "hysteresis": 1},
        scheduler={"name": "warmup_lr", "warmup_num_steps": 10, "warmup_type": "linear",
                   "warmup_min_lr": 0.001, "warmup_max_lr": 0.01},
    )
    x, y = torch.randn(8, 8), torch.randn(8, 1)
    lrs, scales = [], []
    for step in range(5):
        before = [p.detach().clone() for p in engine.optimizer.param_groups[0]["params"]]
        lr_before = engine.get_lr()[0]
        train_step(engine, x, y, poison=(step == 2))
        after = engine.optimizer.param_groups[0]["params"]
        changed = any(not torch.equal(a, b) for a, b in zip(before, after))
        assert changed == (step != 2), step
        assert engine.last_step_skipped == (step == 2)
        lrs.append(lr_before)
        scales.append(engine.precision.loss_scale)
    assert engine.skipped_steps == 1 and engine.global_steps == 5
    # the schedule did not advance on the skipped step: the lr used at step 3 equals the one at step 2
    assert lrs == pytest.approx([0.001, 0.0019, 0.0028, 0.0028, 0.0037])
    assert scales == [1024, 1024, 512, 512, 512]
    assert math.isnan(engine.last_grad_norm) is False


def test_fp16_unscale_and_clip_in_one_pass_on_the_true_norm():
    """SGD lr=1: the update equals the clipped, unscaled gradient of an fp32 reference."""
    engine = make_engine({"dtype": "fp16", "master_weights": True, "loss_scale": 1024.0},
                         optimizer={"name": "sgd", "lr": 1.0, "weight_decay": 0.0}, clipping=0.05)
    reference = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    masters = engine.optimizer.param_groups[0]["params"] + engine.optimizer.param_groups[1]["params"]
    with torch.no_grad():  # the reference starts from the fp16-rounded weights the engine computes with
        for ref, low in zip(reference.parameters(), engine.module.parameters()):
            ref.copy_(low.float())
    x, y = torch.randn(8, 8), torch.randn(8, 1)
    nn.functional.mse_loss(reference(x), y).backward()
    true_norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in reference.parameters()]))
    before = {id(p): p.detach().clone() for p in masters}
    train_step(engine, x, y)
    assert engine.last_grad_norm == pytest.approx(true_norm.item(), rel=2e-2)  # unscaled, not x1024
    assert true_norm > 0.05
    expected_scale = 0.05 / (true_norm.item() + 1e-6)
    by_name = dict(zip([id(p) for p in masters], masters))
    low_to_master = {id(low): master for low, master in engine.masters.pairs}
    for ref, low in zip(reference.parameters(), engine.module.parameters()):
        master = low_to_master[id(low)]
        update = before[id(master)] - by_name[id(master)]
        torch.testing.assert_close(update, ref.grad * expected_scale, rtol=3e-2, atol=1e-4)


def test_bf16_master_weights_keep_fp32_optimizer_and_save_fp32(tmp_path):
    engine = make_engine({"dtype": "bf16", "master_weights": True})
    assert all(p.dtype == torch.bfloat16 for p in engine.module.parameters())
    assert all(p.dtype == torch.float32 for g in engine.optimizer.param_groups for p in g["params"])
    x = torch.randn(64, 8)
    y = x.sum(dim=1, keepdim=True)
    losses = [train_step(engine, x[i % 8 * 8:(i % 8 + 1) * 8], y[i % 8 * 8:(i % 8 + 1) * 8]).item() for i in range(60)]
    assert sum(losses[-8:]) < 0.5 * sum(losses[:8])
    path = engine.save_checkpoint(tmp_path)
    saved = torch.load(path / "model.pt")
    assert all(t.dtype == torch.float32 for t in saved.values())
    fresh = make_engine({"dtype": "bf16", "master_weights": True})
    fresh.load_checkpoint(tmp_path)
    for a, b in zip(engine.module.parameters(), fresh.module.parameters()):
        assert torch.equal(a, b)


def test_bf16_masters_step_the_bf16_weights_themselves_and_resume_bitwise(tmp_path):
    """precision.master_dtype=bf16 (DeepSpeed's bf16_master_weights_and_grads + bf16_optimizer_states): no fp32 copy,
    the optimizer steps the module's bf16 parameters and holds bf16 state; the layout line and the estimator say so;
    a checkpoint resumes bitwise. At world 2 against DeepSpeed: tests/integration/test_deepspeed_parity.py."""
    from dsrecipes.profiling.memory_estimator import estimate_model_states

    bf16_masters = {"dtype": "bf16", "master_weights": True, "master_dtype": "bf16"}
    engine = make_engine(bf16_masters)
    stepped = [p for g in engine.optimizer.param_groups for p in g["params"]]
    assert {id(p) for p in stepped} == {id(p) for p in engine.module.parameters()}  # no master copy
    assert all(p.dtype == torch.bfloat16 for p in stepped) and engine.masters is None
    assert "precision: bf16 weights and compute, stepped in bf16 (no fp32 master copy), bf16 optimizer state" \
        in engine.layout and "optimizer: adamw, state 4 B/param (bf16" in engine.layout
    x = torch.randn(64, 8)
    y = x.sum(dim=1, keepdim=True)
    losses = [train_step(engine, x[i % 8 * 8:(i % 8 + 1) * 8], y[i % 8 * 8:(i % 8 + 1) * 8]).item() for i in range(40)]
    assert sum(losses[-8:]) < 0.5 * sum(losses[:8])
    assert {v.dtype for state in engine.optimizer.state.values() for v in state.values() if v.dim()} == {torch.bfloat16}
    engine.save_checkpoint(tmp_path)
    fresh = make_engine(bf16_masters)
    fresh.load_checkpoint(tmp_path)
    for engine_ in (engine, fresh):
        train_step(engine_, x[:8], y[:8])
    for a, b in zip(engine.module.parameters(), fresh.module.parameters()):
        assert torch.equal(a, b)
    states = estimate_model_states(1000, 1, 0, "bf16", True, bf16_masters=True)  # 2 + 2 + 4 bytes a parameter
    assert (states.parameters, states.gradients, states.optimizer_states) == (2000, 2000, 4000)


@pytest.mark.parametrize("precision", [{"dtype": "fp32", "master_dtype": "bf16"},
                                       {"dtype": "bf16", "master_weights": False, "master_dtype": "bf16"}])
def test_bf16_masters_need_bf16_with_master_weights(precision):
    with pytest.raises(ValueError, match=r"precision.master_dtype=bf16 .* needs precision.dtype=bf16 and "
                                         r"precision.master_weights=true"):
        make_engine(precision)


def test_fp32_nonfinite_loss_stops_with_the_step():
    engine = make_engine({"dtype": "fp32"})
    x, y = torch.randn(8, 8), torch.randn(8, 1)
    train_step(engine, x, y)
    with pytest.raises(FloatingPointError, match="non-finite gradients .* at step 2.*nonfinite_grads=skip"):
        train_step(engine, x, y, poison=True)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_nonfinite_skip_policy_counts_skipped_steps(dtype):
    engine = make_engine({"dtype": dtype, "nonfinite_grads": "skip"})
    x, y = torch.randn(8, 8), torch.randn(8, 1)
    before = [p.detach().clone() for p in engine.module.parameters()]
    train_step(engine, x, y, poison=True)
    assert engine.skipped_steps == 1 and engine.global_steps == 1 and engine.last_step_skipped
    assert all(torch.equal(a, b) for a, b in zip(before, engine.module.parameters()))
    train_step(engine, x, y)
    assert engine.skipped_steps == 1 and not engine.last_step_skipped


def test_min_scale_error_or_warning():
    engine = make_engine({"dtype": "fp16", "master_weights": True, "initial_scale_power": 0, "hysteresis": 1})
    x, y = torch.randn(8, 8), torch.randn(8, 1)
    with pytest.raises(FloatingPointError, match="minimum"):
        train_step(engine, x, y, poison=True)
    engine = make_engine({"dtype": "fp16", "master_weights": True, "initial_scale_power": 0, "hysteresis": 1,
                          "raise_error_at_min_scale": False})
    with pytest.warns(UserWarning, match="minimum"):
        train_step(engine, x, y, poison=True)
    assert engine.skipped_steps == 1


@pytest.mark.parametrize(
    "precision, message",
    [
        # Enum fields: rejected when the config dict is merged onto the schema, naming the key and the choices
        ({"dtype": "fp8"}, r"Invalid value 'fp8', expected one of \[fp32, bf16, fp16, auto\]\s+full_key: precision\.dtype"),
        ({"dtype": "fp32", "master_weights": True}, r"master_weights=true needs dtype bf16 or fp16"),
        ({"dtype": "fp16", "loss_scale_window": 0}, r"precision\.loss_scale_window=0 must be > 0"),
        ({"dtype": "bf16", "nonfinite_grads": "ignore"},
         r"Invalid value 'ignore', expected one of \[error, skip\]\s+full_key: precision\.nonfinite_grads"),
    ],
)
def test_precision_config_errors(precision, message):
    with pytest.raises(ValueError, match=message):
        make_engine(precision)


def test_plain_string_precision_values_are_checked_by_the_validator():
    from dsrecipes.training.config import PrecisionConfig
    from dsrecipes.training.precision import validate_precision_config

    with pytest.raises(ValueError, match="precision.dtype='fp8' is not valid; choose one of: fp32, bf16, fp16"):
        validate_precision_config(PrecisionConfig(dtype="fp8"))
    with pytest.raises(ValueError, match="precision.nonfinite_grads='ignore' is not valid; choose one of: error, skip"):
        validate_precision_config(PrecisionConfig(nonfinite_grads="ignore"))


def test_auto_precision_picks_bf16_only_where_the_device_is_fast_at_it(monkeypatch):
    """precision=auto: fp32 on this CPU (no AMX tiles), bf16 autocast where fast_bf16 says so, logged with the reason."""
    import torch

    from dsrecipes.config import validate_recipe
    from dsrecipes.config.store import compose
    from dsrecipes.training import precision as precision_module
    from dsrecipes.training.config import PrecisionConfig

    root, _ = validate_recipe(compose(["precision=auto", "trainer.device=cpu"]))
    fast, why = precision_module.fast_bf16(torch.device("cpu"))
    assert root.precision.dtype == ("bf16" if fast else "fp32") and why
    monkeypatch.setattr(precision_module, "fast_bf16", lambda device: (True, "fake AMX"))
    cfg = PrecisionConfig(dtype="auto", master_weights=True)
    assert precision_module.resolve_auto_precision(cfg, torch.device("cpu")) == "precision.dtype=auto -> bf16 on cpu: fake AMX"
    assert (cfg.dtype, cfg.master_weights) == ("bf16", True)
    monkeypatch.setattr(precision_module, "fast_bf16", lambda device: (False, "no AMX"))
    cfg = PrecisionConfig(dtype="auto", master_weights=True)
    precision = precision_module.Precision(cfg, torch.device("cpu"))  # the library path resolves it too
    assert (precision.name, precision.master_weights, precision.use_autocast) == ("fp32", False, False)
