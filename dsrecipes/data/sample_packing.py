"""Samples (ids + target flags) into fixed-length training rows, three ways (data.packing).

Every row holds ``input_ids`` [T] and ``labels`` [T] (T = block_size; labels[t] is the token after input_ids[t],
or -100 where that token is not a target or is padding); ``documents`` rows also hold ``position_ids`` [T].
A sample of L tokens gives L - 1 (input, label) pairs: its own first token is predicted by nothing, so no label
ever crosses from one sample into the next, except under ``concat``.

* ``none``: one sample per row, cut to T + 1 tokens (data.overlong), padded at the end (input: the pad id; label:
  -100). Plain causal attention is exact: padding comes after every real token.
* ``documents``: whole samples packed into rows, first-fit by decreasing length within each map batch of 1000
  samples (deterministic); positions restart at 0 for each sample and the padding at a row's end is a document
  of its own. The model gives each document its own causal block from the restarts of position_ids (native:
  dsrecipes.models.document_attention; transformers: its packed-sequence masks read the same position_ids), so
  a packed row gives each sample exactly the logits it has alone.
* ``concat``: the samples' token stream cut into blocks of T + 1 overlapping by one token, as the text stream
  is (dsrecipes.data.packing.pack_batch), the target flags travelling with it; attention runs across samples.

Rows without a single label (a sample whose targets were all cut off) are dropped.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

IGNORE = -100
#: Bumped whenever a packing function here changes its output (part of datasets' cache fingerprint).
SAMPLE_PACKING_VERSION = 1


def _samples(batch: pa.Table, prefix: str = "") -> list[tuple[np.ndarray, np.ndarray]]:
    """Each sample's (ids, target flags) of the batch's `<prefix>ids` / `<prefix>targets` columns."""
    ids = batch.column(f"{prefix}ids").combine_chunks()
    targets = batch.column(f"{prefix}targets").combine_chunks()
    offsets = ids.offsets.to_numpy()
    flat_ids = ids.values.to_numpy(zero_copy_only=False).astype(np.int64)
    flat_targets = targets.values.to_numpy(zero_copy_only=False).astype(bool)
    return [(flat_ids[a:b], flat_targets[a:b]) for a, b in zip(offsets[:-1], offsets[1:])]


def _pairs(ids: np.ndarray, targets: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """A sample's (input ids, labels), cut to block_size pairs."""
    ids, targets = ids[:block_size + 1], targets[:block_size + 1]
    labels = np.where(targets[1:], ids[1:], IGNORE)
    return ids[:-1], labels


def _padded(row_in: np.ndarray, row_labels: np.ndarray, block_size: int, pad_id: int) -> tuple[np.ndarray, ...]:
    """A sample's (inputs, labels) padded at the end to block_size: inputs with pad_id, labels with IGNORE."""
    pad = block_size - len(row_in)
    return np.concatenate([row_in, np.full(pad, pad_id)]), np.concatenate([row_labels, np.full(pad, IGNORE)])


