"""The batch triple and the precision blocks (fp16, bf16 / bfloat16, torch_autocast, amp) of a DeepSpeed config.

Both need several keys at once, so they are read here rather than key by key.

Batch: DeepSpeed's rule counts only the keys given, so when the config gives any of
train_batch_size / train_micro_batch_size_per_gpu / gradient_accumulation_steps, the ones it leaves
out are set to null (not given) rather than keeping a recipe's value: a default never counts as
given. "auto" (Hugging Face): train_batch_size is derived from the other two (null), the micro-batch
and accumulation take the numbers of ds_import.absent (HF fills them from its TrainingArguments:
per_device_train_batch_size, gradient_accumulation_steps), so the accelerate template
(accumulation 1, micro-batch auto) trains 16 x 1 per rank. A config with
no batch key leaves the recipe's batch alone.

Precision: the one of fp16 / bf16 / torch_autocast that is enabled picks precision.dtype:
fp16 -> fp16 model with fp32 master weights and DeepSpeed's dynamic loss scaler (its FP16
optimizer; every scaler key, DeepSpeed's defaults for the ones left out), bf16 -> bf16 model with
fp32 master weights (check_grad_overflow -> nonfinite_grads=skip), torch_autocast -> autocast
over fp32 weights. If the config has one of these blocks and none is enabled, it trains in fp32, as
DeepSpeed does. enabled: "auto" keeps the recipe's precision (HF fills it from --fp16 / --bf16).
Apex `amp` is refused when enabled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dsrecipes.config.ds_import.rules import (
    ABSENT,
    Custom,
    Handled,
    NoEffect,
    RefuseUnless,
    Rule,
    To,
    apply_table,
    one_of,
)
from dsrecipes.config.ds_import.translation import DEFAULT, MAPPED, Translation

BATCH_KEYS = {
    "train_batch_size": "trainer.train_batch_size",
    "train_micro_batch_size_per_gpu": "trainer.train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps": "trainer.gradient_accumulation_steps",
}
_HF_BATCH = {"train_micro_batch_size_per_gpu": "per_device_train_batch_size",
             "gradient_accumulation_steps": "gradient_accumulation_steps"}


def read_batch(t: Translation, ds: Mapping[str, Any]) -> None:
    """The batch triple, with DeepSpeed's rule: any two of the three determine the third."""
    if not any(key in ds for key in BATCH_KEYS):
        return
    for key, target in BATCH_KEYS.items():
        if key not in ds:
            t.default(key, target, None, "not given, so derived from the keys given")
            continue
        value = ds[key]
        if value == "auto" and key == "train_batch_size":
            t.auto(key, f"{target}=null: derived from the other two (Hugging Face computes world x micro x "
                        "accumulation)", target, None)
        elif value == "auto":
            t.auto_pending(key, target, f"Hugging Face: TrainingArguments.{_HF_BATCH[key]}")
        elif value is None:
            t.mapped(key, value, target, note="not given")
        elif isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            t.refused(key, value, "must be a positive integer (DeepSpeed asserts > 0)")
        else:
            t.mapped(key, value, target)


# ---------------------------------------------------------------------------------------------- precision

_SCALER_DEFAULTS = {"loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000, "hysteresis": 2,
                    "consecutive_hysteresis": False, "min_loss_scale": 1}
_AUTO_CAST = To("precision.auto_cast", one_of("auto_cast", {True: True, False: False}), default=False,
                note="true: the engine casts the forward's floating inputs to fp16, as DeepSpeed's engine does")
_FP16_REFUSE = RefuseUnless("DeepSpeed would keep fp16 master weights and gradients (ZeRO 1/2 with CPU offload); "
                            "dsrecipes has no fp16 master copy, so it cannot train this the same way: remove the key to "
                            "train with fp32 master weights (precision=fp16), a different update")
_BF16_MASTER = RefuseUnless("bf16 master weights are read only in the enabled bf16 block", ok_why="DeepSpeed's "
                            "default: fp32 master weights")
