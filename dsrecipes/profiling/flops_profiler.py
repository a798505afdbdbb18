"""FlopsProfiler: DeepSpeed's flops profiler API on torch.utils.flop_counter.FlopCounterMode and module hooks.

    prof = FlopsProfiler(model)
    prof.start_profile()                 # latency hooks on every module
    with prof.counting():                # a forward (or several) whose FLOPs are counted
        model(input_ids)
    prof.stop_profile()
    prof.get_total_flops(), prof.get_total_macs(), prof.get_total_params(), prof.get_total_duration()
    prof.module_rows(module_depth=2)     # per module: params, forward FLOPs / MACs, latency, shares
    prof.end_profile()

FLOPs come from FlopCounterMode (dsrecipes.profiling.flop_formulas adds CPU attention), per module
through its ModuleTracker hierarchy: a module's count holds its children's. Only what runs inside
`counting()` is counted, so the Trainer counts a step's forward passes (its `forward` phase) and,
separately, its backward. Unlike DeepSpeed, which patches torch.nn.functional and also counts
elementwise work (GELU, softmax, norms), the counter counts matrix products and attention, where
FLOPs = 2 x MACs. Latency: forward pre/post hooks on every module, timed with perf_counter while
counting (the device synchronised at each hook on CUDA only, so a module is charged its own kernels;
this slows the profiled forward, as DeepSpeed's does).
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from dataclasses import asdict, dataclass

import torch
from torch import nn

from dsrecipes.profiling.flop_formulas import flop_counter, warm_up_flop_counter
from dsrecipes.utils.dtensors import local


@dataclass
class ModuleRow:
    """One module's line of the profile (FLOPs and latency of its forward passes, children included)."""

    name: str  # "" is the whole model
    type: str
    depth: int  # 0 = the model, 1 = its children ...
    params: int
    flops: int
    macs: int
    latency_s: float
    calls: int
    flops_share: float  # of the model's forward FLOPs
    latency_share: float  # of the model's forward latency

    def as_dict(self) -> dict:
        return asdict(self)


