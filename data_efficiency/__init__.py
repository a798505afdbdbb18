"""dsrecipes.data_efficiency: curriculum learning, data analysis, random-LTD (installed from data_efficiency/).

Import as `dsrecipes.data_efficiency`. A plain Python library usable without Hydra (depends on torch only).

Landed so far:

* `curriculum`: `CurriculumConfig` / `CurriculumScheduler`, DeepSpeed's curriculum pacing functions
  (``fixed_linear``, ``fixed_root``, ``fixed_discrete``, ``custom``) with DeepSpeed's key names.
* `seqlen`: `SeqlenCurriculum`, a batch hook truncating ``input_ids``/``labels`` to the curriculum's
  sequence length, with kept/saved token accounting.

Not yet: offline data analysis / data sampling, dynamic batching, random-LTD.
"""

from .curriculum import SCHEDULE_TYPES, CurriculumConfig, CurriculumScheduler, resolve_custom_fn
from .seqlen import SEQLEN_MODES, SeqlenCurriculum

__all__ = [
    "SCHEDULE_TYPES",
    "SEQLEN_MODES",
    "CurriculumConfig",
    "CurriculumScheduler",
    "SeqlenCurriculum",
    "resolve_custom_fn",
]
