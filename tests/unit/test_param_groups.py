"""`dsrecipes.initialize(model_parameters=...)`: the caller's parameter groups, DeepSpeed's argument, at every ZeRO stage.

The configured optimizer is built over the groups the caller gives (per-group lr, weight decay ...).
At world 2, ZeRO 0-3 (DDP, ZeroRedundancyOptimizer, replicated ZeRO-2, FSDP2, whose fully_shard
replaces the parameter objects: the groups are found again by parameter name) must train like one
process running torch.optim.SGD over the same groups. Tolerance: SGD + momentum differs from one
process only in fp32 summation order (half batches averaged), ~1e-7, so parameters agree within 1e-6
(as in test_zero2.py); the two groups' lrs differ 10x, so ignoring the groups misses by far more.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import dsrecipes

STEPS, GAS, MICRO = 4, 2, 2  # per rank: micro-batch 2, accumulation 2


class Net(nn.Module):
    """A ModuleList body (FSDP2 shards each member) and a head: the two parameter groups."""

    def __init__(self):
        super().__init__()
        self.body = nn.ModuleList([nn.Linear(5, 7), nn.Linear(7, 7)])
        self.head = nn.Linear(7, 3)

    def forward(self, x):
        for layer in self.body:
            x = torch.tanh(layer(x))
        return self.head(x)


def _net() -> Net:
    torch.manual_seed(0)
    return Net()


def _groups(net: Net) -> list[dict]:
    """Two groups: the body at lr 0.2 (the config's weight decay), the head at lr 0.02 without weight decay."""
    return [{"params": net.body.parameters(), "lr": 0.2}, {"params": list(net.head.parameters()), "lr": 0.02,
                                                           "weight_decay": 0.0}]


# the config's optimizer: its lr (0.5) and weight decay apply where a group sets none
OPTIMIZER = {"name": "sgd", "lr": 0.5, "momentum": 0.9, "weight_decay": 0.05, "no_decay_bias_and_norm": False}


def _config(stage: int, world: int) -> dict:
    return {"zero": {"stage": stage}, "optimizer": OPTIMIZER, "lr_scheduler": {"name": "constant"},
            "trainer": {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GAS,
                        "gradient_clipping": 0.3, "device": "cpu"}}


def _data(world: int):
    g = torch.Generator().manual_seed(1)
    rows = STEPS * GAS * MICRO * world
    return torch.randn(rows, 5, generator=g), torch.randn(rows, 3, generator=g)


def _reference(world: int, groups: bool = True) -> dict[str, torch.Tensor]:
    """One process, torch.optim.SGD over the same groups (or, groups=False, one group at the config's
    lr), the global batch of every micro-step, the same clipping."""
    net = _net()
    params = ([{"params": list(net.body.parameters()), "lr": 0.2},
               {"params": list(net.head.parameters()), "lr": 0.02, "weight_decay": 0.0}] if groups
              else net.parameters())
    opt = torch.optim.SGD(params, lr=0.5, momentum=0.9, weight_decay=0.05)
    x, y = _data(world)
    rows = MICRO * world
    for step in range(STEPS):
        for m in range(GAS):
            start = (step * GAS + m) * rows
            loss = nn.functional.mse_loss(net(x[start:start + rows]), y[start:start + rows])
            (loss / GAS).backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 0.3)
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def _train(rank: int, world: int, stage: int):
    net = _net()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zero.stage > 0 at world 1: nothing to shard
        engine, optimizer, _, _ = dsrecipes.initialize(model=net, config=_config(stage, world),
                                                       model_parameters=_groups(net))
    x, y = _data(world)
    for step in range(STEPS):
        for m in range(GAS):
            start = ((step * GAS + m) * world + rank) * MICRO
            loss = nn.functional.mse_loss(engine(x[start:start + MICRO]), y[start:start + MICRO])
            engine.backward(loss)
            engine.step()
    lrs = [group["lr"] for group in optimizer.param_groups]
    return engine.module_state_dict(), lrs  # a collective under FSDP2: every rank calls it


