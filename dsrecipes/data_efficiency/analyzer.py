"""Offline data analysis: per-sample difficulty metrics and the index files a metric curriculum samples from.

DeepSpeed's ``DataAnalyzer`` computes, for every sample, a difficulty metric and writes an
``index_to_metric`` file (metric of sample i) and an ``index_to_sample`` file (sample ids in order of
difficulty). This does the same over a Hugging Face ``datasets.Dataset`` with ``Dataset.map`` (parallel
with ``num_proc``, cached by datasets' fingerprint, with its progress bar):

    from dsrecipes.data_efficiency import DataAnalyzer, load_metric_index
    indexes = DataAnalyzer(prepared.train, metrics=["seqlen", "vocab_rarity"]).run()
    indexes["vocab_rarity"].values            # float per sample
    load_metric_index(indexes["vocab_rarity"].directory, "vocab_rarity")   # read back from disk

Built-in metrics (over a column of token ids, ``tokens`` by default):

* ``seqlen``: number of tokens, ignoring ``pad_id`` if one is given.
* ``vocab_rarity``: mean of ``-log p(token)`` over the sample, p the unigram frequency over the whole
  dataset (DeepSpeed's vocabulary-rarity metric, averaged so it does not grow with length): samples made of
  common tokens are easy.

Any other metric is a function ``fn(tokens: np.ndarray) -> float``. Files, in ``output_dir`` (default: a
``data_analysis`` folder next to the dataset's arrow cache files):
``<metric>_index_to_metric.npy``, ``<metric>_index_to_sample.npy`` and ``<metric>.json`` (count, min, max,
mean, the dataset fingerprint).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["BUILTIN_METRICS", "DataAnalyzer", "MetricIndex", "load_metric_index", "token_counts"]

BUILTIN_METRICS = ("seqlen", "vocab_rarity")
ANALYSIS_DIRNAME = "data_analysis"


@dataclass
class MetricIndex:
    """One metric over a dataset: ``values[i]`` for sample i, ``order`` = sample ids by increasing value."""

    name: str
    values: np.ndarray
    order: np.ndarray
    directory: Path | None = None

    def __len__(self) -> int:
        return len(self.values)


def _seqlen_batch(batch: Mapping[str, Any], column: str, pad_id: int | None) -> dict:
    rows = batch[column]
    if pad_id is None:
        return {"_metric": [len(r) for r in rows]}
    return {"_metric": [int(np.count_nonzero(np.asarray(r) != pad_id)) for r in rows]}


def _rarity_batch(batch: Mapping[str, Any], column: str, neg_log_prob: np.ndarray) -> dict:
    return {"_metric": [float(neg_log_prob[np.asarray(r, dtype=np.int64)].mean()) if len(r) else 0.0
                        for r in batch[column]]}


def _user_batch(batch: Mapping[str, Any], column: str, fn: Callable) -> dict:
    return {"_metric": [float(fn(np.asarray(r))) for r in batch[column]]}


def token_counts(dataset, column: str = "tokens", chunk: int = 4096) -> np.ndarray:
    """Occurrences of every token id over the dataset (np.int64 array of length max id + 1)."""
    rows = dataset.with_format("numpy", columns=[column])
    counts = np.zeros(0, dtype=np.int64)
    for start in range(0, len(dataset), chunk):
        part = rows[start:start + chunk][column]
        flat = np.concatenate([np.asarray(r).ravel() for r in part]) if part.dtype == object else np.asarray(part).ravel()
        if flat.size == 0:
            continue
        new = np.bincount(flat.astype(np.int64))
        if len(new) > len(counts):
            counts = np.pad(counts, (0, len(new) - len(counts)))
        counts[:len(new)] += new
    return counts


def _default_output_dir(dataset) -> Path:
    files = getattr(dataset, "cache_files", None) or []
    if not files:
        raise ValueError("output_dir=None: the dataset is in memory (no cache files to write next to); "
                         "pass output_dir= for the index files")
    return Path(files[0]["filename"]).parent / ANALYSIS_DIRNAME


class DataAnalyzer:
    """Compute metrics over ``dataset`` and write their index files.

    metrics: names of built-in metrics and/or a mapping ``name -> fn(tokens) -> float`` (a built-in name in
    the mapping may map to None).
    """

    def __init__(self, dataset, metrics: Sequence[str] | Mapping[str, Callable | None], *,
                 output_dir: str | os.PathLike | None = None, column: str = "tokens", num_proc: int | None = None,
                 batch_size: int = 1000, pad_id: int | None = None):
        if column not in dataset.column_names:
            raise ValueError(f"column={column!r} is not a column of the dataset (columns: {dataset.column_names})")
        metric_fns = dict(metrics) if isinstance(metrics, Mapping) else {name: None for name in metrics}
        if not metric_fns:
            raise ValueError(f"metrics=[]: name at least one metric (built-in: {list(BUILTIN_METRICS)}) or pass "
                             "{name: fn(tokens) -> float}")
        for name, fn in metric_fns.items():
            if fn is None and name not in BUILTIN_METRICS:
                raise ValueError(f"metric {name!r} is not built in (built-in: {list(BUILTIN_METRICS)}); pass "
                                 f"metrics={{{name!r}: fn}} with fn(tokens) -> float")
            if fn is not None and not callable(fn):
                raise ValueError(f"metric {name!r}: {fn!r} is not callable")
        if num_proc is not None and num_proc < 1:
            raise ValueError(f"num_proc={num_proc} must be >= 1 or None")
        self.dataset = dataset
        self.metric_fns = metric_fns
        self.column = column
        self.num_proc = num_proc
        self.batch_size = batch_size
        self.pad_id = pad_id
        self.output_dir = Path(output_dir) if output_dir is not None else _default_output_dir(dataset)

    def _map_kwargs(self, name: str) -> tuple[Callable, dict]:
        fn = self.metric_fns[name]
        if fn is not None:
            return _user_batch, {"column": self.column, "fn": fn}
        if name == "seqlen":
            return _seqlen_batch, {"column": self.column, "pad_id": self.pad_id}
        counts = token_counts(self.dataset, self.column).astype(np.float64)
        neg_log_prob = -np.log(np.maximum(counts, 1.0) / max(counts.sum(), 1.0))
        return _rarity_batch, {"column": self.column, "neg_log_prob": neg_log_prob}

    def compute(self, name: str) -> np.ndarray:
        """The metric of every sample (datasets.map: batched, parallel with num_proc, cached, with progress)."""
        fn, kwargs = self._map_kwargs(name)
        mapped = self.dataset.map(fn, batched=True, batch_size=self.batch_size, fn_kwargs=kwargs,
                                  num_proc=self.num_proc, remove_columns=self.dataset.column_names,
                                  desc=f"data analysis: {name}")
        return np.asarray(mapped["_metric"])

    def run(self) -> dict[str, MetricIndex]:
        """Compute every metric and write its index files; returns them by name."""
        self.output_dir.mkdir(parents=True, exist_ok=True)
        out = {}
        for name in self.metric_fns:
            values = self.compute(name)
            order = np.argsort(values, kind="stable")
            index = MetricIndex(name, values, order, self.output_dir)
            np.save(self.output_dir / f"{name}_index_to_metric.npy", values)
            np.save(self.output_dir / f"{name}_index_to_sample.npy", order)
            summary = {"metric": name, "num_samples": int(len(values)),
                       "min": float(values.min()) if len(values) else None,
                       "max": float(values.max()) if len(values) else None,
                       "mean": float(values.mean()) if len(values) else None,
                       "dataset_fingerprint": getattr(self.dataset, "_fingerprint", None)}
            (self.output_dir / f"{name}.json").write_text(json.dumps(summary, indent=2))
            out[name] = index
        return out


def load_metric_index(directory: str | os.PathLike, name: str) -> MetricIndex:
    """Read back the index files `DataAnalyzer.run` wrote for metric ``name``."""
    directory = Path(directory)
    paths = [directory / f"{name}_index_to_metric.npy", directory / f"{name}_index_to_sample.npy"]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ValueError(f"metric {name!r}: index file(s) {missing} not found; run DataAnalyzer first")
    values, order = np.load(paths[0]), np.load(paths[1])
    if len(values) != len(order):
        raise ValueError(f"metric {name!r}: {paths[0].name} has {len(values)} entries but {paths[1].name} {len(order)}")
    return MetricIndex(name, values, order, directory)
