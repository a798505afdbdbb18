"""Metric sinks: metrics.jsonl, TensorBoard and Weights & Biases behind one `log(metrics, step)` call.

W&B runs offline (files under <run dir>/wandb, sync later with `wandb sync`) unless an API key is
configured or logger.wandb_mode=online; it is imported only when enabled, since it is slow to start.
Online, a server that does not answer (no network, a wrong WANDB_BASE_URL) or a failing wandb.init
falls back to offline with a warning, within ~15 s, instead of blocking and crashing. A run that
resumes from a checkpoint continues the W&B run of the run directory that wrote it (its id is kept
in <run dir>/wandb/dsrecipes_run_id).

Sweep jobs (a multirun's, `group` set) are made comparable: their W&B run is named after the run name and
the job's overrides ("gpt optimizer.lr=0.001 zero.stage=2") with job_type "sweep-job" (else the run name and
"train"), and at the end of the run (`log_final`) TensorBoard gets the job's overrides as HParams with its
final metrics as hparams/<metric>, so TensorBoard's HPARAMS tab, pointed at the sweep directory, shows one
row per job. W&B's run summary gets the final metrics as final/<metric>.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from pathlib import Path

from dsrecipes.training.config import LoggerConfig


class JsonlLogger:
    """One JSON object per log call: {"step": N, "time": unix_s, "train/loss": ...}."""

    def __init__(self, path: Path):
        self.path = path
        self._file = open(path, "a", buffering=1)

    def log(self, metrics: dict, step: int) -> None:
        record = {"step": step, "time": round(time.time(), 3)}
        record.update({k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in metrics.items()})
        self._file.write(json.dumps(record) + "\n")

    def log_histogram(self, name: str, values: list[float], step: int) -> None:
        self._file.write(json.dumps({"step": step, "time": round(time.time(), 3), name: list(values)}) + "\n")

    def log_text(self, name: str, text: str) -> None:
        """Not a per-step record: run-level text goes to summary.json (written by the Trainer)."""

    def close(self) -> None:
        self._file.close()

    def log_final(self, metrics: dict, step: int) -> None:
        """Nothing: the final metrics are in summary.json."""


def _config_value(config: dict, dotted: str):
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def override_hparams(overrides: list[str], config: dict) -> dict:
    """{key: value} of a job's overrides, the value as the resolved config holds it (a number stays a number);
    a group choice (model=gpt_debug), an experiment or a list keeps the override's own text."""
    out = {}
    for override in overrides:
        key, sep, text = override.partition("=")
        key = key.lstrip("+~")
        if not sep or not key or key.startswith("hydra."):
            continue
        value = _config_value(config, key)
        out[key] = value if isinstance(value, (bool, int, float, str)) else text
    return out


