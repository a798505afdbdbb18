"""The autotuner: ZeRO stage x micro-batch (x activation checkpointing, x CPU offload) measured by short trials,
pruned first by dsrecipes' memory estimator (DeepSpeed's `autotuning`, reference section 6.5).

    python -m dsrecipes -m hydra/sweeper=autotune +experiment=gpt_tiny hydra.sweeper.max_memory_gib=8
    python -m dsrecipes.autotune +experiment=gpt_tiny tuner_type=random      # the same, shorter

config (the keys), space (candidates), pruning (memory estimate vs cap), tuners (order and stopping),
results (table, CSV, chart, best experiment), recipe (what is read from the recipe), session (the whole run).
The Hydra side is hydra_plugins/dsrecipes_autotune (the Sweeper that launches trials as Hydra jobs).
"""

from dsrecipes.profiling.autotuning.config import AutotuneConfig, Metric, TunerType, validate_autotune_config
from dsrecipes.profiling.autotuning.pruning import NoCandidateFits, RecipeMemory, plan_candidates
from dsrecipes.profiling.autotuning.space import Candidate, Group, micro_batch_sizes, search_groups

__all__ = [
    "AutotuneConfig", "Candidate", "Group", "Metric", "NoCandidateFits", "RecipeMemory", "TunerType",
    "micro_batch_sizes", "plan_candidates", "search_groups", "validate_autotune_config",
]
