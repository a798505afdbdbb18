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

from dsrecipes.data.files import check_data_sources, required_columns
from dsrecipes.utils.compatibility_rows import Refusal, Supported
from dsrecipes.utils.config_enum import ConfigEnum, check_choice, enum_values
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


class DataFormat(ConfigEnum):
    """``data.format``: plain text, prompt/completion pairs, chat conversations (a ``messages`` list), or preference
    pairs (prompt, chosen, rejected: DPO)."""

    text = "text"
    prompt_completion = "prompt_completion"
    chat = "chat"
    preference = "preference"


class TrainOn(ConfigEnum):
    """``data.train_on``: which tokens carry labels (auto: all for text, completion for prompt_completion,
    assistant for chat)."""

    auto = "auto"
    all = "all"
    completion = "completion"
    assistant = "assistant"


class Packing(ConfigEnum):
    """``data.packing``: one sample per padded row, a concatenated stream cut into blocks, or whole documents
    packed into rows with their own positions and causal block each."""

    none = "none"
    concat = "concat"
    documents = "documents"


class Overlong(ConfigEnum):
    """``data.overlong``: what a sample longer than one row (block_size + 1 tokens) gets, under packing=none or
    documents."""

    truncate = "truncate"
    refuse = "refuse"


class LossMean(ConfigEnum):
    """``data.loss_mean``: the training loss as the mean over every label token of the global batch (all micro-
    batches of a step, all data-parallel ranks), or DeepSpeed's mean of per-micro-batch means."""

    global_tokens = "global_tokens"
    micro_batch = "micro_batch"


#: data.train_on choices each data.format allows (auto resolves to the first).
TRAIN_ON_CHOICES = {"text": ("all",), "prompt_completion": ("completion", "all"), "chat": ("assistant", "all"),
                    "preference": ("completion",)}

#: data.val_fraction is at most this: a larger hold-out would leave less data to train on than to evaluate.
MAX_VAL_FRACTION = 0.5


def _pp_documents(root, dims):
    if dims.pp > 1 and root.data.packing == "documents":
        return (f"data.packing=documents is not supported with parallel.pp={dims.pp}: the pipeline stages take no "
                "position ids; use data.packing=none or concat, or parallel.pp=1")
    return None


def _pp_token_mean(root, dims):
    if dims.pp > 1 and weights_loss_by_tokens(root.data):
        return (f"data.loss_mean=global_tokens is not supported with parallel.pp={dims.pp} (the schedule averages its "
                f"micro-batches' means); use data.loss_mean=micro_batch, or parallel.pp=1")
    return None


def _sp_documents(root, dims):
    if dims.sp > 1 and root.data.packing == "documents":
        return (f"data.packing=documents is not supported with parallel.sp={dims.sp}: each sequence chunk would need "
                "the whole row's document boundaries; use data.packing=none, or parallel.sp=1")
    return None


def _sparse_documents(root, dims):
    if root.data.packing == "documents" and str(root.sparse_attention.mode) != "none":
        return (f"data.packing=documents is not supported with sparse_attention.mode={root.sparse_attention.mode}: the "
                "block-sparse layouts take no document mask; use sparse_attention=none or data.packing=none")
    return None


