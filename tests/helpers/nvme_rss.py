"""Peak RSS growth of one optimizer step, torch's AdamW vs NVMeOptimizer (a script tests/integration/test_nvme_offload.py
runs).

    python -m tests.helpers.nvme_rss PARAMS_MILLIONS MODE SWAP_DIR     # MODE: torch | nvme

Prints one JSON line: {"grow_mib": ...}: the peak resident set (VmHWM, reset through /proc/self/clear_refs
just before the step) minus the RSS before it, for the first step, which is where the optimizer state
comes into being. A fresh process per measurement keeps other allocations out of the figure.
"""

from __future__ import annotations

import json
import sys


def _status(key: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def main() -> None:
    import torch
    from torch import nn

    from dsrecipes.distributed.config import AioConfig
    from dsrecipes.distributed.offload.aio import AsyncIO
    from dsrecipes.distributed.offload.optimizer_swapper import NVMeOptimizer

    millions, mode, directory = float(sys.argv[1]), sys.argv[2], sys.argv[3]
    torch.set_num_threads(1)
    width = 1024
    layers = max(1, round(millions * 1e6 / (width * width)))
    model = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(layers)])
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    if mode == "nvme":
        optimizer = NVMeOptimizer(optimizer, AsyncIO(AioConfig()), directory, buffer_count=4, buffer_size=width * width)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = _status("VmRSS")
    optimizer.step()
    grow = _status("VmHWM") - before
    print(json.dumps({"grow_mib": grow / 2**20, "layers": layers}))


if __name__ == "__main__":
    main()