# the enabled bf16 block's pair, read together by _read_bf16_masters (mapped to precision.master_dtype, or refused)
_BF16_MASTERS_READ = Custom(lambda t, key, value: None, kind="mapped")
_GRAD_OVERFLOW = To("precision.nonfinite_grads", one_of("check_grad_overflow", {True: "skip", False: "error"}),
                    default=True, note="true: skip the step, as DeepSpeed; false: dsrecipes stops the run where "
                                          "DeepSpeed would step on inf/nan gradients")

# dsrecipes' names of DeepSpeed's dtype strings (DeepSpeed's DtypeEnum spellings)
AUTOCAST_DTYPES = {name: "bf16" for name in ("bfloat16", "bf16", "torch.bfloat16")} | \
                  {name: "fp16" for name in ("float16", "fp16", "half", "torch.float16")}


def _fp16_table(with_defaults: bool) -> dict[str, Rule]:
    scaler = {key: To(f"precision.{key}", default=default if with_defaults else ABSENT)
              for key, default in _SCALER_DEFAULTS.items()}
    return {"enabled": Handled(), "auto_cast": _AUTO_CAST, **scaler, "fp16_master_weights_and_grads": _FP16_REFUSE}


def _bf16_table(with_defaults: bool) -> dict[str, Rule]:
    overflow = _GRAD_OVERFLOW if with_defaults else To(_GRAD_OVERFLOW.target, _GRAD_OVERFLOW.convert,
                                                       note=_GRAD_OVERFLOW.note)
    masters = _BF16_MASTERS_READ if with_defaults else _BF16_MASTER
    return {"enabled": Handled(), "immediate_grad_update": NoEffect("a speed option of DeepSpeed's bf16 optimizer"),
            "check_grad_overflow": overflow, "bf16_master_weights_and_grads": masters,
            "bf16_optimizer_states": masters}


AUTOCAST_TABLE: dict[str, Rule] = {
    "enabled": Handled(), "dtype": Handled(),
    "lower_precision_safe_modules": NoEffect("DeepSpeed reduces these modules' gradients in the low precision; "
                                             "dsrecipes reduces gradients in fp32"),
}
FP16_TABLE = _fp16_table(True)
BF16_TABLE = _bf16_table(True)
PRECISION_BLOCKS = ("fp16", "bf16", "bfloat16", "torch_autocast", "amp")


