"""The recipe Trainer: what `python -m dsrecipes` runs.

Build order, fixed and readable: device -> data -> layout (ParallelDims) -> model -> engine (through
dsrecipes.training.assembly, the same path `dsrecipes.initialize` takes) -> loggers. Then the loop:
`engine.train_batch` for every optimizer step (micro-batches, extra loss terms, backward, step: the
engine's runner knows whether a pipeline schedule runs them), metrics every log_interval,
validation every eval_interval, checkpoints every checkpoint.interval, and at the end a final
evaluation, the final checkpoint, a summary table and a short text sample from the model. The
recipe's extensions (compression, data efficiency, MoE) plug in through
dsrecipes.training.extensions.base; the loop does not know which ones are there.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from omegaconf import OmegaConf
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from dsrecipes.data import BatchIterator, eval_batches, prepare_data
from dsrecipes.distributed.parallel_dims import ParallelDims, device_type_of
from dsrecipes.distributed.utils import is_distributed, maybe_inject_failure, mean_over_ranks, rank_zero_first
from dsrecipes.models.config import padded_vocab_size
from dsrecipes.models.hf_export import export_model
from dsrecipes.models.hf_import import tokenizer_for_training
from dsrecipes.models.hf_module_export import export_transformers
from dsrecipes.models.lora_export import export_lora_adapter
from dsrecipes.models.sampling import sample_tokens
from dsrecipes.profiling.wall_clock import WallClockBreakdown
from dsrecipes.training.assembly import build_engine
from dsrecipes.training.batch import BatchSizes
from dsrecipes.training.checkpointing.checkpoint import find_resume_checkpoint, newest_checkpoint
from dsrecipes.training.config import to_dictconfig
from dsrecipes.training.extensions.base import Extensions, RunContext, callback_states, load_callback_states
from dsrecipes.training.extensions.recipe import build_extensions
from dsrecipes.training.layout import LAYOUT_KEY
from dsrecipes.training.recipe_model import build_recipe_model
from dsrecipes.training.reporting.loggers import MetricLoggers, wandb_run_id
from dsrecipes.training.reporting.loss_curve import write_loss_curve
from dsrecipes.training.reporting.progress import TrainingProgress, progress_line
from dsrecipes.training.reporting.throughput import ThroughputMeter
from dsrecipes.utils.console import make_console, print_table
from dsrecipes.utils.device import peak_tflops, resolve_device
from dsrecipes.utils.interrupts import signals_held
from dsrecipes.utils.logging import get_logger, setup_logging
from dsrecipes.utils.seed import seed_everything

SUMMARY_FILE = "summary.json"


class Trainer:
    def __init__(
        self,
        cfg,
        run_dir: str | Path,
        batch: BatchSizes,
        overrides: list[str] | None = None,
        extensions: Extensions | None = None,
        console: Console | None = None,
        rank: int = 0,
        sweep_name: str | None = None,
    ):
        """cfg: a validated RootConfig (dsrecipes.config.validate_recipe returns it with `batch`);
        extensions: replaces the recipe's own (dsrecipes.training.extensions.recipe.build_extensions(cfg))."""
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.batch = batch
        self.overrides = list(overrides or [])
        self.extensions = extensions if extensions is not None else build_extensions(cfg)
        self.console = console or make_console()
        self.rank = rank
        self.sweep_name = sweep_name
        self.is_logging_rank = rank == 0
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = setup_logging(self.run_dir, rank, self.console, cfg.logger.level)
        self.log = get_logger()

    # ------------------------------------------------------------------ build
    def setup(self) -> None:
        cfg = self.cfg
        seed_everything(cfg.trainer.seed)
        self.device = resolve_device(cfg.trainer.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)  # mem/peak_gib is this run's, not the process's
        self.log.info("device: %s", self.device)

        if cfg.model.path:  # model=hf: the checkpoint's own tokenizer unless data.tokenizer names one
            cfg.data.tokenizer = tokenizer_for_training(cfg.model.path, cfg.data.tokenizer)
        with rank_zero_first():  # rank 0 fills datasets' cache; the others then read it
            self.data = prepare_data(cfg.data, status=lambda msg: self.log.info("data: %s", msg))
        world = torch.distributed.get_world_size() if is_distributed() else 1
        self.dims = ParallelDims.from_config(cfg, world, device_type_of(self.device))
        self.data_rank = self.dims.dp_rank(self.rank)  # model-parallel peers read the same data shard
        self.context = RunContext(cfg, self.run_dir, self.rank, self.device, self.batch, self.data, self.data_rank)
        self.train_batches = BatchIterator(
            self.data.train,
            self.batch.micro_batch_size,
            seed=cfg.trainer.seed,
            rank=self.data_rank,
            world_size=self.batch.dp_world_size,
        )
        for batch_source in self.extensions.batch_sources:  # e.g. a curriculum sampler
            self.train_batches = batch_source(self.context, self.train_batches)

        model_cfg = cfg.model
        if model_cfg.vocab_size is None:
            model_cfg.vocab_size = padded_vocab_size(self.data.tokenizer.vocab_size)
        elif model_cfg.vocab_size < self.data.tokenizer.vocab_size:
            raise ValueError(
                f"model.vocab_size={model_cfg.vocab_size} is smaller than the tokenizer's "
                f"{self.data.tokenizer.vocab_size} tokens; set it to null to take it from the tokenizer"
            )
        # from scratch (under pipeline parallelism only this rank's stages), or model=hf: a Hugging Face checkpoint,
        # built on the meta device and filled with what this rank holds once parallelize has sharded it
        built = build_recipe_model(model_cfg, cfg.moe, self.dims, cfg.parallel, self.device)
        self.gpt = built.module
        if model_cfg.path:
            self.log.info("model: weights from %s (%s), tokenizer %s", model_cfg.path, built.description,
                          cfg.data.tokenizer)
        config_yaml = OmegaConf.to_yaml(to_dictconfig(cfg))
        self.engine = build_engine(self.gpt, cfg, self.batch, self.dims, config_yaml=config_yaml,
                                   transforms=self.extensions.model_transforms, materialize=built.materialize,
                                   model_description=built.description)
        # trainer.wall_clock_breakdown: perf/<phase>_s in every log line (dsrecipes.profiling.wall_clock)
        self.wall_clock = WallClockBreakdown(self.device) if cfg.trainer.wall_clock_breakdown else None
        if self.wall_clock is not None:
            self.engine.phases.add(self.wall_clock)
        self.log.info(
            "model: %s (%s), %s parameters", model_cfg.name, model_cfg.style, f"{self.gpt.num_params():,}"
        )
        self.log.info(
            "batch: train_batch_size=%d = micro %d x accumulation %d x dp %d",
            self.batch.train_batch_size,
            self.batch.micro_batch_size,
            self.batch.gradient_accumulation_steps,
            self.batch.dp_world_size,
        )

        self.resume_path = self._find_resume_checkpoint()
        self.loggers = MetricLoggers(
            cfg.logger,
            self.run_dir,
            cfg.name,
            OmegaConf.to_container(to_dictconfig(cfg), enum_to_str=True),
            self.is_logging_rank,
            group=self.sweep_name,
            wandb_resume_id=wandb_run_id(self._run_dir_of(self.resume_path)) if self.resume_path else None,
            overrides=self.overrides,
        )
        self.loggers.log_text(LAYOUT_KEY, self.engine.layout)
        self.context.engine, self.context.loggers = self.engine, self.loggers
        self.flops_per_token = self.gpt.flops_per_token(cfg.data.block_size)
        self.peak_flops = peak_tflops(self.device, cfg.trainer.peak_tflops)

    # ------------------------------------------------------------------ steps
    def _micro_batch(self, step: int) -> dict:
        with self.engine.phases("data"):
            batch = {k: v.to(self.device, non_blocking=True) for k, v in next(self.train_batches).items()}
            for hook in self.extensions.batch_hooks:
                batch = hook(batch, step)
        counter = self.extensions.token_counter
        self._step_tokens += counter(batch) if counter is not None else batch["input_ids"].numel()
        return batch

    def train_step(self, step: int, reduce_across_ranks: bool = True) -> dict:
        """One optimizer step over gradient_accumulation_steps micro-batches; returns its metrics.

        Losses are the global batch's mean when reduce_across_ranks (one all-reduce; the loop asks
        for it on logged steps only), else this rank's mean.
        """
        engine = self.engine
        engine.train()
        lr = engine.get_lr()[0]
        self._step_tokens = 0
        totals = engine.train_batch(lambda: self._micro_batch(step), self.extensions.loss_terms)
        self.meter.add_step(self._step_tokens * self.batch.dp_world_size)  # data-parallel ranks see equal shapes
        gas = engine.gradient_accumulation_steps
        names = list(totals)
        values = torch.stack([totals[n] for n in names])
        values = (mean_over_ranks(values) if reduce_across_ranks else values) / gas
        metrics = {f"train/{name}": float(v) for name, v in zip(names, values)}
        metrics["train/lr"] = lr
        metrics["train/grad_norm"] = engine.last_grad_norm
        metrics["train/loss_scale"] = engine.precision.loss_scale
        metrics["train/skipped_steps"] = engine.skipped_steps
        return metrics

    @torch.no_grad()
    def evaluate(self) -> dict:
        engine = self.engine
        engine.eval()
        max_batches = self.cfg.trainer.eval_batches or None
        val_loss = engine.eval_loss(eval_batches(self.data.validation, self.batch.micro_batch_size,
                                                 max_batches=max_batches))
        engine.train()
        return {"val/loss": val_loss, "val/ppl": math.exp(min(val_loss, 50.0))}

    def _perf_metrics(self) -> dict:
        """The log interval's throughput (training steps only; see dsrecipes.training.reporting.throughput), MFU, memory."""
        metrics = self.meter.window()
        if self.peak_flops:
            metrics["perf/mfu"] = metrics["perf/tokens_per_s"] * self.flops_per_token / (self.peak_flops * 1e12)
        if getattr(self, "wall_clock", None) is not None:
            metrics.update(self.wall_clock.window_metrics())
        if self.device.type == "cuda":
            metrics["mem/peak_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        return metrics

    def _synchronize(self) -> None:
        device = getattr(self, "device", None)
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)

    def save_checkpoint(self) -> Path:
        save_dir = self.run_dir / self.cfg.checkpoint.dirname
        client_state = {"data": self.train_batches.state_dict(),
                        "callbacks": callback_states(self.extensions.callbacks)}
        with signals_held():  # a signal during the save stops the run after this line (the checkpoint named)
            path = self.engine.save_checkpoint(save_dir, client_state=client_state)
            self.log.info("checkpoint: %s", path)
        return path

    # ------------------------------------------------------------------ run
    def _find_resume_checkpoint(self) -> Path | None:
        """The checkpoint trainer.resume names (checkpoints/step_N of some run directory), or None."""
        spec = self.cfg.trainer.resume
        if not spec:
            return None
        path = find_resume_checkpoint(spec, self.run_dir, self.cfg.checkpoint.dirname, self.cfg.name)
        if path is None:
            self.log.info("resume: no checkpoint found, starting fresh")
        return path

    def _run_dir_of(self, checkpoint: Path) -> Path:
        """The run directory that holds `checkpoint` (<run dir>/<checkpoint.dirname>/step_N)."""
        return checkpoint.parents[len(Path(self.cfg.checkpoint.dirname).parts)]

    def maybe_resume(self) -> None:
        """Apply trainer.resume: restore engine, schedule, scaler, RNG and data position."""
        path = getattr(self, "resume_path", None)
        if path is None:
            return
        _, client_state = self.engine.load_checkpoint(path.parent, tag=path.name)
        if "data" in client_state:
            self.train_batches.load_state_dict(client_state["data"])
        load_callback_states(self.extensions.callbacks, client_state.get("callbacks", {}))
        self.log.info("resumed from %s at step %d", path, self.engine.global_steps)

    def fit(self) -> dict:
        """Train to trainer.max_steps; returns the summary (also written to summary.json).

        Loggers are closed on every exit path, errors included.
        """
        try:
            self.meter = ThroughputMeter(self.batch.train_batch_size * self.cfg.data.block_size, self._synchronize)
            self.setup()
            self.maybe_resume()
            return self._train()
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM under dsrecipes.utils.interrupts.stop_on_signals
            self._log_interrupted()
            raise
        finally:
            for callback in self.extensions.callbacks:
                close = getattr(callback, "close", None)  # Callback.close; duck-typed callbacks may lack it
                if close is not None:
                    close()  # e.g. the comms logger's wrappers come off, errors included
            loggers = getattr(self, "loggers", None)
            if loggers is not None:
                loggers.close()
            engine = getattr(self, "engine", None)
            if engine is not None:
                engine.strategy.close()  # e.g. NVMe offload's swap files

    def _log_interrupted(self) -> None:
        """The run's last line when a signal stops it: the step reached and where to resume from."""
        if not self.is_logging_rank:
            return
        engine = getattr(self, "engine", None)
        step = f"at step {engine.global_steps}" if engine is not None else "before training started"
        newest = newest_checkpoint(self.run_dir / self.cfg.checkpoint.dirname)
        if newest is None:
            where = "no checkpoint was saved (checkpoint.interval sets how often one is)"
        else:
            where = f"newest checkpoint: {newest}; resume: the same command + trainer.resume=auto (or ={newest})"
        self.log.warning("interrupted %s; %s", step, where)

    def _train(self) -> dict:
        cfg, t = self.cfg, self.cfg.trainer
        for callback in self.extensions.callbacks:
            callback.on_train_start(self.context)
        if t.eval_on_start and self.engine.global_steps == 0:  # the starting point of the validation curve
            self._evaluate_and_log(0)
        self.meter.start_training()
        first_loss, last_train, last_eval, last_checkpoint = None, {}, {}, None
        show_bar = t.progress_bar and self.is_logging_rank
        with TrainingProgress(self.console, t.max_steps, self.engine.global_steps, enabled=show_bar) as bar:
            while self.engine.global_steps < t.max_steps:
                next_step = self.engine.global_steps + 1
                logged = next_step % t.log_interval == 0 or next_step == t.max_steps or first_loss is None
                metrics = self.train_step(self.engine.global_steps, reduce_across_ranks=logged)
                step = self.engine.global_steps
                maybe_inject_failure(self.rank, step)
                first_loss = metrics["train/loss"] if first_loss is None else first_loss
                if self.engine.last_step_skipped:
                    self.log.warning(
                        "step %d skipped: gradient overflow (loss scale now %g, %d skipped so far)",
                        step, self.engine.precision.loss_scale, self.engine.skipped_steps,
                    )
                if step % t.log_interval == 0 or step == t.max_steps:
                    metrics.update(self._perf_metrics())
                    self.loggers.log(metrics, step)
                    last_train = metrics
                    bar.update(step, metrics["train/loss"], metrics["train/lr"], self.meter.tokens_per_s)
                    line = progress_line(step, t.max_steps, metrics["train/loss"], metrics["train/lr"],
                                         self.meter.tokens_per_s, self.meter.eta_s(t.max_steps - step))
                    self.log.info(line, extra={"console": not bar.enabled})  # the live bar shows it there
                    self.log.debug("step %d %s", step, _fmt(metrics))
                else:
                    bar.update(step)
                for callback in self.extensions.callbacks:
                    callback.on_step_end(self.context, step, metrics)
                if t.eval_interval and step % t.eval_interval == 0 and step < t.max_steps:
                    last_eval = self._evaluate_and_log(step)
                if cfg.checkpoint.interval and step % cfg.checkpoint.interval == 0 and step < t.max_steps:
                    with self.meter.paused("checkpoint"):
                        last_checkpoint = self.save_checkpoint()
        last_eval = self._evaluate_and_log(self.engine.global_steps)
        with self.meter.paused("checkpoint"):
            if cfg.checkpoint.save_final:
                last_checkpoint = self.save_checkpoint()
            export_dir = self.export() if cfg.checkpoint.export_safetensors else None
        summary = self._summary(first_loss, last_train, last_eval, last_checkpoint)
        summary["export"] = str(export_dir) if export_dir else None
        sample = self.sample_text()
        if sample is not None:
            summary["sample"] = sample
        self._report(summary)
        for callback in self.extensions.callbacks:
            callback.on_train_end(self.context, summary)
        self.loggers.log_final(summary["metrics"], self.engine.global_steps)  # a sweep job's HParams, W&B final/*
        if self.is_logging_rank:
            (self.run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2))
            if cfg.trainer.loss_curve:
                write_loss_curve(self.run_dir, self.loggers.history)  # loss_curve.png (needs matplotlib)
        return summary

    def export(self) -> Path:
        """The final model in <run dir>/export/: the Hugging Face layout (full-precision weights, tokenizer copied in)."""
        out = self.run_dir / "export"
        state = self.engine.module_state_dict()  # a collective under FSDP2: every rank takes part
        if self.is_logging_rank and self.cfg.peft.enabled:  # the adapters merged in; adapter/ in PEFT's format
            state = export_lora_adapter(state, self.cfg, out)
        if self.is_logging_rank:
            extra = {}
            if str(self.cfg.sparse_attention.mode) != "none":  # recorded for inference (which attends densely)
                extra["sparse_attention"] = OmegaConf.to_container(OmegaConf.structured(self.cfg.sparse_attention),
                                                                   enum_to_str=True)
            if self.cfg.model.runs_transformers:  # the Hugging Face module: its own save_pretrained layout
                export_transformers(state, self.cfg.model, out, tokenizer=self.cfg.data.tokenizer)
            else:
                export_model(state, self.cfg.model, out, tokenizer=self.cfg.data.tokenizer, extra=extra,
                             moe_cfg=self.cfg.moe)
            self.log.info("export: %s", out)
        return out

    def _evaluate_and_log(self, step: int) -> dict:
        with self.meter.paused("eval"):
            metrics = self.evaluate()
        self.loggers.log(metrics, step)
        self.log.info("eval step %d: val/loss %.4f  val/ppl %.2f", step, metrics["val/loss"], metrics["val/ppl"])
        for callback in self.extensions.callbacks:
            callback.on_eval_end(self.context, step, metrics)
        return metrics

    def sample_text(self) -> str | None:
        t = self.cfg.trainer
        if not t.sample_tokens:
            return None
        with self.engine.runner.single_rank_module(self.engine) as model:
            if model is None:
                self.log.info("sample: skipped under pipeline parallelism (generate from the export instead)")
                return None
            tokenizer = self.data.tokenizer
            prompt = tokenizer.encode(t.sample_prompt)
            with self.engine.precision.autocast():
                new_ids = sample_tokens(model, prompt, t.sample_tokens, self.cfg.data.block_size,
                                        temperature=t.sample_temperature, top_k=t.sample_top_k, seed=t.seed,
                                        device=self.device, stop_id=getattr(tokenizer, "eos_id", None))
        return t.sample_prompt + tokenizer.decode(new_ids)

    def _summary(self, first_loss, last_train, last_eval, checkpoint) -> dict:
        metrics = {
            "train/first_loss": first_loss,
            "train/loss": last_train.get("train/loss"),
            **last_eval,
            "train/steps": self.engine.global_steps,
            **self.meter.totals(),  # throughput of the steps this run trained (not those before a resume)
        }
        if "perf/mfu" in last_train:
            metrics["perf/mfu"] = last_train["perf/mfu"]
        metrics.update(self.engine.strategy.offload_metrics())  # nvme/*: swap-file traffic (rank 0's)
        return {
            "name": self.cfg.name,
            "run_dir": str(self.run_dir),
            "overrides": self.overrides,
            "parameters": self.gpt.num_params(),
            "layout": self.engine.layout,
            "checkpoint": str(checkpoint) if checkpoint else None,
            "metrics": metrics,
        }

    def _report(self, summary: dict) -> None:
        if not self.is_logging_rank:
            return
        table = Table(title=f"dsrecipes run summary: {summary['name']}", show_header=False)
        table.add_column("what", style="bold")
        table.add_column("value", justify="right")
        table.add_row("parameters", f"{summary['parameters']:,}")
        for key, value in summary["metrics"].items():
            table.add_row(key, _fmt_value(value))
        table.add_row("layout", summary["layout"])
        table.add_row("run directory", summary["run_dir"])
        table.add_row("checkpoint", summary["checkpoint"] or "-")
        table.add_row("export", summary.get("export") or "-")
        print_table(self.console, table)
        if "sample" in summary:
            self.console.print(Panel(summary["sample"], title="sample from the trained model", expand=False))


def _fmt_value(value) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e5 else f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _fmt(metrics: dict) -> str:
    return " ".join(f"{k}={_fmt_value(v)}" for k, v in metrics.items())
