"""Load a DeepSpeed checkpoint (or one converted by `python -m dsrecipes.convert_ds_checkpoint`) into an Engine.

    engine.load_checkpoint("ds_ckpt")          # the folder holding DeepSpeed's `latest`, or a global_stepN folder
    python -m dsrecipes ... trainer.resume=ds_ckpt

The whole, named tensors of dsrecipes.training.checkpointing.deepspeed_checkpoint go into any data-parallel strategy
the way a full state dict does: every rank takes its shard (FSDP2's DTensors, ZeRO-2's flat shards)
or the whole (replicated and ZeRO-1 strategies, fp32 masters). Carried: the weights (DeepSpeed's fp32
masters where it kept them), the per-parameter optimizer state (moments and step), global_steps /
global_samples / skipped_steps, the LR-schedule position and the fp16 dynamic loss scale. The
optimizer's hyperparameters (lr, betas, weight decay, ...) come from this run's config, as on every
dsrecipes resume; DeepSpeed saves no RNG state, so the RNG is left as it is.
Any world size and ZeRO stage loads any other: the state is whole until each rank cuts its piece.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor, distribute_tensor

from dsrecipes.training.checkpointing.checkpoint import SHARDED_OPTIONS, check_state_dict_matches, drop_optimizer_state
from dsrecipes.training.checkpointing.deepspeed_checkpoint import DeepSpeedCheckpoint
from dsrecipes.training.optim.lr_schedules import ClosedFormLR

_PREFIX = "module."


def load_deepspeed_state(engine, ckpt: DeepSpeedCheckpoint, load_optimizer_states: bool = True) -> tuple[Path, dict]:
    """Put `ckpt` into `engine` (every rank calls it); returns (the checkpoint's folder, its client state)."""
    plan, strategy = engine.plan, engine.strategy
    if not plan.holds_every_parameter:
        raise ValueError(f"DeepSpeed checkpoint {ckpt.path}: loading into a pipeline- or expert-parallel layout is not "
                         "supported; load it at data parallelism (ZeRO 0-3), save, and resume that checkpoint")
    with strategy.states_in_memory(writes=True):
        if strategy.uses_full_state_checkpoints:  # ZeRO-1, fp32 masters beside the module: whole tensors on every rank
            expected = strategy.unwrapped.state_dict()  # names and shapes (the gathered state lives on rank 0 only)
            weights, optimizer_state = _renamed(ckpt.weights, expected), _renamed(ckpt.optimizer_state, expected)
            check_state_dict_matches(expected, weights, ckpt.path)
            loader = (lambda: _positional_optimizer_state(engine, optimizer_state)) if load_optimizer_states else None
            strategy.load_full_state(dict(weights), loader)
        else:
            _load_through_state_dicts(engine, ckpt, load_optimizer_states)
    _load_counters(engine, ckpt, load_optimizer_states)
    return ckpt.path, dict(ckpt.client_state)


def _renamed(named: dict, expected: dict) -> dict:
    """DeepSpeed's names are those of the module it wrapped; drop a 'module.' prefix the engine's names lack."""
    if named and all(k.startswith(_PREFIX) for k in named) and not any(k.startswith(_PREFIX) for k in expected):
        return {k[len(_PREFIX):]: v for k, v in named.items()}
    return named


def _positional_optimizer_state(engine, optimizer_state: dict) -> dict:
    """A torch optimizer state_dict over the engine optimizer's own groups (ZeRO-1, fp32 masters): state by position."""
    names = {id(p): n for n, p in engine.strategy.optimizer_module().named_parameters(remove_duplicate=False)}
    state, groups, position = {}, [], 0
    for group in engine.optimizer.param_groups:
        indices = []
        for param in group["params"]:
            entry = optimizer_state.get(names.get(id(param)))
            if entry:
                state[position] = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in entry.items()}
            indices.append(position)
            position += 1
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": indices})
    return {"state": state, "param_groups": groups}


def _fill(target: torch.Tensor, whole: torch.Tensor) -> None:
    """Copy whole (a full tensor) into target: all of it, or, for a DTensor, this rank's piece."""
    if isinstance(target, DTensor):
        piece = distribute_tensor(whole.detach().to(target.device, target.dtype), target.device_mesh, target.placements,
                                  src_data_rank=None).to_local()
        target.to_local().copy_(piece)
    else:
        target.copy_(whole.reshape(target.shape))


@torch.no_grad()
def _load_through_state_dicts(engine, ckpt: DeepSpeedCheckpoint, load_optimizer_states: bool) -> None:
    """The strategies checkpointed with DCP: fill the (flattened, name-keyed) state dicts torch's helpers give, set them."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    strategy = engine.strategy
    model_state, optim_state = get_state_dict(strategy.state_module, engine.optimizer, options=SHARDED_OPTIONS)
    weights, optimizer_state = _renamed(ckpt.weights, model_state), _renamed(ckpt.optimizer_state, model_state)
    check_state_dict_matches(model_state, weights, ckpt.path)  # DTensors have the whole tensor's shape
    for name, value in model_state.items():
        _fill(value, weights[name])
    if not load_optimizer_states:
        set_model_state_dict(strategy.state_module, model_state)
        strategy.after_load()
        return
    fresh = set()
    for key, value in optim_state.items():
        if not key.startswith("state.") or not isinstance(value, torch.Tensor):
            continue
        name, entry = key[len("state."):].rsplit(".", 1)
        stored = optimizer_state.get(name, {}).get(entry)
        if stored is None:
            fresh.add(name)  # never stepped in DeepSpeed (no state): it starts fresh here too
            continue
        _fill(value, stored if stored.dim() else stored.reshape(()))
    set_state_dict(strategy.state_module, engine.optimizer, model_state_dict=model_state,
                   optim_state_dict=optim_state, options=SHARDED_OPTIONS)
    if fresh:
        drop_optimizer_state(engine, fresh)
    strategy.after_load()


def _load_counters(engine, ckpt: DeepSpeedCheckpoint, load_optimizer_states: bool) -> None:
    engine.global_steps = ckpt.global_steps
    engine.global_samples = ckpt.global_samples
    engine.skipped_steps = ckpt.skipped_steps
    engine.micro_steps = ckpt.global_steps * engine.gradient_accumulation_steps
    if not load_optimizer_states:
        return
    if engine.lr_scheduler is not None and ckpt.lr_scheduler:
        set_schedule_position(engine.lr_scheduler, ckpt.lr_scheduler)
    scaler = engine.precision.loss_scaler
    if scaler is not None and ckpt.loss_scaler:
        scaler.load_state_dict(ckpt.loss_scaler)


def set_schedule_position(scheduler, state: dict) -> None:
    """DeepSpeed's {'last_batch_iteration': t} (t + 1 schedule steps taken), or a torch scheduler's own state_dict."""
    if "last_batch_iteration" not in state:
        scheduler.load_state_dict(state)
        return
    taken = int(state["last_batch_iteration"]) + 1
    if isinstance(scheduler, ClosedFormLR):  # a closed form of the step: jump there
        scheduler.load_state_dict({"last_epoch": taken, "_step_count": taken + 1})
        return
    with warnings.catch_warnings():  # any other torch scheduler: replay its steps
        warnings.simplefilter("ignore")
        for _ in range(taken - scheduler.last_epoch):
            scheduler.step()
