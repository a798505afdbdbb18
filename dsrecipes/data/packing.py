"""From documents to fixed-length training blocks: split, tokenize, pack (all cached by datasets).

``prepare_data`` is the package's entry point:

1. load the documents (``sources.load_documents``);
2. split them deterministically into train/validation *at the document level*
   (no document contributes to both);
3. tokenize each split (appending the tokenizer's eos id after every document
   when it has one);
4. pack the token stream into blocks of ``block_size + 1`` ids: the model reads
   ``block[:-1]`` and predicts ``block[1:]``. Consecutive blocks overlap by one
   token, so every token after the first is a target exactly once.

Steps 3 and 4 are ``Dataset.map`` calls with top-level functions and picklable
``fn_kwargs``, so datasets' fingerprinting makes a second run with the same
config load the packed result from its cache instead of recomputing it.
Tokenizing runs on ``num_proc`` workers; packing (cheap numpy slicing) always
runs in one process, in map batches of 1000 documents, so the blocks do not
depend on ``num_proc``. That matters because datasets 5 reuses a map cache
written with a different ``num_proc`` (the fingerprint ignores it). The
trailing partial block of each 1000-document batch is dropped, which keeps
packing a cacheable map at the price of at most ``block_size`` tokens per batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dsrecipes.data.cache import cache_file_names, map_with_reuse
from dsrecipes.data.config import uses_samples, validate_data_config
from dsrecipes.data.sample_packing import stream_blocks
from dsrecipes.data.samples import list_array
from dsrecipes.data.sources import load_documents
from dsrecipes.data.tokenizers import build_tokenizer

#: Bumped whenever tokenize_batch/pack_batch change their output. datasets hashes
#: importable functions by reference (module + name), not by their code, so this
#: number (passed in fn_kwargs) is what invalidates caches written by older code.
PACKING_VERSION = 1


@dataclass
class PreparedData:
    """Packed train/validation datasets and their facts.

    Rows are either "tokens" (block_size+1 ids: format=text, packing=concat) or "input_ids" / "labels" (and, for
    packing=documents, "position_ids") of block_size each (dsrecipes.data.sample_data).

    Attributes:
        train: packed training blocks.
        validation: packed validation blocks.
        tokenizer: the tokenizer used (``ByteTokenizer`` or ``HFTokenizerFile``).
        num_documents: documents in the corpus (both splits).
        num_train_tokens: training targets (labels), ``len(train) * block_size`` for a text stream.
        num_val_tokens: validation targets.
        cache_files: the Arrow cache files backing ``train``.
        from_cache: True when both packed splits were loaded from an existing cache.
    """

    train: datasets.Dataset
    validation: datasets.Dataset
    tokenizer: Any
    num_documents: int
    num_train_tokens: int
    num_val_tokens: int
    cache_files: list[str]
    from_cache: bool

    @property
    def vocab_size(self) -> int:
        """The tokenizer's vocabulary size."""
        return int(self.tokenizer.vocab_size)


def tokenize_batch(batch: dict, tokenizer, add_eos: bool, version: int = PACKING_VERSION) -> pa.Table:
    """``Dataset.map`` function: encode each document of ``batch["text"]`` into an int32 "ids" list."""
    del version  # only part of the cache fingerprint
    eos = [int(tokenizer.eos_id)] if add_eos else []
    encoded = tokenizer.encode_batch([text or "" for text in batch["text"]])
    return pa.table({"ids": list_array([list(ids) + eos for ids in encoded], np.int32)})


def pack_batch(batch: pa.Table, block_size: int, version: int = PACKING_VERSION) -> pa.Table:
    """``Dataset.map`` function (arrow format): cut the batch's token stream into blocks of block_size+1.

    Block ``k`` is ``stream[k*block_size : k*block_size + block_size + 1]``; the
    incomplete tail of the batch is dropped.
    """
    del version  # only part of the cache fingerprint
    stream = pc.list_flatten(batch.column("ids")).to_numpy().astype(np.int32, copy=False)
    blocks = pa.array(stream[stream_blocks(len(stream), block_size)].reshape(-1), type=pa.int32())
    return pa.table({"tokens": pa.FixedSizeListArray.from_arrays(blocks, block_size + 1)})


