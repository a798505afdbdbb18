"""DeepSpeed's `optimizer` and `scheduler` blocks -> the optimizer / lr_scheduler options and their keys.

optimizer.type is read as DeepSpeed reads it: its own names case-insensitively (Adam, AdamW, Lamb,
Lion, Adagrad -> optimizer=adam / adamw / lamb / lion / adagrad), any other name as a torch.optim
class, case-sensitively (SGD, RMSprop -> sgd / rmsprop, anything else -> optimizer=custom with
_target_=torch.optim.<type>). The communication-compressed OneBitAdam, ZeroOneAdam and OneBitLamb (DeepSpeed
<= 0.19.6; 0.19.7 removed them, and the report says DeepSpeed 0.19.7+ refuses such a config) map to
optimizer=onebitadam / zerooneadam / onebitlamb with their params (comm_backend_name and cuda_aware
have no effect: dsrecipes compresses over torch.distributed; bias_correction neither: DeepSpeed's
1-bit optimizers never apply it, so optimizer.bias_correction stays false, their update). muP
(MuAdam, MuAdamW, MuSGD) is refused. Muon maps to optimizer=muon with DeepSpeed's split (adam_params
[embed, lm_head]), its lrs (muon_lr / adam_lr / lr) and update_scale=shape_ratio; per_head_muon is refused.
Params the block leaves out take the
defaults of the class DeepSpeed builds (FusedAdam / FusedLamb / FusedLion: betas (0.9, 0.999),
weight_decay 0; torch_adam: torch's own), not the recipe's. DeepSpeed hands its optimizer the
parameters as given, one weight decay for all, so no_decay_bias_and_norm is false.

scheduler.type: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest -> the options with
DeepSpeed's formulas, its defaults for the params left out (WarmupDecayLR's warmup_max_lr 0.001
included) and lr_scheduler.step_alignment=deepspeed (DeepSpeed's exact step sequence); StepLR ->
torch_step; any other torch.optim.lr_scheduler class -> lr_scheduler=custom.

"auto", as Hugging Face's integration fills it: lr, betas, eps, weight_decay, warmup_num_steps ->
the numbers of the chosen option's schema (HF: its TrainingArguments; resolved in ds_import.absent);
warmup_max_lr -> null (the optimizer's lr; HF: learning_rate); warmup_min_lr -> 0 (HF fills 0);
total_num_steps -> null (trainer.max_steps; HF: the number of training steps).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from dsrecipes.config.ds_import.rules import (
    Custom,
    Handled,
    NoEffect,
    RefuseUnless,
    Rule,
    To,
    apply_table,
    one_of,
    positive_int,
)
from dsrecipes.config.ds_import.translation import Translation

_HF = {"lr": "TrainingArguments.learning_rate", "betas": "adam_beta1, adam_beta2", "eps": "adam_epsilon",
       "weight_decay": "TrainingArguments.weight_decay"}
_NO_MAX_GRAD_NORM = RefuseUnless("DeepSpeed rejects max_grad_norm in optimizer params too; use the top-level "
                                 "gradient_clipping (trainer.gradient_clipping)", ok=())
_KERNELS = NoEffect("dsrecipes picks torch's kernels itself (optimizer.impl)")
_FP32_STATES = NoEffect("dsrecipes keeps the optimizer states in fp32")


def _param(key: str, default: Any) -> To:
    return To(f"optimizer.{key}", list if key == "betas" else None, default=default, auto_why=_HF.get(key, ""))


def _adam_table(option: str, torch_adam: bool, adam_w: bool) -> dict[str, Rule]:
    amsgrad = To("optimizer.amsgrad", default=False) if torch_adam else \
        RefuseUnless("DeepSpeed's FusedAdam does not support AMSGrad (it raises); set torch_adam: true for torch's")
    table = {
        "lr": _param("lr", 1e-3), "betas": _param("betas", [0.9, 0.999]), "eps": _param("eps", 1e-8),
        # torch.optim.AdamW's own default (torch_adam) is 0.01; DeepSpeed's FusedAdam / CPUAdam default 0
        "weight_decay": _param("weight_decay", 0.01 if torch_adam and adam_w else 0.0),
        "amsgrad": amsgrad,
        "bias_correction": RefuseUnless("dsrecipes' Adam always corrects the moments' bias", ok=(True,),
                                        ok_why="dsrecipes corrects the bias too"),
        "torch_adam": NoEffect("dsrecipes builds torch's Adam / AdamW either way"),
        "fp32_optimizer_states": _FP32_STATES, "foreach": _KERNELS, "max_grad_norm": _NO_MAX_GRAD_NORM,
        "set_grad_none": NoEffect("zeroing is the engine's"),
    }
    if option == "adam":
        table["adam_w_mode"] = To("optimizer.adam_w_mode", default=True)
    else:
        table["adam_w_mode"] = NoEffect("type AdamW decouples weight decay whatever adam_w_mode says (DeepSpeed too)")
    return table


LAMB_TABLE: dict[str, Rule] = {
    "lr": _param("lr", 1e-3), "betas": _param("betas", [0.9, 0.999]), "eps": _param("eps", 1e-8),
    "weight_decay": _param("weight_decay", 0.0), "bias_correction": To("optimizer.bias_correction", default=True),
    "max_coeff": To("optimizer.max_coeff", default=10.0), "min_coeff": To("optimizer.min_coeff", default=0.01),
    "eps_inside_sqrt": RefuseUnless("eps inside the square root is another update; dsrecipes' Lamb adds eps outside"),
    "amsgrad": RefuseUnless("DeepSpeed's FusedLamb does not support AMSGrad (it raises)"),
    "max_grad_norm": _NO_MAX_GRAD_NORM, "set_grad_none": NoEffect("zeroing is the engine's"),
}
LION_TABLE: dict[str, Rule] = {
    "lr": _param("lr", 1e-3), "betas": _param("betas", [0.9, 0.999]), "weight_decay": _param("weight_decay", 0.0),
    "set_grad_none": NoEffect("zeroing is the engine's"), "fp32_optimizer_states": _FP32_STATES,
    "max_grad_norm": _NO_MAX_GRAD_NORM,
}
_ONEBIT_COMMON: dict[str, Rule] = {
    "lr": _param("lr", 1e-3), "betas": _param("betas", [0.9, 0.999]), "eps": _param("eps", 1e-8),
    "weight_decay": _param("weight_decay", 0.0),
    "bias_correction": NoEffect("DeepSpeed's 1-bit optimizers take it but never apply it; optimizer.bias_correction "
                                "stays false, their update"),
    "eps_inside_sqrt": NoEffect("DeepSpeed's 1-bit optimizers take it but never apply it"),
    "amsgrad": RefuseUnless("DeepSpeed's 1-bit optimizers do not support AMSGrad (they raise)"),
    "cuda_aware": NoEffect("MPI backend only; dsrecipes compresses over torch.distributed (gloo / NCCL)"),
    "comm_backend_name": NoEffect("dsrecipes' compressed all-reduce runs over torch.distributed (gloo / NCCL) "
                                  "whatever the backend name"),
    "max_grad_norm": _NO_MAX_GRAD_NORM,
}
ONEBIT_ADAM_TABLE: dict[str, Rule] = {**_ONEBIT_COMMON, "freeze_step": To("optimizer.freeze_step", default=100000)}
ZERO_ONE_ADAM_TABLE: dict[str, Rule] = {
    **_ONEBIT_COMMON, **{k: To(f"optimizer.{k}", default=d) for k, d in (
        ("var_freeze_step", 100000), ("var_update_scaler", 16), ("local_step_scaler", 32678),
        ("local_step_clipper", 16))},
}
ONEBIT_LAMB_TABLE: dict[str, Rule] = {
    **_ONEBIT_COMMON, **{k: To(f"optimizer.{k}", default=d) for k, d in (
        ("freeze_step", 100000), ("max_coeff", 10.0), ("min_coeff", 0.01), ("coeff_beta", 0.9), ("factor_max", 4.0),
        ("factor_min", 0.5), ("factor_threshold", 0.1))},
}
_ONEBIT_REMOVED = "DeepSpeed <= 0.19.6; removed in 0.19.7, so DeepSpeed 0.19.7+ refuses this config"
ONEBIT_TABLES = {"onebitadam": (ONEBIT_ADAM_TABLE, f"DeepSpeed's OnebitAdam of {_ONEBIT_REMOVED}"),
                 "zerooneadam": (ZERO_ONE_ADAM_TABLE, f"DeepSpeed's ZeroOneAdam of {_ONEBIT_REMOVED}"),
                 "onebitlamb": (ONEBIT_LAMB_TABLE, f"DeepSpeed's OnebitLamb of {_ONEBIT_REMOVED}")}
_TORCH_EXTRAS: dict[str, Rule] = {
    "maximize": RefuseUnless("maximizing is not supported by dsrecipes' optimizer options"),
    "foreach": _KERNELS, "fused": _KERNELS, "capturable": _KERNELS,
    "differentiable": RefuseUnless("differentiable optimizer steps are not supported"),
    "max_grad_norm": _NO_MAX_GRAD_NORM,
}
ADAGRAD_TABLE: dict[str, Rule] = {
    "lr": _param("lr", 1e-2), "lr_decay": To("optimizer.lr_decay", default=0.0),
    "weight_decay": _param("weight_decay", 0.0), "eps": _param("eps", 1e-10),
    "initial_accumulator_value": RefuseUnless("optimizer=adagrad starts its accumulator at 0", ok=(0, 0.0)),
    "amsgrad": RefuseUnless("Adagrad has no AMSGrad"), **_TORCH_EXTRAS,
}
SGD_TABLE: dict[str, Rule] = {
    "lr": _param("lr", 1e-3), "momentum": To("optimizer.momentum", default=0.0),
    "weight_decay": _param("weight_decay", 0.0), "nesterov": To("optimizer.nesterov", default=False),
    "dampening": RefuseUnless("optimizer=sgd has no dampening", ok=(0, 0.0)), **_TORCH_EXTRAS,
}
RMSPROP_TABLE: dict[str, Rule] = {
    "lr": _param("lr", 1e-2), "alpha": To("optimizer.alpha", default=0.99), "eps": _param("eps", 1e-8),
    "weight_decay": _param("weight_decay", 0.0), "momentum": To("optimizer.momentum", default=0.0),
    "centered": To("optimizer.centered", default=False), **_TORCH_EXTRAS,
}
# DeepSpeed's Muon (MuonWithAuxAdam): Muon for every matrix whose name holds neither "embed" nor "lm_head", Adam for
# the rest; its defaults are MuonWithAuxAdam's (Muon lr 0.02, momentum 0.95, Adam lr 3e-4, betas (0.9, 0.95),
# eps 1e-10, weight decay 0) and the shape-ratio update scale. lr / muon_lr / adam_lr are read together (_read_muon_lrs).
_LRS = ("lr", "muon_lr", "adam_lr")
MUON_TABLE: dict[str, Rule] = {
    **{key: Handled() for key in _LRS},
    "momentum": To("optimizer.momentum", default=0.95), "weight_decay": To("optimizer.weight_decay", default=0.0),
    "ns_method": To("optimizer.ns_method", one_of("ns_method", {"gram": "gram", "standard": "standard"}),
                    default="gram"),
    "betas": To("optimizer.betas", list, default=[0.9, 0.95]), "eps": To("optimizer.eps", default=1e-10),
    "adam_w_mode": RefuseUnless("the Adam half of optimizer=muon decouples weight decay (adam_w_mode true)",
                                ok=(True,), ok_why="DeepSpeed's default: the Adam half decouples weight decay"),
    "per_head_muon": RefuseUnless("per-head orthogonalisation of attention projections is not implemented; "
                                  "optimizer=muon orthogonalises each whole matrix"),
    "torch_adam": NoEffect("the Adam half is dsrecipes' own (no FusedAdam kernel)"),
    "fp32_optimizer_states": _FP32_STATES, "max_grad_norm": _NO_MAX_GRAD_NORM,
}
REFUSED_OPTIMIZERS = {
    "muadam": "muP optimizers (the mup package) scale lr per parameter shape; not supported",
    "muadamw": "muP optimizers (the mup package) scale lr per parameter shape; not supported",
    "musgd": "muP optimizers (the mup package) scale lr per parameter shape; not supported",
}
DEEPSPEED_OPTIMIZERS = {"adam": "adam", "adamw": "adamw", "lamb": "lamb", "lion": "lion", "adagrad": "adagrad"}
TORCH_OPTIONS = {"SGD": "sgd", "RMSprop": "rmsprop"}


def _torch_class(module: str, name: str) -> type | None:
    import importlib

    cls = getattr(importlib.import_module(module), name, None) if name.isidentifier() else None
    return cls if inspect.isclass(cls) else None


def read_optimizer(t: Translation, key: str, block: Any) -> None:
    """The optimizer block: its type picks the option, its params map with the class's defaults."""
    if block is None:
        t.ignored(key, block, "null: as if absent")
        return
    if not isinstance(block, Mapping):
        t.refused(key, block, "DeepSpeed's optimizer is a block with type and params")
        return
    for extra in set(block) - {"type", "params", "legacy_fusion"}:
        t.refused(f"{key}.{extra}", block[extra], "not a key of DeepSpeed's optimizer block (valid: type, params, "
                                                  "legacy_fusion)")
    if "legacy_fusion" in block:
        t.ignored(f"{key}.legacy_fusion", block["legacy_fusion"], "a kernel option of DeepSpeed's FP16 optimizer")
    params = block.get("params") or {}
    if not isinstance(params, Mapping):
        t.refused(f"{key}.params", params, "must be a block of the optimizer's arguments")
        return
    name = block.get("type")
    if not isinstance(name, str):
        t.refused(f"{key}.type", name, "required (DeepSpeed ignores an optimizer block without a type; dsrecipes "
                                       "refuses it as a likely mistake)")
        return
    option, table, note = _optimizer_option(name, params)
    if option is None:
        t.refused(f"{key}.type", name, note)
        return
    t.choose("optimizer", option)
    t.set("optimizer.no_decay_bias_and_norm", False)
    t.record(f"{key}.type", name, "mapped", f"optimizer={option} ({note}; no_decay_bias_and_norm=false: DeepSpeed "
                                             "decays every parameter it is given alike)")
    if table is None:  # custom: a torch.optim class, its params as flat keys
        _read_custom(t, f"{key}.params", params, "optimizer", f"torch.optim.{name}")
    else:
        apply_table(t, f"{key}.params", params, table, f"{name} params")
    if option == "muon":
        _read_muon_lrs(t, f"{key}.params", params)


