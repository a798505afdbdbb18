"""Optimizers: Lamb and Lion arithmetic, DeepSpeed's name mapping, impl selection, per-option schemas and validation.

Expected values of Lamb and Lion are written out here with plain tensor arithmetic (not by calling
the code under test); everything runs on CPU in a few seconds.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import math
from dataclasses import replace

import pytest
import torch
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError
from torch import nn
from torch.testing import assert_close

import dsrecipes
from dsrecipes.config.loading import load_config
from dsrecipes.config.store import compose
from dsrecipes.config.validate import to_root, validate_recipe
from dsrecipes.training.optim.lamb import Lamb
from dsrecipes.training.optim.lion import Lion
from dsrecipes.training.optim.optimizer_config import (
    OPTIMIZER_SCHEMAS,
    AdamWConfig,
    CustomOptimizerConfig,
    OptimizerConfig,
    OptimizerImpl,
)
from dsrecipes.training.optim.optimizers import (
    OPTIMIZER_IMPLS,
    OPTIMIZERS,
    build_optimizer,
    optimizer_class,
    param_groups,
    supported_impls,
    validate_optimizer_config,
)
from tests.helpers.paths import REPO

CONF_DIR = REPO / "conf" / "optimizer"
CONF_NAMES = sorted(p.stem for p in CONF_DIR.glob("*.yaml"))


class SmallNet(nn.Module):
    """Embedding + Linear + LayerNorm + Linear: matrices, biases and a norm weight."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.fc1 = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)
        self.fc2 = nn.Linear(16, 1)

    def forward(self, idx):
        return self.fc2(torch.tanh(self.norm(self.fc1(self.embed(idx))))).squeeze(-1)


def _regression_batch():
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 10, (64,), generator=g)
    target = torch.linspace(-1.0, 1.0, 10)[idx]
    return idx, target


def _cfg(option: str = "adamw", **overrides) -> OptimizerConfig:
    """The option's schema with its dataclass defaults (what a dict naming it gets), then overrides."""
    return replace(OPTIMIZER_SCHEMAS[option](), **overrides)


def _custom(target: str, **arguments) -> CustomOptimizerConfig:
    """optimizer=custom with _target_ and the class's own arguments (flat, as on the command line)."""
    cfg = CustomOptimizerConfig(_target_=target)
    for key, value in arguments.items():
        setattr(cfg, key, value)
    return cfg


def _composed(*overrides: str) -> OptimizerConfig:
    return to_root(compose(list(overrides))).optimizer


BUILT_IN = [name for name in OPTIMIZERS if name != "custom"]


def _set_grads(params, seed):
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)


# --------------------------------------------------------------------------------------- Lamb


def test_lamb_two_steps_match_hand_computation():
    lr, b1, b2, eps, wd = 0.1, 0.9, 0.999, 1e-8, 0.01
    p0 = torch.tensor([1.0, -2.0, 3.0, 0.5])
    g1 = torch.tensor([0.5, 0.1, -0.2, 0.0])
    g2 = torch.tensor([-0.3, 0.2, 0.4, 0.1])
    param = nn.Parameter(p0.clone())
    opt = Lamb([param], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)

    # step 1, written out
    m = (1 - b1) * g1
    v = (1 - b2) * g1 * g1
    u = (m / (1 - b1)) / (torch.sqrt(v / (1 - b2)) + eps) + wd * p0
    ratio = min(max(torch.sqrt((p0 * p0).sum()) / torch.sqrt((u * u).sum()), 0.01), 10.0)
    p1 = p0 - lr * ratio * u
    param.grad = g1.clone()
    opt.step()
    assert_close(param.data, p1)
    assert_close(opt.state[param]["exp_avg"], m)
    assert_close(opt.state[param]["exp_avg_sq"], v)
    assert float(opt.state[param]["step"]) == 1.0

    # step 2: bias corrections 1 - beta^2
    m = b1 * m + (1 - b1) * g2
    v = b2 * v + (1 - b2) * g2 * g2
    u = (m / (1 - b1**2)) / (torch.sqrt(v / (1 - b2**2)) + eps) + wd * p1
    ratio = min(max(torch.sqrt((p1 * p1).sum()) / torch.sqrt((u * u).sum()), 0.01), 10.0)
    p2 = p1 - lr * ratio * u
    param.grad = g2.clone()
    opt.step()
    assert_close(param.data, p2)
    assert float(opt.state[param]["step"]) == 2.0


