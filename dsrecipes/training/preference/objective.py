"""DPO in the recipe: the reference log-probabilities, the step's objective, and the extension that wires them.

    extensions = dpo_extension(cfg)      # what the Trainer adds for dpo.enabled (dsrecipes.training.extensions)

When training starts, `ReferenceLogps` runs the model (before its first step: the reference of DPO, and with LoRA
the base model itself, the adapters being zero) over every train and validation pair once, shared out over the
ranks (each the same number of forwards: a ZeRO-3 forward is a collective), and keeps the two tables [pairs, 2]
(chosen, rejected) in every checkpoint, so a resumed run scores against the same reference. `DPOObjective` then
replaces the runner's language-model forward: chosen and rejected rows go through the model as one batch, their
label log-probabilities are summed per sequence (dsrecipes.training.preference.losses.sequence_logps) and the DPO
loss is taken against the table rows of the batch's pair indices. Every micro-batch holds the same number of pairs,
so the runner's mean of micro-batch means is the mean over every pair of the global batch. Rewards, margins and
accuracy are logged as train/rewards_chosen, train/rewards_rejected, train/reward_margin, train/reward_accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from dsrecipes.data.batches import gather_batch, row_columns
from dsrecipes.distributed.utils import is_distributed
from dsrecipes.training.extensions.base import Callback, Extensions, RunContext
from dsrecipes.training.preference.losses import dpo_loss, sequence_logps

SIDES = ("chosen", "rejected")


@dataclass
class ObjectiveOutput:
    loss: torch.Tensor
    metrics: dict = field(default_factory=dict)


def pair_logps(engine, batch: dict) -> tuple[torch.Tensor, ...]:
    """(chosen sums, rejected sums, chosen label counts, rejected label counts) of the batch's pairs."""
    ids = torch.cat([batch["chosen_input_ids"], batch["rejected_input_ids"]])
    labels = torch.cat([batch["chosen_labels"], batch["rejected_labels"]])
    logps, counts = sequence_logps(engine(ids).logits, labels)
    pairs = batch["chosen_input_ids"].shape[0]
    return logps[:pairs], logps[pairs:], counts[:pairs], counts[pairs:]


class DPOObjective:
    """runner.objective(engine, batch) -> ObjectiveOutput: the DPO loss of the batch's pairs (module docstring)."""

    def __init__(self, cfg, tables: dict[str, torch.Tensor]):
        self.cfg = cfg
        self.tables = tables

    def __call__(self, engine, batch: dict) -> ObjectiveOutput:
        chosen, rejected, chosen_counts, rejected_counts = pair_logps(engine, batch)
        table = self.tables["train" if engine.module.training else "validation"]
        reference = table[batch["index"].cpu()].to(chosen.device)
        out = dpo_loss(chosen, rejected, reference[:, 0], reference[:, 1], beta=float(self.cfg.beta),
                       label_smoothing=float(self.cfg.label_smoothing), loss_type=str(self.cfg.loss_type),
                       chosen_token_counts=chosen_counts, rejected_token_counts=rejected_counts)
        metrics = {"rewards_chosen": out.chosen_rewards.mean(), "rewards_rejected": out.rejected_rewards.mean(),
                   "reward_margin": out.reward_margins.mean(), "reward_accuracy": out.reward_accuracy.mean()}
        return ObjectiveOutput(out.loss, {k: v.detach() for k, v in metrics.items()})


@torch.no_grad()
def reference_table(engine, dataset, micro_batch_size: int) -> torch.Tensor:
    """[pairs, 2] float32 log-probabilities of every pair of `dataset` under the model as it is (eval mode).

    The rows are shared out over the ranks (rank r scores micro-batches r, r + world, ...) and the table summed
    over them; a rank that runs out of micro-batches scores its last one again (unused), so every rank runs the same
    number of forwards, which a ZeRO-3 forward (a collective) needs."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if is_distributed() else (0, 1)
    table = torch.zeros((int(max(dataset["index"])) + 1, 2), dtype=torch.float64)
    batches = list(range(-(-len(dataset) // micro_batch_size)))
    rounds = -(-len(batches) // world)
    rows = dataset.with_format("numpy", columns=row_columns(dataset))
    was_training = engine.module.training
    engine.eval()
    try:
        for turn in range(rounds):
            number = turn * world + rank
            mine = number < len(batches)
            number = min(number, len(batches) - 1)
            batch = gather_batch(rows, slice(number * micro_batch_size, (number + 1) * micro_batch_size))
            batch = {k: v.to(engine.device) for k, v in batch.items()}
            chosen, rejected, _, _ = pair_logps(engine, batch)
            if mine:
                table[batch["index"].cpu()] = torch.stack([chosen, rejected], dim=1).double().cpu()
    finally:
        engine.train(was_training)
    if world > 1:
        device_table = table.to(engine.device)
        dist.all_reduce(device_table, op=dist.ReduceOp.SUM)
        table = device_table.cpu()
    return table.float()


class ReferenceLogps(Callback):
    """Computes the reference tables when training starts (unless a checkpoint brought them) and installs the
    objective on the engine's runner; the tables are its checkpoint state."""

    state_key = "dpo_reference"

    def __init__(self, cfg):
        self.cfg = cfg
        self.tables: dict[str, torch.Tensor] = {}

    def on_train_start(self, context: RunContext) -> None:
        engine = context.engine
        if not self.tables:
            micro = context.batch.micro_batch_size
            self.tables = {"train": reference_table(engine, context.data.train, micro),
                           "validation": reference_table(engine, context.data.validation, micro)}
        engine.runner.objective = DPOObjective(self.cfg.dpo, self.tables)

    def state_dict(self) -> dict:
        return {name: table.clone() for name, table in self.tables.items()}

    def load_state_dict(self, state: dict) -> None:
        self.tables = {name: torch.as_tensor(table) for name, table in state.items()}


def pair_tokens(batch: dict) -> int:
    """Tokens a preference micro-batch processes: both sides of every pair."""
    return int(batch["chosen_input_ids"].numel() + batch["rejected_input_ids"].numel())


def dpo_extension(cfg) -> Extensions:
    """The Trainer's DPO pieces for dpo.enabled (nothing otherwise)."""
    if not cfg.dpo.enabled:
        return Extensions()
    return Extensions(callbacks=[ReferenceLogps(cfg)], token_counter=pair_tokens)
