"""`dsrecipes.initialize` (this module is dsrecipes.library): the library path, shaped like `deepspeed.initialize`.

    import dsrecipes
    engine, optimizer, dataloader, lr_scheduler = dsrecipes.initialize(
        model=my_module,
        training_data=my_dataset,                 # optional: a micro-batch DataLoader is built
        config={"trainer": {"train_batch_size": 32, "gradient_accumulation_steps": 2},
                "optimizer": {"lr": 3e-4}, "precision": {"dtype": "bf16"}},
    )
    for batch in dataloader:
        loss = my_loss(engine(batch))
        engine.backward(loss)
        engine.step()

`config` may be a dict, a DictConfig, a YAML path or a list of Hydra overrides (see
dsrecipes.config.loading), e.g. `["zero.stage=2", "kernels=triton", "activation_checkpointing=full"]`,
or a DeepSpeed config, as deepspeed.initialize takes one (a .json path or a DeepSpeed dict; its
translation's report is printed once, on rank 0): `dsrecipes.initialize(model=net, config="ds_config.json")`.
`model_parameters`, as in DeepSpeed, is what the configured optimizer steps: an iterable of the
module's parameters, or of param-group dicts with per-group options, at every zero.stage:

    dsrecipes.initialize(model=net, config={"zero": {"stage": 3}, "optimizer": {"lr": 1e-3}},
                         model_parameters=[{"params": net.body.parameters()},
                                           {"params": net.head.parameters(), "lr": 1e-4, "weight_decay": 0.0}])

`optimizer`, as in DeepSpeed, is an optimizer object or a callable building one from the parameters
(`optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3)`), at every zero.stage. Where sharding
replaces the parameters (zero.stage=3, FSDP2), the object is rebuilt over the sharded ones: the same
class, defaults and per-group options (with zero.offload_optimizer=cpu its state then lives and steps on
the CPU); initialize returns the rebuilt optimizer, as DeepSpeed returns its wrapper.
The module goes through the same assembly as the recipe Trainer's GPT (dsrecipes.training.assembly:
ParallelDims, Precision, parallelize, the data-parallel strategy), so kernel injection, activation
checkpointing, sparse attention, ZeRO and the model-parallel groups apply to it where they can; a
group that cannot apply to a user's module is named in a warning (or, where running without it
would compute something else, a ValueError). The recipe-only groups (compression, data_efficiency,
and moe, which shapes the GPT the recipe builds) are the Trainer's: initialize warns when they are set.

Under torchrun or srun, initialize joins the launcher's process group itself (no init_process_group
needed first, as with deepspeed.initialize): `torchrun --nproc-per-node 2 train.py`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from omegaconf import OmegaConf
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, RandomSampler

from dsrecipes.config.loading import load_config
from dsrecipes.config.validate import data_parallel_world_size, to_root, validate_engine_config
from dsrecipes.distributed.parallel_dims import ParallelDims, device_type_of
from dsrecipes.distributed.utils import is_distributed
from dsrecipes.launch.workers import join_launcher_group
from dsrecipes.training.assembly import build_engine
from dsrecipes.utils.device import resolve_device


def _warn_recipe_only_groups(cfg) -> None:
    """The Trainer applies these groups through its extensions; a user's own loop does not get them."""
    enabled = []
    if any(getattr(getattr(cfg.compression, k), "enabled", False) for k in vars(cfg.compression)):
        enabled.append("compression")
    de = cfg.data_efficiency
    if de.curriculum_learning.enabled or de.random_ltd.enabled:
        enabled.append("data_efficiency")
    for group in enabled:
        warnings.warn(f"{group} is ignored by dsrecipes.initialize: it is applied by the recipe Trainer "
                      f"(python -m dsrecipes {group}=...), not to a user's own module and loop", stacklevel=3)


def initialize(
    model: nn.Module,
    config=None,
    optimizer: torch.optim.Optimizer | Callable[..., torch.optim.Optimizer] | None = None,
    training_data: Dataset | None = None,
    lr_scheduler=None,
    collate_fn=None,
    model_parameters=None,
):
    """Returns (engine, optimizer, dataloader or None, lr_scheduler), like deepspeed.initialize.

    model_parameters: parameters of `model`, or param-group dicts ({"params": ..., "lr": ...,
    "weight_decay": ...}), to build the configured optimizer over instead of all of the model's
    (dsrecipes.training.optim.optimizers documents how the config's weight_decay and
    no_decay_bias_and_norm apply to a group that sets no weight_decay). Works at every zero.stage.
    Ignored, with a warning, next to an optimizer object, as DeepSpeed ignores it; passed (found again
    by name, each group's options as given) to an optimizer callable.

    optimizer: an optimizer object over `model`'s parameters (rebuilt over the sharded parameters where
    sharding replaces them; it must not have stepped), or a callable(parameters) -> optimizer, called with
    the parameters the optimizer steps (all of them, or model_parameters' groups), as DeepSpeed calls it.
    The optimizer returned is the one the engine steps.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    composed = load_config(config, report=True)
    cfg = to_root(composed)
    # under torchrun / srun, join the launcher's group as deepspeed.initialize does (a caller's group is kept)
    join_launcher_group(cfg.launcher.backend, cfg.launcher.collective_timeout_s)
    world = data_parallel_world_size()
    batch = validate_engine_config(cfg, world)
    _warn_recipe_only_groups(cfg)
    dims = ParallelDims.from_config(cfg, world, device_type_of(resolve_device(cfg.trainer.device)))
    engine = build_engine(model, cfg, batch, dims, optimizer, lr_scheduler, OmegaConf.to_yaml(composed),
                          model_parameters=model_parameters)
    dataloader = None
    if training_data is not None:
        generator = torch.Generator().manual_seed(cfg.trainer.seed)
        if is_distributed():
            sampler = DistributedSampler(training_data, num_replicas=dims.dp, rank=dims.dp_rank(engine.rank),
                                         seed=cfg.trainer.seed)
        else:
            sampler = RandomSampler(training_data, generator=generator)
        dataloader = DataLoader(training_data, batch_size=batch.micro_batch_size, sampler=sampler, collate_fn=collate_fn,
                                drop_last=cfg.trainer.dataloader_drop_last)
    return engine, engine.optimizer, dataloader, engine.lr_scheduler
