"""dsrecipes.data_efficiency: curriculum learning, data analysis, random-LTD (installed from data_efficiency/).

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

from .analyzer import BUILTIN_METRICS, DataAnalyzer, MetricIndex, load_metric_index, token_counts
from .config import (
    CurriculumLearningConfig,
    DataEfficiencyConfig,
    RandomLTDConfig,
    build_curriculum_scheduler,
    build_random_ltd_scheduler,
    validate_data_efficiency_config,
)
from .curriculum import SCHEDULE_TYPES, CurriculumConfig, CurriculumScheduler, resolve_custom_fn
from .random_ltd import RandomLTD, RandomLTDScheduler, find_blocks, layer_token_equivalent_step, validate_layer_ids
from .sampler import DIFFICULTY_TYPES, CurriculumSampler
from .seqlen import SEQLEN_MODES, SeqlenCurriculum

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
