"""The flops profile as rich tables, Markdown and JSON, and `get_model_profile` for any nn.Module (DeepSpeed's).

    from dsrecipes.profiling import get_model_profile
    flops, macs, params = get_model_profile(model, args=[input_ids])            # strings: "1.90 GFLOPs" ...
    flops, macs, params = get_model_profile(model, input_shape=(2, 3, 224, 224), as_string=False)

One forward pass is profiled after `warm_up` unprofiled ones (under torch.no_grad: the FLOPs are
the same and no graph is kept). The per-module table (detailed=True) lists, down to module_depth,
every module's parameters, forward FLOPs and MACs, latency and their share of the model's; the
top-modules table names, at each depth, the `top_modules` modules with the most FLOPs, latency and
parameters. What is counted is dsrecipes.profiling.flops_profiler's (matrix products and attention).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from torch import nn

from dsrecipes.profiling.flops_profiler import FlopsProfiler, duration_to_string, number_to_string
from dsrecipes.utils.console import make_console, print_table
from dsrecipes.utils.tables import table_markdown


def module_table(profiler: FlopsProfiler, module_depth: int = -1) -> Table:
    table = Table(title="flops profile per module (forward; a module includes its children)")
    for column, justify in (("module", "left"), ("type", "left"), ("params", "right"), ("FLOPs", "right"),
                            ("MACs", "right"), ("FLOPs %", "right"), ("latency", "right"), ("latency %", "right")):
        table.add_column(column, justify=justify)
    for row in profiler.module_rows(module_depth):
        table.add_row("  " * row.depth + (row.name or "(model)"), row.type, number_to_string(row.params, ""),
                      number_to_string(row.flops, "FLOPs"), number_to_string(row.macs, "MACs"),
                      f"{100 * row.flops_share:.2f}", duration_to_string(row.latency_s), f"{100 * row.latency_share:.2f}")
    return table


def top_modules_table(profiler: FlopsProfiler, top: int, module_depth: int = -1) -> Table:
    table = Table(title=f"top {top} module(s) at each depth")
    for column in ("depth", "by FLOPs", "by latency", "by params"):
        table.add_column(column)
    for entry in profiler.top_modules(top, module_depth):
        table.add_row(str(entry["depth"]), ", ".join(entry["by_flops"]), ", ".join(entry["by_latency"]),
                      ", ".join(entry["by_params"]))
    return table


def totals_table(title: str, totals: dict[str, str]) -> Table:
    table = Table(title=title, show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    for key, value in totals.items():
        table.add_row(key, value)
    return table


def profile_tables(profiler: FlopsProfiler, title: str, totals: dict[str, str], module_depth: int = -1,
                   top_modules: int = 1, detailed: bool = True) -> list[Table]:
    """The totals, the top modules and (detailed) the per-module table."""
    tables = [totals_table(title, totals), top_modules_table(profiler, top_modules, module_depth)]
    if detailed:
        tables.append(module_table(profiler, module_depth))
    return tables


def profile_data(profiler: FlopsProfiler, totals: dict[str, Any], module_depth: int = -1, top_modules: int = 1) -> dict:
    """What the JSON file holds: raw totals, the top modules and every module's row (numbers, not strings)."""
    return {"totals": totals, "top_modules": profiler.top_modules(top_modules, module_depth),
            "modules": [row.as_dict() for row in profiler.module_rows(module_depth)]}


def write_profile(tables: list[Table], data: dict, markdown_path: Path) -> tuple[Path, Path]:
    """The tables as Markdown at markdown_path and the numbers as JSON beside it (same name, .json)."""
    markdown_path.parent.mkdir(parents=True, exist_ok=True)
    markdown_path.write_text("\n\n".join(table_markdown(t) for t in tables) + "\n")
    json_path = markdown_path.with_suffix(".json")
    json_path.write_text(json.dumps(data, indent=2))
    return markdown_path, json_path


def _input_for(model: nn.Module, input_shape: tuple[int, ...]) -> torch.Tensor:
    """DeepSpeed's dummy input (ones in the parameters' dtype), or token ids (zeros, long) for a model whose
    first submodule is an nn.Embedding."""
    first_param = next(model.parameters(), None)
    device = first_param.device if first_param is not None else torch.device("cpu")
    first_module = next((m for _, m in model.named_modules() if m is not model), None)
    if isinstance(first_module, nn.Embedding):
        return torch.zeros(input_shape, dtype=torch.long, device=device)
    dtype = first_param.dtype if first_param is not None else torch.float32
    return torch.ones(input_shape, dtype=dtype, device=device)


def get_model_profile(
    model: nn.Module,
    input_shape: tuple[int, ...] | None = None,
    args: list | tuple | None = None,
    kwargs: dict | None = None,
    print_profile: bool = True,
    detailed: bool = True,
    module_depth: int = -1,
    top_modules: int = 1,
    warm_up: int = 1,
    as_string: bool = True,
    output_file: str | Path | None = None,
    console: Console | None = None,
) -> tuple[Any, Any, Any]:
    """Profile one forward of `model`; returns (flops, macs, params), strings when as_string (DeepSpeed's API).

    The input: input_shape (a dummy tensor, see _input_for), or args / kwargs for model(*args, **kwargs).
    output_file: also write the tables as Markdown there (and the numbers as JSON beside it).
    """
    if input_shape is None and not args and not kwargs:
        raise ValueError("get_model_profile needs the model's input: input_shape=(...) or args=[...] / kwargs={...}")
    args = list(args or [])
    kwargs = dict(kwargs or {})
    if input_shape is not None:
        if args:
            raise ValueError("get_model_profile: pass input_shape or args, not both")
        args = [_input_for(model, tuple(input_shape))]
    profiler = FlopsProfiler(model)
    with torch.no_grad():
        for _ in range(warm_up):
            model(*args, **kwargs)
        profiler.start_profile()
        with profiler.counting():
            model(*args, **kwargs)
    profiler.stop_profile()
    flops, macs, params = profiler.get_total_flops(), profiler.get_total_macs(), profiler.get_total_params()
    if print_profile or output_file:
        seconds = profiler.get_total_duration()
        totals = {"parameters": number_to_string(params, ""), "forward FLOPs": number_to_string(flops, "FLOPs"),
                  "forward MACs": number_to_string(macs, "MACs"), "forward latency": duration_to_string(seconds),
                  "forward FLOP/s": number_to_string(flops / max(seconds, 1e-12), "FLOP/s")}
        if profiler.tokens:
            totals["forward FLOPs per token"] = number_to_string(flops / profiler.tokens, "FLOPs")
        tables = profile_tables(profiler, "model profile", totals, module_depth, top_modules, detailed)
        if print_profile:
            console = console or make_console()
            for table in tables:
                print_table(console, table)
        if output_file:
            raw = {"parameters": params, "forward_flops": flops, "forward_macs": macs, "forward_latency_s": seconds,
                   "tokens": profiler.tokens}
            write_profile(tables, profile_data(profiler, raw, module_depth, top_modules), Path(output_file))
    if as_string:
        return number_to_string(flops, "FLOPs"), number_to_string(macs, "MACs"), number_to_string(params, "")
    return flops, macs, params