@pytest.mark.parametrize("foreach", [True, False])
def test_lamb_trust_ratio_clamped_at_both_bounds(foreach):
    # At step 1 with weight_decay 0, u = g / (|g| + eps) ~ sign(g), so ||u|| = 2 for four nonzero entries.
    g = torch.tensor([1.0, -1.0, 2.0, -0.5])
    u = g / (g.abs() + 1e-8)
    big = nn.Parameter(torch.full((4,), 1000.0))  # ||p|| / ||u|| = 1000 -> max_coeff
    small = nn.Parameter(torch.full((4,), 1e-4))  # 1e-4 -> min_coeff
    mid = nn.Parameter(torch.full((4,), 3.0))  # 3, inside the bounds
    expected = [big.data - 0.1 * 10.0 * u, small.data - 0.1 * 0.01 * u, mid.data - 0.1 * 3.0 * u]
    opt = Lamb([big, small, mid], lr=0.1, weight_decay=0.0, foreach=foreach)
    for p in (big, small, mid):
        p.grad = g.clone()
    opt.step()
    for p, want in zip((big, small, mid), expected):
        assert_close(p.data, want)

    custom = nn.Parameter(torch.full((4,), 1000.0))
    opt = Lamb([custom], lr=0.1, max_coeff=2.0, min_coeff=0.5, foreach=foreach)
    custom.grad = g.clone()
    opt.step()
    assert_close(custom.data, torch.full((4,), 1000.0) - 0.1 * 2.0 * u)


@pytest.mark.parametrize("foreach", [True, False])
def test_lamb_trust_ratio_is_one_when_a_norm_is_zero(foreach):
    g = torch.tensor([0.5, -2.0, 1.0])
    zero_param = nn.Parameter(torch.zeros(3))  # ||p|| = 0 -> ratio 1 (not min_coeff)
    zero_grad = nn.Parameter(torch.tensor([1.0, 2.0, 3.0]))  # u = 0 (no decay) -> ratio 1, no move
    opt = Lamb([zero_param, zero_grad], lr=0.1, weight_decay=0.0, foreach=foreach)
    zero_param.grad = g.clone()
    zero_grad.grad = torch.zeros(3)
    opt.step()
    assert_close(zero_param.data, -0.1 * g / (g.abs() + 1e-8))
    assert_close(zero_grad.data, torch.tensor([1.0, 2.0, 3.0]))
    assert torch.isfinite(zero_param.data).all()


# --------------------------------------------------------------------------------------- Lion


def test_lion_two_steps_match_hand_computation():
    lr, b1, b2, wd = 0.01, 0.9, 0.99, 0.5
    p0 = torch.tensor([1.0, -2.0, 3.0, 0.25])
    g1 = torch.tensor([1.0, -1.0, 0.5, 0.0])
    g2 = torch.tensor([-0.05, -1.0, 2.0, 0.0])
    param = nn.Parameter(p0.clone())
    opt = Lion([param], lr=lr, betas=(b1, b2), weight_decay=wd)

    m = torch.zeros(4)
    c = b1 * m + (1 - b1) * g1
    p1 = p0 * (1 - lr * wd) - lr * torch.sign(c)
    m = b2 * m + (1 - b2) * g1
    param.grad = g1.clone()
    opt.step()
    assert_close(param.data, p1)
    assert_close(opt.state[param]["exp_avg"], m)

    # step 2: momentum 0.9 * 0.01 outweighs 0.1 * (-0.05), so the first entry still moves down
    c = b1 * m + (1 - b1) * g2
    assert c[0] > 0 and g2[0] < 0 and c[3] == 0
    p2 = p1 * (1 - lr * wd) - lr * torch.sign(c)
    m = b2 * m + (1 - b2) * g2
    param.grad = g2.clone()
    opt.step()
    assert_close(param.data, p2)
    assert_close(opt.state[param]["exp_avg"], m)


def test_lion_default_betas_and_groups_with_own_lr():
    assert Lion([nn.Parameter(torch.zeros(1))]).defaults["betas"] == (0.9, 0.99)
    a, b = nn.Parameter(torch.zeros(5)), nn.Parameter(torch.zeros(5))
    opt = Lion([{"params": [a], "lr": 0.1}, {"params": [b], "lr": 0.01, "weight_decay": 1.0}], lr=1.0)
    a.grad, b.grad = torch.ones(5), -torch.ones(5)
    opt.step()
    assert_close(a.data, torch.full((5,), -0.1))
    assert_close(b.data, torch.full((5,), 0.01))  # sign step of exactly lr; decay of 0 is 0


