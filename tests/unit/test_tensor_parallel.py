"""Tensor parallelism (CPU/gloo, through the real CLI) reproduces the single process.

TP=2 at world size 2 (dp 1), and dp 2 x tp 2 under ZeRO-3 at world size 4, train gpt_debug on the
same global batch as one process, with the default sequence-parallel activations (the replicated
layout, and Llama-style models with grouped-query attention, are checked layer by layer in
tests/integration/test_tensor_parallel_layouts.py).
Tolerance as tests/integration/equivalence/table.py: losses within 2e-5, exported parameters within 5e-5 over 10
steps; the differences are fp32 summation orders (matmuls split over the hidden dimension and summed
by all-reduce, vocab-parallel lookups).
"""


from tests.helpers.equivalence import (
    assert_refused,
)


def test_bad_parallel_layouts_are_refused_naming_the_keys():
    """Checked by validate_recipe, which the CLI runs before spawning (tests/integration/test_distributed.py shows that path)."""
    cases = {
        ("parallel.tp=3", "launcher.nproc_per_node=2"):
            "parallel.tp=3 x parallel.sp=1 x parallel.pp=1 = 3 does not divide the world size 2",
        ("parallel.tp=2", "model.n_head=3", "model.d_model=96", "launcher.nproc_per_node=2"):
            "parallel.tp=2 does not divide model.n_head=3",
        ("parallel.tp=2", "launcher.nproc_per_node=4"): "parallel.tp=2 with 2 data-parallel ranks needs zero.stage 2 or 3",
        ("parallel.tp=2", "moe=top2", "moe.ep_size=2", "launcher.nproc_per_node=2"):
            "moe.ep_size=2 must divide the data-parallel size 1 (= world / parallel.tp",
        ("parallel.tp=2", "optimizer.impl=foreach", "launcher.nproc_per_node=2"): "parallel.tp=2 with optimizer.impl=foreach",
        ("parallel.tp=2", "data.block_size=63", "launcher.nproc_per_node=2"): "needs data.block_size divisible by 2",
    }
    assert_refused(cases)
