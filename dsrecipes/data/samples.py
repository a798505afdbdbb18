"""From one row of data to one sample: token ids and which of them are training targets.

    ids, targets = encode_sample(row, spec)      # targets[i] == 1: ids[i] is a label (predicted from ids[:i])

Per data.format:

* ``text``: the tokens of the text, then the tokenizer's end-of-sequence id; every token a target.
* ``prompt_completion``: tokens of the prompt, then of the completion, then end-of-sequence (prompt and
  completion tokenized apart, as TRL does, so the boundary is a token boundary); with train_on=completion only
  the completion's tokens and the end-of-sequence id are targets.
* ``chat``: the conversation rendered by the chat template (dsrecipes.data.chat_templates) and tokenized whole
  without added special tokens, which gives transformers' `apply_chat_template(messages, tokenize=True)` ids; with
  train_on=assistant exactly the tokens holding a character of an assistant turn are targets (the turns as
  dsrecipes.data.chat_templates finds them: the template's {% generation %} blocks, else the characters each
  assistant message adds, its end-of-turn tokens included).

A row the format cannot use (a missing or non-string field, an empty completion, a message without role or
content, a conversation with no assistant turn under train_on=assistant) raises a ValueError naming the row and
the key: bad data stops the run before training, with one line.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from dsrecipes.data.chat_templates import ChatTemplate

#: Bumped whenever encode_sample changes its output (part of datasets' cache fingerprint, as PACKING_VERSION).
SAMPLES_VERSION = 1


@dataclass(frozen=True)
class SampleSpec:
    """What encode_sample needs of the data config, as plain picklable data."""

    format: str
    train_on: str
    text_field: str = "text"
    prompt_field: str = "prompt"
    completion_field: str = "completion"
    messages_field: str = "messages"
    chosen_field: str = "chosen"
    rejected_field: str = "rejected"
    template: ChatTemplate | None = None


def sample_spec(cfg, train_on: str, template: ChatTemplate | None) -> SampleSpec:
    """The SampleSpec of a data config (train_on already resolved from auto; text comes as the "text" column of
    dsrecipes.data.sources.load_documents)."""
    return SampleSpec(str(cfg.format), train_on, "text", str(cfg.prompt_field), str(cfg.completion_field),
                      str(cfg.messages_field), str(cfg.chosen_field), str(cfg.rejected_field), template)


def _string(row: dict, key: str, column: str, index: int, allow_empty: bool = True) -> str:
    value = row.get(column)
    if not isinstance(value, str):
        raise ValueError(f"data: row {index}: data.{key}={column!r} holds {type(value).__name__}, not a string")
    if not allow_empty and not value.strip():
        raise ValueError(f"data: row {index}: empty {column} (data.{key}={column!r}); every sample needs one")
    return value


def _messages(row: dict, spec: SampleSpec, index: int) -> list[dict]:
    messages = row.get(spec.messages_field)
    key = f"data.messages_field={spec.messages_field!r}"
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"data: row {index}: {key} holds {type(messages).__name__ if messages is not None else 'null'}"
                         ", not a non-empty list of {role, content} messages")
    for number, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) \
                or not isinstance(message.get("content"), str):
            raise ValueError(f"data: row {index}: message {number} of {key} is not a {{role: str, content: str}} "
                             f"object ({message!r:.80})")
    return [{key_: value for key_, value in m.items() if value is not None} for m in messages]


def _prompt_completion(prompt: list[int], completion: str, tokenizer, eos: list[int], completion_only: bool) \
        -> tuple[list[int], list[int]]:
    """The prompt's ids, then the completion's and end-of-sequence; the prompt flagged only unless completion_only."""
    tokens = list(tokenizer.encode(completion)) + eos
    return prompt + tokens, [0 if completion_only else 1] * len(prompt) + [1] * len(tokens)


def encode_sample(row: dict, spec: SampleSpec, tokenizer, eos_id: int | None, index: int = 0) \
        -> tuple[list[int], list[int]]:
    """The ids of one row and its target flags (see the module docstring)."""
    eos = [int(eos_id)] if eos_id is not None else []
    if spec.format == "text":
        ids = list(tokenizer.encode(_string(row, "text_field", spec.text_field, index))) + eos
        return ids, [1] * len(ids)
    if spec.format == "prompt_completion":
        prompt = list(tokenizer.encode(_string(row, "prompt_field", spec.prompt_field, index)))
        completion = _string(row, "completion_field", spec.completion_field, index, allow_empty=False)
        return _prompt_completion(prompt, completion, tokenizer, eos, spec.train_on == "completion")
    messages = _messages(row, spec, index)
    if spec.train_on == "all":
        ids, _ = tokenizer.encode_with_offsets(spec.template.render(messages))
        return list(ids), [1] * len(ids)
    text, spans = spec.template.render_with_assistant_spans(messages)
    if not spans:
        raise ValueError(f"data: row {index}: the conversation has no assistant turn, so data.train_on=assistant "
                         "leaves it nothing to learn (roles: "
                         f"{', '.join(m['role'] for m in messages)}); drop it or use data.train_on=all")
    ids, offsets = tokenizer.encode_with_offsets(text)
    bounds = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    targets = np.zeros(len(ids), dtype=np.int8)
    for start, end in spans:  # a token that holds any character of the turn (transformers' assistant mask rule)
        targets |= ((bounds[:, 0] < end) & (np.maximum(bounds[:, 1], bounds[:, 0] + 1) > start)).astype(np.int8)
    if not targets.any():
        raise ValueError(f"data: row {index}: the assistant turns render to no token (template {spec.template.source})")
    return list(ids), targets.tolist()


def encode_pair(row: dict, spec: SampleSpec, tokenizer, eos_id: int | None, index: int = 0) \
        -> tuple[tuple[list[int], list[int]], tuple[list[int], list[int]]]:
    """A preference row as two prompt_completion samples: (prompt + chosen) and (prompt + rejected), each with its
    completion's tokens (and end-of-sequence) as the only targets."""
    eos = [int(eos_id)] if eos_id is not None else []
    prompt = list(tokenizer.encode(_string(row, "prompt_field", spec.prompt_field, index)))
    pairs = [_prompt_completion(prompt, _string(row, key, column, index, allow_empty=False), tokenizer, eos, True)
             for key, column in (("chosen_field", spec.chosen_field), ("rejected_field", spec.rejected_field))]
    if pairs[0][0] == pairs[1][0]:
        raise ValueError(f"data: row {index}: the chosen and the rejected completion are the same text, so the pair "
                         "says nothing to prefer")
    return pairs[0], pairs[1]


