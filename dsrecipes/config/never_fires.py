"""Techniques a recipe enables that never (or only partly) take effect within its trainer.max_steps.

A compression schedule that starts after the last step trains and exports a model exactly as if the
technique were off (a x1.00 "compressed" export); a curriculum whose shortest length is already the
full block size cuts nothing; random-LTD that keeps every token drops nothing. The run is valid (a
short smoke run of a long recipe is a normal thing to do), so each case is one UserWarning at start
naming the key, its value and trainer.max_steps, not an error. Schedules that start but end after
the last step (sparse pruning's ramp, weight quantization's bit decrease) warn that the run stops
part-way, with what it reaches.

The 1-bit optimizers are such a technique too: 1-bit Adam and 1-bit LAMB run uncompressed for freeze_step updates
(DeepSpeed's default, kept here, is 100000), so a shorter run never compresses a byte; 0/1 Adam compresses from the
start but reaches its local-step stage only after var_freeze_step.

Schedule arithmetic as the techniques apply it (compression's callback advances after every
optimizer step, so the state after step max_steps is what the export holds): weight quantization
and pruning act from step schedule_offset on; activation quantization from the forward after step
schedule_offset, so it needs schedule_offset < max_steps.
"""

from __future__ import annotations

import warnings
from typing import Any

_PRUNING = ("sparse_pruning", "row_pruning", "head_pruning", "channel_pruning")


def never_firing(root: Any) -> list[str]:
    """One message per enabled technique of root (a RootConfig) that its run will not (fully) apply."""
    steps = root.trainer.max_steps
    found = _compression(root.compression, steps)
    found += _data_efficiency(root.data_efficiency, root.data.block_size)
    found += _onebit(root.optimizer, steps)
    return found


def _onebit(optimizer: Any, steps: int) -> list[str]:
    """1-bit Adam / LAMB compress from update freeze_step + 1; 0/1 Adam takes local steps after var_freeze_step."""
    name = getattr(optimizer, "name", None)
    if name in ("onebitadam", "onebitlamb") and optimizer.freeze_step >= steps:
        return [f"optimizer.freeze_step={optimizer.freeze_step} is not before trainer.max_steps={steps}: "
                f"optimizer={name} runs every step uncompressed (the full gradient all-reduce, as its uncompressed "
                f"twin), so the run never compresses; set optimizer.freeze_step to ~15-25% of trainer.max_steps"]
    if name == "zerooneadam" and optimizer.var_freeze_step >= steps:
        return [f"optimizer.var_freeze_step={optimizer.var_freeze_step} is not before trainer.max_steps={steps}: "
                f"optimizer=zerooneadam never freezes the variance, so the run takes no local steps (it stops in "
                f"the variance stage: exact all-reduces at the variance updates, 1-bit ones in between)"]
    return []


def _compression(comp: Any, steps: int) -> list[str]:
    found = []
    end = f"trainer.max_steps={steps}, so the run trains and exports the model as if it were off"
    wq = comp.weight_quantization
    if wq.enabled:
        key = "compression.weight_quantization"
        if wq.schedule_offset > steps:
            found.append(f"{key}.schedule_offset={wq.schedule_offset} is after {end}")
        else:
            reached = wq.target_bits if wq.quantization_period == 0 else \
                max(wq.target_bits, wq.start_bits - (steps - wq.schedule_offset) // wq.quantization_period)
            if reached > wq.target_bits:
                found.append(f"{key}: the bits fall from start_bits={wq.start_bits} by one every quantization_period="
                             f"{wq.quantization_period} steps from schedule_offset={wq.schedule_offset}, so at "
                             f"trainer.max_steps={steps} they reach {reached}, not target_bits={wq.target_bits}")
    aq = comp.activation_quantization
    if aq.enabled and aq.schedule_offset >= steps:
        found.append(f"compression.activation_quantization.schedule_offset={aq.schedule_offset} is not before the "
                     f"last step ({end}; activations are quantized from the forward after step schedule_offset)")
    for name in _PRUNING:
        section = getattr(comp, name)
        if not section.enabled:
            continue
        key = f"compression.{name}"
        if section.schedule_offset > steps:
            found.append(f"{key}.schedule_offset={section.schedule_offset} is after {end}")
        elif section.dense_ratio >= 1.0:
            found.append(f"{key}.dense_ratio={section.dense_ratio} keeps every weight: nothing is pruned")
        elif name == "sparse_pruning" and (section.schedule_offset_end or 0) > steps:
            found.append(f"{key}.schedule_offset_end={section.schedule_offset_end} is after trainer.max_steps={steps}:"
                         f" the run stops part-way up the ramp, short of dense_ratio={section.dense_ratio}")
    return found


def _data_efficiency(de: Any, block_size: int) -> list[str]:
    found = []
    cl = de.curriculum_learning
    if cl.enabled and cl.metric == "seqlen" and cl.min_difficulty is not None and cl.min_difficulty >= block_size:
        found.append(f"data_efficiency.curriculum_learning.min_difficulty={cl.min_difficulty} is not shorter than "
                     f"data.block_size={block_size}: the sequence-length curriculum never cuts a batch")
    ltd = de.random_ltd
    if ltd.enabled and ltd.min_value >= block_size:
        found.append(f"data_efficiency.random_ltd.min_value={ltd.min_value} keeps every token of data.block_size="
                     f"{block_size} from the first step: random-LTD drops nothing")
    return found


def warn_never_firing(root: Any) -> None:
    """One UserWarning per technique that never (fully) takes effect in this run (see never_firing)."""
    for message in never_firing(root):
        warnings.warn(message, stacklevel=3)
