"""torch.compile as an assembly step: the `compile` config group (none | blocks | full).

    python -m dsrecipes compile=blocks                       # each transformer block compiled on its own
    python -m dsrecipes compile=blocks zero.stage=3 launcher.nproc_per_node=2
    python -m dsrecipes compile=full compile.mode=max-autotune   # the whole model, one process

blocks is torchtitan's scheme: every block of the model's block list is compiled separately, so the
data-parallel strategy's hooks (FSDP2's all-gathers, DDP's and ZeRO-2's gradient hooks) stay outside
the compiled code and the per-block units compose with FSDP2, DDP, ZeRO-1/2, tensor parallelism,
activation checkpointing and MoE. The blocks share one compiled graph (torch inlines the modules and
treats their parameters as inputs), so compile time does not grow with depth. With `compile.loss`
(default: on CUDA only) the GPT's final norm, LM head and cross-entropy are compiled too (the fp32
upcast of the logits fused into the loss), where nothing else owns that code (no tensor / pipeline
parallelism, no injected Triton loss).

full compiles the whole model's forward: one graph, the most fusion, for single-process runs
(data-parallel hooks inside a whole-model graph would be traced; parallel layouts are refused
before any worker starts, see dsrecipes.config.compatibility).

Only each module's `forward` is replaced (as activation checkpointing and random-LTD do), so module
names and state-dict keys stay those of the eager model: checkpoints move freely between compiled
and eager runs. Compilation happens on the first step (inductor caches the generated code on disk,
so later runs start faster). Inductor on CPU generates C++, so it needs a C++ compiler on PATH.

Not compiled: the optimizer step. dsrecipes' optimizers already run torch's fused / foreach kernels
(or its own fused Triton AdamW); a compiled step adds a long first-step compile for the same work.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from dsrecipes.utils.compatibility_rows import Refusal, Supported
from dsrecipes.utils.config_enum import ConfigEnum, enum_values
from dsrecipes.utils.inactive_rules import Inactive
from dsrecipes.utils.recipe_facts import RecipeFacts

# torch is imported in the functions that use it: the recipe schema imports CompileConfig from here, and
# composing a recipe (`python -m dsrecipes --help`) must not import torch.
if TYPE_CHECKING:
    from torch import nn


class CompileScope(ConfigEnum):
    """compile.scope: nothing compiled, each block separately, or the whole model."""

    none = "none"
    blocks = "blocks"
    full = "full"


COMPILE_SCOPES = enum_values(CompileScope)
# torch.compile's modes (None: its default)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _compile_full_parallel(root, dims):
    if root.compile.scope != "full":
        return None
    for key, degree in (("data parallel (world size / model-parallel degrees)", dims.dp_replicate * dims.dp_shard),
                        ("parallel.tp", dims.tp), ("parallel.pp", dims.pp), ("parallel.sp", dims.sp),
                        ("moe.ep_size", dims.ep)):
        if degree > 1:
            return (f"compile=full with {key}={degree} is not supported: a whole-model graph would trace the "
                    "parallel layout's hooks and collectives; use compile=blocks (each block compiled on its own, "
                    "composes with every layout)")
    return None


@dataclass
class CompileConfig:
    """The `compile` group: which part of the model torch.compile sees, and torch.compile's own keys."""

    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        Inactive(lambda root, c: c.scope == "none", lambda root, path: "compile.scope=none (choose compile=blocks or "
                 "compile=full)", but=("scope",)),
        Inactive(lambda root, c: c.scope == "full", lambda root, path: "compile=full compiles the loss with the whole "
                 "model", keys=("loss",)),
    )

    # how the group composes with the layouts and the other groups (dsrecipes.config.compatibility)
    COMPATIBILITY: ClassVar[tuple[Refusal | Supported, ...]] = (
        Refusal("compile=full with any parallel layout (dp, tp, pp, sp, ep > 1)", "one whole-model graph would trace "
                "the layout's hooks; compile=blocks composes with every layout", _compile_full_parallel),
        Supported("compile=blocks with any layout (and compile=full in one process)", "supported: each block compiled on "
                  "its own (eager names in checkpoints and exports), with DDP, ZeRO-3, tp, activation checkpointing, MoE",
                  ("compile-blocks", "compile-full", "compile-blocks-activation_checkpointing", "compile-blocks-dp2-zero0",
                   "compile-blocks-dp2-zero3", "compile-blocks-tp2", "compile-blocks-moe")),
    )

    scope: CompileScope = CompileScope.none  # none | blocks | full
    backend: str = "inductor"  # any installed torch.compile backend (torch._dynamo.list_backends())
    mode: str | None = None  # null (torch's default) | default | reduce-overhead | max-autotune | max-autotune-no-cudagraphs
    fullgraph: bool = False  # error on a graph break instead of running that code eagerly
    dynamic: bool | None = None  # null: static shapes first, dynamic after a shape change (torch's default)
    # blocks: also compile the GPT's final norm + LM head + cross-entropy; null = on CUDA only (on CPU,
    # inductor's cross-entropy measured slower than ATen's: 0.27 vs 0.21 s per gpt_debug step)
    loss: bool | None = None

    def check(self, facts: RecipeFacts) -> None:
        """The group's own checks, against the run's device."""
        validate_compile_config(self, facts.device.type)