def _read_muon_lrs(t: Translation, key: str, params: Mapping[str, Any]) -> None:
    """Muon's two lrs as DeepSpeed resolves them: muon_lr, else lr, else 0.02 for the Muon half; adam_lr, else lr,
    else 3e-4 for the Adam half. Plus what DeepSpeed's Muon does that the option's defaults do not: its name split
    and its update scale."""
    for name in _LRS:
        value = params.get(name)
        if name in params and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            t.refused(f"{key}.{name}", value, "must be a number > 0 (Hugging Face's integration fills no Muon lr)")
            return
    halves = (("optimizer.lr", "muon_lr", 0.02), ("optimizer.adam_lr", "adam_lr", 3e-4))
    for target, own, default in halves:
        source = own if own in params else "lr" if "lr" in params else None
        if source is None:
            t.default(f"{key}.{own}", target, default, "MuonWithAuxAdam's")
        else:
            t.mapped(f"{key}.{source}", params[source], target, float(params[source]))
    t.set("optimizer.update_scale", "shape_ratio")
    t.set("optimizer.adam_params", ["embed", "lm_head"])
    t.set("optimizer.muon_params", ["all-matrices"])


def _optimizer_option(name: str, params: Mapping[str, Any]) -> tuple[str | None, dict | None, str]:
    lower = name.lower()
    if lower in REFUSED_OPTIMIZERS:
        return None, None, REFUSED_OPTIMIZERS[lower]
    if lower in ("adam", "adamw"):
        torch_adam = params.get("torch_adam") is True
        adam_w = lower == "adamw" or params.get("adam_w_mode", True) is not False
        where = "torch" if torch_adam else "DeepSpeed's FusedAdam defaults"
        return lower, _adam_table(lower, torch_adam, adam_w), f"{'AdamW' if adam_w else 'Adam'}, {where}"
    if lower in ONEBIT_TABLES:
        table, note = ONEBIT_TABLES[lower]
        return lower, table, note
    if lower == "muon":
        return "muon", MUON_TABLE, ("Muon for the matrices whose names hold neither embed nor lm_head, Adam for the "
                                    "rest, shape-ratio update scale: DeepSpeed's MuonWithAuxAdam")
    if lower in DEEPSPEED_OPTIMIZERS:
        tables = {"lamb": (LAMB_TABLE, "FusedLamb's update and defaults"), "lion": (LION_TABLE, "FusedLion's defaults"),
                  "adagrad": (ADAGRAD_TABLE, "torch.optim.Adagrad")}
        table, note = tables[lower]
        return lower, table, note
    if name in TORCH_OPTIONS:
        return TORCH_OPTIONS[name], SGD_TABLE if name == "SGD" else RMSPROP_TABLE, f"torch.optim.{name}"
    cls = _torch_class("torch.optim", name)
    if cls is None or not _is_subclass(cls, "torch.optim", "Optimizer"):
        hint = f" (did you mean {TORCH_OPTIONS.get(name.upper(), name)}?)" if name.upper() in ("SGD",) else ""
        return None, None, (f"neither one of DeepSpeed's optimizers ({', '.join(sorted(DEEPSPEED_OPTIMIZERS))}) nor a "
                            f"torch.optim class (torch names are case-sensitive){hint}")
    return "custom", None, f"torch.optim.{name}"


