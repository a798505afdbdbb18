"""Expert parallelism at world size 2 (CPU/gloo, through the real CLI) reproduces the single process.

EP=2: each worker holds 2 of the 4 experts of every MoE block; tokens travel by all_to_all. The
single-process reference sees the same micro-batches (micro 4 x accumulation 4 vs 2 ranks x micro
4 x accumulation 2: BatchIterator hands rank r's i-th micro-batch to the single process as its
(2i + r)-th), so gating, capacity, dropped tokens and the auxiliary loss are computed over the same
token groups. Random routing choices are off (use_rts=false, no second-expert sampling: their
random streams differ per rank).

Tolerance: as tests/integration/equivalence/table.py (losses 2e-5 absolute, exported parameters 5e-5 over 10
steps); the only differences are fp32 summation orders (gradients summed across ranks, and over the
EP group by the all_to_all backward).
"""

import torch

from tests.helpers.equivalence import (
    assert_refused,
)


def test_bad_moe_layouts_are_refused_naming_the_keys():
    """Checked by validate_recipe, which the CLI runs before spawning (tests/integration/test_distributed.py shows that path)."""
    cases = {
        ("moe.num_experts=3", "moe.ep_size=2", "launcher.nproc_per_node=2"):
            "moe.num_experts=3 is not divisible by moe.ep_size=2",
        ("moe.num_experts=4", "moe.k=5"): "moe.k=5 must be between 1 and moe.num_experts=4",
        ("moe.num_experts=4", "moe.capacity_factor=0"): "moe.capacity_factor=0.0 must be > 0",
        ("moe.num_experts=4", "moe.ep_size=4", "launcher.nproc_per_node=2"): "moe.ep_size=4 must divide the world size 2",
    }
    assert_refused(cases)


def test_stage_loss_gradient_equals_adding_the_term_to_the_loss():
    """add_loss_gradient(x, term, s): x's backward also gives term the gradient s, as loss + term would."""
    from dsrecipes.distributed.pipeline_loss_terms import add_loss_gradient

    torch.manual_seed(0)
    w = torch.randn(4, 3, requires_grad=True)
    x = torch.randn(2, 4)

    def run(inject: bool):
        w.grad = None
        h = x @ w
        term = (h ** 2).mean()
        out = add_loss_gradient(h * 2, term, 8.0) if inject else h * 2
        loss = out.sum() * 8.0 + (0 if inject else term * 8.0)
        loss.backward()
        return w.grad.clone()

    torch.testing.assert_close(run(True), run(False))
