"""Python logging for a run: a log file per rank in the run directory, rich console output on rank 0."""

from __future__ import annotations

import logging
from pathlib import Path

from rich.console import Console
from rich.logging import RichHandler

LOGGER_NAME = "dsrecipes"
_HANDLER_TAG = "_dsrecipes_handler"


def setup_logging(run_dir: Path, rank: int, console: Console, level: str = "INFO") -> Path:
    """Route the `dsrecipes` logger to <run_dir>/logs/rank<R>.log (and the console on rank 0).

    Replaces the handlers a previous run in the same process installed (multirun jobs run in-process).
    """
    logger = logging.getLogger(LOGGER_NAME)
    for handler in [h for h in logger.handlers if getattr(h, _HANDLER_TAG, False)]:
        logger.removeHandler(handler)
        handler.close()
    logger.setLevel(level)
    logger.propagate = False
    log_path = run_dir / "logs" / f"rank{rank}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    file_handler = logging.FileHandler(log_path)
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s [rank%(rank)s] %(message)s"))
    file_handler.addFilter(_RankFilter(rank))
    handlers: list[logging.Handler] = [file_handler]
    if rank == 0:
        handler = _console_handler(console)
        handler.addFilter(lambda record: getattr(record, "console", True))  # extra={"console": False}: file only
        handlers.append(handler)
    for handler in handlers:
        setattr(handler, _HANDLER_TAG, True)
        logger.addHandler(handler)
    return log_path


def _console_handler(console: Console) -> logging.Handler:
    """rich's handler on a terminal; off one (SLURM, nohup, a pipe) plain lines, neither wrapped nor padded to
    the console's width as rich's layout would (a quiet console: nothing)."""
    if console.is_terminal:
        return RichHandler(console=console, show_path=False, markup=False, rich_tracebacks=False)
    if console.quiet:
        return logging.NullHandler()
    handler = logging.StreamHandler(console.file)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S"))
    return handler


class _RankFilter(logging.Filter):
    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


def get_logger() -> logging.Logger:
    return logging.getLogger(LOGGER_NAME)