def _is_subclass(cls: type, module: str, base: str) -> bool:
    import importlib

    return issubclass(cls, getattr(importlib.import_module(module), base))


def _read_custom(t: Translation, key: str, params: Mapping[str, Any], group: str, target: str) -> None:
    """A class outside the options: `_target_` plus its arguments as flat keys (checked against its signature later)."""
    t.set(f"{group}._target_", target)
    module, _, name = target.rpartition(".")
    signature = inspect.signature(_torch_class(module, name))
    for param, value in params.items():
        if value == "auto":
            t.ignored(f"{key}.{param}", value, "auto: the class's own default (nothing fills it here)")
        elif param == "max_grad_norm" and group == "optimizer":
            _NO_MAX_GRAD_NORM.apply(t, f"{key}.{param}", value)
        else:
            t.mapped(f"{key}.{param}", value, f"{group}.{param}", list(value) if isinstance(value, tuple) else value)
    for shared in ("lr", "weight_decay") if group == "optimizer" else ():
        default = signature.parameters.get(shared)
        if shared not in params and default is not None and default.default is not inspect.Parameter.empty:
            t.default(f"{key}.{shared}", f"{group}.{shared}", default.default, f"{name}'s own")


# ---------------------------------------------------------------------------------------------- scheduler

_LAST_ITERATION = RefuseUnless("a schedule started part-way; dsrecipes resumes schedules from checkpoints "
                               "(trainer.resume)", ok=(-1,))


