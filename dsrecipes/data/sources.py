"""Load the raw documents of a corpus as a ``datasets.Dataset`` with one ``"text"`` column.

Three sources, all read through Hugging Face datasets so that the loaded corpus
lands in datasets' Arrow cache (and every later step can be cached on top of it):

* ``builtin``: the Python standard library's own top-level ``*.py`` files, one
  document per file, read with the packaged ``"text"`` builder. It exists
  wherever Python is installed, so recipes run offline with no download.
* ``files``: local text (``.txt/.md/.py``), JSON lines/JSON or Parquet files.
* ``hub``: ``datasets.load_dataset(name, config, split=...)`` (needs network, or a cached copy).

Nothing is downloaded for ``builtin`` or ``files``: only packaged builders are used, with datasets
in offline mode for the call (`hub_offline`), since even a packaged builder otherwise pings the
Hub's download counter (a 3-second timeout on a machine without network). For ``hub``, the Hub is
probed first (a TCP connection, 3 s at most): unreachable, or with HF_HUB_OFFLINE=1, the dataset is
read from datasets' cache, and when it is not there the run stops with one line naming the
dataset, the cache and HF_HUB_OFFLINE, instead of datasets' ~40 s of retries and a traceback.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence

import datasets
import numpy as np
import pyarrow.compute as pc

from dsrecipes.data.files import builtin_files, cap_files_by_size, common_kind, expand_paths, file_kind

__all__ = ["builtin_files", "cap_files_by_size", "cap_rows_by_bytes", "common_kind", "expand_paths", "file_kind",
           "load_documents", "select_text_column"]


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


def _root_cause(err: BaseException) -> str:
    """The message of the error at the end of the `raise ... from` chain (datasets wraps the parser's error in
    DatasetGenerationError)."""
    while err.__cause__ is not None:
        err = err.__cause__
    return f"{type(err).__name__}: {err}".splitlines()[0]


@contextlib.contextmanager
def hub_offline():
    """datasets (and huggingface_hub) in offline mode for the duration: no request leaves the machine."""
    import huggingface_hub.constants as hub_constants

    config = datasets.config
    saved = (config.HF_HUB_OFFLINE, config.HF_DATASETS_OFFLINE, config.HF_UPDATE_DOWNLOAD_COUNTS,
             hub_constants.HF_HUB_OFFLINE)
    config.HF_HUB_OFFLINE = config.HF_DATASETS_OFFLINE = True
    config.HF_UPDATE_DOWNLOAD_COUNTS = False
    hub_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        (config.HF_HUB_OFFLINE, config.HF_DATASETS_OFFLINE, config.HF_UPDATE_DOWNLOAD_COUNTS,
         hub_constants.HF_HUB_OFFLINE) = saved


def _load_text_files(files: Sequence[str], cache_dir) -> datasets.Dataset:
    """Read each text file as one document with the packaged "text" builder (no network)."""
    with hub_offline():
        return datasets.load_dataset(
            "text",
            data_files=list(files),
            sample_by="document",
            encoding_errors="replace",
            split="train",
            cache_dir=cache_dir,
        )


def _load_hub(cfg) -> datasets.Dataset:
    """data=hub: online when the Hub answers, else (or with HF_HUB_OFFLINE=1) datasets' cached copy, else one line."""
    from huggingface_hub.constants import ENDPOINT

    from dsrecipes.utils.network import unreachable

    def load() -> datasets.Dataset:
        return datasets.load_dataset(cfg.hub_name, cfg.hub_config, split=cfg.hub_split, cache_dir=cfg.cache_dir)

    why = "HF_HUB_OFFLINE is set" if datasets.config.HF_HUB_OFFLINE else unreachable(ENDPOINT)
    if why is None:
        return load()
    try:
        with hub_offline():
            return load()
    except Exception as err:  # ConnectionError / FileNotFoundError / DatasetNotFoundError: not in the cache
        cache = cfg.cache_dir or datasets.config.HF_DATASETS_CACHE
        name = cfg.hub_name + (f" ({cfg.hub_config})" if cfg.hub_config else "")
        raise ValueError(f"data.hub_name={name}: offline ({why}) and not in the datasets cache {cache} "
                         f"({type(err).__name__}); connect once to cache it (HF_HUB_OFFLINE=1 then reads the "
                         "cached copy), or use data=files") from None


