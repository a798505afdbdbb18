"""The autotuner: ZeRO stage x micro-batch (x activation checkpointing, x CPU offload) measured by short trials,
pruned first by dsrecipes' memory estimator (DeepSpeed's `autotuning`, reference section 6.5).

    python -m dsrecipes -m hydra/sweeper=autotune +experiment=gpt_tiny hydra.sweeper.max_memory_gib=8
    python -m dsrecipes.autotune +experiment=gpt_tiny tuner_type=random      # the same, shorter

config (the keys), space (candidates), pruning (memory estimate vs cap), tuners (order and stopping),
results (table, CSV, chart, best experiment), recipe (what is read from the recipe), session (the whole run).
The Hydra side is hydra_plugins/dsrecipes_autotune (the Sweeper that launches trials as Hydra jobs).
"""

from dsrecipes.utils.lazy_exports import lazy_exports

_EXPORTS = {
    "AutotuneConfig": "dsrecipes.profiling.autotuning.config",
    "Metric": "dsrecipes.profiling.autotuning.config",
    "TunerType": "dsrecipes.profiling.autotuning.config",
    "validate_autotune_config": "dsrecipes.profiling.autotuning.config",
    "NoCandidateFits": "dsrecipes.profiling.autotuning.pruning",
    "RecipeMemory": "dsrecipes.profiling.autotuning.pruning",
    "plan_candidates": "dsrecipes.profiling.autotuning.pruning",
    "Candidate": "dsrecipes.profiling.autotuning.space",
    "Group": "dsrecipes.profiling.autotuning.space",
    "micro_batch_sizes": "dsrecipes.profiling.autotuning.space",
    "search_groups": "dsrecipes.profiling.autotuning.space",
}

__all__ = [
    "AutotuneConfig", "Candidate", "Group", "Metric", "NoCandidateFits", "RecipeMemory", "TunerType",
    "micro_batch_sizes", "plan_candidates", "search_groups", "validate_autotune_config",
]


# Lazy, so that the autotune sweeper plugin, which `python -m dsrecipes` registers at start-up, imports its
# schema (autotuning.config) without pruning's memory estimator, which imports torch.
__getattr__ = lazy_exports(__name__, _EXPORTS)