def _warmup_type(value: Any) -> str:
    return value if value in ("log", "linear") else "log"  # DeepSpeed warns and falls back to log


class Required(To):
    """A param DeepSpeed's class requires: refused when the block leaves it out."""

    def absent(self, t: Translation, key: str) -> None:
        t.refused(key, "(absent)", "required by DeepSpeed's schedule (it raises without it); give a value, or "
                                   "\"auto\" for the recipe's")


def _steps(target: str, default: Any, auto_why: str = "the warmup steps of TrainingArguments") -> To:
    return To(target, positive_int, default=default, auto_why=auto_why)


_WARMUP = {
    "warmup_min_lr": To("lr_scheduler.warmup_min_lr", default=0.0, auto=0.0, auto_why="fills 0"),
    "warmup_max_lr": To("lr_scheduler.warmup_max_lr", default=None, auto=None,
                        auto_why="learning_rate; null here = the optimizer's lr"),
    "warmup_num_steps": _steps("lr_scheduler.warmup_num_steps", 1000),
    "warmup_type": To("lr_scheduler.warmup_type", _warmup_type, default="log",
                      note="DeepSpeed reads anything but linear as log"),
    "last_batch_iteration": _LAST_ITERATION,
}
_TOTAL = Required("lr_scheduler.total_num_steps", positive_int, auto=None,
                  auto_why="the number of training steps; null here = trainer.max_steps")