class FlopsProfiler:
    def __init__(self, model: nn.Module, device: torch.device | None = None):
        """model: the module whose forward is profiled (the one `counting()` wraps a call of)."""
        self.model = model
        if device is None:
            first = next(model.parameters(), None)
            device = first.device if first is not None else torch.device("cpu")
        self._sync = device.type == "cuda"
        self.device = device
        self._hooks: list = []
        self._counting = False
        self.reset()

    # ------------------------------------------------------------------ lifecycle
    def reset(self) -> None:
        self.module_flops: dict[str, int] = defaultdict(int)
        self.total_flops = 0
        self.module_latency: dict[str, float] = defaultdict(float)
        self.module_calls: dict[str, int] = defaultdict(int)
        self.tokens = 0
        self._starts: dict[str, list[float]] = defaultdict(list)

    def start_profile(self) -> None:
        """Reset the counts and hook every module (idempotent while started)."""
        self.reset()
        warm_up_flop_counter()
        if self._hooks:
            return
        for name, module in self.model.named_modules():
            self._hooks.append(module.register_forward_pre_hook(self._pre_hook(name)))
            self._hooks.append(module.register_forward_hook(self._post_hook(name)))
        self._hooks.append(self.model.register_forward_pre_hook(self._count_tokens))

    def stop_profile(self) -> None:
        """Remove the hooks; the counts stay readable."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def end_profile(self) -> None:
        self.stop_profile()
        self.reset()

    @contextlib.contextmanager
    def counting(self):
        """Count the FLOPs (and time the modules) of what runs inside: a forward of self.model."""
        counter = flop_counter()
        self._counting = True
        try:
            with counter:
                yield counter
        finally:
            self._counting = False
        root = type(self.model).__name__  # how the counter's ModuleTracker names the model it first sees
        for key, ops in counter.get_flop_counts().items():
            total = sum(ops.values())
            if key == "Global":
                self.total_flops += total
            elif key == root:
                self.module_flops[""] += total
            elif key.startswith(root + "."):
                self.module_flops[key[len(root) + 1:]] += total

    # ------------------------------------------------------------------ hooks
    def _now(self) -> float:
        if self._sync:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _pre_hook(self, name: str):
        def hook(module, args):
            if self._counting:
                self._starts[name].append(self._now())
        return hook

    def _post_hook(self, name: str):
        def hook(module, args, output):
            if self._counting and self._starts[name]:
                self.module_latency[name] += self._now() - self._starts[name].pop()
                self.module_calls[name] += 1
        return hook

    def _count_tokens(self, module, args) -> None:
        if self._counting and args and isinstance(args[0], torch.Tensor) and not args[0].is_floating_point():
            self.tokens += args[0].numel()  # token ids: an LM's forward

    # ------------------------------------------------------------------ totals (DeepSpeed's getters)
    def get_total_flops(self, as_string: bool = False) -> int | str:
        return number_to_string(self.total_flops, "FLOPs") if as_string else self.total_flops

    def get_total_macs(self, as_string: bool = False) -> int | str:
        macs = self.total_flops // 2
        return number_to_string(macs, "MACs") if as_string else macs

    def get_total_params(self, as_string: bool = False) -> int | str:
        """The parameters this rank holds: its shards under ZeRO-3 / FSDP2 and tensor parallelism (a DTensor's
        numel() is its global size, which every rank would otherwise report)."""
        params = sum(local(p).numel() for p in self.model.parameters())
        return number_to_string(params, "") if as_string else params

    def get_model_params(self) -> int:
        """The whole model's parameters, every rank's shards together (a DTensor's global size)."""
        return sum(p.numel() for p in self.model.parameters())

    def get_total_duration(self, as_string: bool = False) -> float | str:
        seconds = self.module_latency.get("", 0.0)
        return duration_to_string(seconds) if as_string else seconds

    # ------------------------------------------------------------------ rows
    def module_rows(self, module_depth: int = -1) -> list[ModuleRow]:
        """Every module down to module_depth (-1: all), in the model's order, the model itself first."""
        total_flops = max(self.total_flops, 1)
        total_latency = max(self.module_latency.get("", 0.0), 1e-12)
        rows = []
        for name, module in self.model.named_modules():
            depth = 0 if not name else name.count(".") + 1
            if module_depth >= 0 and depth > module_depth:
                continue
            flops = self.module_flops.get(name, 0)
            latency = self.module_latency.get(name, 0.0)
            rows.append(ModuleRow(
                name=name, type=type(module).__name__, depth=depth,
                params=sum(local(p).numel() for p in module.parameters()), flops=flops, macs=flops // 2,
                latency_s=latency, calls=self.module_calls.get(name, 0),
                flops_share=flops / total_flops, latency_share=latency / total_latency,
            ))
        return rows

    def top_modules(self, top: int = 1, module_depth: int = -1) -> list[dict]:
        """At each depth (1 ... module_depth), the `top` modules by forward FLOPs, by latency and by parameters."""
        by_depth: dict[int, list[ModuleRow]] = defaultdict(list)
        for row in self.module_rows(module_depth):
            if row.depth > 0:
                by_depth[row.depth].append(row)
        out = []
        for depth in sorted(by_depth):
            rows = by_depth[depth]
            pick = {key: [r.name for r in sorted(rows, key=lambda r, k=key: getattr(r, k), reverse=True)[:top]]
                    for key in ("flops", "latency_s", "params")}
            out.append({"depth": depth, "by_flops": pick["flops"], "by_latency": pick["latency_s"],
                        "by_params": pick["params"]})
        return out


def number_to_string(value: float, unit: str, precision: int = 2) -> str:
    """1.23 G<unit> style (DeepSpeed's flops_to_string / params_to_string)."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= scale:
            return f"{value / scale:.{precision}f} {prefix}{unit}".rstrip()
    if float(value).is_integer():
        return f"{int(value)} {unit}".rstrip()
    return f"{value:.{precision}f} {unit}".rstrip()


def duration_to_string(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.2f} us"