def _samples_data_efficiency(root, dims):
    de = root.data_efficiency
    on = [key for key, value in (("random_ltd", de.random_ltd.enabled),
                                 ("curriculum_learning", de.curriculum_learning.enabled)) if value]
    if on and uses_samples(root.data):
        return (f"data_efficiency.{on[0]}.enabled=true is not supported with data.format={root.data.format} "
                f"data.packing={root.data.packing}: it works on a text stream's blocks (no label mask, no document "
                "boundaries); use data.format=text data.packing=concat, or turn it off")
    return None


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
        text_field: column holding the text for json/parquet/hub data (format=text).
        format: ``text`` (documents), ``prompt_completion`` (``prompt_field`` + ``completion_field`` columns) or
            ``chat`` (a ``messages_field`` list of {role, content} dicts, rendered by a chat template).
        prompt_field / completion_field: the columns of format=prompt_completion (prompt_field: of preference too).
        chosen_field / rejected_field: the preferred and the rejected completion of format=preference.
        messages_field: the column of format=chat.
        chat_template: null (the tokenizer's own: chat_template.jinja or tokenizer_config.json beside its
            tokenizer.json), a built-in name (dsrecipes.data.chat_templates.BUILTIN_TEMPLATES) or a .jinja file.
        train_on: which tokens carry labels: ``all``, ``completion`` (prompt_completion), ``assistant`` (chat:
            the assistant turns, their end-of-turn tokens included); ``auto`` = the format's natural choice.
        packing: ``concat`` (the token stream cut into blocks, attention across documents: pre-training),
            ``documents`` (whole samples packed into rows; positions restart and attention stays inside each),
            ``none`` (one sample per row, padded).
        overlong: ``truncate`` (with a warning naming how many) or ``refuse`` a sample longer than a row under
            packing=none / documents.
        loss_mean: ``global_tokens`` (the loss of a step is the mean over all its label tokens, however they fall
            into micro-batches and ranks: a micro-batch with more labels weighs more) or ``micro_batch``
            (DeepSpeed's: each micro-batch's own mean, averaged). They differ only when rows hold different numbers
            of labels, so a text stream (format=text, packing=concat) always takes the plain mean.
        tokenizer: ``"byte"`` or a path to a ``tokenizers`` ``tokenizer.json`` file.
        block_size: tokens per training example (the model's context length).
        val_fraction: fraction of documents held out for validation, in (0, 0.5].
        max_bytes: cap on the corpus size; documents are taken in sorted order
            while the cumulative size fits (always at least one); for the built-in instruction tasks, rows while
            their JSON size fits.
        num_proc: worker processes for ``datasets.Dataset.map``.
        cache_dir: datasets cache directory (``None``: datasets' default).
        split_seed: seed of the deterministic document-level train/validation split.
    """

    COMPATIBILITY: ClassVar[tuple[Refusal | Supported, ...]] = (
        Refusal("pp with data.packing=documents", "the pipeline stages take no position ids yet", _pp_documents),
        Refusal("pp with data.loss_mean=global_tokens", "the schedule averages micro-batch means; "
                "data.loss_mean=micro_batch runs", _pp_token_mean),
        Refusal("sp with data.packing=documents", "a chunk would need the whole row's document boundaries",
                _sp_documents),
        Refusal("sparse attention with data.packing=documents", "the block-sparse layouts take no document mask",
                _sparse_documents),
        Refusal("random-LTD or the curriculum with prompt/chat data or packing other than concat", "they work on a "
                "text stream's blocks", _samples_data_efficiency),
        Supported("data.packing=documents with chat data under ZeRO-3, global-token loss mean", "supported: each "
                  "document its own causal block, the step's loss the mean over all label tokens of the global batch",
                  ("sft-chat-documents-dp2-zero3",)),
    )
    INACTIVE: ClassVar[tuple[Inactive, ...]] = (
        Inactive(lambda root, d: d.source != "files", lambda root, path: f"data.source={root.data.source} (paths are "
                 "for data=files)", keys=("paths",)),
        Inactive(lambda root, d: d.source != "hub", lambda root, path: f"data.source={root.data.source} (hub_* keys "
                 "are for data=hub)", keys=("hub_name", "hub_config", "hub_split")),
        Inactive(lambda root, d: d.source == "builtin" or d.format != "text", lambda root, path: "the column name is for "
                 "format=text json / parquet / hub data", keys=("text_field",)),
        Inactive(lambda root, d: d.format not in ("prompt_completion", "preference"), lambda root, path:
                 f"data.format={root.data.format} (prompt_field is for format=prompt_completion / preference)",
                 keys=("prompt_field",)),
        Inactive(lambda root, d: d.format != "prompt_completion", lambda root, path: f"data.format={root.data.format} "
                 "(completion_field is for format=prompt_completion)", keys=("completion_field",)),
        Inactive(lambda root, d: d.format != "preference", lambda root, path: f"data.format={root.data.format} "
                 "(chosen_field / rejected_field are for format=preference)", keys=("chosen_field", "rejected_field")),
        Inactive(lambda root, d: d.format != "chat", lambda root, path: f"data.format={root.data.format} "
                 "(messages_field / chat_template are for format=chat)", keys=("messages_field", "chat_template")),
        Inactive(lambda root, d: d.packing == "concat", lambda root, path: "data.packing=concat cuts a stream (no "
                 "sample is longer than a block)", keys=("overlong",)),
        Inactive(lambda root, d: not uses_samples(d), lambda root, path: "a text stream (format=text, packing=concat) "
                 "holds a label at every position, so every mean is the same", keys=("loss_mean",)),
    )

    source: DataSource = DataSource.builtin
    paths: list[str] = field(default_factory=list)
    hub_name: str | None = None
    hub_config: str | None = None
    hub_split: str = "train"
    text_field: str = "text"
    format: DataFormat = DataFormat.text
    prompt_field: str = "prompt"
    completion_field: str = "completion"
    chosen_field: str = "chosen"
    rejected_field: str = "rejected"
    messages_field: str = "messages"
    chat_template: str | None = None
    train_on: TrainOn = TrainOn.auto
    packing: Packing = Packing.concat
    overlong: Overlong = Overlong.truncate
    loss_mean: LossMean = LossMean.global_tokens
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
        if self.format == "chat":  # the template the run will render with, from the tokenizer it will use
            from dsrecipes.data.chat_templates import check_chat_template

            tokenizer = str(self.tokenizer)
            if facts.root.model.path:
                from dsrecipes.models.hf_import import tokenizer_for_training

                tokenizer = tokenizer_for_training(facts.root.model.path, tokenizer)
            check_chat_template(_WithTokenizer(self, tokenizer))
        if self.block_size > facts.root.model.max_seq_len:
            raise ValueError(f"data.block_size={self.block_size} exceeds model.max_seq_len={facts.root.model.max_seq_len}")


class _WithTokenizer:
    """A data config read as is, but for its tokenizer."""

    def __init__(self, cfg, tokenizer: str):
        self._cfg, self.tokenizer = cfg, tokenizer

    def __getattr__(self, name):
        return getattr(self._cfg, name)


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
    check_choice("data.format", cfg.format, enum_values(DataFormat))
    check_choice("data.packing", cfg.packing, enum_values(Packing))
    check_choice("data.overlong", cfg.overlong, enum_values(Overlong))
    check_choice("data.train_on", cfg.train_on, enum_values(TrainOn))
    check_choice("data.loss_mean", cfg.loss_mean, enum_values(LossMean))
    if cfg.format == "preference" and cfg.packing != "none":
        raise ValueError(f"data.packing={cfg.packing} is not valid for data.format=preference: each row holds one "
                         "(chosen, rejected) pair; use data.packing=none")
    allowed = TRAIN_ON_CHOICES[str(cfg.format)]
    if cfg.train_on != "auto" and cfg.train_on not in allowed:
        raise ValueError(f"data.train_on={cfg.train_on} is not valid for data.format={cfg.format}; choose one of: "
                         f"{', '.join(('auto',) + allowed)} (completion is for prompt_completion, assistant for chat)")
    for key in required_columns(cfg):  # the format's column keys (text_field: its own message below)
        value = getattr(cfg, key.removeprefix("data."))
        if not value and key != "data.text_field":
            raise ValueError(f"{key}={value!r} is not valid; name the column")
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


def resolved_train_on(cfg) -> str:
    """data.train_on with auto resolved: all (text), completion (prompt_completion), assistant (chat)."""
    return str(cfg.train_on) if cfg.train_on != "auto" else TRAIN_ON_CHOICES[str(cfg.format)][0]


def weights_loss_by_tokens(cfg) -> bool:
    """Whether the training loss is weighted to the global mean over label tokens (data.loss_mean=global_tokens on
    data whose rows may hold different numbers of labels; not preference pairs, whose DPO loss is a mean over pairs,
    the same number in every micro-batch)."""
    return cfg is not None and uses_samples(cfg) and cfg.loss_mean == "global_tokens" and cfg.format != "preference"


def uses_samples(cfg) -> bool:
    """Whether the data is prepared sample by sample (input_ids / labels rows, dsrecipes.data.samples) rather than
    as today's concatenated token stream of text (the "tokens" column): any format but text, or packing other than
    concat."""
    return cfg.format != "text" or cfg.packing != "concat"
