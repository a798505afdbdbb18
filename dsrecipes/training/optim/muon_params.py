"""Which parameters Muon steps and which Adam does: the split of optimizer=muon's parameter groups by name.

A parameter goes to Muon when it has two or more dimensions, some entry of `optimizer.muon_params` selects it and
no entry of `optimizer.adam_params` does; everything else (embeddings, the LM head, norms, biases, and whatever
adam_params names) goes to Adam. An entry selects a parameter by its qualified name (`blocks.0.attn.q_proj.weight`):

* a plain entry when it is a substring of the name: DeepSpeed's rule (its Muon takes every matrix whose name
  contains neither "embed" nor "lm_head"), so `adam_params: [embed, lm_head]` is DeepSpeed's split;
* ``re:<regex>`` when the regex matches the whole name;
* ``all-matrices`` (muon_params' default) selects every parameter.

adam_params' default, `embed, lm_head, tok_emb, pos_emb, wte, wpe`, covers dsrecipes' GPT (`tok_emb`, `pos_emb`; the
head is tied or `lm_head`) and the Hugging Face families (`embed_tokens`, `lm_head`, GPT-2's `wte` / `wpe`); an
entry that names nothing of this model is fine. An entry of muon_params that selects no matrix is refused, and so
is a split that leaves Muon nothing (both name the key, before any worker starts for dsrecipes' own GPT, when the
optimizer is built for a checkpoint's model).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from dsrecipes.utils.name_patterns import REGEX_PREFIX, check_regex, regex_matches

ALL_MATRICES = "all-matrices"


def entry_selects(name: str, entry: str) -> bool:
    """Whether one muon_params / adam_params entry selects the parameter called `name`."""
    if entry == ALL_MATRICES:
        return True
    if entry.startswith(REGEX_PREFIX):
        return regex_matches(name, entry)
    return entry in name


def check_entries(entries: Sequence[str], key: str) -> None:
    """ValueError for an entry that is not a string or a `re:` entry whose regex does not compile."""
    for entry in entries:
        if not isinstance(entry, str) or not entry:
            raise ValueError(f"{key} entry {entry!r} must be a non-empty string (a name substring, 're:<regex>' or "
                             f"'{ALL_MATRICES}')")
        check_regex(entry, key)


def muon_names(named: Iterable[tuple[str, torch.Tensor]], muon_params: Sequence[str], adam_params: Sequence[str],
               prefix: str = "optimizer") -> set[str]:
    """The names of the trainable parameters Muon steps; ValueError when a muon_params entry selects no matrix or
    nothing is left for Muon."""
    check_entries(muon_params, f"{prefix}.muon_params")
    check_entries(adam_params, f"{prefix}.adam_params")
    matrices = [name for name, p in named if p.requires_grad and p.ndim >= 2]
    for entry in muon_params:
        if not any(entry_selects(name, entry) for name in matrices):
            raise ValueError(f"{prefix}.muon_params entry {entry!r} selects no trainable matrix of the model; its "
                             f"matrices are named like {', '.join(matrices[:3]) or '(none)'}")
    chosen = {name for name in matrices if any(entry_selects(name, e) for e in muon_params)
              and not any(entry_selects(name, e) for e in adam_params)}
    if not chosen:
        raise ValueError(f"optimizer=muon leaves Muon no parameter: {prefix}.adam_params={list(adam_params)} takes "
                         f"every matrix {prefix}.muon_params={list(muon_params)} selects; narrow adam_params")
    return chosen


def split_muon_groups(module: nn.Module, groups: list[dict], muon_params: Sequence[str], adam_params: Sequence[str],
                      adam_lr: float | None) -> list[dict]:
    """Each parameter group split in two: its Muon half (use_muon true) and its Adam half (use_muon false, lr =
    adam_lr when set and the group sets no lr of its own, DeepSpeed's precedence). A half with no parameters is dropped;
    the other options of a group go to both halves."""
    named = list(module.named_parameters())
    names = muon_names(named, muon_params, adam_params)
    chosen = {id(p) for name, p in named if name in names}
    out = []
    for group in groups:
        options = {k: v for k, v in group.items() if k != "params"}
        muon = [p for p in group["params"] if id(p) in chosen]
        adam = [p for p in group["params"] if id(p) not in chosen]
        if muon:
            out.append({**options, "params": muon, "use_muon": True})
        if adam:
            own_lr = {"lr": adam_lr} if adam_lr is not None and "lr" not in options else {}  # a group's own wins
            out.append({**options, **own_lr, "params": adam, "use_muon": False})
    return out
