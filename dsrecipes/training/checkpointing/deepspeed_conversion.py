"""A DeepSpeed checkpoint as a dsrecipes checkpoint folder, or its weights as one safetensors file.

    write_converted_checkpoint(read_deepspeed_checkpoint("ds_ckpt"), "converted")   # converted/step_N + latest
    write_safetensors(read_deepspeed_checkpoint("ds_ckpt"), "model.safetensors")

The folder is a dsrecipes checkpoint (`trainer.resume=converted`, `engine.load_checkpoint("converted")`):
engine.pt (counters, client state), model.pt (whole fp32 weights by name) and imported_state.pt (the
per-parameter optimizer state by name, LR-schedule position, loss scale, what DeepSpeed wrote it with),
a manifest and `latest`. It loads at any world size and ZeRO stage, like DeepSpeed's own folder;
converting once spares reading DeepSpeed's partitioned files on every resume and keeps the result
independent of DeepSpeed's file layout.
"""

from __future__ import annotations

from pathlib import Path

from dsrecipes.training.checkpointing.checkpoint import (
    COMPLETE_MARKER,
    LATEST,
    _write_text_atomic,
    read_checkpoint,
    save_file,
    write_manifest,
)
from dsrecipes.training.checkpointing.deepspeed_checkpoint import DeepSpeedCheckpoint

IMPORTED_STATE = "imported_state.pt"
MODEL_FILE = "model.pt"


def write_converted_checkpoint(ckpt: DeepSpeedCheckpoint, out_dir: str | Path) -> Path:
    """<out_dir>/step_<global_steps>/ (with manifest) and <out_dir>/latest; returns the step folder."""
    out_dir = Path(out_dir)
    folder = out_dir / f"step_{ckpt.global_steps}"
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in ckpt.weights.items()}, folder / MODEL_FILE)
    save_file({"optimizer_state": ckpt.optimizer_state, "param_groups": ckpt.param_groups,
               "lr_scheduler": ckpt.lr_scheduler, "loss_scaler": ckpt.loss_scaler, "zero_stage": ckpt.zero_stage,
               "dp_world_size": ckpt.dp_world_size, "ds_version": ckpt.ds_version, "source": str(ckpt.path)},
              folder / IMPORTED_STATE)
    save_file({"global_steps": ckpt.global_steps, "global_samples": ckpt.global_samples, "skipped_steps": ckpt.skipped_steps,
               "client_state": ckpt.client_state}, folder / COMPLETE_MARKER)
    write_manifest(folder)
    _write_text_atomic(out_dir / LATEST, folder.name)
    return folder


def read_converted_checkpoint(folder: Path) -> DeepSpeedCheckpoint:
    """The DeepSpeedCheckpoint a converted folder holds (verified by its manifest before)."""
    imported, counters = read_checkpoint(folder, IMPORTED_STATE), read_checkpoint(folder, COMPLETE_MARKER)
    return DeepSpeedCheckpoint(
        path=folder, zero_stage=imported["zero_stage"], dp_world_size=imported["dp_world_size"],
        weights=read_checkpoint(folder, MODEL_FILE), optimizer_state=imported["optimizer_state"],
        param_groups=imported["param_groups"], global_steps=counters["global_steps"],
        global_samples=counters["global_samples"], skipped_steps=counters["skipped_steps"],
        lr_scheduler=imported["lr_scheduler"], loss_scaler=imported["loss_scaler"],
        client_state=counters["client_state"], ds_version=imported["ds_version"],
    )


def write_safetensors(ckpt: DeepSpeedCheckpoint, file: str | Path) -> Path:
    """The weights (fp32, tied parameters stored once under their first name) as one safetensors file."""
    from safetensors.torch import save_file as save_safetensors

    file = Path(file)
    file.parent.mkdir(parents=True, exist_ok=True)
    seen: dict[int, str] = {}
    tensors = {}
    for name, value in ckpt.weights.items():
        key = value.untyped_storage().data_ptr() if value.numel() else id(value)
        if key in seen:
            continue  # a tied alias: safetensors refuses shared storage
        seen[key] = name
        tensors[name] = value.contiguous().clone()
    save_safetensors(tensors, str(file), metadata={"format": "pt", "source": "deepspeed " + ckpt.ds_version})
    return file
