"""Saving and loading an Engine: which files, in which format, through which strategy hooks.

Two formats, picked by the data-parallel strategy (`strategy.uses_full_state_checkpoints`):

* sharded: torch.distributed.checkpoint under `<tag>/dcp/`, one shard file per rank, loadable at
  any world size and under any strategy that uses it; optimizer values keyed by parameter name
  (`flatten_optimizer_state_dict`), so pipeline stages write disjoint keys and any layout reads
  back what it needs. Expert-parallel experts are stored as global [E, ...] tensors.
* full: consolidated `model.pt` (full-precision weights) and `optimizer.pt`, written by rank 0: for
  ZeRO-1's ZeroRedundancyOptimizer and fp32 master weights beside the module, which DCP cannot
  describe; they resume with the same stage and precision. Expert-parallel experts (and their
  optimizer moments) are gathered whole into them and cut back to each rank's slice on load.

Every rank also writes its RNG state; rank 0 writes engine.pt (counters, LR schedule, loss scaler,
client state) and the manifest last, and the directory is renamed into place only when every rank
is done (see dsrecipes.training.checkpointing.checkpoint); a failed write on any rank fails the save on all.
Loads check every tensor against the model first and load nothing
on a mismatch. A checkpoint written by DeepSpeed (its `latest` / global_stepN folders), or one converted
from DeepSpeed (imported_state.pt), is read whole and loaded by dsrecipes.training.checkpointing.deepspeed_checkpoint_load.
`engine` below is a dsrecipes.training.engine.Engine (not imported: it imports this).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_model_state_dict, set_state_dict

from dsrecipes.training.checkpointing.checkpoint import (
    COMPLETE_MARKER,
    SHARDED_OPTIONS,
    begin_checkpoint,
    check_state_dict_matches,
    checkpoint_bytes,
    complete_checkpoints,
    describe_write_error,
    drop_optimizer_state,
    finish_checkpoint,
    raise_if_any_rank_failed,
    read_checkpoint,
    resolve_checkpoint_dir,
    save_file,
)
from dsrecipes.training.checkpointing.deepspeed_checkpoint import looks_like_deepspeed_checkpoint, read_deepspeed_checkpoint
from dsrecipes.training.checkpointing.deepspeed_checkpoint_load import load_deepspeed_state
from dsrecipes.training.checkpointing.deepspeed_conversion import IMPORTED_STATE, read_converted_checkpoint
from dsrecipes.utils.seed import rng_state, set_rng_state

DCP_DIR = "dcp"


@contextlib.contextmanager
def _single_process_dcp_quiet():
    """DCP warns on every save/load without a process group; in a single process that is expected."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def _sharded_state(engine) -> tuple[dict, dict]:
    """(model, optimizer) state dicts as DCP stores them (experts as global DTensors)."""
    model_state, optimizer_state = get_state_dict(engine.strategy.state_module, engine.optimizer,
                                                  options=SHARDED_OPTIONS)
    return engine.plan.to_checkpoint(model_state, optimizer_state)


def save(engine, save_dir: str | os.PathLike, tag: str, client_state: dict | None) -> Path:
    """Write checkpoint `tag` under save_dir on every rank; a write failing on any rank fails it on all (CheckpointSaveError)."""
    save_dir = Path(save_dir)
    tmp = begin_checkpoint(save_dir, tag, engine.is_writer, expected_checkpoint_bytes(engine, save_dir))
    error = None
    try:
        with engine.strategy.states_in_memory(writes=False):
            _write_states(engine, tmp)
    except (OSError, CheckpointException) as failure:  # CheckpointException (DCP) is a BaseException
        error = _describe_failure(failure)
    raise_if_any_rank_failed(error, save_dir, tag, tmp, engine.is_writer)
    if engine.is_writer:
        try:
            if engine.config_yaml is not None:
                (tmp / "config.yaml").write_text(engine.config_yaml)
            save_file(engine.counters_state(client_state), tmp / COMPLETE_MARKER)
        except OSError as failure:
            error = describe_write_error(failure)
    raise_if_any_rank_failed(error, save_dir, tag, tmp, engine.is_writer)
    return finish_checkpoint(save_dir, tag, engine.is_writer, engine.keep_last_checkpoints)


def _write_states(engine, tmp: Path) -> None:
    """Model and optimizer (full files on the writer, or DCP shards on every rank) and this rank's RNG state."""
    strategy = engine.strategy
    if strategy.uses_full_state_checkpoints:
        strategy.prepare_full_save()
        model_state = engine.plan.full_model_state()
        experts = engine.plan.expert_parallel
        # every rank holds its experts' moments: gathered whole on every rank (a collective)
        optimizer_state = experts.full_optimizer_state(strategy.optimizer_state_for_save(), engine.optimizer) \
            if experts is not None else None
        if engine.is_writer:
            save_file(model_state, tmp / "model.pt")
            save_file(optimizer_state if experts is not None else strategy.optimizer_state_for_save(),
                      tmp / "optimizer.pt")
    else:
        model_state, optimizer_state = _sharded_state(engine)
        with _single_process_dcp_quiet():
            dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(tmp / DCP_DIR))
    save_file(rng_state(), tmp / f"rng_rank{engine.rank}.pt")


def _describe_failure(failure: BaseException) -> str:
    """DCP wraps each rank's write error; name the underlying OS error where there is one."""
    causes = getattr(failure, "failures", None)
    if causes:
        # each value is (exception, frames)
        return "; ".join(describe_write_error(cause[0] if isinstance(cause, tuple) else cause) for cause in causes.values())
    return describe_write_error(failure)


