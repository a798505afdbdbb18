"""The ``data`` section of a recipe: where the corpus comes from and how it is cut.

``DataConfig`` is a plain dataclass so that it can serve both as a Python object
for library users and as an OmegaConf structured-config schema for the Hydra
recipes (hence only OmegaConf-friendly field types: no ``Literal``/``Union``). ``source`` is a
ConfigEnum (``DataSource``), so a bad value fails at composition; ``tokenizer`` stays a string
(``"byte"`` or a path).
``validate_data_config`` turns the easy mistakes (typos in choices, missing
files) into one-line errors that name the key, the value and the valid choices,
before any expensive work starts.
"""

import os
from dataclasses import dataclass, field
from typing import ClassVar

from dsrecipes.data.files import check_data_sources
from dsrecipes.utils.config_enum import ConfigEnum, enum_values
from dsrecipes.utils.inactive_rules import Inactive
from dsrecipes.utils.ranges import POSITIVE_INT, SEED, at_least, between, ranged
from dsrecipes.utils.recipe_facts import RecipeFacts


class DataSource(ConfigEnum):
    """``data.source``: the standard library's own files, local files, or the Hugging Face Hub."""

    builtin = "builtin"
    files = "files"
    hub = "hub"


#: Valid values of ``data.source``.
SOURCES = enum_values(DataSource)

#: data.val_fraction is at most this: a larger hold-out would leave less data to train on than to evaluate.
MAX_VAL_FRACTION = 0.5


@dataclass
class DataConfig:
    """Where the training text comes from, how it is tokenized and cut into blocks.

    Attributes:
        source: ``"builtin"`` (the Python standard library's own top-level
            ``*.py`` files, present wherever Python is), ``"files"`` (local
            files/directories in ``paths``) or ``"hub"`` (``datasets.load_dataset``).
        paths: for ``source=files``: ``.txt/.md/.py`` (one document per file),
            ``.jsonl/.json`` or ``.parquet`` files, or directories searched
            recursively for those suffixes (sorted).
        hub_name: dataset name on the Hugging Face Hub (``source=hub``).
        hub_config: dataset configuration name (``source=hub``).
        hub_split: split to load (``source=hub``).
        text_field: column holding the text for json/parquet/hub data.
        tokenizer: ``"byte"`` or a path to a ``tokenizers`` ``tokenizer.json`` file.
        block_size: tokens per training example (the model's context length).
        val_fraction: fraction of documents held out for validation, in (0, 0.5].
        max_bytes: cap on the corpus size; documents are taken in sorted order
            while the cumulative size fits (always at least one).
        num_proc: worker processes for ``datasets.Dataset.map``.
        cache_dir: datasets cache directory (``None``: datasets' default).
        split_seed: seed of the deterministic document-level train/validation split.
    """

    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        Inactive(lambda root, d: d.source != "files", lambda root, path: f"data.source={root.data.source} (paths are "
                 "for data=files)", keys=("paths",)),
        Inactive(lambda root, d: d.source != "hub", lambda root, path: f"data.source={root.data.source} (hub_* keys "
                 "are for data=hub)", keys=("hub_name", "hub_config", "hub_split")),
        Inactive(lambda root, d: d.source == "builtin", lambda root, path: "data.source=builtin reads text files (the "
                 "column name is for json / parquet / hub data)", keys=("text_field",)),
    )

    source: DataSource = DataSource.builtin
    paths: list[str] = field(default_factory=list)
    hub_name: str | None = None
    hub_config: str | None = None
    hub_split: str = "train"
    text_field: str = "text"
    tokenizer: str = "byte"
    block_size: int = ranged(128, POSITIVE_INT)
    val_fraction: float = ranged(0.05, between(0, 0.5, low_open=True))
    max_bytes: int | None = ranged(None, at_least(1, nullable=True, null_means="no cap"))
    num_proc: int | None = ranged(None, at_least(1, nullable=True, null_means="one process"))
    cache_dir: str | None = None
    split_seed: int = ranged(1234, SEED)

    def check(self, facts: RecipeFacts) -> None:
        """The group's own checks, and the block against the model's longest sequence."""
        validate_data_config(self)
        if self.block_size > facts.root.model.max_seq_len:
            raise ValueError(f"data.block_size={self.block_size} exceeds model.max_seq_len={facts.root.model.max_seq_len}")


def validate_data_config(cfg) -> None:
    """Check ``cfg`` (a ``DataConfig`` or an equivalent OmegaConf node).

    Also looks at the disk (dsrecipes.data.files.check_data_sources): every corpus file must be
    readable as its suffix says, the tokenizer file must load, the cache directory must be writable.

    Raises:
        ValueError: naming the offending ``data.<key>``, its value (or file) and what would be valid.
    """
    if cfg.source not in SOURCES:
        raise ValueError(f"data.source={cfg.source!r} is not valid; choose one of: {', '.join(SOURCES)}")
    if not isinstance(cfg.block_size, int) or cfg.block_size <= 0:
        raise ValueError(f"data.block_size={cfg.block_size!r} is not valid; it must be a positive integer")
    if not 0.0 < float(cfg.val_fraction) <= MAX_VAL_FRACTION:
        raise ValueError(f"data.val_fraction={cfg.val_fraction!r} is not valid; it must be in (0, {MAX_VAL_FRACTION}] "
                         "(the fraction of documents held out for validation)")
    if cfg.max_bytes is not None and cfg.max_bytes <= 0:
        raise ValueError(f"data.max_bytes={cfg.max_bytes!r} is not valid; use a positive integer or null (no cap)")
    if cfg.num_proc is not None and cfg.num_proc < 1:
        raise ValueError(f"data.num_proc={cfg.num_proc!r} is not valid; use a positive integer or null")
    if not cfg.text_field:
        raise ValueError(f"data.text_field={cfg.text_field!r} is not valid; name the column holding the text")
    if cfg.source == "files":
        if not cfg.paths:
            raise ValueError("data.paths is empty; source=files needs at least one file or directory")
        for path in cfg.paths:
            if not os.path.exists(str(path)):
                raise ValueError(f"data.paths: {str(path)!r} does not exist")
    if cfg.source == "hub" and not cfg.hub_name:
        raise ValueError("data.hub_name is not set; source=hub needs a dataset name, e.g. data.hub_name=wikitext")
    if cfg.tokenizer != "byte" and not os.path.isfile(str(cfg.tokenizer)):
        raise ValueError(
            f"data.tokenizer={cfg.tokenizer!r} is not valid; use 'byte' or the path of an existing tokenizer.json file"
        )

    check_data_sources(cfg)