def installed_backends() -> list[str]:
    """Names torch.compile accepts as `backend` in this environment."""
    from torch._dynamo import list_backends

    return sorted(set(list_backends(exclude_tags=())) | {"inductor"})


def cpp_compiler() -> str | None:
    """The C++ compiler inductor's CPU backend would use (CXX, else g++ / c++ / clang++ on PATH)."""
    candidates = [os.environ["CXX"]] if os.environ.get("CXX") else []
    for name in (*candidates, "g++", "c++", "clang++"):
        found = shutil.which(name)
        if found:
            return found
    return None


def validate_compile_config(cfg: CompileConfig, device_type: str, prefix: str = "compile") -> None:
    """ValueError naming the key, value and choices; checked before any worker starts."""
    if cfg.scope not in COMPILE_SCOPES:
        raise ValueError(f"{prefix}.scope={cfg.scope!r} is not valid; choose one of: {', '.join(COMPILE_SCOPES)}")
    if cfg.scope == "none":
        return
    if cfg.mode is not None and cfg.mode not in COMPILE_MODES:
        raise ValueError(f"{prefix}.mode={cfg.mode!r} is not valid; choose null or one of: {', '.join(COMPILE_MODES)}")
    backends = installed_backends()
    if cfg.backend not in backends:
        raise ValueError(f"{prefix}.backend={cfg.backend!r} is not an installed torch.compile backend; choose one of: "
                         f"{', '.join(backends)}")
    if cfg.backend == "inductor" and device_type == "cpu" and cpp_compiler() is None:
        raise ValueError(f"{prefix}.backend=inductor on CPU generates C++ and needs a C++ compiler (g++, clang++ "
                         "or $CXX) on PATH; none was found. Install one (apt install g++) or use compile=none")


def _compile(fn, cfg: CompileConfig):
    import torch

    return torch.compile(fn, backend=cfg.backend, mode=cfg.mode, fullgraph=cfg.fullgraph, dynamic=cfg.dynamic)


def block_lists(model: nn.Module) -> list[nn.ModuleList]:
    """The outermost nn.ModuleLists of `model` (a GPT's `blocks`; a Hugging Face model's decoder layers,
    dsrecipes.models.decoder_layers); lists inside a block (experts) are left to it."""
    from torch import nn

    from dsrecipes.models.decoder_layers import decoder_layers

    layers = decoder_layers(model)
    if layers:
        return [layers]
    found: list[nn.ModuleList] = []
    inside: set[str] = set()
    for name, module in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix in inside):
            continue
        if isinstance(module, nn.ModuleList):
            found.append(module)
            inside.add(name)
    return found


def _compile_head_and_loss(model: nn.Module, cfg: CompileConfig) -> bool:
    """Compile a GPT's head_and_loss (final norm, LM head, cross-entropy) when it is the plain torch code."""
    head = getattr(model, "head_and_loss", None)
    if head is None or getattr(model, "loss_fn", None) is not None:
        return False  # not a dsrecipes GPT, or an injected (Triton) loss owns it
    model.head_and_loss = _compile(head, cfg)
    return True


def _wants_loss(model: nn.Module, cfg: CompileConfig) -> bool:
    if cfg.loss is not None:
        return bool(cfg.loss)
    param = next(model.parameters(), None)
    return param is not None and param.device.type == "cuda"


def apply_compile(model: nn.Module, cfg: CompileConfig) -> list[str]:
    """Compile `model` in place per `cfg.scope`; returns the log lines (empty when nothing was compiled).

    Runs after tensor parallelism and the pipeline split: a vocab-parallel loss (tp) or a pipeline
    stage (no head_and_loss) leaves the head eager.
    """
    if cfg.scope == "none":
        return []
    settings = f"backend {cfg.backend}, mode {cfg.mode or 'default'}"
    if cfg.scope == "full":
        model.forward = _compile(model.forward, cfg)
        return [f"compile: full model ({type(model).__name__}), {settings}"]
    count = 0
    for blocks in block_lists(model):
        for block in blocks:
            block.forward = _compile(block.forward, cfg)
            count += 1
    if count == 0:
        return []
    line = f"compile: {count} block(s) compiled separately, {settings}"
    if _wants_loss(model, cfg) and _compile_head_and_loss(model, cfg):
        line += ", + final norm / LM head / loss"
    return [line]
