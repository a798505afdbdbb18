"""Registers the recipe schema in Hydra's ConfigStore and composes configs outside @hydra.main.

Stored: RootConfig as `dsrecipes_schema` (first in conf/config.yaml's defaults), and for the
optimizer and lr_scheduler groups one schema per option, `<group>/<option>_schema`, which the
option's YAML extends (`defaults: [<option>_schema, _self_]`). So `optimizer=sgd` composes an
SGDConfig node: a key SGD does not take (`optimizer.betas=...`) fails at composition naming it
and SGDConfig, and Enum fields (every fixed-choice field, e.g. impl, warmup_type) reject other values listing the valid ones.
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from dsrecipes.config.compose_cache import compose_from_merge
from dsrecipes.config.run_directory import config_subdir, run_dir, run_stamp
from dsrecipes.config.schema import RootConfig
from dsrecipes.models.hf_config import register_hf_resolver
from dsrecipes.training.config import OPTION_SCHEMAS
from dsrecipes.training.option_schemas import ExtraArguments

SCHEMA_NAME = "dsrecipes_schema"
CONFIG_MODULE = "dsrecipes.conf"


def option_node(schema: type) -> DictConfig:
    """An option's schema as a config node; a `custom` one (ExtraArguments) also accepts keys it does not list.

    Its struct flag is explicitly off: OmegaConf then lets a typed node take new keys, and the flag
    carries over when the node is merged into the recipe (the class's signature checks them later).
    """
    node = OmegaConf.structured(schema)
    if issubclass(schema, ExtraArguments):
        OmegaConf.set_struct(node, False)
    return node


def _root_schema() -> DictConfig:
    """RootConfig with the option groups left MISSING: the option in the defaults list fills each in.

    RootConfig's own defaults (AdamWConfig, WarmupCosineConfig) would not do here: OmegaConf merges
    a schema only into its own type or a base class of it, never into a sibling such as SGDConfig.
    """
    node = OmegaConf.structured(RootConfig)
    for group in OPTION_SCHEMAS:
        node[group] = MISSING
    return node


_stored: list = []  # the root schema's ConfigNode as this module stored it (empty until the first call)


def register_configs() -> None:
    """Idempotent: store the root schema as `dsrecipes_schema` and each option's `<option>_schema`; add resolvers.

    Building the ~40 structured nodes is a third of a composition's time, and every compose() registers: once
    stored, they are kept while the store still holds this module's root node (nothing else replaces it)."""
    store = ConfigStore.instance()
    if not _stored or store.repo.get(f"{SCHEMA_NAME}.yaml") is not _stored[0]:
        store.store(name=SCHEMA_NAME, node=_root_schema())
        for group, schemas in OPTION_SCHEMAS.items():
            for option, schema in schemas.items():
                store.store(group=group, name=f"{option}_schema", node=option_node(schema))
        _stored[:] = [store.repo[f"{SCHEMA_NAME}.yaml"]]
    for name, resolver in (("run_stamp", run_stamp), ("run_dir", run_dir)):
        if not OmegaConf.has_resolver(name):  # cached: Hydra hands a sweep's cache to each of its jobs
            OmegaConf.register_new_resolver(name, resolver, use_cache=True)
    if not OmegaConf.has_resolver("config_subdir"):  # not cached: it asks where the job's directory is now
        OmegaConf.register_new_resolver("config_subdir", config_subdir)
    register_hf_resolver()  # ${hf_model:PATH,KEY}: conf/model/hf.yaml's fields from a checkpoint's config.json


def compose(overrides: list[str] | None = None, return_hydra_config: bool = False):
    """Compose conf/config.yaml with command-line style overrides, as `python -m dsrecipes` would.

    Without the hydra node, compositions that choose the same group options share one merge
    (dsrecipes.config.compose_cache): ~10 ms instead of ~0.2 s."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from dsrecipes.config.ds_import.cli import apply_deepspeed_argument

    register_configs()
    overrides = apply_deepspeed_argument(list(overrides or []), compose, report=False)  # deepspeed_config=PATH, as the CLI
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        if not return_hydra_config:  # value overrides on a cached merge of the same group choices (compose_cache)
            composed = compose_from_merge("config", overrides, lambda groups: hydra_compose("config", groups))
            if composed is not None:
                return composed
        return hydra_compose(config_name="config", overrides=overrides, return_hydra_config=return_hydra_config)
