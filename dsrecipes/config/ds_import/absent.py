"""What a DeepSpeed config leaves out or writes as "auto", resolved once, the same for every entry point.

`dsrecipes.initialize(config=...)`, `python -m dsrecipes deepspeed_config=PATH` and the experiment
file of `convert_ds_config` all read the Translation these functions finish, so a file trains the
same way whichever door it comes in by: the translation writes numbers, never "the recipe's value"
(which was the dataclass default on one path and the conf/ YAML on the other).

Blocks the file leaves out mean what they mean in DeepSpeed:

* no `scheduler` block: DeepSpeed builds no scheduler (`lr_scheduler=None`, engine
  `_configure_lr_scheduler`), so the lr stays the optimizer's at every step: lr_scheduler=constant;
* no `optimizer` block: DeepSpeed steps the optimizer the caller hands it (Hugging Face's Trainer
  builds AdamW from its TrainingArguments); dsrecipes' default option stands in for it, adamw with the
  numbers of its schema, written out and reported;
* ZeRO stage 1 with `offload_optimizer: cpu`: DeepSpeed runs stages 1 and 2 in one optimizer class
  (stage_1_and_2.py) whose update is the same; dsrecipes offloads the optimizer through FSDP2, which
  shards gradients as well, so the file trains as zero.stage=2 (the same losses and lr; less
  memory), and the report says so.

"auto" is resolved by Hugging Face's rules (transformers' HfTrainerDeepSpeedConfig), here in one
table: each "auto" key takes the dsrecipes key standing for the TrainingArguments field HF reads
(`optimizer.params.lr` <- learning_rate <- optimizer.lr, `gradient_clipping` <- max_grad_norm <-
trainer.gradient_clipping, `train_micro_batch_size_per_gpu` <- per_device_train_batch_size <- the
micro-batch dsrecipes trains with when no batch key is set ...), with the number the schema of that key
gives. A dsrecipes key given beside the file (or on the command line) still wins, as any override does.
"""

from __future__ import annotations

import copy
import enum
import functools
from collections.abc import Mapping
from typing import Any

from dsrecipes.config.ds_import.translation import DEFAULT, Fate, Translation, shown

# dsrecipes keys whose schema default is null ("derive it"), with the number "auto" stands for instead
_AUTO_NUMBERS = {
    "trainer.train_micro_batch_size_per_gpu": ("DEFAULT_MICRO_BATCH_SIZE", "the micro-batch dsrecipes trains with "
                                                                          "when no batch key is set"),
    "trainer.gradient_accumulation_steps": (1, "no accumulation"),
}


def recipe_default(target: str, t: Translation) -> Any:
    """The number the schema gives the dsrecipes key `target` (the option the translation picks, for optimizer /
    lr_scheduler keys): what "auto" resolves to when nothing beside the file sets the key."""
    if target in _AUTO_NUMBERS:
        value = _AUTO_NUMBERS[target][0]
        if value == "DEFAULT_MICRO_BATCH_SIZE":
            from dsrecipes.training.batch import DEFAULT_MICRO_BATCH_SIZE

            return DEFAULT_MICRO_BATCH_SIZE
        return value
    group, _, rest = target.partition(".")
    from dsrecipes.training.config import OPTION_SCHEMAS

    if group in OPTION_SCHEMAS:
        node, path = _schema_instance(group, t.choices.get(group)), rest
    else:
        node, path = _schema_instance(None, None), target
    for part in path.split("."):
        node = getattr(node, part, None)
    value = node.value if isinstance(node, enum.Enum) else node
    return copy.deepcopy(value)


@functools.cache
def _schema_instance(group: str | None, option: str | None) -> Any:
    """The dataclass of the option (or RootConfig with group None) with its defaults; built once."""
    from dsrecipes.config.schema import RootConfig
    from dsrecipes.training.config import option_schema

    return RootConfig() if group is None else option_schema(group, option)()