def test_world_1_groups_keep_their_options_and_the_callers_parameters():
    net = _net()
    engine, optimizer, _, _ = dsrecipes.initialize(model=net, config=_config(0, 1), model_parameters=_groups(net))
    assert [(g["lr"], g["weight_decay"], len(g["params"])) for g in optimizer.param_groups] == [(0.2, 0.05, 4),
                                                                                               (0.02, 0.0, 2)]
    assert optimizer.param_groups[1]["params"][0] is net.head.weight
    state, _ = _train(0, 1, 0)
    for name, value in _reference(1).items():
        torch.testing.assert_close(state[name], value, rtol=0, atol=1e-6, msg=name)


def test_fp32_master_weights_keep_the_original_parameters_as_masters():
    net = _net()
    given = [p for g in _groups(net) for p in g["params"]]
    config = {**_config(0, 1), "precision": {"dtype": "bf16", "master_weights": True}}
    engine, optimizer, _, _ = dsrecipes.initialize(model=net, config=config, model_parameters=_groups(net))
    masters = [p for g in optimizer.param_groups for p in g["params"]]
    assert len(masters) == len(given) and all(m is p for m, p in zip(masters, given))
    assert all(m.dtype == torch.float32 for m in masters)
    assert net.head.bias is not given[-1] and net.head.bias.dtype == torch.bfloat16  # the module now runs a bf16 copy


def test_plain_parameters_get_the_default_split_and_groups_without_weight_decay_too():
    """model_parameters=model.parameters() builds the default groups; a group without weight_decay is split the same
    way (no_decay_bias_and_norm), its companion keeping the group's lr; one that sets weight_decay is kept whole."""
    net = _net()
    config = {"optimizer": {"name": "adamw", "lr": 1e-3, "weight_decay": 0.1}, "lr_scheduler": {"name": "constant"},
              "trainer": {"device": "cpu"}}
    _, optimizer, _, _ = dsrecipes.initialize(model=net, config=config, model_parameters=net.parameters())
    _, default, _, _ = dsrecipes.initialize(model=_net(), config=config)
    shape = [(g["weight_decay"], [tuple(p.shape) for p in g["params"]]) for g in optimizer.param_groups]
    assert shape == [(g["weight_decay"], [tuple(p.shape) for p in g["params"]]) for g in default.param_groups]
    assert [wd for wd, _ in shape] == [0.1, 0.0]
    net = _net()
    _, optimizer, _, _ = dsrecipes.initialize(model=net, config=config, model_parameters=_groups(net))
    assert [(g["lr"], g["weight_decay"], len(g["params"])) for g in optimizer.param_groups] == [
        (0.2, 0.1, 2), (0.2, 0.0, 2), (0.02, 0.0, 2)]


def test_frozen_parameters_are_left_out():
    net = _net()
    net.body[0].weight.requires_grad_(False)
    _, optimizer, _, _ = dsrecipes.initialize(model=net, config=_config(0, 1), model_parameters=_groups(net))
    assert all(p is not net.body[0].weight for g in optimizer.param_groups for p in g["params"])
    assert len(optimizer.param_groups[0]["params"]) == 3


@pytest.mark.parametrize(
    "model_parameters, message",
    [
        (lambda net: [torch.zeros(2, requires_grad=True)], "model_parameters[0] holds a tensor of shape (2,) that is not "
                                                           "a parameter of Net"),
        (lambda net: [{"params": [net.head.weight]}, {"params": [net.head.weight]}],
         "parameter 'head.weight' is in model_parameters[0] and model_parameters[1]"),
        (lambda net: [{"lr": 0.1}], "model_parameters[0] has no 'params'"),
        (lambda net: [net.head.weight, {"params": [net.head.bias]}], "not a mix"),
        (lambda net: [], "model_parameters is empty"),
    ],
)
def test_bad_model_parameters_name_the_group(model_parameters, message):
    net = _net()
    with pytest.raises(ValueError) as err:
        dsrecipes.initialize(model=net, config=_config(0, 1), model_parameters=model_parameters(net))
    assert message in str(err.value)


def test_model_parameters_next_to_an_optimizer_object_is_ignored_with_a_warning():
    net = _net()
    own = torch.optim.SGD(net.parameters(), lr=0.3)
    with pytest.warns(UserWarning, match="model_parameters is ignored"):
        _, optimizer, _, _ = dsrecipes.initialize(model=net, config=_config(0, 1), optimizer=own,
                                                  model_parameters=_groups(net))
    assert optimizer is own
