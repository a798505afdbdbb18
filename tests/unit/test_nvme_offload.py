"""ZeRO-Infinity NVMe offload (dsrecipes.distributed.offload): the I/O engine, the swap files, the optimizer
and parameter swappers, start-up checks, and the CLI equivalence with CPU offload.

Equivalence is bitwise: NVMe offload moves the same fp32 bytes through files that CPU offload keeps in
memory, and the optimizer steps each swap unit with the configured optimizer itself (per-parameter
updates), so losses and exported parameters must be identical, not merely close.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from dsrecipes.distributed.config import AioConfig
from dsrecipes.distributed.offload.aio import AsyncIO, aligned_buffer
from dsrecipes.distributed.offload.optimizer_swapper import NVMeOptimizer
from dsrecipes.distributed.offload.plan import pack_units, plan_offload
from dsrecipes.distributed.offload.swap_file import SwapFile, check_nvme_path


def _files(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.is_file()]


# ------------------------------------------------------------------------------------------- I/O engine


@pytest.mark.parametrize("aio", [AioConfig(), AioConfig(block_size=4096, queue_depth=2, thread_count=2),
                                 AioConfig(block_size=8192, single_submit=True, overlap_events=False)])
def test_async_io_writes_and_reads_back_every_byte(tmp_path, aio):
    engine = AsyncIO(aio)
    swap = SwapFile(str(tmp_path), "x.swp", 3 * 2**20)
    data = aligned_buffer(3 * 2**20)
    data.copy_(torch.randint(0, 256, (data.numel(),), dtype=torch.uint8))
    engine.write(swap.fd, data[: 2**20], 0).wait()
    engine.write(swap.fd, data[2**20:], 2**20).wait()
    back = aligned_buffer(3 * 2**20)
    requests = [engine.read(swap.fd, back[i * 2**20:(i + 1) * 2**20], i * 2**20) for i in range(3)]
    for r in requests:
        r.wait()
    assert torch.equal(back, data)
    assert engine.bytes_read == engine.bytes_written == 3 * 2**20 and engine.busy_s > 0
    engine.close()
    swap.close()


def test_swap_files_are_preallocated_and_unlinked_at_once(tmp_path):
    swap = SwapFile(str(tmp_path / "run"), "optimizer.swp", 10**6)
    assert swap.nbytes % 4096 == 0 and swap.nbytes >= 10**6
    assert swap.size_on_disk() >= swap.nbytes  # posix_fallocate reserved the blocks
    assert _files(tmp_path) == []  # no directory entry: the kernel frees the file when the fd closes
    assert swap.direct  # ext4 / xfs take O_DIRECT
    swap.close()


def test_the_nvme_path_check_names_the_key_and_the_problem(tmp_path):
    with pytest.raises(ValueError, match="zero.nvme_path is not set"):
        check_nvme_path(None, 1)
    with pytest.raises(ValueError, match="does not exist"):
        check_nvme_path(str(tmp_path / "missing"), 1)
    with pytest.raises(ValueError, match="is not writable"):
        check_nvme_path("/proc", 1)  # not writable even for root
    with pytest.raises(ValueError, match=r"GiB free but this run's swap files need"):
        check_nvme_path(str(tmp_path), 10**18)
    check_nvme_path(str(tmp_path), 1)


# ------------------------------------------------------------------------------------------- optimizer swapper


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(48, 64), nn.LayerNorm(64), nn.Linear(64, 64), nn.Linear(64, 8, bias=False))


def _groups(model):
    decay = [p for p in model.parameters() if p.ndim == 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    return [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]


def _lamb(params):
    from dsrecipes.training.optim.lamb import Lamb

    return Lamb(params, lr=1e-2)


OPTIMIZERS = {
    "adamw_foreach": lambda params: torch.optim.AdamW(params, lr=1e-2, foreach=True),
    "adam_amsgrad_loop": lambda params: torch.optim.Adam(params, lr=1e-2, amsgrad=True, foreach=False),
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9),
    "adagrad": lambda params: torch.optim.Adagrad(params, lr=1e-2),
    "lamb": _lamb,
}


@pytest.mark.parametrize("name", OPTIMIZERS)
@pytest.mark.parametrize("buffer_count, buffer_size, aio", [
    (4, 5000, AioConfig()),                        # several units, two in flight
    (3, 4200, AioConfig(block_size=4096)),         # one unit in flight for Adam (3 // 2), small blocks
    (8, 10**6, AioConfig(overlap_events=False)),   # the whole model in one unit, no overlap
])
def test_nvme_optimizer_steps_bitwise_like_the_optimizer_it_wraps(tmp_path, name, buffer_count, buffer_size, aio):
    reference, swapped = _model(), _model()
    plain = OPTIMIZERS[name](_groups(reference))
    nvme = NVMeOptimizer(OPTIMIZERS[name](_groups(swapped)), AsyncIO(aio), str(tmp_path), buffer_count, buffer_size)
    torch.manual_seed(1)
    for step in range(4):
        x = torch.randn(8, 48)
        for model, optimizer in ((reference, plain), (swapped, nvme)):
            model(x).square().mean().backward()
            if step == 1:
                model[2].weight.grad = None  # a parameter without a gradient this step keeps its state
            optimizer.step()
            optimizer.zero_grad()
        for a, b in zip(reference.parameters(), swapped.parameters()):
            assert torch.equal(a, b)
    assert not any(torch.is_tensor(v) and v.shape == p.shape for p, s in nvme.state.items() for k, v in s.items()
                   if k != "step")  # between steps no per-element state is held in memory
    with nvme.resident(lambda: False):
        ours, theirs = nvme.state_dict(), plain.state_dict()
    assert ours["param_groups"] == theirs["param_groups"]
    for index, state in theirs["state"].items():
        for key, value in state.items():
            assert torch.equal(ours["state"][index][key], value), (index, key)
    nvme.close()
    assert _files(tmp_path) == []


def test_a_state_loaded_while_resident_is_what_the_next_step_reads(tmp_path):
    reference, swapped = _model(), _model()
    plain = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    nvme = NVMeOptimizer(torch.optim.AdamW(swapped.parameters(), lr=1e-2), AsyncIO(), str(tmp_path), 4, 4200)
    x = torch.randn(8, 48)
    for _ in range(2):
        reference(x).square().mean().backward()
        plain.step()
        plain.zero_grad()
    swapped.load_state_dict(reference.state_dict())
    with nvme.resident(lambda: True):  # a checkpoint load: the states come in through load_state_dict
        nvme.load_state_dict(copy.deepcopy(plain.state_dict()))
    for model, optimizer in ((reference, plain), (swapped, nvme)):
        model(x).square().mean().backward()
        optimizer.step()
    for a, b in zip(reference.parameters(), swapped.parameters()):
        assert torch.equal(a, b)


def test_the_plan_packs_as_the_swapper_and_refuses_a_shard_larger_than_a_buffer():
    assert pack_units([10, 20, 5000, 7], 5020) == [[(0, 0), (1, 16)], [(2, 0)], [(3, 0)]]
    with pytest.raises(ValueError, match="zero.buffer_size=100"):
        pack_units([101], 100)
    plan = plan_offload([(64, 48), (64,), (8, 64)], world=2, state_tensors=2, offload_optimizer="nvme",
                        offload_param="nvme", buffer_count=4, param_buffer_count=5, buffer_size=4096)
    assert plan.device == 0 and plan.largest_shard == 32 * 48
    assert plan.param_pool == 5 * 8192 and plan.optimizer_pool == 2 * 2 * 8192


# ------------------------------------------------------------------------------------------- start-up checks


def test_bad_nvme_settings_fail_validation_naming_the_key(tmp_path):
    from tests.helpers.equivalence import assert_refused

    nvme = ["zero.stage=3", f"zero.nvme_path={tmp_path}", "launcher.nproc_per_node=2"]
    assert_refused({
        ("zero.stage=3", "zero.offload_optimizer=nvme", "launcher.nproc_per_node=2"): "zero.nvme_path is not set",
        ("zero.stage=3", "zero.offload_param=nvme", f"zero.nvme_path={tmp_path}/missing",
         "launcher.nproc_per_node=2"): "does not exist",
        ("zero.stage=3", "zero.offload_param=nvme", "zero.nvme_path=/proc", "launcher.nproc_per_node=2"):
            "is not writable",
        ("zero.stage=2", "zero.offload_param=nvme", f"zero.nvme_path={tmp_path}", "launcher.nproc_per_node=2"):
            "zero.offload_param=nvme needs zero.stage=3",
        ("zero.stage=2", "zero.offload_optimizer=nvme", f"zero.nvme_path={tmp_path}", "launcher.nproc_per_node=2"):
            "zero.offload_optimizer=nvme needs zero.stage=3",
        (*nvme, "zero.offload_param=nvme", "zero.buffer_size=1000"): "raise zero.buffer_size to at least",
        (*nvme, "zero.offload_optimizer=nvme", "zero.buffer_count=1"): "zero.buffer_count=1 is less than the 2",
        (*nvme, "zero.offload_optimizer=nvme", "zero.aio.block_size=5000"): "multiple of 4096",
        (*nvme, "zero.offload_optimizer=nvme", "parallel.tp=2"): "zero.offload_optimizer=nvme with parallel.tp",
    })


def test_not_enough_free_space_fails_before_any_worker_starts(tmp_path, monkeypatch):
    import shutil

    from tests.helpers.equivalence import assert_refused

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=10_000))
    assert_refused({("zero.stage=3", "zero.offload_optimizer=nvme", f"zero.nvme_path={tmp_path}",
                     "launcher.nproc_per_node=2"): "GiB free but this run's swap files need"})


def test_deepspeed_nvme_blocks_map_onto_the_zero_keys():
    from dsrecipes.config.loading import load_config
    from dsrecipes.config.validate import to_root

    zero = to_root(load_config({
        "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/nvme", "buffer_size": 1e7,
                                                            "buffer_count": 6, "max_in_cpu": 1e9},
                              "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme", "buffer_count": 8,
                                                    "pin_memory": False, "pipeline_read": True}},
        "aio": {"block_size": 262144, "queue_depth": 16, "intra_op_parallelism": 2, "single_submit": True,
                "overlap_events": False}})).zero
    assert (zero.offload_param, zero.offload_optimizer, zero.nvme_path) == ("nvme", "nvme", "/nvme")
    assert (zero.buffer_count, zero.param_buffer_count, zero.buffer_size, zero.pin_memory) == (8, 6, 10**7, False)
    assert (zero.aio.block_size, zero.aio.queue_depth, zero.aio.thread_count, zero.aio.single_submit,
            zero.aio.overlap_events) == (262144, 16, 2, True, False)


def test_the_estimate_command_places_offloaded_states_on_device_host_and_nvme(capsys):
    from dsrecipes.estimate import main

    main(["model=gpt_debug", "zero.stage=3", "zero.offload_optimizer=nvme", "zero.offload_param=nvme",
          "zero.buffer_size=4000000", "world_size=2"])
    out = capsys.readouterr().out
    assert "offload_optimizer=nvme" in out and "NVMe GiB" in out and "parameter pool MiB" in out
    with pytest.raises(SystemExit, match="raise zero.buffer_size"):
        main(["model=gpt_debug", "zero.stage=3", "zero.offload_param=nvme", "zero.buffer_size=100", "world_size=2"])