# ------------------------------------------------------------------------------ Lamb and Lion


def _make_params(seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(4, 3), (3,), (2, 2, 2), (7,), (5, 1)]
    return [nn.Parameter(torch.randn(s, generator=g)) for s in shapes]


def _run_paths(cls, foreach, steps=4, **kwargs):
    params = _make_params()
    groups = [
        {"params": params[:2], "weight_decay": 0.1},
        {"params": params[2:4], "weight_decay": 0.0, "lr": 0.03},
        {"params": params[4:]},
    ]
    opt = cls(groups, lr=0.01, foreach=foreach, **kwargs)
    for step in range(steps):
        _set_grads(params, seed=100 + step)
        params[3].grad = None if step % 2 == 0 else params[3].grad  # sometimes skipped
        opt.step()
    return params, opt


@pytest.mark.parametrize("cls", [Lamb, Lion], ids=["lamb", "lion"])
def test_foreach_and_loop_paths_agree(cls):
    fe_params, fe_opt = _run_paths(cls, foreach=True)
    lp_params, lp_opt = _run_paths(cls, foreach=False)
    for a, b in zip(fe_params, lp_params):
        assert_close(a.data, b.data, rtol=1e-6, atol=1e-7)
        for key, value in fe_opt.state[a].items():
            assert_close(value, lp_opt.state[b][key], rtol=1e-6, atol=1e-7)
    if cls is Lamb:  # the sometimes-skipped parameter counted only its own steps
        assert float(fe_opt.state[fe_params[3]]["step"]) == 2.0 and float(fe_opt.state[fe_params[0]]["step"]) == 4.0


@pytest.mark.parametrize("cls", [Lamb, Lion], ids=["lamb", "lion"])
def test_params_without_grad_are_skipped(cls):
    used, unused = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(3))
    opt = cls([used, unused], lr=0.1, weight_decay=0.1)
    used.grad = torch.ones(3)
    opt.step()
    assert not torch.equal(used.data, torch.ones(3))
    assert torch.equal(unused.data, torch.ones(3)) and unused not in opt.state


@pytest.mark.parametrize("cls", [Lamb, Lion], ids=["lamb", "lion"])
def test_step_with_closure_returns_the_loss(cls):
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    opt = cls(model.parameters(), lr=1e-2)

    def closure():
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    losses = [opt.step(closure).item() for _ in range(20)]
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("cls", [Lamb, Lion], ids=["lamb", "lion"])
def test_state_dict_round_trip_continues_identically(cls):
    torch.manual_seed(0)
    model = SmallNet()
    idx, target = _regression_batch()
    opt = cls(param_groups(model, 0.1, True), lr=1e-2)

    def train(m, o, steps):
        for _ in range(steps):
            o.zero_grad()
            nn.functional.mse_loss(m(idx), target).backward()
            o.step()

    train(model, opt, 3)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)

    resumed = SmallNet()
    resumed.load_state_dict(saved["model"])
    resumed_opt = cls(param_groups(resumed, 0.5, True), lr=0.5)  # hyperparameters come from the checkpoint
    resumed_opt.load_state_dict(saved["opt"])
    train(model, opt, 3)
    train(resumed, resumed_opt, 3)
    for a, b in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("cls", [Lamb, Lion], ids=["lamb", "lion"])
def test_invalid_hyperparameters_are_rejected(cls):
    p = [nn.Parameter(torch.zeros(1))]
    with pytest.raises(ValueError, match="lr"):
        cls(p, lr=0.0)
    with pytest.raises(ValueError, match="betas"):
        cls(p, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="weight_decay"):
        cls(p, weight_decay=-1.0)


# ------------------------------------------------------------------------- build_optimizer


