"""The loss of a step as the mean over every label token of the global batch (data.loss_mean=global_tokens).

Each micro-batch's forward returns the mean cross-entropy over its own labels; Engine.backward divides by the
gradient-accumulation steps and gradient reduction averages over the ranks, so unweighted the step's loss is the
mean of per-micro-batch means (DeepSpeed's). With rows that hold different numbers of labels (masked prompts,
padding, packed documents) that over-weighs the tokens of sparse micro-batches. Weighting micro-batch i's mean by

    w_i = n_i * gas * world / N        (n_i: its labels on this rank, N: the labels of every micro-batch of the step
                                         on every rank, one all-reduce)

makes the sum that backward and the reduction take equal sum(loss_i * n_i) / N over the global batch, the global
token mean; equal counts give w_i == 1.0 exactly. The world (not only the data-parallel ranks) is summed over:
model-parallel peers that hold the same rows count them alike in n_i and N (tensor parallelism), and sequence-
parallel ranks count the labels of their own chunks, whose means their gradient reduction averages.

A micro-batch without a single label gets w = 0: one placeholder label keeps its mean finite (0/0 would be NaN)
and the weight 0 keeps it out of the gradients and of the logged loss.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from dsrecipes.distributed.utils import is_distributed

IGNORE_INDEX = -100


def token_weights(labels: list[torch.Tensor], gas: int, device: torch.device) -> list[float]:
    """w_i of the module docstring for this rank's micro-batches of one step (a collective when distributed)."""
    counts = torch.stack([(lab != IGNORE_INDEX).sum() for lab in labels]).to(device=device, dtype=torch.float64)
    total = counts.sum()
    world = 1
    if is_distributed():
        total = total.clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        world = dist.get_world_size()
    total = float(total)
    if total == 0:
        raise ValueError("no label token in the whole global batch of this step: every row's targets are masked "
                         "(data.train_on) or cut off (data.block_size); check the data")
    return [float(n) * gas * world / total for n in counts.tolist()]


def with_a_label(batch: dict) -> dict:
    """The batch with one placeholder label (the first position predicts token 0), for a weight-0 micro-batch."""
    labels = batch["labels"].clone()
    labels.view(-1)[0] = 0
    return {**batch, "labels": labels}