def read_precision(t: Translation, ds: Mapping[str, Any]) -> None:
    """fp16 / bf16 / bfloat16 / torch_autocast / amp, read together (at most one may be enabled)."""
    blocks = {}
    for name in PRECISION_BLOCKS:
        if name not in ds:
            continue
        if isinstance(ds[name], Mapping):
            blocks[name] = ds[name]
        else:
            t.refused(name, ds[name], f"DeepSpeed's {name} is a block (a JSON object), not {type(ds[name]).__name__}")
    if not blocks:
        return
    if "bf16" in blocks and "bfloat16" in blocks:
        t.refused("bfloat16", blocks.pop("bfloat16"), "bf16 is given too (bfloat16 is its legacy name)")
    bf16 = "bf16" if "bf16" in blocks else "bfloat16"
    enabled = {name: block.get("enabled", False) for name, block in blocks.items()}
    kinds = ("fp16", bf16, "torch_autocast")
    on = [name for name in kinds if enabled.get(name) is True]
    if len(on) == 2 and on[1] == "torch_autocast":  # fp16 / bf16 with torch_autocast: DeepSpeed autocasts its model
        _autocast_over_the_model(t, on[0], blocks["torch_autocast"])
        on = on[:1]
        blocks.pop("torch_autocast")  # read whole
        enabled.pop("torch_autocast")
    autos = [name for name in kinds if enabled.get(name) == "auto"]
    chosen = on[0] if on else None
    recorded = set()
    if enabled.get("amp") is True:
        t.refused("amp.enabled", True, "Apex AMP is not supported (DeepSpeed 0.19.7 removed it too); use fp16, bf16 "
                                       "or torch_autocast")
        recorded.add("amp")
    for extra in on[1:]:
        t.refused(f"{extra}.enabled", True, f"{chosen}.enabled is true too; DeepSpeed refuses it too ('bfloat16 and "
                                            "fp16 modes cannot be simultaneously enabled')")
        recorded.add(extra)
    if chosen == "fp16":
        t.set("precision.master_weights", True)
        t.set("precision.raise_error_at_min_scale", True)
        t.mapped("fp16.enabled", True, "precision.dtype", "fp16",
                 "and precision.master_weights=true, raise_error_at_min_scale=true: DeepSpeed's FP16 optimizer")
    elif chosen == bf16:
        t.set("precision.master_weights", True)
        bf16_masters = blocks[bf16].get("bf16_master_weights_and_grads") is True
        t.mapped(f"{bf16}.enabled", True, "precision.dtype", "bf16",
                 "and precision.master_weights=true: DeepSpeed's bf16 optimizer keeps "
                 + ("the master weights bf16_master_weights_and_grads says" if bf16_masters else "fp32 master weights"))
        _read_bf16_masters(t, bf16, blocks[bf16], ds)
    elif chosen == "torch_autocast":
        _read_autocast_dtype(t, blocks["torch_autocast"])
    for name in autos:
        t.auto(f"{name}.enabled", "precision.dtype: the recipe's precision, fp32 unless it picks another with "
                                  "precision=... (Hugging Face: --fp16 / --bf16)")
    recorded.update(on[:1], autos)
    fp32 = chosen is None and not autos
    for name, block in blocks.items():
        if name in recorded:
            continue
        if fp32 and name != "amp":  # the first disabled block says what it means: fp32
            fp32 = False
            t.set("precision.master_weights", False)
            note = "no fp16 / bf16 / torch_autocast is enabled: DeepSpeed trains in fp32"
            if "enabled" in block:
                t.mapped(f"{name}.enabled", block["enabled"], "precision.dtype", "fp32", note)
            else:
                t.default(f"{name}.enabled", "precision.dtype", "fp32", note)
        elif "enabled" in block:
            t.ignored(f"{name}.enabled", block["enabled"], "disabled")
    for name, block in blocks.items():
        _read_block_keys(t, name, block, chosen, autos, bf16)


def _read_bf16_masters(t: Translation, bf16: str, block: Mapping[str, Any], ds: Mapping[str, Any]) -> None:
    """bf16_master_weights_and_grads with bf16_optimizer_states: DeepSpeed's ZeRO optimizer steps the bf16 weights
    themselves (bf16 flat partitions, torch's optimizer keeping bf16 state) -> precision.master_dtype=bf16. Masters
    without bf16 states DeepSpeed runs only through ZeRO-Offload's DeepSpeedCPUAdam (fp32 moments of bf16 masters),
    which dsrecipes has no counterpart of; states without masters, or either at ZeRO-0, DeepSpeed refuses."""
    masters_key, states_key = f"{bf16}.bf16_master_weights_and_grads", f"{bf16}.bf16_optimizer_states"
    masters, states = block.get("bf16_master_weights_and_grads", False), block.get("bf16_optimizer_states", False)
    given = [(key, value) for key, value in ((masters_key, masters), (states_key, states))
             if key.split(".", 1)[1] in block]
    if masters is not True and states is not True:
        for key, value in given:
            t.ignored(key, value, "DeepSpeed's default: fp32 master weights")
        return
    stage = (ds.get("zero_optimization") or {}).get("stage", 0)
    if stage not in (1, 2, 3):
        for key, value in given:
            t.refused(key, value, f"DeepSpeed takes bf16 master weights at ZeRO stage 1-3 only (zero_optimization.stage="
                                  f"{stage}) and refuses this file too")
        return
    if masters is True and states is True:
        note = "the optimizer steps the bf16 weights themselves, its state in bf16: no fp32 copy"
        t.mapped(masters_key, True, "precision.master_dtype", "bf16", note)
        t.mapped(states_key, True, "precision.master_dtype", "bf16", note)
    elif masters is True:
        t.refused(masters_key, True, "bf16 master weights with fp32 optimizer states: DeepSpeed runs them only through "
                                     "ZeRO-Offload's DeepSpeedCPUAdam, which dsrecipes has no counterpart of; add "
                                     f"{states_key}: true (bf16 weights and state) or remove the key (fp32 masters)")
    else:
        t.refused(states_key, True, f"bf16 optimizer states need {masters_key} (DeepSpeed refuses it too)")


