"""The report of a DeepSpeed config's translation: one row per key, what became of it, and the counts.

    DeepSpeed config ds_config.json: 14 mapped, 3 auto, 9 defaults, 6 no effect, 0 refused
    key                                   value   fate       dsrecipes / why
    train_batch_size                      32      mapped     trainer.train_batch_size=32
    zero_optimization.overlap_comm        true    no effect  a speed / memory option of ...

Printed once (rank 0) by `dsrecipes.initialize(config=<DeepSpeed config>)` and the CLI's
`deepspeed_config=PATH`, on stderr; `python -m dsrecipes.convert_ds_config` prints it on stderr
beside the YAML on stdout.
"""

from __future__ import annotations

import os
import sys

from rich.table import Table

from dsrecipes.config.ds_import.translation import KINDS, Translation, shown

_STYLES = {"mapped": "green", "auto": "cyan", "default": "blue", "no effect": "yellow", "refused": "bold red"}


def summary(t: Translation, source: str) -> str:
    counts = t.counts()
    parts = ", ".join(f"{counts[kind]} {'defaults' if kind == 'default' else kind}" for kind in KINDS)
    return f"DeepSpeed config {source}: {parts}"


def report_table(t: Translation, source: str) -> Table:
    table = Table(title=summary(t, source), title_justify="left")
    table.add_column("DeepSpeed key", overflow="fold")
    table.add_column("value", overflow="fold", max_width=24)
    table.add_column("fate", no_wrap=True)
    table.add_column("dsrecipes / why", overflow="fold", max_width=90)
    for fate in t.fates:
        style = _STYLES.get(fate.kind, "")
        table.add_row(fate.key, shown(fate.value), f"[{style}]{fate.kind}[/{style}]" if style else fate.kind,
                      fate.detail)
    return table


def report_lines(t: Translation, source: str) -> list[str]:
    """The report as plain lines (tests, logs)."""
    return [summary(t, source)] + [f"{f.key} = {shown(f.value)}: {f.kind}: {f.detail}" for f in t.fates]


def is_rank_zero() -> bool:
    """Rank 0 of a process group, or a process outside one (RANK unset)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank() == 0
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return os.environ.get("RANK", "0") == "0"


def print_report(t: Translation, source: str) -> None:
    """The report on stderr, on rank 0 only."""
    if not is_rank_zero():
        return
    from dsrecipes.utils.console import make_console, print_table

    print_table(make_console(stderr=True), report_table(t, source))
    sys.stderr.flush()
