"""A client optimizer object, or optimizer callable, passed to dsrecipes.initialize (dsrecipes.training.optim.client_optimizer).

Where FSDP2 replaces the parameters (zero.stage=3), the object is recorded by parameter name before wrapping and
rebuilt after it: the same class, defaults and per-group options over the new parameters. Here the wrapping is
simulated in-process by replacing every parameter of a module with a new object under the same name (what
fully_shard does, with DTensors); the run against DeepSpeed 0.19.8 at world 2 is
tests/integration/test_deepspeed_parity.py::test_client_optimizer_at_zero3_matches_deepspeed.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import dsrecipes
from dsrecipes.training.optim.client_optimizer import (
    build_from_factory,
    check_rebuildable,
    rebind_lr_scheduler,
    rebuild_client_optimizer,
    record_client_optimizer,
)
from dsrecipes.training.optim.optimizers import named_param_groups
from tests.unit.test_param_groups import Net, _net  # a ModuleList body and a head: two groups


def _groups(net: Net) -> list[dict]:
    return [{"params": list(net.body.parameters()), "lr": 0.02, "weight_decay": 0.05},
            {"params": list(net.head.parameters()), "lr": 0.005, "weight_decay": 0.0}]


def _replace_parameters(module: nn.Module) -> None:
    """What fully_shard does to the parameter objects: new ones under the same names (a tied one stays tied)."""
    new: dict[int, nn.Parameter] = {}
    for sub in module.modules():
        for name, param in list(sub.named_parameters(recurse=False)):
            if id(param) not in new:
                new[id(param)] = nn.Parameter(param.detach().clone(), requires_grad=param.requires_grad)
            setattr(sub, name, new[id(param)])


def test_rebuilt_over_the_new_parameters_with_the_class_defaults_and_group_options():
    net = _net()
    client = torch.optim.AdamW(_groups(net), lr=0.01, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1, amsgrad=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(client, lambda step: 0.5)  # scales the lrs, adds initial_lr
    spec = record_client_optimizer(client, net)
    check_rebuildable(spec, "test")
    _replace_parameters(net)
    rebuilt = rebuild_client_optimizer(spec, net)
    assert type(rebuilt) is torch.optim.AdamW and rebuilt.defaults == client.defaults
    assert len(rebuilt.param_groups) == 2
    for ours, theirs in zip(rebuilt.param_groups, client.param_groups):
        assert {k: v for k, v in ours.items() if k != "params"} == {k: v for k, v in theirs.items() if k != "params"}
    assert [g["lr"] for g in rebuilt.param_groups] == [0.01, 0.0025] and rebuilt.param_groups[0]["initial_lr"] == 0.02
    assert rebuilt.param_groups[1]["params"] == [net.head.weight, net.head.bias]  # the new objects, in order
    assert all(p is not q for p, q in zip(rebuilt.param_groups[1]["params"], client.param_groups[1]["params"]))
    rebind_lr_scheduler(scheduler, client, rebuilt)
    net(torch.randn(3, 5)).sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "optimizer.step() has been overridden" from the rebound scheduler
        rebuilt.step()
        scheduler.step()
    assert scheduler.optimizer is rebuilt and set(rebuilt.state) == set(net.parameters())


def test_named_parameters_and_a_tied_parameter_are_found_again():
    net = _net()
    net.body[0].bias.requires_grad_(False)  # a frozen parameter in the client's group stays there
    net.tied = net.head  # a second name for the head's parameters: named_parameters gives them once
    client = torch.optim.SGD(list(net.named_parameters()), lr=0.1, momentum=0.5)
    spec = record_client_optimizer(client, net)
    _replace_parameters(net)
    rebuilt = rebuild_client_optimizer(spec, net)
    assert rebuilt.param_groups[0]["param_names"] == client.param_groups[0]["param_names"]
    assert rebuilt.param_groups[0]["params"] == list(net.parameters()) and net.tied.weight is net.head.weight


def test_a_stepped_optimizer_is_refused_but_adagrads_initial_state_is_not():
    net = _net()
    client = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net(torch.randn(3, 5)).sum().backward()
    client.step()
    with pytest.raises(ValueError, match=r"torch\.optim\.sgd\.SGD\) already holds step state for 6 parameter"):
        record_client_optimizer(client, net)
    adagrad = torch.optim.Adagrad(net.parameters(), lr=0.1, initial_accumulator_value=0.3)  # state made at init
    spec = record_client_optimizer(adagrad, net)
    _replace_parameters(net)
    rebuilt = rebuild_client_optimizer(spec, net)
    assert float(rebuilt.state[net.head.bias]["sum"][0]) == pytest.approx(0.3)


def test_a_tensor_outside_the_model_names_the_group():
    net = _net()
    client = torch.optim.SGD([{"params": list(net.parameters())}, {"params": [nn.Parameter(torch.zeros(3))]}], lr=0.1)
    with pytest.raises(ValueError, match=r"param_groups\[1\] .* holds a tensor of shape \(3,\) that is not a parameter of Net"):
        record_client_optimizer(client, net)


class NeedsRank(torch.optim.SGD):
    """A constructor that needs more than (params, **defaults)."""

    def __init__(self, params, rank, lr=0.1):
        super().__init__(params, lr=lr)
        self.rank = rank


class TakesKwargs(torch.optim.SGD):
    def __init__(self, params, **kwargs):
        super().__init__(params, **{k: v for k, v in kwargs.items() if k != "decoupled_weight_decay"})


def test_a_constructor_that_needs_more_names_the_class_and_the_way_out():
    net = _net()
    spec = record_client_optimizer(NeedsRank(net.parameters(), rank=0), net)
    with pytest.raises(ValueError) as err:
        check_rebuildable(spec, "zero.stage=3 shards the parameters (FSDP2)")
    message = str(err.value)
    assert "zero.stage=3 shards the parameters" in message and "NeedsRank" in message and "'rank'" in message
    assert "optimizer=lambda params: NeedsRank(params, ...)" in message
    spec = record_client_optimizer(TakesKwargs(net.parameters(), lr=0.3, momentum=0.2), net)
    check_rebuildable(spec, "test")
    rebuilt = rebuild_client_optimizer(spec, net)
    assert type(rebuilt) is TakesKwargs and rebuilt.param_groups[0]["momentum"] == 0.2


def test_names_another_rank_holds_are_left_out_only_when_allowed():
    net = _net()
    spec = record_client_optimizer(torch.optim.SGD(_groups(net), lr=0.1), net)
    del net.head  # e.g. another pipeline stage's
    with pytest.raises(RuntimeError, match="parameter 'head.weight'"):
        rebuild_client_optimizer(spec, net)
    rebuilt = rebuild_client_optimizer(spec, net, allow_missing=True)
    assert [g["lr"] for g in rebuilt.param_groups] == [0.02]  # the emptied group is dropped


def test_a_factory_gets_all_parameters_or_the_callers_groups_by_name():
    net = _net()
    named = named_param_groups(_groups(net), net)
    _replace_parameters(net)
    everything = build_from_factory(lambda params: torch.optim.SGD(params, lr=0.1), net)
    assert everything.param_groups[0]["params"] == list(net.parameters())
    grouped = build_from_factory(lambda params: torch.optim.Adam(params, lr=0.1), net, named)
    assert [(g["lr"], g["weight_decay"]) for g in grouped.param_groups] == [(0.02, 0.05), (0.005, 0.0)]
    assert grouped.param_groups[1]["params"] == [net.head.weight, net.head.bias]
    with pytest.raises(ValueError, match="returned list, not a torch.optim.Optimizer"):
        build_from_factory(lambda params: list(params), net)


def test_initialize_takes_an_optimizer_callable_with_model_parameters():
    net = _net()
    config = {"lr_scheduler": {"name": "constant"}, "trainer": {"device": "cpu"}}
    engine, optimizer, _, _ = dsrecipes.initialize(model=net, config=config, model_parameters=_groups(net),
                                                   optimizer=lambda params: torch.optim.SGD(params, lr=0.3))
    assert type(optimizer) is torch.optim.SGD and engine.optimizer is optimizer
    assert [(g["lr"], g["weight_decay"], len(g["params"])) for g in optimizer.param_groups] == [(0.02, 0.05, 4),
                                                                                               (0.005, 0.0, 2)]
    with pytest.raises(TypeError, match="a torch.optim.Optimizer or a callable"):
        dsrecipes.initialize(model=_net(), config=config, optimizer="adamw")


def test_initialize_checks_the_rebuild_before_sharding():
    """zero.stage=3 with CPU offload runs FSDP2 even at one rank: the constructor is checked before any wrapping."""
    net = _net()
    config = {"zero": {"stage": 3, "offload_optimizer": "cpu"}, "trainer": {"device": "cpu"}}
    with pytest.raises(ValueError, match=r"zero.stage=3 shards the parameters \(FSDP2\), so dsrecipes rebuilds"):
        dsrecipes.initialize(model=net, config=config, optimizer=NeedsRank(net.parameters(), rank=0))
    assert all(type(p) is nn.Parameter for p in net.parameters())  # nothing was wrapped