def expected_checkpoint_bytes(engine, save_dir: Path) -> int:
    """The size to check free space for: the previous checkpoint of this directory, else a first estimate.

    The estimate is the parameters at full precision plus this rank's optimizer state times the
    data-parallel degree it is sharded over (an upper bound for replicated states).
    """
    previous = complete_checkpoints(save_dir)
    if previous:
        return checkpoint_bytes(previous[-1])
    module = engine.strategy.state_module
    params = sum(p.numel() * 4 for p in module.parameters())
    states = sum(t.numel() * t.element_size() for state in engine.optimizer.state.values()
                 for t in state.values() if isinstance(t, torch.Tensor))
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    return params + states * world


def load(engine, load_dir: str | os.PathLike, tag: str | None, load_optimizer_states: bool) -> tuple[Path, dict]:
    deepspeed_dir = Path(load_dir) / tag if tag is not None else Path(load_dir)
    if looks_like_deepspeed_checkpoint(deepspeed_dir):  # written by DeepSpeed itself: read and reassembled whole
        return load_deepspeed_state(engine, read_deepspeed_checkpoint(deepspeed_dir), load_optimizer_states)
    path = resolve_checkpoint_dir(load_dir, tag)
    if (path / IMPORTED_STATE).exists():  # converted from DeepSpeed by python -m dsrecipes.convert_ds_checkpoint
        return load_deepspeed_state(engine, read_converted_checkpoint(path), load_optimizer_states)
    state = read_checkpoint(path, COMPLETE_MARKER)
    with engine.strategy.states_in_memory(writes=True):
        if (path / DCP_DIR).exists():
            _load_sharded(engine, path, load_optimizer_states)
        else:
            _load_full(engine, path, load_optimizer_states)
    engine.load_counters_state(state, load_optimizer_states)
    rng_file = path / f"rng_rank{engine.rank}.pt"
    set_rng_state(read_checkpoint(path, rng_file.name if rng_file.exists() else "rng_rank0.pt"))
    return path, state["client_state"]


def _load_full(engine, path: Path, load_optimizer_states: bool) -> None:
    model_state = read_checkpoint(path, "model.pt")
    check_state_dict_matches(engine.plan.full_model_state(), model_state, path / "model.pt")
    experts = engine.plan.expert_parallel
    if experts is not None:  # the files hold every expert whole; keep this rank's
        model_state = experts.local_model_state(model_state)
    optimizer_loader = None
    if load_optimizer_states:
        def optimizer_loader():
            state = read_checkpoint(path, "optimizer.pt", map_location=engine.device)
            return experts.local_optimizer_state(state, engine.optimizer) if experts is not None else state
    engine.strategy.load_full_state(model_state, optimizer_loader)


def _load_sharded(engine, path: Path, load_optimizer_states: bool) -> None:
    strategy = engine.strategy
    if strategy.uses_full_state_checkpoints:
        raise ValueError(
            f"checkpoint {path} is sharded (dcp/), which ZeRO-1 and precision.master_weights cannot load; "
            "resume it with zero.stage 0, 2 or 3 and without master weights"
        )
    model_state, optimizer_state = get_state_dict(strategy.state_module, engine.optimizer, options=SHARDED_OPTIONS)
    try:
        stored = dcp.FileSystemReader(str(path / DCP_DIR)).read_metadata().state_dict_metadata
    except Exception as error:  # a missing or truncated .metadata file
        raise ValueError(f"checkpoint {path / DCP_DIR} is truncated or corrupt ({error})") from error
    loaded = {k[len("model."):]: v for k, v in stored.items() if k.startswith("model.")}
    # Expert tensors load through DTensor views of the local shards (any stored EP degree works);
    # the views share storage, so the plain dicts below receive the values too.
    global_model, global_optimizer = engine.plan.to_checkpoint(model_state, optimizer_state)
    # a pipeline stage loads its own part of a checkpoint that holds the whole model
    check_state_dict_matches(global_model, loaded, path / DCP_DIR, allow_extra=not engine.plan.holds_every_layer)
    to_load = {"model": global_model}
    fresh: set[str] = set()
    if load_optimizer_states:
        # parameters that never received a gradient before the save (unused layers) have no stored
        # optimizer state: read what exists, and those start fresh after loading as they would have
        fresh = {k for k in global_optimizer if k.startswith("state.") and f"optimizer.{k}" not in stored}
        to_load["optimizer"] = {k: v for k, v in global_optimizer.items() if k not in fresh}
    try:
        with _single_process_dcp_quiet():
            dcp.load(to_load, checkpoint_id=str(path / DCP_DIR))
    except (Exception, CheckpointException) as error:  # CheckpointException is a BaseException
        causes = getattr(error, "failures", {}) or {0: error}
        reason = "; ".join(f"rank {r}: {type(e).__name__} {e}".strip() for r, e in causes.items())
        raise ValueError(f"checkpoint {path / DCP_DIR} could not be read, it may be truncated or corrupt ({reason})") from error
    if load_optimizer_states:
        # values DCP replaced rather than filled in place (hyperparameters) live in the loaded copy
        optimizer_state.update({k: v for k, v in global_optimizer.items() if not isinstance(v, torch.Tensor)})
        set_state_dict(strategy.state_module, engine.optimizer, model_state_dict=model_state,
                       optim_state_dict=optimizer_state, options=SHARDED_OPTIONS)
        if fresh:  # "state.<fqn>.<name>": forget the placeholder state DCP's helpers created for them
            drop_optimizer_state(engine, {key.split(".", 1)[1].rsplit(".", 1)[0] for key in fresh})
    else:
        set_model_state_dict(strategy.state_module, model_state)
    strategy.after_load()

