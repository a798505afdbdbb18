"""The multi-process, CLI and launcher tests (marked slow) whose in-process twins are tests/unit/test_sparse_attention.py;
that module's docstring describes both halves.
"""

from __future__ import annotations

import pytest
import torch

from dsrecipes.models import GPT
from dsrecipes.models.config import ModelConfig
from dsrecipes.models.sparse_attention import (
    SparseAttentionConfig,
    apply_sparse_attention,
)
from tests.unit.test_sparse_attention import ATOL


def _worker_sparse_under_ulysses(rank: int, world: int) -> None:
    """Ulysses wraps the sparse attention_fn; each rank's logits equal the single-process sparse model's."""
    import copy

    import torch.distributed as dist

    from dsrecipes.distributed.sequence_parallel import SequenceParallel, UlyssesAttention

    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=4, d_model=64, max_seq_len=32, vocab_size=64)
    ref = GPT(cfg)
    apply_sparse_attention(ref, SparseAttentionConfig(mode="bslongformer", block=4), cfg.n_head)  # 8 blocks, window 3
    ids = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(1))
    ref_logits = ref(ids).logits
    model = copy.deepcopy(ref)
    sp = SequenceParallel(dist.group.WORLD)
    sp.install(model)  # what build_engine does after the model transforms (sparse attention) ran
    assert all(isinstance(b.attn.attention_fn, UlyssesAttention) for b in model.blocks)
    local = sp.shard({"input_ids": ids, "labels": ids})
    out = model(local["input_ids"], position_offset=local["position_offset"])
    chunk = 32 // world
    torch.testing.assert_close(out.logits, ref_logits[:, rank * chunk:(rank + 1) * chunk], rtol=1e-5, atol=ATOL)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sparse_attention_composes_with_ulysses_sp2():
    from tests.helpers.distributed import run_distributed

    run_distributed(_worker_sparse_under_ulysses, 2, timeout_s=110)
