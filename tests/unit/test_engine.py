"""The library path: dsrecipes.initialize + Engine on a user's own nn.Module and loop."""

import pytest
import torch
from omegaconf.errors import ConfigKeyError, ValidationError
from torch import nn
from torch.utils.data import TensorDataset

import dsrecipes


class TwoLayerRegressor(nn.Module):
    """A plain user model, nothing to do with dsrecipes' GPT."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, x):
        return self.net(x)


def regression_data(n=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


ENGINE_CFG = {
    "trainer": {"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1, "device": "cpu"},
    "optimizer": {"lr": 1e-2, "weight_decay": 0.0},
    "lr_scheduler": {"name": "constant"},
}


def test_engine_trains_a_user_module_with_a_user_loop():
    torch.manual_seed(0)
    engine, optimizer, loader, scheduler = dsrecipes.initialize(
        model=TwoLayerRegressor(), config=ENGINE_CFG, training_data=regression_data()
    )
    assert isinstance(optimizer, torch.optim.AdamW) and scheduler is engine.lr_scheduler
    losses = []
    for _ in range(10):
        for x, y in loader:
            loss = nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
    assert engine.global_steps == 10 * 16 and engine.global_samples == 10 * 256
    assert sum(losses[-16:]) / 16 < 0.2 * sum(losses[:16]) / 16


def _train_params(micro, gas, steps=3):
    torch.manual_seed(0)
    model = TwoLayerRegressor()
    cfg = {**ENGINE_CFG, "trainer": {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas,
                                     "device": "cpu", "gradient_clipping": 0.0}}
    engine, *_ = dsrecipes.initialize(model=model, config=cfg)
    data = regression_data(n=steps * 32)
    x, y = data.tensors
    for i in range(steps * gas):
        sl = slice(i * micro, (i + 1) * micro)
        engine.backward(nn.functional.mse_loss(engine(x[sl]), y[sl]))
        engine.step()
    assert engine.global_steps == steps
    return [p.detach().clone() for p in model.parameters()]


def test_loss_is_averaged_over_the_accumulation_window_exactly_once():
    """micro 8 x 4 accumulation steps == one micro-batch of 32 (mean losses): same parameters."""
    for a, b in zip(_train_params(micro=32, gas=1), _train_params(micro=8, gas=4)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_step_only_at_accumulation_boundary():
    engine, *_ = dsrecipes.initialize(
        model=TwoLayerRegressor(),
        config={"trainer": {"train_batch_size": 12, "train_micro_batch_size_per_gpu": 4, "device": "cpu",
                            "gradient_accumulation_steps": None}, "lr_scheduler": {"name": "constant"}},
    )
    assert engine.gradient_accumulation_steps == 3
    before = [p.detach().clone() for p in engine.module.parameters()]
    x = torch.randn(4, 8)
    for expected_steps in (0, 0, 1):
        assert engine.is_gradient_accumulation_boundary() == (expected_steps == 1)
        engine.backward(engine(x).pow(2).mean())
        engine.step()
        assert engine.global_steps == expected_steps
    assert any(not torch.equal(a, b) for a, b in zip(before, engine.module.parameters()))


def test_gradient_clipping_by_global_norm():
    cfg = {**ENGINE_CFG, "trainer": {**ENGINE_CFG["trainer"], "gradient_clipping": 0.5}}
    engine, *_ = dsrecipes.initialize(model=TwoLayerRegressor(), config=cfg)
    x = torch.randn(16, 8) * 100
    engine.backward(engine(x).pow(2).mean())
    grads = [p.grad.clone() for p in engine.module.parameters()]
    raw_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    engine.step()
    assert engine.last_grad_norm == pytest.approx(raw_norm.item(), rel=1e-5)
    assert raw_norm > 0.5


def test_no_weight_decay_for_biases_and_norms():
    engine, optimizer, *_ = dsrecipes.initialize(model=TwoLayerRegressor(),
                                                 config=ENGINE_CFG | {"optimizer": {"weight_decay": 0.1}})
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim == 2 for p in decay["params"]) and all(p.ndim == 1 for p in no_decay["params"])


def test_checkpoint_round_trip_continues_identically(tmp_path):
    def make():
        torch.manual_seed(0)
        return dsrecipes.initialize(model=TwoLayerRegressor(), config=ENGINE_CFG | {"lr_scheduler": {"warmup_num_steps": 4}})[0]

    x, y = regression_data(n=16 * 6).tensors
    def train(engine, steps):
        losses = []
        for i in steps:
            sl = slice(i * 16, (i + 1) * 16)
            loss = nn.functional.mse_loss(engine(x[sl]), y[sl])
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        return losses

    straight = train(make(), range(6))
    first = make()
    head = train(first, range(3))
    path = first.save_checkpoint(tmp_path)
    assert path.name == "step_3" and (tmp_path / "latest").read_text() == "step_3"
    resumed = make()
    resumed.load_checkpoint(tmp_path)
    assert resumed.global_steps == 3 and resumed.get_lr() == first.get_lr()
    assert head + train(resumed, range(3, 6)) == straight


def test_keep_last_prunes_old_checkpoints(tmp_path):
    engine, *_ = dsrecipes.initialize(model=TwoLayerRegressor(), config=ENGINE_CFG | {"checkpoint": {"keep_last": 2}})
    for step in range(4):
        engine.global_steps = step
        engine.save_checkpoint(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["step_2", "step_3"]
    with pytest.raises(FileNotFoundError, match="step_0"):
        engine.load_checkpoint(tmp_path, tag="step_0")


def test_config_forms_dict_yaml_overrides(tmp_path):
    yaml_path = tmp_path / "engine.yaml"
    yaml_path.write_text("trainer:\n  train_micro_batch_size_per_gpu: 4\n  device: cpu\noptimizer:\n  lr: 0.05\n")
    engine, optimizer, *_ = dsrecipes.initialize(model=TwoLayerRegressor(), config=str(yaml_path))
    assert engine.train_micro_batch_size_per_gpu == 4 and optimizer.defaults["lr"] == 0.05
    engine, optimizer, *_ = dsrecipes.initialize(
        model=TwoLayerRegressor(), config=["optimizer.lr=0.02", "trainer.device=cpu", "precision=bf16"]
    )
    assert optimizer.defaults["lr"] == 0.02 and engine.precision.compute_dtype == torch.bfloat16


def test_config_typos_and_bad_values_fail_with_the_key(tmp_path):
    with pytest.raises(ConfigKeyError, match="lrr"):
        dsrecipes.initialize(model=TwoLayerRegressor(), config={"optimizer": {"lrr": 1.0}})
    with pytest.raises(ValidationError, match="trainer.max_steps"):
        dsrecipes.initialize(model=TwoLayerRegressor(), config={"trainer": {"max_steps": "many"}})
    choices = r"\[fp32, bf16, fp16, auto\]"
    with pytest.raises(ValidationError, match=rf"(?s)Invalid value 'fp8', expected one of {choices}.*precision.dtype"):
        dsrecipes.initialize(model=TwoLayerRegressor(), config={"precision": {"dtype": "fp8"}})
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("trainer:\n  max_stepz: 3\n")
    with pytest.raises(ConfigKeyError, match="max_stepz"):
        dsrecipes.initialize(model=TwoLayerRegressor(), config=str(bad_yaml))


def test_bf16_autocast_forward():
    engine, *_ = dsrecipes.initialize(model=nn.Linear(8, 8),
                                      config={"precision": {"dtype": "bf16"}, "trainer": {"device": "cpu"}})
    out = engine(torch.randn(2, 8))
    assert out.dtype == torch.bfloat16 and engine.module.weight.dtype == torch.float32