@pytest.mark.parametrize("adam_w_mode, expected", [(True, torch.optim.AdamW), (False, torch.optim.Adam)])
def test_adam_follows_adam_w_mode(adam_w_mode, expected):
    torch.manual_seed(0)
    model = SmallNet()
    reference_model = copy.deepcopy(model)
    cfg = _cfg("adam", adam_w_mode=adam_w_mode, lr=1e-2, betas=[0.9, 0.95], eps=1e-8, weight_decay=0.5)
    assert optimizer_class(cfg) is expected
    opt = build_optimizer(cfg, model)
    assert type(opt) is expected
    reference = expected(param_groups(reference_model, 0.5, True), lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    idx, target = _regression_batch()
    for m, o in ((model, opt), (reference_model, reference)):
        for _ in range(3):
            o.zero_grad()
            nn.functional.mse_loss(m(idx), target).backward()
            o.step()
    for a, b in zip(model.parameters(), reference_model.parameters()):
        assert_close(a, b)


def test_adam_and_adamw_weight_decay_differ():
    results = []
    for adam_w_mode in (True, False):
        torch.manual_seed(0)
        model = nn.Linear(4, 4)
        opt = build_optimizer(_cfg("adam", adam_w_mode=adam_w_mode, weight_decay=0.5, lr=0.1), model)
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        results.append(model.weight.detach().clone())
    assert not torch.allclose(results[0], results[1])


def test_param_groups_exempt_biases_and_norms_from_weight_decay():
    model = SmallNet()
    opt = build_optimizer(_cfg(weight_decay=0.2), model)
    decay, no_decay = opt.param_groups
    ids = lambda group: {id(p) for p in group["params"]}  # noqa: E731
    assert decay["weight_decay"] == 0.2 and no_decay["weight_decay"] == 0.0
    assert ids(decay) == {id(model.embed.weight), id(model.fc1.weight), id(model.fc2.weight)}
    assert ids(no_decay) == {id(model.fc1.bias), id(model.norm.weight), id(model.norm.bias), id(model.fc2.bias)}

    everything = build_optimizer(_cfg(weight_decay=0.2, no_decay_bias_and_norm=False), model)
    assert len(everything.param_groups) == 1 and everything.param_groups[0]["weight_decay"] == 0.2
    assert len(everything.param_groups[0]["params"]) == 7

    frozen = SmallNet()
    frozen.embed.weight.requires_grad_(False)
    assert id(frozen.embed.weight) not in {id(p) for g in build_optimizer(_cfg(), frozen).param_groups for p in g["params"]}
    norm_only = build_optimizer(_cfg(), nn.LayerNorm(4))
    assert [g["weight_decay"] for g in norm_only.param_groups] == [0.0]


def test_every_option_has_a_config_file_and_a_schema():
    assert set(OPTIMIZERS) == set(CONF_NAMES) and list(OPTIMIZERS)[0] == "adamw"  # the default first
    for name in CONF_NAMES:
        text = (CONF_DIR / f"{name}.yaml").read_text()
        assert f"- {name}_schema" in text, f"{name}.yaml should extend {name}_schema in its defaults list"
        assert OPTIMIZER_SCHEMAS[name]().name == name and issubclass(OPTIMIZER_SCHEMAS[name], OptimizerConfig)


# torchao's AdamW8bit step is torch.compile'd: inductor runs a C++ compiler, a subprocess the unit tier refuses; it
# trains in tests/integration/test_adamw8bit.py
COMPILED_STEP = ("adamw8bit",)


@pytest.mark.parametrize("conf_name", [name for name in CONF_NAMES if name not in COMPILED_STEP])
def test_every_config_file_builds_and_trains(conf_name):
    first_line = (CONF_DIR / f"{conf_name}.yaml").read_text().splitlines()[0]
    assert first_line.startswith("# "), f"{conf_name}.yaml should start with a comment saying what it is"
    extra = ["optimizer._target_=torch.optim.NAdam"] if conf_name == "custom" else []
    cfg = _composed(f"optimizer={conf_name}", *extra)
    assert type(cfg) is OPTIMIZER_SCHEMAS[conf_name]
    validate_optimizer_config(cfg)
    torch.manual_seed(0)
    model = SmallNet()
    opt = build_optimizer(cfg, model)
    idx, target = _regression_batch()
    losses = []
    for _ in range(15):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(idx), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0]


# the 1-bit optimizers have one per-tensor path (their compressed all-reduce is per tensor): impl=auto only; so does
# muon (each matrix gathered and orthogonalised on its own; tests/unit/test_muon.py)
# and so does torchao's adamw8bit (its own compiled step, no impl argument)
ONEBIT = ("onebitadam", "zerooneadam", "onebitlamb", "muon", *COMPILED_STEP)


@pytest.mark.parametrize("name", [n for n in BUILT_IN if n not in ONEBIT])
@pytest.mark.parametrize("impl", ["auto", "foreach", "for_loop"])
def test_every_option_builds_with_every_portable_impl(name, impl):
    model = SmallNet()
    opt = build_optimizer(_cfg(name, impl=impl), model)
    assert opt.defaults["foreach"] is (impl != "for_loop")  # auto on CPU = foreach
    model(torch.arange(4)).sum().backward()
    opt.step()


