"""NVMe offload's start-up checks against the model (run by validate_recipe before any worker starts).

The model is built on the meta device (no memory) for its parameter shapes; dsrecipes.distributed.
offload.plan turns them into this layout's shard sizes, swap-file bytes and pools. Refused here: a
zero.buffer_size smaller than the largest parameter shard, a zero.buffer_count below the optimizer's
state tensors per parameter, and a zero.nvme_path that is missing, read-only or has less free space
than every rank of this node needs for its swap files.
"""

from __future__ import annotations

import copy
import os

import torch

from dsrecipes.distributed.config import uses_nvme
from dsrecipes.distributed.offload.plan import OffloadPlan, plan_offload
from dsrecipes.distributed.offload.swap_file import check_nvme_path
from dsrecipes.training.optim.state_bytes import optimizer_state_bytes


def parameter_shapes(root) -> list[tuple[int, ...]]:
    """The recipe's model parameter shapes in the optimizer's order (its decay groups; built on the meta device)."""
    from dsrecipes.data.tokenizers import build_tokenizer
    from dsrecipes.models import GPT
    from dsrecipes.models.config import padded_vocab_size

    model_cfg = copy.deepcopy(root.model)
    if model_cfg.vocab_size is None:
        model_cfg.vocab_size = padded_vocab_size(build_tokenizer(str(root.data.tokenizer)).vocab_size)
    from dsrecipes.training.optim.optimizers import param_groups

    with torch.device("meta"):
        model = GPT(model_cfg, root.moe)
    groups = param_groups(model, 0.0, bool(getattr(root.optimizer, "no_decay_bias_and_norm", True)))
    return [tuple(p.shape) for group in groups for p in group["params"]]


def state_tensors(root) -> int:
    """Optimizer state tensors per parameter (Adam 2, Lion / Adagrad / SGD with momentum 1)."""
    return optimizer_state_bytes(str(root.optimizer.name), float(getattr(root.optimizer, "momentum", 0.0) or 0.0)) // 4


def nvme_plan(root, dims) -> OffloadPlan:
    zero = root.zero
    return plan_offload(parameter_shapes(root), dims.dp_shard, state_tensors(root), str(zero.offload_optimizer),
                        str(zero.offload_param), zero.buffer_count, zero.param_buffer_count, zero.buffer_size)


def validate_nvme_recipe(root, dims) -> OffloadPlan | None:
    """Every NVMe offload check that needs the model; returns the plan (None without NVMe offload)."""
    zero = root.zero
    if not uses_nvme(zero):
        return None
    k = state_tensors(root)
    if zero.offload_optimizer == "nvme" and k > zero.buffer_count:
        raise ValueError(f"zero.buffer_count={zero.buffer_count} is less than the {k} state tensors per parameter of "
                         f"optimizer={root.optimizer.name}: every swap unit needs one buffer per state tensor; set "
                         f"zero.buffer_count >= {k} (>= {2 * k} to overlap reads and writes with the step)")
    plan = nvme_plan(root, dims)
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", dims.world_size))
    check_nvme_path(zero.nvme_path, plan.nvme * local_ranks)
    return plan
