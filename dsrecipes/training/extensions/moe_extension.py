"""MoE as a Trainer extension: the auxiliary losses in the training loss, routing metrics in the logs.

One of dsrecipes.training.extensions.recipe.RECIPE_EXTENSIONS; inert when moe.num_experts=0.

* loss term `moe_aux_loss` = moe.aux_loss_coef x sum over MoE layers of the load-balancing loss, and
  `moe_z_loss` = moe.z_loss_coef x sum of router z-losses (when that coefficient is > 0). They are
  added to the LM loss and logged as train/moe_aux_loss, train/moe_z_loss (train/lm_loss is the
  language-model part alone).
* every log interval: moe/dropped_frac (routes dropped by the capacity limit over the interval),
  moe/max_load_ratio (busiest expert's load / mean load, 1.0 = perfectly balanced) and a per-layer
  histogram moe/expert_load/block<i> (tokens routed to each expert), summed over all ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from dsrecipes.distributed.utils import is_distributed
from dsrecipes.models.moe import MoELayer
from dsrecipes.training.extensions.base import Callback, Extensions, RunContext


def _named_moe_layers(model: torch.nn.Module) -> list[tuple[str, MoELayer]]:
    """(name under the user's module, layer) of every MoE layer, a DDP wrapper's "module." prefix removed."""
    return [(name.removeprefix("module."), m) for name, m in model.named_modules() if isinstance(m, MoELayer)]


def moe_loss_terms(aux_coef: float, z_coef: float):
    def loss_term(model, batch, output) -> dict:
        layers = [m for _, m in _named_moe_layers(model) if m.aux_loss is not None]
        if not layers:
            return {}
        terms = {"moe_aux_loss": aux_coef * sum(m.aux_loss for m in layers)}
        if z_coef > 0:
            terms["moe_z_loss"] = z_coef * sum(m.z_loss for m in layers)
        return terms

    # reads only the layers' state after the module's forward: a pipeline stage evaluates it on its own layers
    loss_term.stage_local = True
    return loss_term


class MoEMetrics(Callback):
    """Logs routing statistics every log interval (all ranks take part in one all-reduce)."""

    def on_step_end(self, context: RunContext, step: int, metrics: dict) -> None:
        if not context.is_log_step(step):
            return
        # one row per MoE layer of the whole model (a pipeline rank holds some of them), by block index
        layer_ids = context.cfg.moe.moe_layer_ids(context.cfg.model.n_layer)
        local = {_block_index(name): layer for name, layer in _named_moe_layers(context.engine.module)}
        if not layer_ids or not local:
            return
        device = context.device
        num_experts = context.cfg.moe.num_experts
        stats = torch.zeros(len(layer_ids), num_experts + 2, dtype=torch.float64, device=device)
        for row, layer in ((layer_ids.index(i), layer) for i, layer in local.items()):
            if layer.stat_expert_load is not None:
                stats[row, :num_experts] = layer.stat_expert_load.to(device, torch.float64)
                stats[row, num_experts] = layer.stat_dropped.to(device, torch.float64)
            stats[row, num_experts + 1] = layer.stat_routes
            layer.reset_stats()
        if is_distributed():
            stats = stats.float()  # gloo all_reduce has no float64 on every build
            dist.all_reduce(stats)
        stats = stats.double().cpu()
        loads, dropped, routes = stats[:, :num_experts], stats[:, num_experts], stats[:, num_experts + 1]
        if float(routes.sum()) == 0:
            return
        mean_load = loads.mean(dim=1).clamp(min=1e-9)
        context.loggers.log({
            "moe/dropped_frac": float(dropped.sum() / routes.sum()),
            "moe/max_load_ratio": float((loads.max(dim=1).values / mean_load).mean()),
        }, step)
        for block, load in zip(layer_ids, loads):
            context.loggers.log_histogram(f"moe/expert_load/block{block}", load.tolist(), step)


def _block_index(name: str) -> int:
    """blocks.<i>.mlp -> i (the GPT's and a pipeline stage's names alike)."""
    return int(name.split(".")[1])


def moe_extension(cfg) -> Extensions:
    moe = getattr(cfg, "moe", None)
    if moe is None or not moe.enabled:
        return Extensions()
    return Extensions(loss_terms=[moe_loss_terms(moe.aux_loss_coef, moe.z_loss_coef)], callbacks=[MoEMetrics()])