def _read_block_keys(t: Translation, name: str, block: Mapping[str, Any], chosen: str | None, autos: list[str],
                     bf16: str) -> None:
    """The block's keys other than `enabled`: read by its table if it is the enabled (or "auto") one, else no effect."""
    if name == "amp":
        why = "an option of Apex AMP" if block.get("enabled") is True else "amp is disabled"
        for key, value in block.items():
            if key != "enabled":
                t.ignored(f"amp.{key}", value, why)
        return
    table = {"fp16": FP16_TABLE, bf16: BF16_TABLE, "torch_autocast": AUTOCAST_TABLE}[name]
    if name in autos:  # the recipe decides whether it is on: map the keys given, fill in no defaults
        table = _fp16_table(False) if name == "fp16" else _bf16_table(False) if name == bf16 else \
            {**table, "dtype": NoEffect("torch_autocast.enabled is auto: the recipe's precision decides")}
    elif name != chosen:
        table = {key: Handled() if key == "enabled" else NoEffect(f"{name} is not enabled") for key in table}
    apply_table(t, name, block, table, f"{name} block")


def _autocast_over_the_model(t: Translation, model: str, block: Mapping[str, Any]) -> None:
    """fp16 / bf16 enabled with torch_autocast: DeepSpeed keeps its fp16 / bf16 model and optimizer and runs the
    forward under torch.autocast to torch_autocast.dtype. precision=fp16 / bf16 autocasts its forward to the
    model's dtype, the same thing when the dtypes agree; an autocast to the other half type is refused."""
    value = block.get("dtype", "bfloat16")
    dtype = AUTOCAST_DTYPES.get(value)
    model_dtype = "fp16" if model == "fp16" else "bf16"
    if dtype != model_dtype:
        t.refused("torch_autocast.enabled", True, f"autocast to {value} over the {model_dtype} model of {model}.enabled:"
                                                  " dsrecipes autocasts a half-precision model to its own dtype only")
        return
    t.record("torch_autocast.enabled", True, MAPPED, f"precision.dtype={model_dtype} autocasts its {model_dtype} "
                                                     f"forward, as DeepSpeed does with {model} and torch_autocast")
    t.record("torch_autocast.dtype", value, MAPPED if "dtype" in block else DEFAULT, f"precision.dtype={dtype}")
    for key, v in block.items():
        if key not in ("enabled", "dtype"):
            t.ignored(f"torch_autocast.{key}", v, "DeepSpeed reduces these modules' gradients in the low precision; "
                                                  "dsrecipes reduces gradients in fp32")


def _read_autocast_dtype(t: Translation, block: Mapping[str, Any]) -> None:
    value = block.get("dtype", "bfloat16")
    dtype = AUTOCAST_DTYPES.get(value)
    if dtype is None:
        t.refused("torch_autocast.dtype", value, f"must be one of {', '.join(AUTOCAST_DTYPES)} (autocast to bf16 or "
                                                 "fp16)")
        return
    t.set("precision.master_weights", False)
    note = "autocast over fp32 weights, as DeepSpeed's torch_autocast"
    if dtype == "fp16":
        t.set("precision.loss_scale", 0)
        note += ", with dsrecipes' dynamic loss scaler"
    t.mapped("torch_autocast.enabled", True, "precision.dtype", dtype, note)
    if "dtype" in block:
        t.record("torch_autocast.dtype", value, MAPPED, f"precision.dtype={dtype}")
    else:
        t.record("torch_autocast.dtype", value, DEFAULT, f"precision.dtype={dtype} (DeepSpeed's default)")


__all__ = ["BATCH_KEYS", "PRECISION_BLOCKS", "read_batch", "read_precision"]
