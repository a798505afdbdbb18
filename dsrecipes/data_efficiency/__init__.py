"""dsrecipes.data_efficiency: curriculum learning, data analysis, random-LTD.

Import as `dsrecipes.data_efficiency`. A plain Python library usable without Hydra (torch, numpy; the data
analyzer and the sampler take a Hugging Face ``datasets.Dataset``).

* `curriculum`: `CurriculumConfig` / `CurriculumScheduler`, DeepSpeed's curriculum pacing functions
  (``fixed_linear``, ``fixed_root``, ``fixed_discrete``, ``custom``) with DeepSpeed's key names.
* `seqlen`: `SeqlenCurriculum`, a batch hook cutting ``input_ids``/``labels`` to the curriculum's sequence
  length (``truncate``, or ``pack`` into more, shorter rows), with kept/saved token accounting.
* `analyzer`: `DataAnalyzer`, per-sample metrics (sequence length, vocabulary rarity, any function) with
  ``datasets.map`` and the index files a metric curriculum reads.
* `sampler`: `CurriculumSampler`, deterministic, resumable batches drawn within the current difficulty.
* `random_ltd`: `RandomLTD` / `RandomLTDScheduler`, random layerwise token dropping with layer-token
  accounting (and `layer_token_equivalent_step` for DeepSpeed's layer-token LR schedule).
* `config`: `DataEfficiencyConfig`, the ``data_efficiency`` config group's schema and validation.

Not yet: dynamic batching, DeepSpeed's cluster-by-cluster sampling order (batches are drawn independently).
"""

import importlib

# name -> the module (of this package) defining it
_EXPORTS = {
    "BUILTIN_METRICS": "analyzer",
    "DataAnalyzer": "analyzer",
    "MetricIndex": "analyzer",
    "load_metric_index": "analyzer",
    "token_counts": "analyzer",
    "CurriculumLearningConfig": "config",
    "DataEfficiencyConfig": "config",
    "RandomLTDConfig": "config",
    "build_curriculum_scheduler": "config",
    "build_random_ltd_scheduler": "config",
    "validate_data_efficiency_config": "config",
    "SCHEDULE_TYPES": "curriculum",
    "CurriculumConfig": "curriculum",
    "CurriculumScheduler": "curriculum",
    "resolve_custom_fn": "curriculum",
    "RandomLTD": "random_ltd",
    "RandomLTDScheduler": "random_ltd",
    "find_blocks": "random_ltd",
    "layer_token_equivalent_step": "random_ltd",
    "validate_layer_ids": "random_ltd",
    "DIFFICULTY_TYPES": "curriculum",
    "CurriculumSampler": "sampler",
    "SEQLEN_MODES": "curriculum",
    "SeqlenCurriculum": "seqlen",
}

__all__ = [
    "BUILTIN_METRICS",
    "DIFFICULTY_TYPES",
    "SCHEDULE_TYPES",
    "SEQLEN_MODES",
    "CurriculumConfig",
    "CurriculumLearningConfig",
    "CurriculumSampler",
    "CurriculumScheduler",
    "DataAnalyzer",
    "DataEfficiencyConfig",
    "MetricIndex",
    "RandomLTD",
    "RandomLTDConfig",
    "RandomLTDScheduler",
    "SeqlenCurriculum",
    "build_curriculum_scheduler",
    "build_random_ltd_scheduler",
    "find_blocks",
    "layer_token_equivalent_step",
    "load_metric_index",
    "resolve_custom_fn",
    "token_counts",
    "validate_data_efficiency_config",
    "validate_layer_ids",
]


def __getattr__(name: str):
    # Lazy (PEP 562), so that importing the recipe schema (.config, the `data_efficiency` group's RootConfig field)
    # does not import torch and numpy: `python -m dsrecipes --help` composes the recipe only.
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
