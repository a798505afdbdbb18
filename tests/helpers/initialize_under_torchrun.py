"""Run by torchrun in tests/integration/test_library_launch.py: dsrecipes.initialize with no init_process_group first.

    torchrun --standalone --nproc-per-node 2 tests/helpers/initialize_under_torchrun.py STAGE OUT.json
"""

import json
import sys

import torch
import torch.distributed as dist

import dsrecipes


def main() -> None:
    stage, out = int(sys.argv[1]), sys.argv[2]
    assert not dist.is_initialized()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    engine, _, _, _ = dsrecipes.initialize(model=model, config={
        "zero": {"stage": stage}, "trainer": {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4},
        "optimizer": {"lr": 1e-2}})
    rank = dist.get_rank()
    generator = torch.Generator().manual_seed(rank)
    losses = []
    for _ in range(3):
        x = torch.randn(4, 8, generator=generator)
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
        losses.append(float(loss))
    first = [p.detach().clone() for p in engine.module.parameters()][0]
    gathered = [torch.zeros_like(first) for _ in range(dist.get_world_size())] if stage < 2 else None
    if gathered is not None:
        dist.all_gather(gathered, first)  # replicated parameters stay identical across ranks
        assert all(torch.equal(g, gathered[0]) for g in gathered)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"world": dist.get_world_size(), "backend": dist.get_backend(), "losses": losses,
                       "strategy": engine.strategy.name, "steps": engine.global_steps}, f)


if __name__ == "__main__":
    main()
