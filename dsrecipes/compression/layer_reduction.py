"""Layer reduction with knowledge distillation (DeepSpeed's `layer_reduction` + its KD recipe).

Layer reduction: the student keeps `keep_number_layer` of the teacher's layers, chosen by
`teacher_layer`, and starts from their weights. `init_student_from_teacher(student, teacher, cfg)`
copies teacher layer teacher_layer[i] into student layer i (the layers live in the ModuleList at
`module_name_prefix`) and every other module (`other_module_name`, default: everything outside the
layer list: embeddings, final norm, head) by name. `reduce_layers(model, cfg)` does the same in
place on a model that holds the teacher's weights: its layer list is cut to the chosen layers, and
`model.cfg.n_layer` (when the model has a config) is updated.

Distillation (`DistillationLoss`), as DeepSpeed's tutorials do it: the teacher is a trained model of
the same family loaded from disk, frozen; the student's training loss gains

    kd_loss     = kd_weight * T^2 * KL(softmax(teacher_logits / T) || softmax(student_logits / T))
                  (mean over the tokens with a label != -100)
    hidden_loss = hidden_weight * mean_i MSE(student layer i output, teacher layer teacher_layer[i] output)
                  (only when hidden_weight > 0)

Public: `LayerReductionConfig`, `DistillationConfig`, `init_student_from_teacher`, `reduce_layers`,
`DistillationLoss`, `kd_kl_loss`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LayerReductionConfig", "DistillationConfig", "init_student_from_teacher", "reduce_layers",
           "DistillationLoss", "kd_kl_loss"]


@dataclass
class LayerReductionConfig:
    """DeepSpeed `layer_reduction` shared_parameters.

    keep_number_layer: layers the student keeps.  teacher_layer: which teacher layers (len ==
    keep_number_layer, increasing indices).  module_name_prefix: the layer ModuleList's name
    ("blocks" in dsrecipes' GPT).  other_module_name: modules copied from the teacher by name
    (empty: every parameter outside the layer list).
    """

    keep_number_layer: int | None = None
    teacher_layer: list[int] = field(default_factory=list)
    module_name_prefix: str = "blocks"
    other_module_name: list[str] = field(default_factory=list)

    def __post_init__(self):
        self.teacher_layer = [int(i) for i in self.teacher_layer]
        if not isinstance(self.keep_number_layer, int) or self.keep_number_layer < 1:
            raise ValueError(f"layer_reduction.keep_number_layer must be an int >= 1, got {self.keep_number_layer!r}")
        if len(self.teacher_layer) != self.keep_number_layer:
            raise ValueError(f"layer_reduction.teacher_layer={self.teacher_layer} must list keep_number_layer="
                             f"{self.keep_number_layer} layer indices")
        if any(i < 0 for i in self.teacher_layer) or len(set(self.teacher_layer)) != len(self.teacher_layer):
            raise ValueError(f"layer_reduction.teacher_layer={self.teacher_layer} must be distinct indices >= 0")

    def check_teacher_depth(self, n_layer: int) -> None:
        bad = [i for i in self.teacher_layer if i >= n_layer]
        if bad:
            raise ValueError(f"layer_reduction.teacher_layer={self.teacher_layer}: {bad} out of range for a "
                             f"teacher with {n_layer} layers (valid 0..{n_layer - 1})")


@dataclass
class DistillationConfig:
    """temperature T > 0; kd_weight >= 0 scales the logit KL term; hidden_weight >= 0 the hidden-state MSE."""

    temperature: float = 2.0
    kd_weight: float = 1.0
    hidden_weight: float = 0.0

    def __post_init__(self):
        if not float(self.temperature) > 0:
            raise ValueError(f"distillation.temperature must be > 0, got {self.temperature!r}")
        for k in ("kd_weight", "hidden_weight"):
            if float(getattr(self, k)) < 0:
                raise ValueError(f"distillation.{k} must be >= 0, got {getattr(self, k)!r}")


def _layers(model: nn.Module, prefix: str) -> nn.ModuleList:
    try:
        layers = model.get_submodule(prefix)
    except AttributeError:
        layers = None
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"layer_reduction.module_name_prefix={prefix!r} does not name an nn.ModuleList in "
                         f"{type(model).__name__}")
    return layers


@torch.no_grad()
def init_student_from_teacher(student: nn.Module, teacher: nn.Module, cfg: LayerReductionConfig) -> nn.Module:
    """Copy teacher layers `teacher_layer` into the student's layers and the other modules by name."""
    s_layers, t_layers = _layers(student, cfg.module_name_prefix), _layers(teacher, cfg.module_name_prefix)
    cfg.check_teacher_depth(len(t_layers))
    if len(s_layers) != cfg.keep_number_layer:
        raise ValueError(f"layer_reduction.keep_number_layer={cfg.keep_number_layer} but the student has "
                         f"{len(s_layers)} layers")
    for i, t in enumerate(cfg.teacher_layer):
        s_layers[i].load_state_dict(t_layers[t].state_dict())
    prefix = cfg.module_name_prefix + "."
    t_state = teacher.state_dict()
    s_state = student.state_dict()
    for name in s_state:
        if name.startswith(prefix):
            continue
        if cfg.other_module_name and not any(name.startswith(m + ".") or name == m for m in cfg.other_module_name):
            continue
        if name not in t_state or t_state[name].shape != s_state[name].shape:
            raise ValueError(f"layer_reduction: student parameter {name!r} has no same-shaped teacher parameter")
        s_state[name].copy_(t_state[name])
    return student


def reduce_layers(model: nn.Module, cfg: LayerReductionConfig) -> nn.Module:
    """In place: keep only layers `teacher_layer` of `model` (which holds the teacher's weights)."""
    layers = _layers(model, cfg.module_name_prefix)
    cfg.check_teacher_depth(len(layers))
    parent_name, _, child = cfg.module_name_prefix.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, nn.ModuleList(layers[i] for i in cfg.teacher_layer))
    if hasattr(getattr(model, "cfg", None), "n_layer"):
        model.cfg.n_layer = cfg.keep_number_layer
    return model


