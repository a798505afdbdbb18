"""`re:<regex>` entries of the lists that select modules or parameters by qualified name (peft.target_modules,
optimizer.muon_params / adam_params): one spelling, one fullmatch rule, one check of the regex before any work."""

from __future__ import annotations

import re

REGEX_PREFIX = "re:"


def regex_matches(name: str, entry: str) -> bool:
    """Whether the `re:` entry's regex matches the whole of `name` (the caller knows `entry` starts with re:)."""
    return re.fullmatch(entry[len(REGEX_PREFIX):], name) is not None


def check_regex(entry: str, key: str) -> None:
    """ValueError naming `key` when `entry` is a `re:` entry whose regex does not compile; other entries pass."""
    if entry.startswith(REGEX_PREFIX):
        try:
            re.compile(entry[len(REGEX_PREFIX):])
        except re.error as why:
            raise ValueError(f"{key} entry {entry!r} is not a valid regex: {why}") from None
