"""The `compression` recipe group as a Trainer extension: QAT, pruning, layer reduction + KD, export.

    python -m dsrecipes +experiment=gpt_qat_int8
    python -m dsrecipes +experiment=gpt_layer_reduction compression.layer_reduction.teacher_path=outputs/<run>/export

One of dsrecipes.training.extensions.recipe.RECIPE_EXTENSIONS. What it adds:
  * model transform (parallelize's step 4, before any sharding): layer reduction first (the model is
    loaded with the teacher's weights from `layer_reduction.teacher_path`, then cut to the
    `teacher_layer` layers in place, so model.n_layer and the export follow), then
    `init_compression` (fake-quantized forwards, activation hooks, pruners) on the model.
  * loss term: distillation against the frozen teacher (kd_loss, hidden_loss), logged as train/*.
    The teacher is a trained model loaded from disk, as in DeepSpeed's layer-reduction tutorial;
    it stays in eval mode without gradients and runs under the engine's autocast (the student's
    compute dtype).
  * callback: on_train_start brings the schedules to the engine's step; on_step_end (after the
    optimizer step) advances bits / masks to the next step and hands the masks, by parameter name,
    to the data-parallel strategy's apply_masks, which multiplies them into every copy of the weight
    it holds (module parameters, fp32 masters, ZeRO-2 master shards, FSDP2 / tensor-parallel
    shards: each rank its piece). Masks and quantization scales are computed from whole weights
    (DTensors gathered), so a sharded run decides what one process decides. on_train_end runs
    redundancy clean (on a plain copy holding the gathered weights when they are sharded), writes
    <run dir>/<export_dirname>/ (safetensors + config), loads it back, evaluates it, and adds
    summary["compression"] = {bytes and validation loss before / after, ratio, path}. The
    Compressor's state (bit schedules, masks, activation ranges) is saved in every checkpoint, so a
    resume continues the same masks (a schedule point already reached is not recomputed).
"""

from __future__ import annotations

import logging
import math

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from dsrecipes.compression.clean import state_dict_bytes
from dsrecipes.compression.compress import Compressor
from dsrecipes.compression.config import layer_reduction_configs, library_configs
from dsrecipes.compression.layer_reduction import DistillationLoss, reduce_layers
from dsrecipes.data import eval_batches
from dsrecipes.training.extensions.base import Callback, Extensions, RunContext

log = logging.getLogger("dsrecipes")

# ModelConfig fields a teacher export must share with the recipe's model
_TEACHER_KEYS = ("style", "n_layer", "n_head", "n_kv_head", "d_model", "d_ff", "vocab_size", "max_seq_len", "bias",
                 "tie_embeddings")


def load_teacher(path: str, model_cfg, device) -> nn.Module:
    """The teacher GPT from a dsrecipes export directory; its shape must match the recipe's model."""
    from dsrecipes.models.export import load_exported

    teacher, config = load_exported(path, device=device)
    for key in _TEACHER_KEYS:
        want, got = getattr(model_cfg, key), config["model"].get(key)
        if want != got:
            raise ValueError(f"compression.layer_reduction.teacher_path={path}: the teacher has {key}={got!r} but "
                             f"model.{key}={want!r}; the recipe's model must be the teacher's shape")
    return teacher


