"""Random layerwise token dropping (random-LTD, DeepSpeed's ``data_routing.random_ltd``; arXiv 2211.11586).

In each chosen middle layer a random subset of ``L(s)`` tokens per sequence goes through the layer; the
other tokens bypass it unchanged and are scattered back into place, so the layer's compute scales with
``L(s) / T``. The first and last layers always see every token. ``L(s)`` grows from ``min_value`` to
``max_value`` (DeepSpeed's ``fixed_linear`` random-LTD schedule):

    L(s) = min(max, floor(s / require_steps * (max - min) + min) rounded down to a multiple of seq_per_step)

which is `CurriculumScheduler`'s ``fixed_linear`` with ``total_curriculum_step=require_steps`` and
``difficulty_step=seq_per_step``.

    ltd = RandomLTD(model, layer_ids=[1, 2], scheduler=RandomLTDScheduler(min_value=32, max_value=128,
                                                                         require_steps=1000, seq_per_step=16))
    for step, batch in enumerate(batches):
        ltd.update(step)                 # sets L(step) for the next forward passes
        loss = model(batch["input_ids"], labels=batch["labels"]).loss
        ...
        ltd.account(global_batch_size, seq_len=batch["input_ids"].shape[1])   # consumed layer-tokens

Causal order: the kept indices are sorted, so a causal layer over the kept tokens still lets each token see
only tokens that came before it in the original sequence. Rotary positions: when a block gets rotary tables
(Llama style), the kept tokens are rotated with the angles of their *original* positions (the tables are
gathered); then one index set is drawn per layer and micro-batch and shared by the batch rows, because the
model's rotary tables are per position, not per row. Without rotary tables every row draws its own subset
(as DeepSpeed does). Evaluation (``model.eval()``) always runs every token through every layer.

The wrapping replaces each chosen block's ``forward`` (like activation checkpointing), so module names and
state-dict keys are unchanged and sharding wrappers still see the same modules.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from .curriculum import CurriculumConfig, CurriculumScheduler

__all__ = ["RandomLTD", "RandomLTDScheduler", "find_blocks", "layer_token_equivalent_step"]


class RandomLTDScheduler:
    """Step -> kept sequence length ``L(s)`` (DeepSpeed's ``random_ltd_schedule``, ``fixed_linear``)."""

    def __init__(self, min_value: int, max_value: int, require_steps: int, seq_per_step: int = 16,
                 prefix: str = "random_ltd"):
        for key, value in (("min_value", min_value), ("max_value", max_value), ("require_steps", require_steps),
                           ("seq_per_step", seq_per_step)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{prefix}.{key}={value!r} must be a positive integer")
        if min_value > max_value:
            raise ValueError(f"{prefix}.min_value={min_value} must be <= {prefix}.max_value={max_value}")
        self.min_value, self.max_value = min_value, max_value
        self.require_steps, self.seq_per_step = require_steps, seq_per_step
        with warnings.catch_warnings():  # the multiple-of-8 advice is about curricula; seq_per_step is checked above
            warnings.simplefilter("ignore")
            self._curve = CurriculumScheduler(CurriculumConfig(
                min_difficulty=min_value, max_difficulty=max_value, schedule_type="fixed_linear",
                total_curriculum_step=require_steps, difficulty_step=seq_per_step))

    def get_value(self, step: int) -> int:
        return self._curve.get_difficulty(step)

    def update(self, step: int) -> int:
        return self._curve.update_difficulty(step)

    @property
    def current(self) -> int:
        return self._curve.get_current_difficulty()

    def state_dict(self) -> dict[str, Any]:
        return self._curve.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._curve.load_state_dict(state)


def find_blocks(model: nn.Module) -> nn.ModuleList:
    """The model's transformer blocks: ``model.blocks`` if it is an nn.ModuleList, else the only ModuleList."""
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, nn.ModuleList):
        return blocks
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    if len(lists) != 1:
        raise ValueError(f"random-LTD needs the model's transformer blocks: found {len(lists)} nn.ModuleLists and "
                         "no 'blocks' attribute; pass blocks= explicitly")
    return lists[0]


def layer_token_equivalent_step(consumed_layer_tokens: float, full_layer_tokens_per_step: float) -> int:
    """The optimizer step at which a full-length run would have consumed as many layer-tokens.

    DeepSpeed's layer-token LR schedule: with random-LTD the LR schedule advances by consumed layer-tokens,
    not by steps, so early steps (which process fewer tokens) move the schedule less.
    """
    if full_layer_tokens_per_step <= 0:
        raise ValueError(f"full_layer_tokens_per_step={full_layer_tokens_per_step} must be > 0")
    return int(consumed_layer_tokens // full_layer_tokens_per_step)


class _DroppingForward:
    """Replacement ``forward`` of one block: run it on a sorted random subset of tokens, scatter back."""

    def __init__(self, owner: RandomLTD, layer_id: int, block: nn.Module, forward: Callable):
        self.owner, self.layer_id, self.forward = owner, layer_id, forward
        self.block = [block]  # a list, so the block is not registered as a submodule of anything

    def __call__(self, x: torch.Tensor, rope=None, *args, **kwargs) -> torch.Tensor:
        kept = self.owner.kept_length
        block = self.block[0]
        if not block.training or kept is None or x.dim() != 3 or kept >= x.shape[1]:
            return self.forward(x, rope, *args, **kwargs)
        return self.owner.dropped_forward(self.layer_id, self.forward, x, rope, *args, kept=kept, **kwargs)


class RandomLTD:
    """Applies random-LTD to ``layer_ids`` of ``model``'s blocks; tracks consumed layer-tokens.

    layer_ids: indices into the block list (DeepSpeed's ``random_ltd_layer_id``); ``None`` = every block but
    the first and the last. The first and last layers are never dropped from (ValueError naming the key).
    """

    def __init__(self, model: nn.Module, layer_ids: Sequence[int] | None, scheduler: RandomLTDScheduler,
                 seed: int = 1234, blocks: nn.ModuleList | None = None, key: str = "random_ltd.random_ltd_layer_id"):
        blocks = blocks if blocks is not None else find_blocks(model)
        n = len(blocks)
        self.total_layer_num = n
        self.layer_ids = validate_layer_ids(layer_ids, n, key)
        self.scheduler = scheduler
        self.kept_length: int | None = None  # None = no dropping (before the first update)
        self.seed = int(seed)
        self.stream = 0  # the data-parallel rank: each data shard draws its own subsets
        # index draws so far, per dropping layer: a layer's draw k is seeded by (seed, stream, layer, k), so a
        # layer's subsets do not depend on which other layers this process runs (pipeline stages hold some of
        # them, a single process all) and resuming needs only the counts
        self.draws: dict[int, int] = {layer_id: 0 for layer_id in self.layer_ids}
        self.generator = torch.Generator()
        self._paused = 0  # > 0 inside paused(): draws do not advance the counts
        self.consumed_layer_tokens = 0
        self.consumed_tokens = 0
        self.last_indices: dict[int, torch.Tensor] = {}
        for layer_id in self.layer_ids:
            block = blocks[layer_id]
            if isinstance(block.forward, _DroppingForward):
                raise ValueError(f"{key}: block {layer_id} already has random-LTD applied")
            block.forward = _DroppingForward(self, layer_id, block, block.forward)

    @property
    def random_ltd_layer_num(self) -> int:
        return len(self.layer_ids)

    def reseed(self, stream: int) -> None:
        """Give this process its own index stream: its data-parallel rank (model-parallel peers, which read the
        same data shard, must draw the same subsets)."""
        self.stream = int(stream)

    @contextlib.contextmanager
    def paused(self):
        """Forwards that are not training passes (a pipeline schedule's metadata inference runs each stage once
        on the first micro-batch's shapes) draw without advancing the counts, so they take no subset away
        from the real passes."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def update(self, step: int) -> int:
        """Set the kept length for the coming forward passes to ``L(step)``; returns it."""
        self.kept_length = self.scheduler.update(step)
        return self.kept_length

    def effective_length(self, seq_len: int) -> int:
        """Tokens a dropping layer processes for sequences of ``seq_len`` tokens."""
        return seq_len if self.kept_length is None else min(self.kept_length, seq_len)

    def layer_tokens(self, num_sequences: int, seq_len: int) -> int:
        """Layer-tokens of one pass over ``num_sequences`` x ``seq_len`` (DeepSpeed's accounting)."""
        kept = self.effective_length(seq_len)
        return num_sequences * (kept * self.random_ltd_layer_num + seq_len * (self.total_layer_num - self.random_ltd_layer_num))

    def account(self, num_sequences: int, seq_len: int) -> int:
        """Add one step's (or micro-batch's) consumed layer-tokens; returns the running total."""
        self.consumed_layer_tokens += self.layer_tokens(num_sequences, seq_len)
        self.consumed_tokens += num_sequences * seq_len
        return self.consumed_layer_tokens

    def sample_indices(self, batch: int, seq_len: int, kept: int, shared: bool, device, layer_id: int = 0) -> torch.Tensor:
        """Sorted kept positions [batch, kept] for ``layer_id``'s next draw (one row shared by all rows when ``shared``)."""
        rows = 1 if shared else batch
        draw = self.draws.get(layer_id, 0)
        self.generator.manual_seed(int(np.random.SeedSequence([self.seed, self.stream, layer_id, draw]).generate_state(1)[0]))
        if not self._paused:
            self.draws[layer_id] = draw + 1
        scores = torch.rand(rows, seq_len, generator=self.generator)
        idx = scores.argsort(dim=1)[:, :kept].sort(dim=1).values
        return idx.expand(batch, kept).to(device) if shared else idx.to(device)

    def dropped_forward(self, layer_id: int, forward: Callable, x: torch.Tensor, rope=None, *args,
                        kept: int, indices: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        """``forward`` over ``kept`` tokens of x [B, T, D]; the rest of x passes through unchanged."""
        bsz, seq_len, dim = x.shape
        if indices is None:
            indices = self.sample_indices(bsz, seq_len, kept, shared=rope is not None, device=x.device, layer_id=layer_id)
        self.last_indices[layer_id] = indices
        gather_idx = indices.unsqueeze(-1).expand(bsz, indices.shape[1], dim)
        kept_x = x.gather(1, gather_idx)
        if rope is not None:
            positions = indices[0]
            if not bool((indices == positions).all()):
                raise ValueError("random-LTD with rotary embeddings needs one index set shared by the batch rows")
            cos, sin = rope
            rope = (cos[positions], sin[positions])
        kept_y = forward(kept_x, rope, *args, **kwargs)
        return x.scatter(1, gather_idx, kept_y)

    def state_dict(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler.state_dict(), "kept_length": self.kept_length,
                "consumed_layer_tokens": self.consumed_layer_tokens, "consumed_tokens": self.consumed_tokens,
                "draws": dict(self.draws), "layer_ids": list(self.layer_ids)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if list(state.get("layer_ids", self.layer_ids)) != list(self.layer_ids):
            raise ValueError(f"random-LTD state mismatch: layer ids {list(state['layer_ids'])} in the checkpoint, "
                             f"{list(self.layer_ids)} configured")
        self.scheduler.load_state_dict(state["scheduler"])
        self.kept_length = state.get("kept_length")
        self.consumed_layer_tokens = int(state["consumed_layer_tokens"])
        self.consumed_tokens = int(state.get("consumed_tokens", 0))
        draws = state.get("draws", 0)
        if not isinstance(draws, Mapping):  # a checkpoint from before per-layer streams: one count for all layers
            draws = {layer_id: int(draws) // max(1, len(self.layer_ids)) for layer_id in self.layer_ids}
        self.draws = {int(layer_id): int(count) for layer_id, count in draws.items()}


def validate_layer_ids(layer_ids: Sequence[int] | None, n_layer: int, key: str = "random_ltd.random_ltd_layer_id") -> list[int]:
    """Checked, sorted layer ids; ``None`` = all middle layers. ValueError naming ``key`` otherwise."""
    if layer_ids is None:
        if n_layer < 3:
            raise ValueError(f"{key}=null: random-LTD drops tokens in the middle layers, but the model has only "
                             f"{n_layer} layer(s) (the first and last are never dropped); use n_layer >= 3")
        return list(range(1, n_layer - 1))
    ids = list(layer_ids)
    if not ids:
        raise ValueError(f"{key}=[]: list at least one layer (valid: 1..{n_layer - 2}), or null for all middle layers")
    for layer_id in ids:
        if not isinstance(layer_id, int) or isinstance(layer_id, bool) or not 0 <= layer_id < n_layer:
            raise ValueError(f"{key}={ids}: layer id {layer_id!r} is outside the model's {n_layer} layers "
                             f"(valid middle layers: 1..{n_layer - 2})")
        if layer_id in (0, n_layer - 1):
            raise ValueError(f"{key}={ids}: layer {layer_id} is the first or last layer, which random-LTD leaves "
                             f"untouched (valid: 1..{n_layer - 2})")
    if len(set(ids)) != len(ids):
        raise ValueError(f"{key}={ids}: duplicate layer ids")
    return sorted(ids)