def split_documents(
    docs: datasets.Dataset, val_fraction: float, seed: int
) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Deterministic document-level train/validation split (at least one document on each side)."""
    n = len(docs)
    if n < 2:
        raise ValueError(
            f"corpus too small: {n} document(s); a train/validation split needs at least 2 documents "
            "(add data or raise data.max_bytes)"
        )
    n_val = max(1, min(n - 1, int(round(val_fraction * n))))
    parts = docs.train_test_split(test_size=n_val, seed=seed, shuffle=True)
    return parts["train"], parts["test"]


def count_tokens(tokenized: datasets.Dataset) -> int:
    """Total number of ids in a tokenized dataset's "ids" column."""
    column = tokenized.with_format("arrow")[:].column("ids")
    total = pc.sum(pc.list_value_length(column)).as_py()
    return int(total or 0)


def tokenize_and_pack(
    docs: datasets.Dataset,
    split_name: str,
    tokenizer,
    block_size: int,
    num_proc: int | None = None,
) -> tuple[datasets.Dataset, bool]:
    """Tokenize (on ``num_proc`` workers) and pack one split.

    Returns (packed dataset, whether the packed result came from an existing cache).
    """
    procs = None if num_proc is None or num_proc <= 1 else min(num_proc, max(1, len(docs)))
    tokenized, _ = map_with_reuse(
        docs,
        tokenize_batch,
        batched=True,
        remove_columns=docs.column_names,
        fn_kwargs={"tokenizer": tokenizer, "add_eos": tokenizer.eos_id is not None, "version": PACKING_VERSION},
        features=datasets.Features({"ids": datasets.List(datasets.Value("int32"))}),
        num_proc=procs,
        desc=f"Tokenizing {split_name}",
    )
    packed, reused = map_with_reuse(
        tokenized.with_format("arrow"),
        pack_batch,
        batched=True,
        remove_columns=["ids"],
        fn_kwargs={"block_size": block_size, "version": PACKING_VERSION},
        features=datasets.Features({"tokens": datasets.List(datasets.Value("int32"), length=block_size + 1)}),
        desc=f"Packing {split_name} into blocks of {block_size + 1}",
    )
    packed = packed.with_format(None)
    if len(packed) == 0:
        hint = "raise data.val_fraction" if split_name == "validation" else "lower data.val_fraction"
        raise ValueError(
            f"corpus too small: {count_tokens(tokenized)} tokens in {split_name}, need at least "
            f"block_size+1 = {block_size + 1}; lower data.block_size or {hint}, or add data"
        )
    return packed, reused


def prepare_data(cfg, status: Callable[[str], None] | None = None) -> PreparedData:
    """Load, split, tokenize and pack the corpus described by ``cfg`` (a DataConfig).

    Args:
        cfg: the data config (validated first).
        status: optional callback receiving one-line progress messages per phase.

    Raises:
        ValueError: invalid config, or a corpus too small for one block per split.
    """
    say = status or (lambda message: None)
    validate_data_config(cfg)
    tokenizer = build_tokenizer(cfg.tokenizer)
    if uses_samples(cfg):  # prompt/completion or chat data, or packing other than a text stream
        from dsrecipes.data.sample_data import prepare_samples

        return prepare_samples(cfg, tokenizer, say)
    say(f"Loading documents (source={cfg.source})")
    docs = load_documents(cfg)
    say(f"Splitting {len(docs)} documents (val_fraction={cfg.val_fraction}, seed={cfg.split_seed})")
    train_docs, val_docs = split_documents(docs, cfg.val_fraction, cfg.split_seed)
    say(f"Tokenizing and packing {len(train_docs)} train documents (block_size={cfg.block_size})")
    train, train_cached = tokenize_and_pack(train_docs, "train", tokenizer, cfg.block_size, cfg.num_proc)
    say(f"Tokenizing and packing {len(val_docs)} validation documents")
    validation, val_cached = tokenize_and_pack(val_docs, "validation", tokenizer, cfg.block_size, cfg.num_proc)
    prepared = PreparedData(
        train=train,
        validation=validation,
        tokenizer=tokenizer,
        num_documents=len(docs),
        num_train_tokens=len(train) * cfg.block_size,
        num_val_tokens=len(validation) * cfg.block_size,
        cache_files=cache_file_names(train),
        from_cache=train_cached and val_cached,
    )
    origin = "loaded from cache" if prepared.from_cache else "computed"
    say(
        f"Data ready ({origin}): {len(train)} train blocks ({prepared.num_train_tokens} tokens), "
        f"{len(validation)} validation blocks ({prepared.num_val_tokens} tokens)"
    )
    return prepared