def read_absent_blocks(t: Translation, ds: Mapping[str, Any]) -> None:
    """The optimizer and scheduler blocks the file leaves out, as DeepSpeed reads their absence."""
    if ds.get("optimizer") is None:
        t.choose("optimizer", "adamw")
        values = {key: recipe_default(f"optimizer.{key}", t) for key in ("lr", "betas", "eps", "weight_decay")}
        for key, value in values.items():
            t.set(f"optimizer.{key}", value)
        shown_values = ", ".join(f"{k}={shown(v)}" for k, v in values.items())
        t.record("optimizer", "(absent)", DEFAULT,
                 f"optimizer=adamw ({shown_values}): DeepSpeed steps the optimizer its caller passes (Hugging Face: "
                 "AdamW from TrainingArguments); dsrecipes' default option stands in (optimizer=... picks another)")
    if ds.get("scheduler") is None:
        t.choose("lr_scheduler", "constant")
        lr = t.get("optimizer.lr")
        at = f" ({shown(lr)})" if lr is not None else ""
        t.record("scheduler", "(absent)", DEFAULT,
                 f"lr_scheduler=constant: no scheduler block, so DeepSpeed builds none (lr_scheduler=None) and the "
                 f"optimizer's lr{at} holds at every step")


def _recipe_value(recipe: Mapping[str, Any] | None, target: str) -> Any:
    node: Any = recipe or {}
    for part in target.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def after_blocks(t: Translation, recipe: Mapping[str, Any] | None = None) -> None:
    """Resolve every pending "auto" to a number, and the combinations read across blocks.

    recipe: the dsrecipes values the file goes on (dsrecipes.initialize: the keys given beside it; the CLI:
    the recipe composed without the file). An "auto" outside the option groups takes the recipe's number
    where it has one (HF: the TrainingArguments value), else the schema's; in the optimizer / lr_scheduler
    options the file picks, the option's schema number (the recipe's conf/ YAML belongs to its own option).
    """
    from dsrecipes.training.config import OPTION_SCHEMAS

    for target, (key, how) in list(t.pending_autos.items()):
        given = None if target.split(".")[0] in OPTION_SCHEMAS else _recipe_value(recipe, target)
        value = given if given is not None else recipe_default(target, t)
        t.set(target, value)
        why = "the recipe's" if given is not None else \
            _AUTO_NUMBERS[target][1] if target in _AUTO_NUMBERS else "the schema's value"
        t.resolve_auto(key, f"{target}={shown(value)} ({why}; {how})" if how else f"{target}={shown(value)} ({why})")
    t.pending_autos.clear()
    _show_linked_numbers(t, recipe)
    _zero1_offload(t)


def _show_linked_numbers(t: Translation, recipe: Mapping[str, Any] | None) -> None:
    """A null that stands for another key's number (warmup_max_lr -> optimizer.lr) shows that number."""
    links = {"lr_scheduler.warmup_max_lr=null": "optimizer.lr", "lr_scheduler.total_num_steps=null": "trainer.max_steps"}
    for i, fate in enumerate(t.fates):
        for prefix, source in links.items():
            value = next((v for v in (t.get(source), _recipe_value(recipe, source)) if v is not None), None)
            if value is None:
                value = recipe_default(source, t)
            if fate.detail.startswith(prefix) and value is not None:
                t.fates[i] = Fate(fate.key, fate.value, fate.kind,
                                  fate.detail.replace(prefix, f"{prefix} (= {source} = {shown(value)})", 1))


def _zero1_offload(t: Translation) -> None:
    if t.get("zero.stage") != 1 or t.get("zero.offload_optimizer") != "cpu":
        return
    t.set("zero.stage", 2)
    for i, fate in enumerate(t.fates):
        if fate.key == "zero_optimization.stage":
            t.fates[i] = Fate(fate.key, fate.value, fate.kind,
                              "zero.stage=2 (ZeRO-1 with CPU optimizer offload: DeepSpeed runs stages 1 and 2 in one "
                              "optimizer with the same update; dsrecipes offloads through FSDP2, which shards the "
                              "gradients too: the same losses and lr, less memory)")
