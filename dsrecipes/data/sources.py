"""Load the raw documents of a corpus as a ``datasets.Dataset`` with one ``"text"`` column.

Three sources, all read through Hugging Face datasets so that the loaded corpus
lands in datasets' Arrow cache (and every later step can be cached on top of it):

* ``builtin``: the Python standard library's own top-level ``*.py`` files, one
  document per file, read with the packaged ``"text"`` builder. It exists
  wherever Python is installed, so recipes run offline with no download.
* ``files``: local text (``.txt/.md/.py``), JSON lines/JSON or Parquet files.
* ``hub``: ``datasets.load_dataset(name, config, split=...)`` (needs network).

Nothing is downloaded for ``builtin`` or ``files``: only packaged builders are used.
"""

from __future__ import annotations

import glob
import os
import sysconfig
from collections.abc import Sequence

import datasets
import numpy as np
import pyarrow.compute as pc

from dsrecipes.data.config import JSON_SUFFIXES, PARQUET_SUFFIXES, SUPPORTED_SUFFIXES, TEXT_SUFFIXES


def builtin_files() -> list[str]:
    """Return the standard library's top-level ``*.py`` files, sorted by name."""
    stdlib = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(stdlib, "*.py")), key=os.path.basename)
    if not files:
        raise RuntimeError(f"no *.py files found in the standard library directory {stdlib!r}")
    return files


def file_kind(path: str) -> str:
    """Map a file's suffix to the packaged datasets builder that reads it ("text", "json", "parquet")."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix in TEXT_SUFFIXES:
        return "text"
    if suffix in JSON_SUFFIXES:
        return "json"
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    raise ValueError(
        f"data.paths: {path!r} has an unsupported suffix {suffix!r}; supported: {', '.join(SUPPORTED_SUFFIXES)}"
    )


def expand_paths(paths: Sequence[str]) -> list[str]:
    """Expand files and directories (recursively, supported suffixes only, sorted) into a file list."""
    files: list[str] = []
    for path in paths:
        path = str(path)
        if os.path.isdir(path):
            found = []
            for root, dirs, names in os.walk(path):
                dirs.sort()
                found.extend(
                    os.path.join(root, n) for n in names if os.path.splitext(n)[1].lower() in SUPPORTED_SUFFIXES
                )
            if not found:
                raise ValueError(
                    f"data.paths: directory {path!r} holds no files with a supported suffix "
                    f"({', '.join(SUPPORTED_SUFFIXES)})"
                )
            files.extend(sorted(found))
        elif os.path.isfile(path):
            file_kind(path)  # raises on an unsupported suffix
            files.append(path)
        else:
            raise ValueError(f"data.paths: {path!r} does not exist")
    return files


def common_kind(files: Sequence[str]) -> str:
    """Return the single builder kind shared by ``files``; raise ValueError listing them if they mix kinds."""
    by_kind: dict[str, list[str]] = {}
    for f in files:
        by_kind.setdefault(file_kind(f), []).append(f)
    if len(by_kind) != 1:
        listing = "; ".join(f"{kind}: {', '.join(fs)}" for kind, fs in sorted(by_kind.items()))
        raise ValueError(f"data.paths mixes file kinds ({listing}); all files of one run must share one kind")
    return next(iter(by_kind))


def cap_files_by_size(files: Sequence[str], max_bytes) -> list[str]:
    """Take ``files`` in order while their cumulative on-disk size fits ``max_bytes`` (at least one)."""
    if max_bytes is None:
        return list(files)
    taken, total = [], 0
    for f in files:
        size = os.path.getsize(f)
        if taken and total + size > max_bytes:
            break
        taken.append(f)
        total += size
    return taken


def cap_rows_by_bytes(ds: datasets.Dataset, max_bytes) -> datasets.Dataset:
    """Keep the leading rows whose cumulative UTF-8 text size fits ``max_bytes`` (at least one row)."""
    if max_bytes is None or len(ds) == 0:
        return ds
    column = ds.with_format("arrow")[:].column("text")  # respects any indices mapping
    lengths = pc.fill_null(pc.binary_length(column), 0).to_numpy()
    cumulative = np.cumsum(lengths)
    keep = max(1, int(np.searchsorted(cumulative, max_bytes, side="right")))
    return ds if keep >= len(ds) else ds.select(range(keep))


def select_text_column(ds: datasets.Dataset, text_field: str) -> datasets.Dataset:
    """Keep only ``text_field``, renamed to ``"text"``; raise ValueError naming the columns if it is absent."""
    if text_field not in ds.column_names:
        raise ValueError(
            f"data.text_field={text_field!r} is not a column of the data; available columns: "
            f"{', '.join(ds.column_names)}"
        )
    ds = ds.select_columns([text_field])
    if text_field != "text":
        ds = ds.rename_column(text_field, "text")
    dtype = ds.features["text"]
    if getattr(dtype, "dtype", None) not in ("string", "large_string"):
        raise ValueError(f"data.text_field={text_field!r} does not hold strings (its type is {dtype})")
    return ds


def _load_text_files(files: Sequence[str], cache_dir) -> datasets.Dataset:
    """Read each text file as one document with the packaged "text" builder (no network)."""
    return datasets.load_dataset(
        "text",
        data_files=list(files),
        sample_by="document",
        encoding_errors="replace",
        split="train",
        cache_dir=cache_dir,
    )


def load_documents(cfg) -> datasets.Dataset:
    """Load the documents described by ``cfg`` (a DataConfig) as a Dataset with a single "text" column.

    ``max_bytes`` is applied per file (by size on disk) for text files, and per
    row (by UTF-8 text size, in order) for json/parquet/hub data.
    """
    if cfg.source == "builtin":
        return _load_text_files(cap_files_by_size(builtin_files(), cfg.max_bytes), cfg.cache_dir)
    if cfg.source == "files":
        files = expand_paths(cfg.paths)
        kind = common_kind(files)
        if kind == "text":
            return _load_text_files(cap_files_by_size(files, cfg.max_bytes), cfg.cache_dir)
        ds = datasets.load_dataset(kind, data_files=list(files), split="train", cache_dir=cfg.cache_dir)
        return cap_rows_by_bytes(select_text_column(ds, cfg.text_field), cfg.max_bytes)
    if cfg.source == "hub":
        ds = datasets.load_dataset(cfg.hub_name, cfg.hub_config, split=cfg.hub_split, cache_dir=cfg.cache_dir)
        if not isinstance(ds, datasets.Dataset):
            raise ValueError(
                f"data.hub_split={cfg.hub_split!r} did not select a single split of {cfg.hub_name!r} "
                f"(got {type(ds).__name__})"
            )
        return cap_rows_by_bytes(select_text_column(ds, cfg.text_field), cfg.max_bytes)
    raise ValueError(f"data.source={cfg.source!r} is not valid; choose one of: builtin, files, hub")