def kd_kl_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float,
               labels: torch.Tensor | None = None) -> torch.Tensor:
    """T^2 * KL(p_teacher || p_student) at temperature T, averaged over tokens (those with labels != -100)."""
    t = float(temperature)
    s = F.log_softmax(student_logits.float() / t, dim=-1)
    p = F.log_softmax(teacher_logits.float() / t, dim=-1)
    kl = (p.exp() * (p - s)).sum(-1)
    if labels is not None:
        keep = labels != -100
        kl = kl[keep] if keep.any() else kl.new_zeros(1)
    return kl.mean() * t * t


class DistillationLoss:
    """Trainer loss term `fn(model, batch, output) -> {"kd_loss", ["hidden_loss"]}` against a frozen teacher.

    `teacher`: the trained teacher (same vocabulary); it is put in eval mode and frozen.
    `layer_map`: student layer i -> teacher layer layer_map[i] for the hidden-state loss.
    `student`: the student module whose layer outputs are compared (needed when hidden_weight > 0).
    `autocast`: a context-manager factory the teacher's forward runs under, so that it computes at the
    student's precision (the Trainer sets it to the engine's `precision.autocast`); default: none.
    """

    def __init__(self, teacher: nn.Module, cfg: DistillationConfig, student: nn.Module | None = None,
                 layer_map: list[int] | None = None, module_name_prefix: str = "blocks",
                 autocast: Callable[[], Any] | None = None):
        self.teacher, self.cfg = teacher.eval(), cfg
        self.autocast = autocast or contextlib.nullcontext
        for p in teacher.parameters():
            p.requires_grad_(False)
        self._student_h: dict[int, torch.Tensor] = {}
        self._teacher_h: dict[int, torch.Tensor] = {}
        self.layer_map = list(layer_map or [])
        if cfg.hidden_weight > 0:
            if student is None or not self.layer_map:
                raise ValueError("distillation.hidden_weight > 0 needs the student and its teacher layer map")
            for i, layer in enumerate(_layers(student, module_name_prefix)):
                layer.register_forward_hook(self._capture(self._student_h, i))
            t_layers = _layers(teacher, module_name_prefix)
            for t in self.layer_map:
                t_layers[t].register_forward_hook(self._capture(self._teacher_h, t))

    @staticmethod
    def _capture(store: dict, key: int):
        def hook(module, args, out):
            store[key] = out

        return hook

    def __call__(self, model: nn.Module, batch: dict, output: Any) -> dict[str, torch.Tensor]:
        with torch.no_grad(), self.autocast():
            t_out = self.teacher(batch["input_ids"])
        t_logits = t_out.logits if hasattr(t_out, "logits") else t_out
        s_logits = output.logits if hasattr(output, "logits") else output
        terms = {"kd_loss": self.cfg.kd_weight * kd_kl_loss(s_logits, t_logits, self.cfg.temperature,
                                                             batch.get("labels"))}
        if self.cfg.hidden_weight > 0:
            losses = [F.mse_loss(self._student_h[i].float(), self._teacher_h[t].float())
                      for i, t in enumerate(self.layer_map)]
            terms["hidden_loss"] = self.cfg.hidden_weight * torch.stack(losses).mean()
        return terms
