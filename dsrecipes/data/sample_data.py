"""prepare_data's path for instruction data and document packing: rows -> samples -> packed rows (cached).

Taken when data.format is prompt_completion or chat, or data.packing is none or documents
(dsrecipes.data.config.uses_samples); format=text with packing=concat keeps the token-stream path of
dsrecipes.data.packing. Steps:

1. load the rows with the columns the format reads (dsrecipes.data.sources.load_rows);
2. encode every row into ids + target flags (dsrecipes.data.samples; a bad row stops here with one line naming
   its index in the source), on data.num_proc workers;
3. split the samples deterministically into train/validation (whole samples, data.val_fraction);
4. refuse or count the samples longer than a row (data.overlong), then pack each split (dsrecipes.data.sample_packing).

Every step is a `Dataset.map` with top-level functions and picklable arguments, so a second run with the same
config reads the packed rows from datasets' cache.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import datasets
import numpy as np
import pyarrow.compute as pc

from dsrecipes.data.cache import cache_file_names, map_with_reuse
from dsrecipes.data.chat_templates import ChatTemplate, resolve_chat_template
from dsrecipes.data.config import resolved_train_on
from dsrecipes.data.sample_packing import (
    PAIR_COLUMNS,
    SAMPLE_PACKING_VERSION,
    overlong_samples,
    pack_concat,
    pack_documents,
    pack_none,
    pack_pairs,
)
from dsrecipes.data.samples import SAMPLES_VERSION, encode_batch, encode_pair_batch, sample_spec
from dsrecipes.data.sources import load_rows

log = logging.getLogger("dsrecipes")


def pad_id_of(tokenizer) -> int:
    """The id that fills padding (never a label): the tokenizer's end-of-sequence id, else 0."""
    eos = tokenizer.eos_id
    return int(eos) if eos is not None else 0


def encode_rows(rows: datasets.Dataset, cfg, tokenizer, num_proc: int | None = None,
                template: ChatTemplate | None = None) -> datasets.Dataset:
    """Every row encoded into "ids" and "targets" (step 2); template: format=chat's (resolve_chat_template)."""
    spec = sample_spec(cfg, resolved_train_on(cfg), template)
    procs = None if num_proc is None or num_proc <= 1 else min(num_proc, max(1, len(rows)))
    sides = ("chosen_", "rejected_") if cfg.format == "preference" else ("",)
    features = datasets.Features({f"{side}{name}": datasets.List(datasets.Value(dtype)) for side in sides
                                  for name, dtype in (("ids", "int32"), ("targets", "int8"))})
    function = encode_pair_batch if cfg.format == "preference" else encode_batch
    encoded, _ = map_with_reuse(rows, function, batched=True, with_indices=True, remove_columns=rows.column_names,
                                fn_kwargs={"spec": spec, "tokenizer": tokenizer, "eos_id": tokenizer.eos_id,
                                           "version": SAMPLES_VERSION},
                                features=features, num_proc=procs, desc=f"Encoding {cfg.format} samples")
    return encoded


def check_overlong(samples: datasets.Dataset, cfg, split_name: str) -> int:
    """How many samples are longer than a row; ValueError naming the first under data.overlong=refuse."""
    if cfg.packing == "concat":
        return 0
    long, lengths = overlong_samples(samples, cfg.block_size)
    if len(long) and cfg.overlong == "refuse":
        length = int(lengths[long[0]])
        raise ValueError(f"data: {len(long)} {split_name} sample(s) are longer than a row of block_size + 1 = "
                         f"{cfg.block_size + 1} tokens (the first: {length} tokens) and data.overlong=refuse; raise "
                         "data.block_size, or data.overlong=truncate cuts them")
    return len(long)


def pack_split(samples: datasets.Dataset, cfg, tokenizer, split_name: str) -> tuple[datasets.Dataset, bool]:
    """One split packed into rows (step 4); returns (rows, whether they came from datasets' cache)."""
    packing, block = str(cfg.packing), int(cfg.block_size)
    pairs = cfg.format == "preference"
    function = pack_pairs if pairs else {"none": pack_none, "documents": pack_documents, "concat": pack_concat}[packing]
    kwargs = {"block_size": block, "version": SAMPLE_PACKING_VERSION}
    names = list(PAIR_COLUMNS) if pairs else ["input_ids", "labels"]
    if packing != "concat":
        kwargs["pad_id"] = pad_id_of(tokenizer)
    if packing == "documents":
        names.append("position_ids")
    features = {name: datasets.List(datasets.Value("int32"), length=block) for name in names}
    if pairs:
        features["index"] = datasets.Value("int32")
    packed, reused = map_with_reuse(samples.with_format("arrow"), function, batched=True, with_indices=pairs,
                                    remove_columns=samples.column_names, fn_kwargs=kwargs,
                                    features=datasets.Features(features),
                                    desc=f"Packing {split_name} ({packing}) into rows of {block}")
    packed = packed.with_format(None)
    if len(packed) == 0:
        raise ValueError(f"data: no {split_name} row holds a label ({len(samples)} samples, packing={packing}, "
                         f"block_size={block}); add data, raise data.block_size or data.val_fraction")
    return packed, reused


def label_count(rows: datasets.Dataset) -> int:
    """Tokens that carry a label in a packed split."""
    table = rows.with_format("arrow")[:]
    columns = [c for c in ("labels", "chosen_labels", "rejected_labels") if c in table.column_names]
    return sum(int(np.count_nonzero(pc.list_flatten(table.column(c)).to_numpy() != -100)) for c in columns)


def prepare_samples(cfg, tokenizer, say: Callable[[str], None]):
    """Steps 1-4 of the module docstring; returns dsrecipes.data.packing.PreparedData."""
    from dsrecipes.data.packing import PreparedData, split_documents

    say(f"Loading {cfg.format} rows (source={cfg.source})")
    rows = load_rows(cfg)
    template = resolve_chat_template(cfg) if cfg.format == "chat" else None
    say(f"Encoding {len(rows)} {cfg.format} rows (train_on={resolved_train_on(cfg)}"
        + (f", chat template: {template.source})" if template is not None else ")"))
    samples = encode_rows(rows, cfg, tokenizer, cfg.num_proc, template)
    train_samples, val_samples = split_documents(samples, cfg.val_fraction, cfg.split_seed)
    splits, reused = {}, True
    for name, split in (("train", train_samples), ("validation", val_samples)):
        cut = check_overlong(split, cfg, name)
        if cut:
            log.warning("data: %d of %d %s samples are longer than a row of block_size + 1 = %d tokens and are "
                        "truncated (data.overlong=truncate; =refuse stops instead)", cut, len(split), name,
                        cfg.block_size + 1)
        splits[name], cached = pack_split(split, cfg, tokenizer, name)
        reused = reused and cached
    train, validation = splits["train"], splits["validation"]
    prepared = PreparedData(train=train, validation=validation, tokenizer=tokenizer, num_documents=len(rows),
                            num_train_tokens=label_count(train), num_val_tokens=label_count(validation),
                            cache_files=cache_file_names(train), from_cache=reused)
    fill = prepared.num_train_tokens / max(1, len(train) * cfg.block_size)
    say(f"Data ready ({'loaded from cache' if reused else 'computed'}): {len(train)} train rows "
        f"({prepared.num_train_tokens} label tokens, {fill:.0%} of the row tokens), {len(validation)} validation "
        f"rows ({prepared.num_val_tokens} label tokens); packing={cfg.packing}")
    return prepared