class CompressionCallback(Callback):
    state_key = "compression"

    def __init__(self, cfg):
        self.cfg = cfg
        self.comp_cfg = cfg.compression
        self.compressor: Compressor | None = None
        self.teacher: nn.Module | None = None
        self.kd: DistillationLoss | None = None
        self.student: nn.Module | None = None

    # model transform -----------------------------------------------------------------------------

    def transform(self, model: nn.Module) -> nn.Module:
        reduction = layer_reduction_configs(self.comp_cfg)
        if reduction is not None:
            lr_cfg, kd_cfg = reduction
            device = next(model.parameters()).device
            self.teacher = load_teacher(self.comp_cfg.layer_reduction.teacher_path, self.cfg.model, device)
            model.load_state_dict(self.teacher.state_dict())
            reduce_layers(model, lr_cfg)
            log.info("compression: layer reduction %d -> %d layers (teacher layers %s)", len(self.teacher.blocks),
                     lr_cfg.keep_number_layer, lr_cfg.teacher_layer)
            if kd_cfg.kd_weight > 0 or kd_cfg.hidden_weight > 0:
                self.kd = DistillationLoss(self.teacher, kd_cfg, student=model, layer_map=lr_cfg.teacher_layer,
                                           module_name_prefix=lr_cfg.module_name_prefix)
        self.compressor = Compressor(model, **library_configs(self.comp_cfg, num_heads=self.cfg.model.n_head))
        self.student = model
        for name, value in (("weight quantization", self.compressor.weight_quant),
                            ("activation quantization", self.compressor.activation_quant),
                            ("sparse pruning", self.compressor.sparse)):
            if value is not None:
                log.info("compression: %s on %d module(s)", name, len(value.module_names))
        for p in self.compressor.structured:
            log.info("compression: %s pruning on %d module(s)", p.kind, len(p.module_names))
        return model

    def loss_term(self, model: nn.Module, batch: dict, output) -> dict:
        return self.kd(model, batch, output)

    # callbacks ------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return self.compressor.state_dict() if self.compressor is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.compressor is not None and state:
            self.compressor.load_state_dict(state)

    def _apply_masks(self, context: RunContext) -> None:
        """The masks, computed from whole weights, into every copy of each weight the strategy holds
        (module parameters or their shards, fp32 masters, ZeRO-2 master shards)."""
        context.engine.strategy.apply_masks(self.compressor.named_masks())

    def _advance(self, context: RunContext, step: int) -> None:
        c = self.compressor
        c.global_step = step
        if c.weight_quant is not None:
            c.weight_quant.step(step)
        if c.activation_quant is not None:
            c.activation_quant.step(step)
        if c.sparse is not None:
            c.sparse.update(step)
        for p in c.structured:
            p.update(step)
        self._apply_masks(context)

    def on_train_start(self, context: RunContext) -> None:
        if self.kd is not None:  # the teacher's forward at the student's precision (autocast dtype)
            self.kd.autocast = context.engine.precision.autocast
        self._advance(context, context.engine.global_steps)

    def on_step_end(self, context: RunContext, step: int, metrics: dict) -> None:
        self._advance(context, step)
        if context.is_log_step(step):
            context.loggers.log(self.compressor.metrics(), step)

    def on_train_end(self, context: RunContext, summary: dict) -> None:
        if not self.comp_cfg.export:
            return
        report = self.export(context, summary)
        if report is not None:
            summary["compression"] = report

    # redundancy clean + export ---------------------------------------------------------------------

    @torch.no_grad()
    def _val_loss(self, context: RunContext, model: nn.Module) -> float:
        losses = []
        max_batches = context.cfg.trainer.eval_batches or None
        for batch in eval_batches(context.data.validation, context.batch.micro_batch_size, max_batches=max_batches):
            out = model(batch["input_ids"].to(context.device), labels=batch["labels"].to(context.device))
            losses.append(float(out.loss))
        return sum(losses) / max(1, len(losses))

    def export(self, context: RunContext, summary: dict) -> dict | None:
        from dsrecipes.models.compressed_export import export_compressed, load_compressed

        model = context.engine.strategy.unwrapped
        sharded = any(isinstance(p, DTensor) for p in model.parameters())
        state = context.engine.module_state_dict() if sharded else None  # a collective: every rank gathers
        if not context.is_logging_rank:
            return None
        master = context.engine.masters
        if sharded:  # FSDP2 / tensor-parallel shards: clean a plain copy holding the whole fp32 weights
            from dsrecipes.models import GPT

            plain = GPT(model.cfg, moe=context.cfg.moe).to(context.device)
            plain.load_state_dict(state)
            model = plain
        elif master is not None:  # clean from the fp32 masters
            import copy

            model = copy.deepcopy(model)
            model.load_state_dict(master.master_state_dict(context.engine.strategy.unwrapped))
            model.float()
        model.eval()
        before_loss = summary["metrics"].get("val/loss")
        if before_loss is None:
            before_loss = self._val_loss(context, model)
        float_bytes = state_dict_bytes({k: v.float() if v.is_floating_point() else v
                                        for k, v in model.state_dict().items()})
        clean = self.compressor.redundancy_clean(model)
        out_dir = context.run_dir / self.comp_cfg.export_dirname
        info = export_compressed(clean, out_dir, extra={"tokenizer": context.cfg.data.tokenizer})
        loaded, _ = load_compressed(out_dir, device=context.device)
        after_loss = self._val_loss(context, loaded)
        report = {
            "path": str(out_dir),
            "bytes_fp32": float_bytes,
            "bytes_compressed": info["bytes"],
            "file_bytes": info["file_bytes"],
            "size_ratio": float_bytes / max(1, info["bytes"]),
            "val_loss_before": before_loss,
            "val_loss_after": after_loss,
        }
        context.loggers.log({"compression/bytes": info["bytes"], "compression/val_loss_after": after_loss},
                            context.engine.global_steps)
        log.info("compression export: %s  %s -> %s bytes (x%.2f)  val/loss %.4f -> %.4f", out_dir, f"{float_bytes:,}",
                 f"{info['bytes']:,}", report["size_ratio"], before_loss,
                 after_loss if math.isfinite(after_loss) else float("nan"))
        return report


def compression_extension(cfg) -> Extensions:
    comp_cfg = getattr(cfg, "compression", None)
    if comp_cfg is None or not comp_cfg.enabled:
        return Extensions()
    lr = comp_cfg.layer_reduction
    if lr.enabled and not lr.teacher_path:
        raise ValueError("compression.layer_reduction.teacher_path is required when layer_reduction is enabled: "
                         "the export directory of the trained teacher (e.g. outputs/<run>/export)")
    callback = CompressionCallback(cfg)
    kd = lr.enabled and (lr.kd_weight > 0 or lr.hidden_weight > 0)

    def loss_term(model, batch, output):
        return callback.loss_term(model, batch, output)

    return Extensions(model_transforms=[callback.transform], loss_terms=[loss_term] if kd else [],
                      callbacks=[callback])