def test_built_in_classes_and_arguments():
    model = SmallNet()
    sgd = build_optimizer(_cfg("sgd", lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4), model)
    assert type(sgd) is torch.optim.SGD
    assert (sgd.defaults["momentum"], sgd.defaults["nesterov"], sgd.param_groups[0]["weight_decay"]) == (0.9, True, 1e-4)
    adagrad = build_optimizer(_cfg("adagrad", lr=0.01, lr_decay=0.001, eps=1e-10), model)
    assert type(adagrad) is torch.optim.Adagrad
    assert (adagrad.defaults["lr_decay"], adagrad.defaults["eps"]) == (0.001, 1e-10)
    lamb = build_optimizer(_cfg("lamb", max_coeff=5.0, min_coeff=0.1, betas=[0.8, 0.9]), model)
    assert type(lamb) is Lamb and (lamb.defaults["max_coeff"], lamb.defaults["min_coeff"]) == (5.0, 0.1)
    assert lamb.defaults["betas"] == (0.8, 0.9)  # lists reach the class as tuples, as torch.optim declares them
    lion = build_optimizer(_cfg("lion", lr=3e-4, betas=[0.95, 0.98]), model)
    assert type(lion) is Lion and lion.defaults["betas"] == (0.95, 0.98)
    rmsprop = build_optimizer(_cfg("rmsprop", alpha=0.9, centered=True), model)
    assert type(rmsprop) is torch.optim.RMSprop and (rmsprop.defaults["alpha"], rmsprop.defaults["centered"]) == (0.9, True)
    # each option lists the class's other useful arguments as keys of its own
    assert build_optimizer(_cfg("adamw", amsgrad=True), model).defaults["amsgrad"] is True
    assert build_optimizer(_cfg("lamb", bias_correction=False), model).defaults["bias_correction"] is False


def test_engine_keys_never_reach_the_class():
    # torch.optim.SGD takes none of name / impl / no_decay_bias_and_norm: building at all shows they stay out
    opt = build_optimizer(_custom("torch.optim.SGD", momentum=0.5, weight_decay=0.01), SmallNet())
    assert type(opt) is torch.optim.SGD and opt.defaults["momentum"] == 0.5
    assert not {"name", "impl", "no_decay_bias_and_norm", "_target_"} & set(opt.defaults)
    assert opt.defaults["weight_decay"] == 0.01  # passed as well, since SGD takes it


def test_custom_target_builds_any_torch_optimizer_with_flat_arguments():
    torch.manual_seed(0)
    model = SmallNet()
    reference_model = copy.deepcopy(model)
    cfg = _custom("torch.optim.RMSprop", lr=1e-2, weight_decay=0.1, alpha=0.9, centered=True)
    opt = build_optimizer(cfg, model)
    assert type(opt) is torch.optim.RMSprop and opt.defaults["alpha"] == 0.9 and opt.defaults["centered"] is True
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    reference = torch.optim.RMSprop(param_groups(reference_model, 0.1, True), lr=1e-2, alpha=0.9, centered=True)
    idx, target = _regression_batch()
    for m, o in ((model, opt), (reference_model, reference)):
        for _ in range(3):
            o.zero_grad()
            nn.functional.mse_loss(m(idx), target).backward()
            o.step()
    for a, b in zip(model.parameters(), reference_model.parameters()):
        assert_close(a, b)


def test_custom_option_on_the_command_line():
    # docs/precision.md: python -m dsrecipes optimizer=custom optimizer._target_=torch.optim.RMSprop optimizer.alpha=0.9
    cfg = _composed("optimizer=custom", "optimizer._target_=torch.optim.RMSprop", "optimizer.alpha=0.9",
                    "+optimizer.centered=true")  # with or without the `+`: the custom node takes new keys
    assert type(cfg) is CustomOptimizerConfig and cfg.extra_arguments == {"alpha": 0.9, "centered": True}
    opt = build_optimizer(cfg, SmallNet())
    assert type(opt) is torch.optim.RMSprop and (opt.defaults["alpha"], opt.defaults["centered"]) == (0.9, True)
    nadam = build_optimizer(_composed("optimizer=custom", "optimizer._target_=torch.optim.NAdam",
                                      "optimizer.momentum_decay=0.01", "optimizer.betas=[0.8,0.9]"), SmallNet())
    assert type(nadam) is torch.optim.NAdam and nadam.defaults["momentum_decay"] == 0.01
    assert nadam.defaults["betas"] == (0.8, 0.9)