def _load_record_files(files: Sequence[str], kind: str, cache_dir) -> datasets.Dataset:
    """JSON / Parquet files read by their packaged builder (offline); one line naming them when one is not what its
    suffix says."""
    try:
        with hub_offline():
            return datasets.load_dataset(kind, data_files=list(files), split="train", cache_dir=cache_dir)
    except Exception as err:  # DatasetGenerationError / ArrowInvalid: a file that is not what its suffix says
        raise ValueError(f"data.paths: the {kind} file(s) {', '.join(files)} could not be read: "
                         f"{_root_cause(err)}") from err


def _load_hub_split(cfg) -> datasets.Dataset:
    """The data=hub dataset's one split (data.hub_split), online or from datasets' cache."""
    ds = _load_hub(cfg)
    if not isinstance(ds, datasets.Dataset):
        raise ValueError(f"data.hub_split={cfg.hub_split!r} did not select a single split of {cfg.hub_name!r} "
                         f"(got {type(ds).__name__})")
    return ds


def _select_columns(ds: datasets.Dataset, columns: dict[str, str], where: str) -> datasets.Dataset:
    from dsrecipes.data.files import missing_column_error

    error = missing_column_error(columns, ds.column_names, where)
    if error is not None:
        raise error
    return ds.select_columns(list(dict.fromkeys(columns.values())))


def load_rows(cfg) -> datasets.Dataset:
    """The rows of a prompt_completion / chat (or text) data config with only the columns its format reads
    (dsrecipes.data.files.required_columns): the built-in tasks (dsrecipes.data.builtin_tasks), json / parquet
    files or a Dataset.save_to_disk folder, or a Hub dataset."""
    from dsrecipes.data.builtin_tasks import builtin_task_rows
    from dsrecipes.data.files import is_saved_dataset, required_columns

    columns = required_columns(cfg)
    if cfg.format == "text":  # one "text" column, whatever data.text_field named
        return load_documents(cfg)
    if cfg.source == "builtin":
        rows = builtin_task_rows(str(cfg.format), seed=cfg.split_seed)
        if cfg.max_bytes is not None:  # leading rows while their JSON size fits (at least two: a split needs them)
            sizes = np.cumsum([len(json.dumps(row)) for row in rows])
            rows = rows[:max(2, int(np.searchsorted(sizes, cfg.max_bytes, side="right")))]
        ds = datasets.Dataset.from_list(rows)
        defaults = {"data.prompt_field": "prompt", "data.completion_field": "completion",
                    "data.messages_field": "messages", "data.chosen_field": "chosen", "data.rejected_field": "rejected"}
        return ds.rename_columns({defaults[key]: name for key, name in columns.items() if defaults[key] != name})
    if cfg.source == "hub":
        return _select_columns(_load_hub_split(cfg), columns, f"the Hub dataset {cfg.hub_name}")
    if len(cfg.paths) == 1 and is_saved_dataset(str(cfg.paths[0])):
        ds = datasets.load_from_disk(str(cfg.paths[0]))
        return _select_columns(ds, columns, f"the saved dataset {cfg.paths[0]}")
    files = expand_paths(cfg.paths)
    kind = common_kind(files)
    if kind == "text":
        raise ValueError(f"data.format={cfg.format} reads records (json lines, parquet, a saved dataset folder), not "
                         f"text files: {', '.join(files)}")
    return _select_columns(_load_record_files(files, kind, cfg.cache_dir), columns, ", ".join(files))


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
        ds = _load_record_files(files, kind, cfg.cache_dir)
        return cap_rows_by_bytes(select_text_column(ds, cfg.text_field), cfg.max_bytes)
    if cfg.source == "hub":
        return cap_rows_by_bytes(select_text_column(_load_hub_split(cfg), cfg.text_field), cfg.max_bytes)
    raise ValueError(f"data.source={cfg.source!r} is not valid; choose one of: builtin, files, hub")