def list_array(values: list, dtype) -> pa.Array:
    """A pyarrow list array of `values` (int sequences) as `dtype`, with int32 offsets."""
    lengths = np.asarray([len(v) for v in values], dtype=np.int64)
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate([np.asarray(v, dtype=dtype) for v in values]) if values else np.zeros(0, dtype=dtype)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))


def encode_pair_batch(batch: dict, indices: list[int], spec: SampleSpec, tokenizer, eos_id: int | None,
                      version: int = SAMPLES_VERSION) -> pa.Table:
    """``Dataset.map`` function (batched, with indices) for format=preference: chosen_ids / chosen_targets /
    rejected_ids / rejected_targets lists."""
    del version
    columns = list(batch)
    pairs = [encode_pair({c: batch[c][i] for c in columns}, spec, tokenizer, eos_id, int(index))
             for i, index in enumerate(indices)]
    return pa.table({"chosen_ids": list_array([c[0] for c, _ in pairs], np.int32),
                     "chosen_targets": list_array([c[1] for c, _ in pairs], np.int8),
                     "rejected_ids": list_array([r[0] for _, r in pairs], np.int32),
                     "rejected_targets": list_array([r[1] for _, r in pairs], np.int8)})


def encode_batch(batch: dict, indices: list[int], spec: SampleSpec, tokenizer, eos_id: int | None,
                 version: int = SAMPLES_VERSION) -> pa.Table:
    """``Dataset.map`` function (batched, with indices): each row's "ids" (int32) and "targets" (int8) lists."""
    del version  # only part of the cache fingerprint
    columns = list(batch)
    rows = [{column: batch[column][i] for column in columns} for i in range(len(indices))]
    encoded = [encode_sample(row, spec, tokenizer, eos_id, int(index)) for row, index in zip(rows, indices)]
    return pa.table({"ids": list_array([ids for ids, _ in encoded], np.int32),
                     "targets": list_array([targets for _, targets in encoded], np.int8)})