def test_custom_arguments_survive_replace_copy_and_the_worker_round_trip():
    cfg = _composed("optimizer=custom", "optimizer._target_=torch.optim.RMSprop", "optimizer.alpha=0.9")
    replaced = dataclasses.replace(cfg, impl="for_loop")  # what the tensor-parallel assembly does
    assert replaced.alpha == 0.9 and replaced.impl == "for_loop" and cfg.impl == "auto"
    replaced.extra_arguments["alpha"] = 0.5
    assert cfg.alpha == 0.9 and copy.copy(cfg).alpha == 0.9
    # workers get OmegaConf.to_container(composed, resolve=True) and rebuild it with load_config
    plain = OmegaConf.to_container(compose(["optimizer=custom", "optimizer._target_=torch.optim.RMSprop",
                                            "optimizer.alpha=0.9"]), resolve=True)
    assert to_root(load_config(OmegaConf.create(plain))).optimizer.extra_arguments == {"alpha": 0.9}


@pytest.mark.parametrize("target", ["torch.optim.NoSuchOptimizer", "no_such_module.Optimizer", "RMSprop", "torch.optim."])
def test_bad_target_names_key_and_value(target):
    with pytest.raises(ValueError) as err:
        build_optimizer(_custom(target), SmallNet())
    assert f"optimizer._target_={target!r} cannot be imported" in str(err.value)
    with pytest.raises(ValueError, match=r"optimizer\._target_='\?\?\?' must be set"):
        validate_optimizer_config(CustomOptimizerConfig())


def test_target_must_be_an_optimizer():
    with pytest.raises(ValueError, match=r"optimizer._target_='builtins.dict' is not a torch.optim.Optimizer class"):
        build_optimizer(_custom("builtins.dict"), SmallNet())


def test_misspelled_argument_of_a_custom_class_fails_naming_it_and_the_classes_arguments():
    with pytest.raises(ValueError) as err:
        validate_optimizer_config(_custom("torch.optim.RMSprop", alpah=0.9))
    message = str(err.value)
    assert message.startswith("optimizer.alpah is not an argument of torch.optim.rmsprop.RMSprop (optimizer._target_); "
                              "it takes: lr, alpha, eps, weight_decay, momentum, centered")
    assert "foreach" not in message  # the engine's to set (optimizer.impl), so not offered
    # before any work starts: the recipe's validation, and dsrecipes.initialize before the model is touched
    recipe = compose(["optimizer=custom", "optimizer._target_=torch.optim.RMSprop", "optimizer.alpah=0.9"])
    with pytest.raises(ValueError, match="optimizer.alpah is not an argument of torch.optim.rmsprop.RMSprop"):
        validate_recipe(recipe, dp_world_size=1)
    with pytest.raises(ValueError, match="optimizer.alpah is not an argument"):
        dsrecipes.initialize(SmallNet(), config={"optimizer": {"name": "custom", "_target_": "torch.optim.RMSprop",
                                                               "alpah": 0.9}, "trainer": {"device": "cpu"}})
    # another class on a fixed option: that option's keys are checked against it too
    with pytest.raises(ValueError, match="optimizer.momentum is not an argument of torch.optim.adamw.AdamW"):
        validate_optimizer_config(replace(_cfg("sgd"), _target_="torch.optim.AdamW"))


def test_weight_decay_needs_a_class_that_takes_it():
    with pytest.raises(ValueError, match=r"optimizer.weight_decay=0.1 but torch.optim.rprop.Rprop has no weight_decay "
                                         r"argument; set optimizer.weight_decay=0"):
        validate_optimizer_config(_custom("torch.optim.Rprop", weight_decay=0.1))
    rprop = build_optimizer(_custom("torch.optim.Rprop", etas=[0.4, 1.3]), SmallNet())
    assert type(rprop) is torch.optim.Rprop and rprop.defaults["etas"] == (0.4, 1.3)