def stream_blocks(length: int, block_size: int) -> np.ndarray:
    """[blocks, block_size + 1] indices cutting a stream of `length` ids into blocks that overlap by one id (the
    incomplete tail left out)."""
    num_blocks = max(0, (length - 1) // block_size)
    return np.arange(num_blocks)[:, None] * block_size + np.arange(block_size + 1)[None, :]


def _table(columns: dict[str, list[np.ndarray]], block_size: int) -> pa.Table:
    out = {}
    for name, rows in columns.items():
        flat = np.concatenate(rows).astype(np.int32) if rows else np.zeros(0, dtype=np.int32)
        out[name] = pa.FixedSizeListArray.from_arrays(pa.array(flat, type=pa.int32()), block_size)
    return pa.table(out)


def pack_none(batch: pa.Table, block_size: int, pad_id: int, version: int = SAMPLE_PACKING_VERSION) -> pa.Table:
    """``Dataset.map`` function (arrow format): one padded row per sample (see the module docstring)."""
    del version
    inputs, labels = [], []
    for ids, targets in _samples(batch):
        row_in, row_labels = _pairs(ids, targets, block_size)
        if not (row_labels != IGNORE).any():
            continue
        padded_in, padded_labels = _padded(row_in, row_labels, block_size, pad_id)
        inputs.append(padded_in)
        labels.append(padded_labels)
    return _table({"input_ids": inputs, "labels": labels}, block_size)


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Bins of sample indices, each bin's lengths summing to at most capacity: samples by decreasing length
    (ties by index), each into the first bin it fits, bins in order of opening, samples in a bin by index."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    free: list[int] = []
    for i in order:
        for b, room in enumerate(free):
            if lengths[i] <= room:
                bins[b].append(i)
                free[b] -= lengths[i]
                break
        else:
            bins.append([i])
            free.append(capacity - lengths[i])
    return [sorted(b) for b in bins]


def pack_documents(batch: pa.Table, block_size: int, pad_id: int,
                   version: int = SAMPLE_PACKING_VERSION) -> pa.Table:
    """``Dataset.map`` function (arrow format): samples packed whole into rows with restarting positions."""
    del version
    pairs = [_pairs(ids, targets, block_size) for ids, targets in _samples(batch)]
    pairs = [(x, y) for x, y in pairs if len(x) and (y != IGNORE).any()]
    inputs, labels, positions = [], [], []
    for members in first_fit_decreasing([len(x) for x, _ in pairs], block_size):
        row_in = [pairs[i][0] for i in members]
        row_labels = [pairs[i][1] for i in members]
        row_pos = [np.arange(len(pairs[i][0])) for i in members]
        pad = block_size - sum(len(x) for x in row_in)
        if pad:
            row_in.append(np.full(pad, pad_id))
            row_labels.append(np.full(pad, IGNORE))
            row_pos.append(np.arange(pad))
        inputs.append(np.concatenate(row_in))
        labels.append(np.concatenate(row_labels))
        positions.append(np.concatenate(row_pos))
    return _table({"input_ids": inputs, "labels": labels, "position_ids": positions}, block_size)


def pack_pairs(batch: pa.Table, indices: list[int], block_size: int, pad_id: int,
               version: int = SAMPLE_PACKING_VERSION) -> pa.Table:
    """``Dataset.map`` function (arrow format, with indices) for preference pairs: each pair one row of
    chosen_input_ids / chosen_labels / rejected_input_ids / rejected_labels (padded as pack_none pads) and its
    index in the split (DPO's reference log-probs are looked up by it)."""
    del version
    columns: dict[str, list[np.ndarray]] = {name: [] for name in PAIR_COLUMNS}
    kept = []
    sides = {side: _samples(batch, f"{side}_") for side in ("chosen", "rejected")}
    for number, index in enumerate(indices):
        rows = {side: _pairs(*sides[side][number], block_size) for side in sides}
        if not all((labels != IGNORE).any() for _, labels in rows.values()):
            continue
        for side, (row_in, row_labels) in rows.items():
            padded_in, padded_labels = _padded(row_in, row_labels, block_size, pad_id)
            columns[f"{side}_input_ids"].append(padded_in)
            columns[f"{side}_labels"].append(padded_labels)
        kept.append(int(index))
    table = _table(columns, block_size)
    return table.append_column("index", pa.array(np.asarray(kept, dtype=np.int32), type=pa.int32()))


#: The columns of a preference row (pack_pairs), beside its "index".
PAIR_COLUMNS = ("chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels")


def pack_concat(batch: pa.Table, block_size: int, version: int = SAMPLE_PACKING_VERSION) -> pa.Table:
    """``Dataset.map`` function (arrow format): the batch's stream cut into overlapping blocks of block_size+1
    (the incomplete tail dropped), labels where the target token is flagged."""
    del version
    stream = pc.list_flatten(batch.column("ids")).to_numpy().astype(np.int64)
    flags = pc.list_flatten(batch.column("targets")).to_numpy().astype(bool)
    index = stream_blocks(len(stream), block_size)
    blocks, block_flags = stream[index], flags[index]
    keep = block_flags[:, 1:].any(axis=1)
    inputs = list(blocks[keep, :-1])
    labels = list(np.where(block_flags[keep, 1:], blocks[keep, 1:], IGNORE))
    return _table({"input_ids": inputs, "labels": labels}, block_size)


def overlong_samples(samples, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices of the samples longer than one row of block_size + 1 tokens, every sample's length); a preference
    pair's length is its longer side's."""
    table = samples.with_format("arrow")[:]
    columns = [c for c in ("ids", "chosen_ids", "rejected_ids") if c in table.column_names]
    lengths = np.max([pc.list_value_length(table.column(c)).to_numpy() for c in columns], axis=0)
    return np.flatnonzero(lengths > block_size + 1), lengths
