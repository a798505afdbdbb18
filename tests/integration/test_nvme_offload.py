"""The multi-process, CLI and launcher tests (marked slow) whose in-process twins are tests/unit/test_nvme_offload.py;
that module's docstring describes both halves.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.paths import REPO
from tests.unit.test_nvme_offload import _files

ROOT = REPO


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_peak_rss_of_the_optimizer_step_follows_the_pool_not_the_model(tmp_path):
    """Two model sizes (16M and 64M parameters): torch's AdamW grows the step's peak RSS by its new states
    (2 x 4 bytes per parameter); NVMeOptimizer's growth stays at its pool (4 buffers of 4 MiB) plus one
    unit's transient first-step states, the same for both sizes."""
    def grow(millions: float, mode: str) -> float:
        out = subprocess.run([sys.executable, "-m", "tests.helpers.nvme_rss", str(millions), mode, str(tmp_path)],
                             cwd=ROOT, capture_output=True, text=True, timeout=200, check=True)
        return json.loads(out.stdout.splitlines()[-1])["grow_mib"]

    torch_small, torch_large = grow(16, "torch"), grow(64, "torch")
    nvme_small, nvme_large = grow(16, "nvme"), grow(64, "nvme")
    assert torch_large - torch_small > 300  # 48M more parameters x 8 bytes = 366 MiB
    assert nvme_small < 64 and nvme_large < 64  # pool 16 MiB + one unit's fresh states 8 MiB + slack (36 MiB measured)
    assert abs(nvme_large - nvme_small) < 12
    assert _files(tmp_path) == []


# ------------------------------------------------------------------------------------------- scratch files at exit


_CRASHING = """
import sys, torch
from torch import nn
from dsrecipes.distributed.config import AioConfig
from dsrecipes.distributed.offload.aio import AsyncIO
from dsrecipes.distributed.offload.optimizer_swapper import NVMeOptimizer
model = nn.Linear(64, 64)
opt = NVMeOptimizer(torch.optim.AdamW(model.parameters()), AsyncIO(AioConfig()), sys.argv[1], 4, 8192)
model(torch.randn(2, 64)).sum().backward()
opt.step()
print("stepped", flush=True)
if sys.argv[2] == "raise":
    raise RuntimeError("boom")
import os, signal
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("how", ["raise", "sigkill"])
def test_no_swap_file_outlives_a_run_that_fails(tmp_path, how):
    out = subprocess.run([sys.executable, "-c", _CRASHING, str(tmp_path / "swap"), how], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert "stepped" in out.stdout and out.returncode != 0
    assert _files(tmp_path) == []


# ------------------------------------------------------------------------------------------- the CLI, end to end


def _offload(device: str, swap: Path) -> list[str]:
    args = [f"zero.offload_optimizer={device}", f"zero.offload_param={device}"]
    if device == "nvme":  # buffer_size 70000: several swap units (gpt_debug's largest shard is 65536 at world 1)
        args += [f"zero.nvme_path={swap}", "zero.buffer_size=70000"]
    return args


def _run(folder: Path, name: str, world: int, device: str, extra: list[str], cache: str):
    from tests.helpers.equivalence import common, run_and_read

    swap = folder / f"{name}-swap"
    swap.mkdir()
    losses, params = run_and_read(folder, name, common(cache) + [
        "zero.stage=3", f"launcher.nproc_per_node={world}", f"trainer.train_micro_batch_size_per_gpu={8 // world}",
        *_offload(device, swap), *extra])
    assert _files(swap) == []  # the swap files went with the workers
    (summary,) = list((folder / name).glob("outputs/*/*/summary.json"))
    return losses, params, json.loads(summary.read_text())


@pytest.fixture(scope="module")
def offload_runs(tmp_path_factory, datasets_cache):
    """CPU and NVMe offload at world 1 and 2 (accumulation 2, clipping; the world-2 runs save at step 5)."""
    folder = tmp_path_factory.mktemp("nvme_offload")
    runs = {}
    for world in (1, 2):
        for device in ("cpu", "nvme"):
            extra = ["checkpoint.interval=5"] if world == 2 else []
            runs[world, device] = _run(folder, f"w{world}-{device}", world, device, extra, datasets_cache)
    return folder, runs


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [1, 2])
def test_nvme_offload_trains_bitwise_like_cpu_offload(offload_runs, world):
    _, runs = offload_runs
    cpu_losses, cpu_params, _ = runs[world, "cpu"]
    nvme_losses, nvme_params, summary = runs[world, "nvme"]
    assert len(nvme_losses) == 10 and nvme_losses[-1] < nvme_losses[0] - 0.3
    assert nvme_losses == cpu_losses  # bitwise
    for name, value in cpu_params.items():
        assert torch.equal(nvme_params[name], value), name
    assert "NVMe offload of optimizer states and parameter shards under" in summary["layout"]
    metrics = summary["metrics"]
    assert metrics["nvme/read_gib"] > 0 and metrics["nvme/written_gib"] > 0 and metrics["nvme/io_gib_per_s"] > 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_estimator_matches_the_measured_swap_files_and_pools(offload_runs, datasets_cache):
    """plan_offload (the estimator's NVMe model, from the parameter shapes alone) against the sizes rank 0's
    swappers allocated, byte for byte (both pack the shards in the optimizer's decay-group order)."""
    from dsrecipes.config import validate_recipe
    from dsrecipes.config.nvme_checks import nvme_plan
    from dsrecipes.config.store import compose
    from dsrecipes.config.validate import parallel_dims
    from tests.helpers.equivalence import common

    folder, runs = offload_runs
    for world in (1, 2):
        metrics = runs[world, "nvme"][2]["metrics"]
        swap = folder / f"w{world}-nvme-swap"
        root, _ = validate_recipe(compose([*common(datasets_cache), "zero.stage=3", f"launcher.nproc_per_node={world}",
                                           f"trainer.train_micro_batch_size_per_gpu={8 // world}",
                                           *_offload("nvme", swap)]), dp_world_size=world)
        plan = nvme_plan(root, parallel_dims(root, world))
        mib = 2 ** 20
        assert metrics["nvme/param_file_mib"] == pytest.approx(plan.param_file / mib, abs=1e-9)
        assert metrics["nvme/param_pool_mib"] == pytest.approx(plan.param_pool / mib, abs=1e-9)
        assert metrics["nvme/optimizer_pool_mib"] == pytest.approx(plan.optimizer_pool / mib, abs=1e-9)
        assert metrics["nvme/optimizer_file_mib"] == pytest.approx(plan.optimizer_file / mib, abs=1e-9)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("saved, resumed", [("nvme", "cpu"), ("cpu", "nvme")])
def test_a_checkpoint_resumes_across_offload_devices(offload_runs, datasets_cache, saved, resumed):
    """World-2 checkpoints at step 5 hold ordinary state (no swap files): resuming with the other offload
    device continues bitwise with the uninterrupted run's losses and parameters."""
    folder, runs = offload_runs
    (checkpoint,) = list((folder / f"w2-{saved}").glob("outputs/*/*/checkpoints/step_5"))
    losses, params, _ = _run(folder, f"resume-{saved}-to-{resumed}", 2, resumed, [f"trainer.resume={checkpoint}"],
                             datasets_cache)
    ref_losses, ref_params, _ = runs[2, saved]
    assert losses == ref_losses[5:]
    for name, value in ref_params.items():
        assert torch.equal(params[name], value), name