@pytest.mark.parametrize(
    "option, key, value",
    [("adamw", "momentum", 0.9), ("adam", "nesterov", True), ("sgd", "betas", [0.9, 0.99]), ("adagrad", "betas", [0.9, 0.99]),
     ("lamb", "momentum", 0.9), ("lion", "eps", 1e-8), ("rmsprop", "betas", [0.9, 0.99])],
)
def test_a_key_the_option_does_not_take_fails_at_composition(option, key, value):
    schema = OPTIMIZER_SCHEMAS[option].__name__
    with pytest.raises(ConfigCompositionException) as err:
        compose([f"optimizer={option}", f"optimizer.{key}={value}"])
    cause = str(err.value.__cause__)
    assert f"Key '{key}' not in '{schema}'" in cause and f"full_key: optimizer.{key}" in cause
    # the library path picks the schema from the dict's `name`
    with pytest.raises(ConfigKeyError) as err:
        load_config({"optimizer": {"name": option, key: value}})
    assert f"Key '{key}' not in '{schema}'" in str(err.value) and f"full_key: optimizer.{key}" in str(err.value)


def test_dict_path_picks_the_schema_from_name_and_defaults_to_adamw():
    sgd = to_root(load_config({"optimizer": {"name": "sgd", "momentum": 0.9}})).optimizer
    assert type(sgd) is OPTIMIZER_SCHEMAS["sgd"] and sgd.momentum == 0.9
    assert type(to_root(load_config({"optimizer": {"lr": 3e-4}})).optimizer) is AdamWConfig
    with pytest.raises(ConfigKeyError, match=r"Key 'momentum' not in 'AdamWConfig'\n\s+full_key: optimizer.momentum"):
        dsrecipes.initialize(SmallNet(), config={"optimizer": {"momentum": 0.9}})
    with pytest.raises(ValueError, match="optimizer.name='sgdd' is not valid; choose one of: adamw, adam, sgd"):
        load_config({"optimizer": {"name": "sgdd"}})
    engine, opt, *_ = dsrecipes.initialize(SmallNet(), config={"optimizer": {"name": "sgd", "momentum": 0.9},
                                                             "trainer": {"device": "cpu"}})
    assert type(opt) is torch.optim.SGD and opt.defaults["momentum"] == 0.9


def test_bad_impl_fails_at_composition_naming_key_and_values():
    with pytest.raises(ConfigCompositionException) as err:
        compose(["optimizer=lion", "optimizer.impl=turbo"])
    cause = str(err.value.__cause__)
    assert "Invalid value 'turbo', expected one of [auto, fused, foreach, for_loop]" in cause
    assert "full_key: optimizer.impl" in cause
    with pytest.raises(ValidationError, match=r"Invalid value 'cuda', expected one of \[auto, fused, foreach, for_loop\]"):
        load_config({"optimizer": {"impl": "cuda"}})
    impl = _composed("optimizer.impl=for_loop").impl
    assert impl is OptimizerImpl.for_loop and impl == "for_loop" and f"{impl}" == "for_loop"


def test_force_added_key_on_a_fixed_option_is_rejected_before_training():
    # Hydra's `+key=` lets OmegaConf add a key to a typed node; validation catches it
    recipe = compose(["+optimizer.momentum=0.9"])
    with pytest.raises(ValueError) as err:
        validate_recipe(recipe, dp_world_size=1)
    assert str(err.value).startswith("optimizer.momentum is not a key of optimizer option 'adamw' (AdamWConfig: ")


def test_name_must_match_the_option():
    with pytest.raises(ValueError) as err:
        validate_optimizer_config(_composed("optimizer.name=sgd"))
    assert ("optimizer.name='sgd' does not match the option this config was built from, 'adamw' (AdamWConfig); "
            "choose the option itself: optimizer=sgd on the command line") in str(err.value)
    with pytest.raises(ValueError, match="'adamw' \\(AdamWConfig\\); the options are: adamw, adam, sgd"):
        validate_optimizer_config(_cfg("adamw", name="rmsprops"))
    with pytest.raises(ValueError, match="OptimizerConfig is not the schema of a optimizer option"):
        validate_optimizer_config(OptimizerConfig(name="adamw", _target_="torch.optim.AdamW"))


def test_impl_errors_name_what_the_class_supports():
    with pytest.raises(ValueError) as err:
        build_optimizer(_cfg("lion", impl="fused"), SmallNet())
    assert str(err.value) == "optimizer.impl='fused' is not supported by lion; choose one of: auto, foreach, for_loop"
    with pytest.raises(ValueError, match="optimizer.impl='fused' is not supported by lamb"):
        build_optimizer(_cfg("lamb", impl="fused"), SmallNet())
    lbfgs = _custom("torch.optim.LBFGS", impl="foreach")
    with pytest.raises(ValueError, match="optimizer.impl='foreach' is not supported by torch.optim.LBFGS; choose one of: auto"):
        build_optimizer(lbfgs, SmallNet())
    with pytest.raises(ValueError, match="optimizer.impl='turbo' is not valid; choose one of: auto, fused, foreach, for_loop"):
        build_optimizer(_cfg(impl="turbo"), SmallNet())  # only from Python: composition rejects it first
    assert supported_impls(torch.optim.AdamW) == OPTIMIZER_IMPLS and supported_impls(Lion) == ("auto", "foreach", "for_loop")
    lbfgs = _custom("torch.optim.LBFGS", no_decay_bias_and_norm=False)  # LBFGS takes a single group
    assert type(build_optimizer(lbfgs, SmallNet())) is torch.optim.LBFGS  # auto: built as is


