"""The corpus files, tokenizer file and cache directory of a `data` config, checked without reading them whole.

Imports neither datasets nor pandas, so the launching process can check a recipe before any run
directory or worker exists: each file of `data.paths` must be of a supported suffix and look like
what its suffix says (text without NUL bytes; JSON whose first record is an object holding
`data.text_field`; Parquet with its PAR1 magic and a readable schema holding the column), an explicitly
named file must not be empty, `data.tokenizer` must load as a `tokenizers` tokenizer.json and
`data.cache_dir` must be a writable directory (or creatable). Each error names the key and the file.
"""

from __future__ import annotations

import glob
import json
import os
import sysconfig
from collections.abc import Sequence

from dsrecipes.utils.paths import check_writable_dir

#: File suffixes accepted by ``source=files``, grouped by the datasets builder that reads them.
TEXT_SUFFIXES = (".txt", ".md", ".py")
JSON_SUFFIXES = (".jsonl", ".json")
PARQUET_SUFFIXES = (".parquet",)
SUPPORTED_SUFFIXES = TEXT_SUFFIXES + JSON_SUFFIXES + PARQUET_SUFFIXES

_SNIFF_BYTES = 64 * 1024  # how much of each file the checks read
_PARQUET_MAGIC = b"PAR1"


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


def _head(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(_SNIFF_BYTES)
    except OSError as err:
        raise ValueError(f"data.paths: {path!r} cannot be read ({err.strerror or err})") from None


def _check_not_binary(path: str, head: bytes, kind: str) -> None:
    offset = head.find(b"\x00")
    if offset >= 0:
        raise ValueError(f"data.paths: {path!r} is not a {kind} file: it holds NUL bytes (binary data) at byte "
                         f"{offset}; give text, JSON lines or Parquet files with their own suffix")


def required_columns(cfg) -> dict[str, str]:
    """The columns the data must hold, by the config key that names each: text_field (format=text), prompt_field
    and completion_field (prompt_completion), messages_field (chat), prompt_field, chosen_field and rejected_field
    (preference)."""
    fmt = str(getattr(cfg, "format", "text"))
    keys = {"text": ("text_field",), "prompt_completion": ("prompt_field", "completion_field"),
            "chat": ("messages_field",), "preference": ("prompt_field", "chosen_field", "rejected_field")}.get(
        fmt, ("text_field",))
    return {f"data.{key}": str(getattr(cfg, key)) for key in keys}


def missing_column_error(columns: dict[str, str], available, where: str) -> ValueError | None:
    """A ValueError naming the first key whose column is not among `available` (of `where`), or None."""
    for key, column in columns.items():
        if column not in available:
            return ValueError(f"{key}={column!r} is not a column of {where}; available columns: "
                              f"{', '.join(available) or '(none)'}")
    return None


def is_saved_dataset(path: str) -> bool:
    """A folder written by datasets' Dataset.save_to_disk (its state.json and dataset_info.json beside arrow
    files)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "state.json")) \
        and os.path.isfile(os.path.join(path, "dataset_info.json"))


def _check_json(path: str, head: bytes, columns: dict[str, str]) -> None:
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff")
    stripped = text.lstrip()
    if not stripped:
        raise ValueError(f"data.paths: {path!r} holds only whitespace; a JSON file needs at least one record")
    if stripped[0] not in "{[":
        raise ValueError(f"data.paths: {path!r} is not JSON: it starts with {stripped[:20]!r}, not '{{' (JSON lines: "
                         "one object per line) or '[' (a list of objects)")
    if stripped[0] == "[":
        return  # a JSON list: the loader parses it whole
    first = stripped.splitlines()[0]
    try:
        record = json.loads(first)
    except json.JSONDecodeError as err:
        if path.lower().endswith(".jsonl") and (len(first) < len(stripped) or len(head) < _SNIFF_BYTES):
            raise ValueError(f"data.paths: {path!r} is not JSON lines: line 1 does not parse ({err.msg} at column "
                             f"{err.colno})") from None
        return  # a pretty-printed .json object, or a first line longer than what was read: the loader decides
    if not isinstance(record, dict):
        raise ValueError(f"data.paths: {path!r}: line 1 is a JSON {type(record).__name__}, not an object with "
                         f"{' and '.join(map(repr, columns.values()))} keys")
    error = missing_column_error(columns, list(record), f"{path!r} (its first record)")
    if error is not None:
        raise error


def _check_parquet(path: str, columns: dict[str, str]) -> None:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        start = f.read(4)
        f.seek(max(0, size - 4))
        end = f.read(4)
    if size < 12 or start != _PARQUET_MAGIC or end != _PARQUET_MAGIC:
        raise ValueError(f"data.paths: {path!r} is not a Parquet file (no PAR1 magic bytes at its start and end); "
                         "use the .parquet suffix only for Parquet files")
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
    except Exception as err:  # pyarrow raises ArrowInvalid / OSError for a damaged footer
        raise ValueError(f"data.paths: {path!r} is not a readable Parquet file ({err})") from None
    error = missing_column_error(columns, names, repr(path))
    if error is not None:
        raise error


def check_data_files(cfg) -> None:
    """The files of a `source=files` config: supported, of one kind, and each one readable as its kind (a folder
    written by Dataset.save_to_disk is read whole by datasets: only its presence is checked here)."""
    if len(cfg.paths) == 1 and is_saved_dataset(str(cfg.paths[0])):
        return
    columns = required_columns(cfg)
    files = expand_paths(cfg.paths)
    kind = common_kind(files)
    named = {os.path.abspath(str(p)) for p in cfg.paths if os.path.isfile(str(p))}
    used = cap_files_by_size(files, cfg.max_bytes) if kind == "text" else files
    for path in used:
        if os.path.getsize(path) == 0:
            if kind != "text" or os.path.abspath(path) in named:
                raise ValueError(f"data.paths: {path!r} is empty (0 bytes)")
            continue  # an empty text file found in a directory is an empty document
        head = _head(path)
        if kind == "parquet":
            _check_parquet(path, columns)
            continue
        _check_not_binary(path, head, "text" if kind == "text" else "JSON")
        if kind == "json":
            _check_json(path, head, columns)
    if kind == "text" and not any(os.path.getsize(p) for p in used):
        raise ValueError(f"data.paths={list(map(str, cfg.paths))}: the {len(used)} text file(s) taken are all empty")


def check_tokenizer_file(spec: str) -> None:
    """data.tokenizer: 'byte', or a file that `tokenizers.Tokenizer.from_file` loads."""
    if spec == "byte":
        return
    path = str(spec)
    if not os.path.isfile(path):
        raise ValueError(f"data.tokenizer={spec!r} is not valid; use 'byte' or the path of an existing tokenizer.json file")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ValueError(f"data.tokenizer={spec!r} needs the Hugging Face tokenizers package: pip install tokenizers") \
            from None
    try:
        Tokenizer.from_file(path)
    except Exception as err:  # tokenizers raises a plain Exception for any file it cannot parse
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"data.tokenizer={spec!r} is not a tokenizers tokenizer.json file ({reason}); use 'byte' or "
                         "a tokenizer.json saved by the Hugging Face tokenizers library") from None


def check_data_sources(cfg) -> None:
    """Every check of the data config that looks at the disk: corpus files, tokenizer file, cache directory."""
    if cfg.source == "files":
        check_data_files(cfg)
    check_tokenizer_file(cfg.tokenizer)
    if cfg.cache_dir is not None:
        check_writable_dir("data.cache_dir", cfg.cache_dir)