SCHEDULES: dict[str, tuple[str, dict[str, Rule]]] = {
    "WarmupLR": ("warmup_lr", _WARMUP),
    "WarmupDecayLR": ("warmup_decay_lr", {**_WARMUP, "total_num_steps": _TOTAL,
                                          "warmup_max_lr": To("lr_scheduler.warmup_max_lr", default=0.001, auto=None,
                                                              auto_why="learning_rate; null here = the optimizer's lr")}),
    "WarmupCosineLR": ("warmup_cosine", {
        "total_num_steps": _TOTAL, "warmup_min_ratio": To("lr_scheduler.warmup_min_ratio", default=0.0),
        "warmup_num_steps": _WARMUP["warmup_num_steps"], "cos_min_ratio": To("lr_scheduler.cos_min_ratio",
                                                                              default=0.0001),
        "warmup_type": _WARMUP["warmup_type"], "last_batch_iteration": _LAST_ITERATION}),
    "OneCycle": ("one_cycle", {
        "cycle_min_lr": Required("lr_scheduler.cycle_min_lr"), "cycle_max_lr": Required("lr_scheduler.cycle_max_lr"),
        **{k: To(f"lr_scheduler.{k}", default=d) for k, d in (
            ("decay_lr_rate", 0.0), ("cycle_first_step_size", 2000), ("cycle_second_step_size", None),
            ("cycle_first_stair_count", 0), ("cycle_second_stair_count", None), ("decay_step_size", 0),
            ("cycle_momentum", True), ("cycle_min_mom", 0.8), ("cycle_max_mom", 0.9), ("decay_mom_rate", 0.0))},
        "last_batch_iteration": _LAST_ITERATION}),
    "LRRangeTest": ("lr_range_test", {
        **{k: To(f"lr_scheduler.{k}", default=d) for k, d in (
            ("lr_range_test_min_lr", 1e-3), ("lr_range_test_step_size", 2000), ("lr_range_test_step_rate", 1.0),
            ("lr_range_test_staircase", False))},
        "last_batch_iteration": _LAST_ITERATION}),
}
STEP_LR_TABLE: dict[str, Rule] = {
    "step_size": Required("lr_scheduler.step_size", positive_int), "gamma": To("lr_scheduler.gamma", default=0.1),
    "last_epoch": _LAST_ITERATION,
}