@pytest.mark.parametrize("key", ["fused", "foreach", "params", "_recursive_"])
def test_keys_the_engine_sets_are_refused(key):
    with pytest.raises(ValueError, match=f"optimizer.{key} is not allowed"):
        validate_optimizer_config(_custom("torch.optim.AdamW", **{key: True}))


@pytest.mark.parametrize("name", ["adamw", "adam", "sgd", "adagrad"])
def test_forced_fused_on_cpu_uses_torch_fused_kernels(name):
    model = SmallNet()
    opt = build_optimizer(_cfg(name, impl="fused"), model)
    assert opt.defaults["fused"] is True
    model(torch.arange(4)).sum().backward()
    opt.step()


@pytest.mark.parametrize(
    "name, overrides, message",
    [
        ("adamw", {"lr": 0.0}, "optimizer.lr=0.0 must be > 0"),
        ("adamw", {"lr": -1e-3}, "optimizer.lr=-0.001 must be > 0"),
        ("adamw", {"betas": [0.9]}, "optimizer.betas=[0.9] must be two values in [0, 1)"),
        ("lion", {"betas": [0.9, 1.0]}, "optimizer.betas=[0.9, 1.0] must be two values in [0, 1)"),
        ("lamb", {"betas": [-0.1, 0.9]}, "optimizer.betas=[-0.1, 0.9] must be two values in [0, 1)"),
        ("adamw", {"weight_decay": -0.1}, "optimizer.weight_decay=-0.1 must be >= 0"),
        ("adamw", {"eps": -1e-8}, "optimizer.eps=-1e-08 must be >= 0"),
        ("sgd", {"momentum": -0.9}, "optimizer.momentum=-0.9 must be >= 0"),
        ("sgd", {"nesterov": True}, "optimizer.nesterov=true needs optimizer.momentum > 0"),
        ("adagrad", {"lr_decay": -1.0}, "optimizer.lr_decay=-1.0 must be >= 0"),
        ("lamb", {"min_coeff": 20.0}, "optimizer.min_coeff=20.0 and optimizer.max_coeff=10.0: need 0 <= min_coeff <= max_coeff"),
    ],
)
def test_validation_errors(name, overrides, message):
    with pytest.raises(ValueError) as err:
        validate_optimizer_config(_cfg(name, **overrides))
    assert message in str(err.value)


def test_validation_accepts_defaults_and_uses_the_prefix():
    for schema in OPTIMIZER_SCHEMAS.values():
        if schema is not CustomOptimizerConfig:
            validate_optimizer_config(schema())  # every option's dataclass defaults are valid
    validate_optimizer_config(_custom("torch.optim.RMSprop", alpha=0.9))
    with pytest.raises(ValueError, match="engine.optimizer.lr=0.0 must be > 0"):
        validate_optimizer_config(_cfg(lr=0.0), prefix="engine.optimizer")


def test_instantiate_wrapper_builds_objects_and_partials_and_names_a_bad_target():
    from dsrecipes.utils.instantiate import instantiate

    partial = instantiate({"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.5, "betas_unused": None}, "x")
    assert partial.func is torch.optim.SGD and partial.keywords == {"lr": 0.5, "betas_unused": None}
    linear = instantiate({"_target_": "torch.nn.Linear", "in_features": 2, "out_features": 3}, "model")
    assert isinstance(linear, nn.Linear) and linear.weight.shape == (3, 2)
    kept = instantiate({"_target_": "builtins.dict", "_partial_": True, "milestones": [1, 2]}, "x")()
    assert type(kept["milestones"]) is list  # plain containers, never ListConfig
    with pytest.raises(ValueError, match=r"^lr_scheduler\._target_='torch.optim.Nope' cannot be imported"):
        instantiate({"_target_": "torch.optim.Nope", "_partial_": True}, "lr_scheduler")
