"""Tests of dsrecipes.data: sources, tokenizers, split/pack/cache, resumable batches (CPU, offline, fast)."""



from dsrecipes.data import (
    prepare_data,
)
from tests.unit.test_data import (
    builtin_cache,  # noqa: F401 - fixtures, used by name
    builtin_cfg,
    prepared,  # noqa: F401
)


def test_num_proc_does_not_change_the_blocks(prepared, tmp_path):
    parallel = prepare_data(builtin_cfg(tmp_path / "cache", num_proc=2))
    assert list(parallel.train["tokens"]) == list(prepared.train["tokens"])
    assert list(parallel.validation["tokens"]) == list(prepared.validation["tokens"])