def read_scheduler(t: Translation, key: str, block: Any) -> None:
    """The scheduler block: its type picks the lr_scheduler option, its params map with DeepSpeed's defaults."""
    if block is None:
        t.ignored(key, block, "null: as if absent (DeepSpeed builds no scheduler)")
        return
    if not isinstance(block, Mapping):
        t.refused(key, block, "DeepSpeed's scheduler is a block with type and params")
        return
    for extra in set(block) - {"type", "params"}:
        t.refused(f"{key}.{extra}", block[extra], "not a key of DeepSpeed's scheduler block (valid: type, params)")
    params = block.get("params") or {}
    name = block.get("type")
    if not isinstance(params, Mapping) or not isinstance(name, str):
        t.refused(f"{key}.type", name, "required, with params a block of the schedule's arguments")
        return
    if name in SCHEDULES:
        option, table = SCHEDULES[name]
        note = "DeepSpeed's formula"
    elif name == "StepLR":
        option, table, note = "torch_step", STEP_LR_TABLE, "torch.optim.lr_scheduler.StepLR"
    else:
        cls = _torch_class("torch.optim.lr_scheduler", name)
        if cls is None or not _is_subclass(cls, "torch.optim.lr_scheduler", "LRScheduler"):
            t.refused(f"{key}.type", name, f"neither one of DeepSpeed's schedules ({', '.join(SCHEDULES)}) nor a "
                                           "torch.optim.lr_scheduler class")
            return
        option, table, note = "custom", None, f"torch.optim.lr_scheduler.{name}"
    t.choose("lr_scheduler", option)
    t.set("lr_scheduler.step_alignment", "deepspeed")
    t.record(f"{key}.type", name, "mapped", f"lr_scheduler={option} ({note}; step_alignment=deepspeed: DeepSpeed's "
                                            "step sequence)")
    if table is None:
        _read_custom(t, f"{key}.params", params, "lr_scheduler", f"torch.optim.lr_scheduler.{name}")
    else:
        apply_table(t, f"{key}.params", params, table, f"{name} params")


OPTIMIZER_RULE = Custom(read_optimizer)
SCHEDULER_RULE = Custom(read_scheduler)
__all__ = ["OPTIMIZER_RULE", "SCHEDULER_RULE", "read_optimizer", "read_scheduler"]
