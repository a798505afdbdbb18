"""DeepSpeed configs in: a DeepSpeed JSON file or dict translated onto dsrecipes' config groups.

    engine, *_ = dsrecipes.initialize(model=net, config="ds_config.json")
    python -m dsrecipes deepspeed_config=ds_config.json trainer.max_steps=200   # overrides still win
    python -m dsrecipes.convert_ds_config ds_config.json > conf/experiment/mine.yaml

`translate(ds)` reads every key, top-level and nested, with the tables of this package (top_level,
zero, precision, optimizer, data_efficiency, model_blocks) and returns a `Translation`: the
dsrecipes values, the optimizer / lr_scheduler options, and each key's fate (mapped, auto,
default, no effect, refused; see translation.py). Keys dsrecipes cannot honour the same way, or that
DeepSpeed refuses too, are refused with the reason, all of them named in one ValueError before any
work starts; keys that only change speed, memory or logs, and top-level keys DeepSpeed does not read
(`_comment`, `cuda_visible_devices`: DeepSpeed ignores them), are accepted and reported with no effect.

Which values count (the rules every block follows; the same for initialize, the CLI and convert_ds_config):
* a key the config gives maps onto its dsrecipes key, converted to dsrecipes' spelling;
* a block the config gives means what it means in DeepSpeed: the keys it leaves out take
  DeepSpeed's defaults (Adam's betas 0.999, fp16's hysteresis 2, WarmupLR's 1000 warmup steps ...);
* a block the config leaves out means what its absence means in DeepSpeed (ds_import.absent): no
  scheduler block, a constant lr; no optimizer block, adamw with its schema's numbers standing in for the
  caller's optimizer;
* "auto" is resolved as Hugging Face's integration resolves it, to a number, in one place
  (ds_import.absent): lr -> the optimizer option's schema lr, warmup_min_lr -> 0, total_num_steps ->
  trainer.max_steps, the micro-batch -> the recipe's (16 when it sets none), train_batch_size -> derived
  from the other two ...; a dsrecipes key given beside the file wins;
* the batch triple follows DeepSpeed's rule: any of the three given makes the others not given
  (null) unless given too, so a default never counts as given (see precision.read_batch).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import Any, get_type_hints

from dsrecipes.config.ds_import.absent import after_blocks, read_absent_blocks
from dsrecipes.config.ds_import.files import read_deepspeed_file
from dsrecipes.config.ds_import.precision import read_batch, read_precision
from dsrecipes.config.ds_import.top_level import TOP_LEVEL
from dsrecipes.config.ds_import.translation import Fate, Translation
from dsrecipes.config.schema import RootConfig

# dsrecipes' own top-level keys (RootConfig's fields), named when one turns up in a DeepSpeed config
_ROOT_KEYS = frozenset(f.name for f in fields(RootConfig))
# read first: the legacy curriculum_learning refuses itself when data_efficiency's curriculum is on
_FIRST = ("data_efficiency",)


def translate(ds: Mapping[str, Any], recipe: Mapping[str, Any] | None = None) -> Translation:
    """Read a DeepSpeed config dict; refused keys are recorded (see Translation.raise_if_refused), not raised.

    recipe: the dsrecipes values the file goes on, which "auto" batch / clipping keys take (ds_import.absent)."""
    if not isinstance(ds, Mapping):
        raise TypeError(f"a DeepSpeed config is a dict (a JSON object), got {type(ds).__name__}")
    t = Translation()
    read_batch(t, ds)
    read_precision(t, ds)
    for key in sorted(ds, key=lambda k: k not in _FIRST):
        rule = TOP_LEVEL.get(key)
        if rule is None:
            _unknown(t, str(key), ds[key])
        else:
            rule.apply(t, str(key), ds[key])
    read_absent_blocks(t, ds)
    after_blocks(t, recipe)
    return t


def _unknown(t: Translation, key: str, value: Any) -> None:
    """A top-level key DeepSpeed does not read: DeepSpeed ignores it, so does dsrecipes (with a line in the report).

    A dsrecipes key written the dsrecipes way (`"model": {"n_layer": 2}`: every sub-key is one of its schema's) is
    refused instead: whoever wrote it expects it to act, and it acts only beside the DeepSpeed config. A block that
    only shares a dsrecipes key's name (LLaMA-Factory's `"fp8": {"enabled": true, ...}`, not dsrecipes' fp8 keys) is
    another tool's, and is ignored as DeepSpeed ignores it."""
    if key in _ROOT_KEYS and key not in TOP_LEVEL:
        beside = (f"set dsrecipes' {key} beside the DeepSpeed config (on the command line, or "
                  f"{{'deepspeed_config': 'ds_config.json', '{key}': ...}})")
        if _written_for_dsrecipes(key, value):
            t.refused(key, value, f"a dsrecipes key, not a DeepSpeed one: {beside}")
        else:
            t.ignored(key, value, f"not a key DeepSpeed reads: DeepSpeed ignores it, and so does dsrecipes "
                                  f"(its keys are not dsrecipes' {key} keys either; {beside})")
        return
    close = difflib.get_close_matches(key, TOP_LEVEL, n=1)
    hint = f" (a typo of {close[0]}?)" if close and not key.startswith("_") else ""
    t.ignored(key, value, f"not a key DeepSpeed reads: DeepSpeed ignores it, and so does dsrecipes{hint}")


def _written_for_dsrecipes(key: str, value: Any) -> bool:
    """True when `value` could configure dsrecipes' root key `key`: a scalar, or a mapping of its schema's keys only."""
    schema = get_type_hints(RootConfig).get(key)
    if not isinstance(value, Mapping):
        return True
    if isinstance(schema, type) and is_dataclass(schema):
        return set(value) <= {f.name for f in fields(schema)}
    return True


def looks_like_deepspeed(config: Mapping[str, Any]) -> bool:
    """A dict is a DeepSpeed config if it has a key only DeepSpeed has, or DeepSpeed's optimizer block (type, params)."""
    if any(key in TOP_LEVEL and key not in _ROOT_KEYS for key in config):
        return True
    optimizer = config.get("optimizer")
    return isinstance(optimizer, Mapping) and ("type" in optimizer or "params" in optimizer)


def load_translation(source: Any, name: str | None = None, recipe: Mapping[str, Any] | None = None) -> Translation:
    """Read (a path or a dict) and translate a DeepSpeed config; ValueError naming every refused key."""
    ds = read_deepspeed_file(source) if not isinstance(source, Mapping) else source
    t = translate(ds, recipe)
    t.raise_if_refused(f"DeepSpeed config {name or (source if not isinstance(source, Mapping) else '(dict)')}")
    return t


__all__ = ["Fate", "Translation", "load_translation", "looks_like_deepspeed", "read_deepspeed_file", "translate"]
