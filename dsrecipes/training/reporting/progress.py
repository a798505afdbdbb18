"""The progress of a training run: a rich bar on a terminal, a plain line per log interval off one.

On a terminal (rank 0, trainer.progress_bar=true) a live bar shows step, loss, lr, tokens/s and
ETA. Off a terminal (SLURM, nohup, a pipe) a live bar draws nothing until the end, so the Trainer
logs `progress_line(...)` every log_interval instead: to the console and rank0.log there, to
rank0.log only while the bar is live (its `console=False` record attribute keeps it off the console).
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class TrainingProgress:
    """A no-op unless enabled (rank 0 with trainer.progress_bar=true)."""

    def __init__(self, console: Console, total_steps: int, start_step: int = 0, enabled: bool = True):
        self.enabled = enabled and console.is_terminal  # off a terminal the Trainer logs progress lines instead
        if not self.enabled:
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


def progress_line(step: int, total_steps: int, loss: float, lr: float, tokens_per_s: float, eta_s: float) -> str:
    """`step 10/600 | loss 4.1234 | lr 3.00e-04 | 9,171 tokens/s | ETA 0:01:23` (ETA from training-step time)."""
    eta = int(round(eta_s))
    return (f"step {step}/{total_steps} | loss {loss:.4f} | lr {lr:.2e} | {tokens_per_s:,.0f} tokens/s | "
            f"ETA {eta // 3600}:{eta // 60 % 60:02d}:{eta % 60:02d}")
