"""The rich progress bar of a training run: step, loss, lr, tokens/s and ETA."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class TrainingProgress:
    """A no-op unless enabled (rank 0 with trainer.progress_bar=true)."""

    def __init__(self, console: Console, total_steps: int, start_step: int = 0, enabled: bool = True):
        self.enabled = enabled
        if not enabled:
            return
        self.progress = Progress(
            TextColumn("[bold blue]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss [bold]{task.fields[loss]}"),
            TextColumn("lr {task.fields[lr]}"),
            TextColumn("{task.fields[tps]} tok/s"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
        )
        self.task = self.progress.add_task(
            "train", total=total_steps, completed=start_step, loss="-", lr="-", tps="-"
        )

    def __enter__(self) -> TrainingProgress:
        if self.enabled:
            self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self.progress.stop()

    def update(self, step: int, loss: float | None = None, lr: float | None = None, tokens_per_s: float | None = None) -> None:
        if not self.enabled:
            return
        fields = {}
        if loss is not None:
            fields["loss"] = f"{loss:.4f}"
        if lr is not None:
            fields["lr"] = f"{lr:.2e}"
        if tokens_per_s is not None:
            fields["tps"] = f"{tokens_per_s:,.0f}"
        self.progress.update(self.task, completed=step, **fields)