def final_scalars(metrics: dict) -> dict[str, float]:
    """The finite numbers of a run summary's metrics (None, text and non-finite values left out)."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[key] = float(value)
    return out


def sweep_run_name(run_name: str, overrides: list[str], limit: int = 128) -> str:
    """A sweep job's display name: the run name and the job's overrides, at most `limit` characters."""
    name = " ".join([run_name, *overrides])
    return name if len(name) <= limit else name[: limit - 1] + "…"


class TensorBoardLogger:
    """Scalars per step, the resolved config as text (TensorBoard's TEXT tab), and for a sweep job its
    overrides as HParams with the final metrics (the HPARAMS tab)."""

    def __init__(self, log_dir: Path, config: dict, hparams: dict | None = None):
        """hparams: the sweep job's {override key: value} (override_hparams); None: not a sweep job, no HParams."""
        import yaml
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))
        self.hparams = hparams
        text = yaml.safe_dump(config, sort_keys=False)
        self.writer.add_text("config", "\n".join("    " + line for line in text.splitlines()), 0)

    def log(self, metrics: dict, step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def log_text(self, name: str, text: str) -> None:
        self.writer.add_text(name, text, 0)

    def log_histogram(self, name: str, values: list[float], step: int) -> None:
        """values[i] = mass of bucket i (e.g. tokens routed to expert i), drawn as that histogram."""
        import numpy as np

        counts = np.asarray(values, dtype=np.float64)
        edges = np.arange(len(counts) + 1, dtype=np.float64) - 0.5
        self.writer.add_histogram_raw(
            name, min=0.0, max=float(len(counts) - 1), num=float(counts.sum()),
            sum=float((counts * np.arange(len(counts))).sum()),
            sum_squares=float((counts * np.arange(len(counts)) ** 2).sum()),
            bucket_limits=edges[1:].tolist(), bucket_counts=counts.tolist(), global_step=step,
        )

    def log_final(self, metrics: dict, step: int) -> None:
        """A sweep job's HParams record: its overrides, and its final metrics as hparams/<name> scalars.

        Written into this run's own event file (SummaryWriter.add_hparams would open a sub-run per call), so the
        HPARAMS tab shows this job as one row; the hparams/ prefix keeps the final values apart from the
        per-step series of the same names.
        """
        if self.hparams is None:
            return
        from torch.utils.tensorboard.summary import hparams

        scalars = {f"hparams/{key}": value for key, value in final_scalars(metrics).items()}
        experiment, start, end = hparams(self.hparams, scalars)
        for record in (experiment, start, end):
            self.writer.file_writer.add_summary(record, step)
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


def wandb_mode(configured: str) -> str:
    """auto -> online when WANDB_API_KEY is set, else offline."""
    if configured != "auto":
        return configured
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


RUN_ID_FILE = "dsrecipes_run_id"  # in <run dir>/wandb/: the W&B run a resumed run continues
ONLINE_INIT_TIMEOUT_S = 10  # wandb.init's own bound on reaching the server once it is known to answer


def wandb_run_id(run_dir: Path) -> str | None:
    """The W&B run id a run directory's run logged to (None: it had no W&B run)."""
    path = Path(run_dir) / "wandb" / RUN_ID_FILE
    return path.read_text().strip() if path.is_file() else None


def wandb_server(base_url: str | None = None) -> str:
    """The W&B server a run talks to (WANDB_BASE_URL, else the public one)."""
    return base_url or os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai"


class WandbLogger:
    """A W&B run. Online mode first checks, in 3 s, that the server answers, and falls back to offline (a
    warning, files under <run dir>/wandb for `wandb sync`) when it does not or when wandb.init fails, so a
    machine with a key but no network loses neither time nor the run. `resume_id`: continue that run."""

    def __init__(self, cfg: LoggerConfig, run_dir: Path, run_name: str, config: dict, group: str | None,
                 resume_id: str | None = None, job_type: str = "train"):
        try:
            import wandb
        except ImportError as error:
            raise ValueError(
                "logger.wandb=true but the wandb package is not installed; "
                "pip install wandb, or use logger=default (jsonl + TensorBoard)"
            ) from error

        from dsrecipes.utils.network import unreachable

        options = dict(project=cfg.wandb_project, entity=cfg.wandb_entity, name=run_name, job_type=job_type,
                       group=cfg.wandb_group or group, tags=list(cfg.wandb_tags), dir=str(run_dir), config=config,
                       reinit="finish_previous")
        if resume_id:
            options.update(id=resume_id, resume="allow")
        mode = wandb_mode(cfg.wandb_mode)
        if mode == "online":
            why = unreachable(wandb_server())
            if why is None:
                try:
                    self.run = wandb.init(mode="online", settings=wandb.Settings(init_timeout=ONLINE_INIT_TIMEOUT_S),
                                          **options)
                except Exception as error:  # CommError, UsageError (a bad key), timeouts
                    why = f"wandb.init failed: {type(error).__name__}: {str(error).splitlines()[0]}"
            if why is not None:
                warnings.warn(f"W&B online logging is unavailable ({why}); logging offline to {run_dir}/wandb "
                              "instead (upload later with `wandb sync`)", stacklevel=3)
                mode = "offline"
        if mode != "online":
            self.run = wandb.init(mode=mode, **options)
        (Path(run_dir) / "wandb").mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / "wandb" / RUN_ID_FILE).write_text(self.run.id)

    def log(self, metrics: dict, step: int) -> None:
        self.run.log(metrics, step=step)

    def log_text(self, name: str, text: str) -> None:
        """A run-level fact (the layout): in the run's summary, shown on its overview page."""
        self.run.summary[name] = text

    def log_histogram(self, name: str, values: list[float], step: int) -> None:
        import wandb

        edges = [i - 0.5 for i in range(len(values) + 1)]
        self.run.log({name: wandb.Histogram(np_histogram=(list(values), edges))}, step=step)

    def log_final(self, metrics: dict, step: int) -> None:
        """The run summary's metrics as final/<name> in the W&B run summary (the runs table's columns)."""
        self.run.summary.update({f"final/{key}": value for key, value in final_scalars(metrics).items()})

    def close(self) -> None:
        self.run.finish()


