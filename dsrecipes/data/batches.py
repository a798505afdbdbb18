"""Deterministic, resumable micro-batches over packed blocks, sharded across data-parallel ranks.

No ``torch.utils.data.DataLoader``: the position in the data must be exact and
cheap to checkpoint. ``BatchIterator``'s whole state is (epoch, batch index in
the epoch) plus the settings that define the order, so a checkpoint restores
exactly the batch that would have come next, and every rank can share the same
state dict.

Order: epoch ``e`` visits a permutation of all block indices drawn from
``torch.Generator().manual_seed(seed + e)`` (identity without shuffling),
truncated to whole global batches of ``micro_batch_size * world_size``. Global
batch ``g`` is the slice ``[g*B*W, (g+1)*B*W)`` of that order, and rank ``r``
takes the contiguous part ``[r*B, (r+1)*B)`` of it, so the ranks together see
exactly the batch a single process with ``world_size=1`` and micro-batch ``B*W``
would see.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from dsrecipes.data.sample_packing import PAIR_COLUMNS

STATE_KEYS = ("epoch", "batch_in_epoch", "seed", "micro_batch_size", "world_size")


#: The columns of rows packed sample by sample (dsrecipes.data.sample_packing), in the order a batch holds them.
ROW_COLUMNS = ("input_ids", "labels", "position_ids")
#: The columns of preference rows (dsrecipes.data.sample_packing.pack_pairs).
PAIR_ROW_COLUMNS = (*PAIR_COLUMNS, "index")


def row_columns(dataset) -> list[str]:
    """The columns a batch is gathered from: ["tokens"] (a text stream), or input_ids, labels and (packing=documents)
    position_ids; ValueError when the dataset has neither."""
    names = dataset.column_names
    if "tokens" in names:
        return ["tokens"]
    if "input_ids" in names and "labels" in names:
        return [c for c in ROW_COLUMNS if c in names]
    if all(c in names for c in PAIR_ROW_COLUMNS):
        return list(PAIR_ROW_COLUMNS)
    raise ValueError(f"dataset has neither a 'tokens' column nor 'input_ids' and 'labels' (columns: {', '.join(names)})")


def _check_tokens_column(dataset) -> None:
    """Raise ValueError unless ``dataset`` holds packed rows (see row_columns)."""
    row_columns(dataset)


def _check_rank(rank: int, world_size: int, micro_batch_size: int) -> None:
    """Validate the sharding arguments."""
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size={micro_batch_size} must be >= 1")
    if world_size < 1:
        raise ValueError(f"world_size={world_size} must be >= 1")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must lie in [0, world_size={world_size})")


def gather_batch(rows, indices) -> dict[str, torch.Tensor]:
    """Gather packed rows ``indices`` (a slice or index sequence) of a numpy-formatted dataset.

    Returns input_ids/labels (and position_ids, for rows packed with packing=documents) LongTensors of shape
    [len(indices), block_size]; a "tokens" block of block_size+1 ids gives input_ids = block[:-1] and
    labels = block[1:].
    """
    key = indices if isinstance(indices, slice) else [int(i) for i in indices]
    picked = rows[key]
    if "tokens" in picked:
        block = _stacked(picked["tokens"])
        return {"input_ids": block[:, :-1].contiguous(), "labels": block[:, 1:].contiguous()}
    return {name: _stacked(picked[name]) for name in (*ROW_COLUMNS, *PAIR_ROW_COLUMNS) if name in picked}


def _stacked(column) -> torch.Tensor:
    if column.dtype == object:  # variable-length lists come back as an object array
        column = np.stack(column)
    return torch.from_numpy(np.ascontiguousarray(column, dtype=np.int64))


class BatchIterator:
    """Infinite, deterministic, resumable iterator of micro-batches for one data-parallel rank.

    Yields ``{"input_ids": LongTensor[B, T], "labels": LongTensor[B, T]}`` where
    each packed block of ``T + 1`` ids gives ``input_ids = block[:-1]`` and
    ``labels = block[1:]``. Epochs roll over automatically; the tail of each
    epoch's permutation that does not fill a global batch is dropped.
    """

    def __init__(self, dataset, micro_batch_size: int, *, seed: int, rank: int = 0, world_size: int = 1,
                 shuffle: bool = True):
        _check_tokens_column(dataset)
        _check_rank(rank, world_size, micro_batch_size)
        global_batch = micro_batch_size * world_size
        if len(dataset) < global_batch:
            raise ValueError(
                f"dataset has {len(dataset)} blocks, fewer than one global batch of "
                f"micro_batch_size*world_size = {micro_batch_size}*{world_size} = {global_batch}"
            )
        self.dataset = dataset
        self.micro_batch_size = int(micro_batch_size)
        self.seed = int(seed)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.shuffle = bool(shuffle)
        self._rows = dataset.with_format("numpy", columns=row_columns(dataset))
        self._epoch = 0
        self._batch_in_epoch = 0
        self._order_epoch: int | None = None
        self._order: torch.Tensor | None = None

    @property
    def epoch(self) -> int:
        """Epoch of the next batch (after the last batch of epoch e it already reads e + 1)."""
        return self._epoch

    @property
    def batch_in_epoch(self) -> int:
        """Index, within its epoch, of the next global batch."""
        return self._batch_in_epoch

    @property
    def batches_per_epoch(self) -> int:
        """Global batches per epoch (the same on every rank)."""
        return len(self.dataset) // (self.micro_batch_size * self.world_size)

    def _epoch_order(self, epoch: int) -> torch.Tensor:
        """Block indices of ``epoch`` in visiting order (cached for the current epoch)."""
        if self._order_epoch != epoch:
            n = len(self.dataset)
            if self.shuffle:
                generator = torch.Generator().manual_seed(self.seed + epoch)
                self._order = torch.randperm(n, generator=generator)
            else:
                self._order = torch.arange(n)
            self._order_epoch = epoch
        return self._order

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        order = self._epoch_order(self._epoch)
        start = (self._batch_in_epoch * self.world_size + self.rank) * self.micro_batch_size
        batch = gather_batch(self._rows, order[start:start + self.micro_batch_size])
        self._batch_in_epoch += 1
        if self._batch_in_epoch >= self.batches_per_epoch:
            self._epoch += 1
            self._batch_in_epoch = 0
        return batch

    def state_dict(self) -> dict[str, int]:
        """The position (next batch) and the settings that define the order; the same on every rank."""
        return {
            "epoch": self._epoch,
            "batch_in_epoch": self._batch_in_epoch,
            "seed": self.seed,
            "micro_batch_size": self.micro_batch_size,
            "world_size": self.world_size,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume at ``state``'s position; raise ValueError naming the key if it does not fit this iterator."""
        for key in STATE_KEYS:
            if key not in state:
                raise ValueError(f"batch iterator state has no {key!r} entry")
        if int(state["seed"]) != self.seed:
            raise ValueError(f"batch iterator state mismatch: seed={int(state['seed'])} in the state, "
                             f"{self.seed} in this iterator")
        # The position counts global batches, so it carries over to another world size as long as the
        # global batch (micro_batch_size x world_size) is the same.
        saved_global = int(state["micro_batch_size"]) * int(state["world_size"])
        if saved_global != self.micro_batch_size * self.world_size:
            raise ValueError(
                "batch iterator state mismatch: micro_batch_size x world_size = "
                f"{state['micro_batch_size']} x {state['world_size']} = {saved_global} in the state, "
                f"{self.micro_batch_size} x {self.world_size} = {self.micro_batch_size * self.world_size} in this iterator"
            )
        epoch, batch_in_epoch = int(state["epoch"]), int(state["batch_in_epoch"])
        if epoch < 0:
            raise ValueError(f"batch iterator state: epoch={epoch} must be >= 0")
        if not 0 <= batch_in_epoch < self.batches_per_epoch:
            raise ValueError(
                f"batch iterator state: batch_in_epoch={batch_in_epoch} is outside [0, {self.batches_per_epoch}) "
                "for this dataset (did the data change?)"
            )
        self._epoch, self._batch_in_epoch = epoch, batch_in_epoch

    def __repr__(self) -> str:
        return (
            f"BatchIterator(blocks={len(self.dataset)}, micro_batch_size={self.micro_batch_size}, "
            f"rank={self.rank}/{self.world_size}, seed={self.seed}, shuffle={self.shuffle}, "
            f"epoch={self._epoch}, batch_in_epoch={self._batch_in_epoch})"
        )


def eval_batches(dataset, micro_batch_size: int, max_batches: int | None = None, rank: int = 0,
                 world_size: int = 1) -> Iterator[dict[str, torch.Tensor]]:
    """Sequential, unshuffled validation micro-batches for ``rank``, the last partial batch included.

    Global batch ``g`` covers blocks ``[g*B*W, (g+1)*B*W)`` (clipped to the
    dataset) and this rank takes ``[r*B, (r+1)*B)`` of it; a rank whose slice of
    the final global batch is empty yields nothing for it. ``max_batches``
    limits the number of global batches, so all ranks stop together.
    """
    _check_tokens_column(dataset)
    _check_rank(rank, world_size, micro_batch_size)
    rows = dataset.with_format("numpy", columns=row_columns(dataset))
    n = len(dataset)
    global_batch = micro_batch_size * world_size
    num_global = -(-n // global_batch)
    if max_batches is not None:
        num_global = min(num_global, max(0, int(max_batches)))
    for g in range(num_global):
        start = g * global_batch + rank * micro_batch_size
        stop = min(n, start + micro_batch_size)
        if start < stop:
            yield gather_batch(rows, slice(start, stop))
