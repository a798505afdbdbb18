"""Shared fixtures (a session-wide datasets cache, small fast recipe overrides) and the suite-wide rules.

Rules: the Triton interpreter stays inside the kernel tests (a developer's TRITON_INTERPRET is dropped here, and
every other test fails if it finds the variable set or an interpreted kernel loaded: see
tests/helpers/triton_interpreter.py); `gpu` tests are skipped without CUDA; each test's markers go into the
JUnit report as properties, for the per-tier table of tests/durations.py.
"""

from __future__ import annotations

import os

import pytest

from tests.helpers.triton_interpreter import VARIABLE, interpreted_kernels_in_this_process

os.environ.pop(VARIABLE, None)  # the kernel tests set it for themselves, in their own copy of dsrecipes

# Workers that `python -m dsrecipes` starts in tests come from a fork server (launcher.start_method's default,
# see conf/launcher/default.yaml): the test process's own for the commands forked from it (tests/helpers/
# fork_server.py), else the launch's, which imports torch, Hydra and the trainer once
# (dsrecipes.launch.workers.FORKSERVER_PRELOAD) instead of once per worker. Not fork: a worker forked from the
# launcher while the elastic agent's store thread held glibc's resolver lock waited on it forever at its first
# connect (stacks taken from CI-like runs, 2026-12-03: a few multi-rank runs per suite hung that way). The
# restart test in tests/integration/test_distributed.py keeps spawn, users' default.
os.environ.setdefault("DSRECIPES_START_METHOD", "forkserver")
if os.environ.get("PYTEST_XDIST_WORKER") and (os.environ.get("PYTEST_XDIST_WORKER_COUNT") or "1") != "1":
    # Several test processes share the cores: one intra-op thread each (and in the runs they start),
    # or OpenMP's spinning threads oversubscribe them and everything slows several times over.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def datasets_cache(tmp_path_factory) -> str:
    """One datasets cache for the whole session and every xdist worker, so the corpus is tokenized once."""
    from tests.helpers.run_cache import shared_datasets_cache

    return shared_datasets_cache(tmp_path_factory)


@pytest.fixture
def fast_overrides(datasets_cache) -> list[str]:
    """A recipe that trains in seconds: debug model, short blocks, a 300 kB slice of the corpus."""
    return [
        "model=gpt_debug",
        "model.max_seq_len=64",
        "data.max_bytes=300000",
        f"data.cache_dir={datasets_cache}",
        "trainer.max_steps=20",
        "trainer.train_micro_batch_size_per_gpu=8",
        "trainer.log_interval=5",
        "trainer.eval_interval=10",
        "trainer.eval_batches=4",
        "trainer.sample_tokens=16",
        "trainer.progress_bar=false",
        "lr_scheduler.warmup_num_steps=5",
    ]


def pytest_collection_modifyitems(config, items):
    """The documentation examples first (README.md and docs/): their module is the suite's longest (one shared run
    of every example), and xdist's loadscope hands modules out in this order, so it runs beside the rest instead
    of after it.
    The tiers: every test in tests/integration is `slow`; none in tests/unit may be.
    Tests marked `gpu` need CUDA: skipped (with the reason) on machines without it."""
    items.sort(key=lambda item: item.nodeid.split("::")[0] != "tests/docs/test_doc_examples.py")  # stable
    for item in items:
        tier = _tier(item)
        if tier == "integration":
            item.add_marker(pytest.mark.slow)  # every integration test: `pytest -m "not slow"` is the quick loop
        elif tier == "unit" and "slow" in item.keywords:
            raise pytest.UsageError(f"{item.nodeid} is marked slow but sits in tests/unit, the quick loop: move it to "
                                    "tests/integration")
        item.user_properties += [("marker", name) for name in ("slow", "matrix", "gpu") if name in item.keywords]
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def single_gpt(tmp_path_factory):
    """The equivalence table's gpt reference (tests/integration/equivalence/table.py: one process, micro-batch 8 x
    accumulation 2), trained once for the whole run (tests/helpers/run_cache.py): (losses, exported state dict), for
    the launcher and node tests that hold their runs against it."""
    from tests.helpers.run_cache import cached_run
    from tests.integration.equivalence.table import GPT

    run = cached_run(tmp_path_factory, GPT.overrides())
    return run.losses, run.params


@pytest.fixture(autouse=True)
def _no_triton_interpreter_outside_the_kernel_tests(request):
    """Every test outside tests/unit/kernels runs with the kernels' torch paths: no TRITON_INTERPRET, no kernel
    decorated under the interpreter in this process (the kernel tests' copy of dsrecipes is swapped out)."""
    if _is_kernel_test(request.node):
        yield
        return
    assert VARIABLE not in os.environ, f"{VARIABLE}={os.environ[VARIABLE]} leaked out of the kernel tests"
    assert not interpreted_kernels_in_this_process(), "an interpreted kernel leaked out of the kernel tests"
    yield


def pytest_collection_finish(session):
    """Take what collection built (torch, Hydra, every imported module: ~0.5 M objects per test process) out of the
    cyclic garbage collector's sight (gc.freeze), and collect less often: thresholds (10000, 10, 100) instead of
    Python's (700, 10, 10), so a full pass waits for ~11 M net allocations instead of ~85 K.

    Why: Python's full collections walk every tracked object again. Measured on the unit tier (2026-12-04): 29-35
    of them per xdist worker cost 13-16 s of its ~110 s, and the whole collector 16-19 s; after this, 8-9 full
    passes and about 6 s. Garbage the tests make is still collected, by the same collector, in fewer, larger passes;
    nothing a test checks depends on when (the tests that need it call gc.collect() themselves). The cost: garbage
    in reference cycles that reaches the oldest generation (a fixture's model, a traceback holding tensors) waits
    longer to be freed, so a test process's memory can peak higher between passes."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(10000, 10, 100)


def _tier(item) -> str:
    """unit, integration or docs: the folder under tests/ the test sits in."""
    parts = item.path.relative_to(item.config.rootpath / "tests").parts
    return parts[0] if len(parts) > 1 else "tests"


def _is_kernel_test(node) -> bool:
    return "kernels" in node.path.parent.parts[-1:]
