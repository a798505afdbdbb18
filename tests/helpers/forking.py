"""Whether a test may fork its processes from the test process instead of spawning fresh interpreters.

A forked child starts with torch, Hydra and dsrecipes already imported (about 10 s of CPU saved per
process); it is only safe while the test process holds no state a child cannot use: no initialised
process group, no initialised CUDA. DSRECIPES_TEST_FRESH_CLI=1 turns forking off for the whole suite.
"""

from __future__ import annotations

import os


def forking_turned_off() -> bool:
    """DSRECIPES_TEST_FRESH_CLI=1 (fresh interpreters for the whole suite), or a platform without fork."""
    return os.environ.get("DSRECIPES_TEST_FRESH_CLI") == "1" or not hasattr(os, "fork")


def fork_is_safe() -> bool:
    if forking_turned_off():
        return False
    import torch

    group = torch.distributed.is_available() and torch.distributed.is_initialized()
    return not group and not torch.cuda.is_initialized()
