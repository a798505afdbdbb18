"""Data efficiency as a Trainer extension: applies the recipe's `data_efficiency` group.

One of dsrecipes.training.extensions.recipe.RECIPE_EXTENSIONS. What it plugs in:

* sequence-length curriculum (curriculum_learning.metric=seqlen): a batch hook cutting every micro-batch
  to the current difficulty (truncate or pack);
* metric curriculum (any other metric): a batch source replacing the Trainer's BatchIterator by a
  `CurriculumSampler` over the data analyzer's scores (checkpointed as the data position);
* random-LTD: a model transform wrapping the chosen middle blocks and a batch hook setting the kept length
  for the step; with layer_token_lr_schedule, the LR is set from consumed layer-tokens after every step;
* a callback counting consumed tokens / layer-tokens against the full-length baseline, logging
  data/* and random_ltd/* metrics every log interval and saving its state (and the schedules') in
  checkpoints.

    python -m dsrecipes data_efficiency=seqlen_curriculum
    python -m dsrecipes +experiment=gpt_random_ltd
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from dsrecipes.data_efficiency import (
    CurriculumSampler,
    DataAnalyzer,
    RandomLTD,
    SeqlenCurriculum,
    build_curriculum_scheduler,
    build_random_ltd_scheduler,
    layer_token_equivalent_step,
    resolve_custom_fn,
)
from dsrecipes.distributed.utils import rank_zero_first
from dsrecipes.training.extensions.base import Callback, Extensions, RunContext

log = logging.getLogger("dsrecipes")


def analyze_metric(dataset, metric: str, num_proc: int | None = None, fallback_dir=None):
    """Per-sample values of ``metric`` (a built-in name or "pkg.mod:fn") over ``dataset``.

    Index files go next to the dataset's cache files, or to ``fallback_dir`` for an in-memory dataset.
    """
    fn = None if ":" not in metric else resolve_custom_fn(metric)
    name = metric.replace(":", "__").replace(".", "_") if fn is not None else metric
    metrics = {name: fn}
    output_dir = None if getattr(dataset, "cache_files", None) else fallback_dir
    return DataAnalyzer(dataset, metrics, num_proc=num_proc, output_dir=output_dir).run()[name]


class DataEfficiencyCallback(Callback):
    """Token / layer-token accounting against the full-length baseline, metrics, checkpointed state."""

    state_key = "data_efficiency"

    def __init__(self, cfg: Any):
        self.cfg = cfg
        self.n_layer = cfg.model.n_layer
        self.block_size = cfg.data.block_size
        self.seqlen: SeqlenCurriculum | None = None
        self.sampler: CurriculumSampler | None = None
        self.ltd: RandomLTD | None = None
        self.layer_token_lr = bool(cfg.data_efficiency.random_ltd.enabled
                                   and cfg.data_efficiency.random_ltd.layer_token_lr_schedule)
        self.consumed_tokens = 0
        self.consumed_layer_tokens = 0
        self.baseline_tokens = 0
        self.seq_len = self.block_size
        self._step_tokens = 0
        self._step_layer_tokens = 0

    # ------------------------------------------------------------------ per micro-batch
    def observe(self, batch: dict, step: int) -> dict:
        """Last batch hook: counts the tokens and layer-tokens this micro-batch will consume."""
        rows, seq_len = batch["input_ids"].shape
        self.seq_len = seq_len
        self._step_tokens += rows * seq_len
        self._step_layer_tokens += (self.ltd.layer_tokens(rows, seq_len) if self.ltd is not None
                                    else rows * seq_len * self.n_layer)
        return batch

    def processed_tokens(self, batch: dict) -> float:
        """random-LTD: the micro-batch's layer-tokens averaged over the layers (the Trainer's perf/tokens_per_s)."""
        rows, seq_len = batch["input_ids"].shape
        return self.ltd.layer_tokens(rows, seq_len) / self.ltd.total_layer_num

    def ltd_hook(self, batch: dict, step: int) -> dict:
        self.ltd.update(step)
        return batch

    # ------------------------------------------------------------------ per step
    def on_train_start(self, context: RunContext) -> None:
        if self.ltd is not None:
            self.ltd.reseed(context.data_rank)  # pipeline / tensor-parallel peers draw what their data shard's rank draws
            context.engine.plan.outside_shape_inference(self.ltd.paused)  # a shape-inference forward takes no draw
        if self.layer_token_lr:
            self._apply_layer_token_lr(context)

    def on_step_end(self, context: RunContext, step: int, metrics: dict) -> None:
        dp = context.batch.dp_world_size
        self.consumed_tokens += self._step_tokens * dp
        self.consumed_layer_tokens += self._step_layer_tokens * dp
        self.baseline_tokens += context.batch.train_batch_size * self.block_size
        self._step_tokens = self._step_layer_tokens = 0
        if self.ltd is not None:
            self.ltd.consumed_layer_tokens = self.consumed_layer_tokens
            self.ltd.consumed_tokens = self.consumed_tokens
        if self.layer_token_lr:
            self._apply_layer_token_lr(context)
        if context.is_log_step(step):
            context.loggers.log(self.metrics(), step)

    def on_train_end(self, context: RunContext, summary: dict) -> None:
        summary.setdefault("metrics", {}).update(self.metrics())

    def _apply_layer_token_lr(self, context: RunContext) -> None:
        scheduler = context.engine.lr_scheduler
        if scheduler is None or not hasattr(scheduler, "lrs_for_step"):
            raise ValueError("data_efficiency.random_ltd.layer_token_lr_schedule=true needs one of dsrecipes' "
                             "closed-form LR schedules (lr_scheduler.name), not lr_scheduler._target_")
        full_per_step = context.batch.train_batch_size * self.block_size * self.n_layer
        equivalent = layer_token_equivalent_step(self.consumed_layer_tokens, full_per_step)
        # as the schedule itself would, step_alignment included
        for group, lr in zip(context.engine.optimizer.param_groups, scheduler.lrs_for_step(equivalent)):
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr
        self.lr_equivalent_step = equivalent

    def metrics(self) -> dict:
        baseline_layer = self.baseline_tokens * self.n_layer
        out = {
            "data/seqlen": self.seq_len,
            "data/consumed_tokens": self.consumed_tokens,
            "data/consumed_layer_tokens": self.consumed_layer_tokens,
            "data/baseline_tokens": self.baseline_tokens,
            "data/tokens_saved": self.baseline_tokens - self.consumed_tokens,
            "data/layer_tokens_saved": baseline_layer - self.consumed_layer_tokens,
            "data/layer_tokens_saved_frac": 1.0 - self.consumed_layer_tokens / baseline_layer if baseline_layer else 0.0,
        }
        if self.seqlen is not None:
            out["data/difficulty"] = self.seqlen.difficulty
        if self.sampler is not None:
            out.update(self.sampler.metrics())
        if self.ltd is not None:
            out["random_ltd/kept_tokens"] = self.ltd.effective_length(self.seq_len)
            if self.layer_token_lr:
                out["random_ltd/lr_equivalent_step"] = getattr(self, "lr_equivalent_step", 0)
        return out

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {
            "consumed_tokens": self.consumed_tokens,
            "consumed_layer_tokens": self.consumed_layer_tokens,
            "baseline_tokens": self.baseline_tokens,
            "seqlen": self.seqlen.state_dict() if self.seqlen is not None else None,
            "random_ltd": self.ltd.state_dict() if self.ltd is not None else None,
        }

    def load_state_dict(self, state: dict) -> None:
        self.consumed_tokens = int(state["consumed_tokens"])
        self.consumed_layer_tokens = int(state["consumed_layer_tokens"])
        self.baseline_tokens = int(state["baseline_tokens"])
        if self.seqlen is not None and state.get("seqlen") is not None:
            self.seqlen.load_state_dict(state["seqlen"])
        if self.ltd is not None and state.get("random_ltd") is not None:
            self.ltd.load_state_dict(state["random_ltd"])


def data_efficiency_extension(cfg) -> Extensions:
    de = getattr(cfg, "data_efficiency", None)
    if de is None or not (de.curriculum_learning.enabled or de.random_ltd.enabled):
        return Extensions()
    cl, ltd_cfg, block_size = de.curriculum_learning, de.random_ltd, cfg.data.block_size
    callback = DataEfficiencyCallback(cfg)
    extensions = Extensions(callbacks=[callback])

    if cl.enabled and cl.metric == "seqlen":
        callback.seqlen = SeqlenCurriculum(build_curriculum_scheduler(cl, block_size), mode=cl.seqlen_mode)
        extensions.batch_hooks.append(callback.seqlen)
        log.info("data efficiency: sequence-length curriculum (%s), %s", cl.seqlen_mode, cl.schedule_type)
    elif cl.enabled:
        def curriculum_source(context: RunContext, batches):
            with rank_zero_first():  # rank 0 fills datasets' cache; the others read it
                index = analyze_metric(context.data.train, cl.metric, cfg.data.num_proc, context.run_dir / "data_analysis")
            callback.sampler = CurriculumSampler(
                context.data.train, index.values, build_curriculum_scheduler(cl, block_size),
                context.batch.micro_batch_size, seed=de.seed, rank=context.data_rank,
                world_size=context.batch.dp_world_size,
                gradient_accumulation_steps=context.batch.gradient_accumulation_steps,
                difficulty_type=cl.difficulty_type)
            log.info("data efficiency: %s curriculum over %d samples (%s)", cl.metric, len(index), cl.difficulty_type)
            return callback.sampler

        extensions.batch_sources.append(curriculum_source)

    if ltd_cfg.enabled:
        def random_ltd_transform(model):
            callback.ltd = RandomLTD(model, ltd_cfg.random_ltd_layer_id, build_random_ltd_scheduler(ltd_cfg, block_size),
                                     seed=de.seed, key="data_efficiency.random_ltd.random_ltd_layer_id")
            log.info("data efficiency: random-LTD in layers %s, %d -> %d tokens over %d steps",
                     callback.ltd.layer_ids, ltd_cfg.min_value, callback.ltd.scheduler.max_value, ltd_cfg.require_steps)
            return model

        extensions.model_transforms.append(random_ltd_transform)
        extensions.batch_hooks.append(callback.ltd_hook)
        extensions.token_counter = callback.processed_tokens
    extensions.batch_hooks.append(callback.observe)
    return extensions