class MetricLoggers:
    """Fans a metrics dict out to every enabled sink (only on the rank that logs)."""

    HISTORY_KEYS = ("train/loss", "val/loss")  # kept in memory for the loss curve (dsrecipes.training.reporting.loss_curve)

    def __init__(
        self,
        cfg: LoggerConfig,
        run_dir: Path,
        run_name: str,
        config: dict,
        enabled: bool = True,
        group: str | None = None,
        wandb_resume_id: str | None = None,
        overrides: list[str] | None = None,
    ):
        """wandb_resume_id: the W&B run to continue (a resumed run's, see wandb_run_id). group: the multirun
        sweep's name for a sweep job (its W&B group; it also makes the job's `overrides` its W&B name and HParams)."""
        self.sinks = []
        self.history: dict[str, list[tuple[int, float]]] = {key: [] for key in self.HISTORY_KEYS}
        self._last_step = 0
        self.enabled = enabled  # the logging rank: it keeps the history even with no sink (logger=none)
        if not enabled:
            return
        sweep_job = group is not None
        overrides = list(overrides or [])
        if cfg.jsonl:
            self.sinks.append(JsonlLogger(run_dir / "metrics.jsonl"))
        if cfg.tensorboard:
            hparams = override_hparams(overrides, config) if sweep_job else None
            self.sinks.append(TensorBoardLogger(run_dir / "tb", config, hparams=hparams))
        if cfg.wandb and wandb_mode(cfg.wandb_mode) != "disabled":
            name = sweep_run_name(run_name, overrides) if sweep_job else run_name
            self.sinks.append(WandbLogger(cfg, run_dir, name, config, group, resume_id=wandb_resume_id,
                                          job_type="sweep-job" if sweep_job else "train"))

    def log(self, metrics: dict, step: int) -> None:
        self._last_step = max(self._last_step, step)
        if self.enabled:
            for key in self.HISTORY_KEYS:
                value = metrics.get(key)
                if isinstance(value, (int, float)):
                    self.history[key].append((step, float(value)))
        for sink in self.sinks:
            sink.log(metrics, step)

    def log_final(self, metrics: dict, step: int | None = None) -> None:
        """The run summary's final metrics, once at the end of the run: TensorBoard HParams for a sweep job,
        final/<name> in the W&B summary. step: the run's last step (default: the last one logged)."""
        step = self._last_step if step is None else step
        for sink in self.sinks:
            sink.log_final(metrics, step)

    def log_histogram(self, name: str, values: list[float], step: int) -> None:
        """A bucketed distribution (bucket i holds values[i]): TensorBoard/W&B histogram, a list in jsonl."""
        for sink in self.sinks:
            sink.log_histogram(name, values, step)

    def log_text(self, name: str, text: str) -> None:
        """A run-level text (e.g. run/layout): TensorBoard's TEXT tab and the W&B run summary."""
        for sink in self.sinks:
            sink.log_text(name, text)

    def close(self) -> None:
        """Close every sink (idempotent; called on every exit path of a run)."""
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            sink.close()
