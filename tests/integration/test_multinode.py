"""The multi-process, CLI and launcher tests (marked slow) whose in-process twins are tests/unit/test_multinode.py;
that module's docstring describes both halves.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from tests.helpers.cli import run_cli
from tests.helpers.equivalence import STEPS, assert_matches_single_process, common
from tests.helpers.nodes import free_port, kill_node, launcher_node_args, output, start_node, torchrun_node_args, wait_all


@pytest.mark.parametrize("args, message", [
    (["launcher.nnodes=2"], "launcher.nnodes=2 needs launcher.rdzv_endpoint=HOST:PORT"),
    (["launcher.nnodes=2", "launcher.node_rank=2", "launcher.rdzv_endpoint=h:1"],
     "launcher.node_rank=2 is not valid with launcher.nnodes=2; choose one of: 0, 1"),
    (["launcher.nnodes=2", "launcher.rdzv_endpoint=node0"], "launcher.rdzv_endpoint='node0' is not valid; use HOST:PORT"),
    (["launcher.nnodes=2", "launcher.rdzv_endpoint=node0:99999"], "with a port number in 1-65535"),
    (["launcher.nnodes=0"], "launcher.nnodes=0 must be >= 1"),
])
def test_bad_multinode_keys_fail_before_any_worker_starts(tmp_path, args, message):
    result = run_cli(["model=gpt_debug", "zero.stage=3", "launcher.nproc_per_node=2", *args], cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not list(tmp_path.glob("outputs/*/*/logs"))  # no worker ran


# ---------------------------------------------------------------------------------------------- runs
def _run_dirs(cwd: Path) -> list[Path]:
    return [path for path in cwd.glob("outputs/*/*") if path.is_dir()]


def _losses(run_dir: Path) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["train/loss"]) for r in records if "train/loss" in r]


def _read(run_dir: Path):
    from dsrecipes.models import load_exported

    return [loss for _, loss in _losses(run_dir)], load_exported(run_dir / "export")[0].state_dict()


def _two_nodes(cwd: Path, node_args, overrides: list[str], timeout: int = 360, env_extra=None) -> Path:
    """Both simulated nodes to the end; the one run directory they leave."""
    cwd.mkdir(parents=True, exist_ok=True)
    port = free_port()
    nodes = [start_node(cwd, node_args(2, rank, port) + overrides, f"node{rank}", env_extra) for rank in (0, 1)]
    codes = wait_all(nodes, timeout)
    assert codes == [0, 0], "\n".join(output(cwd, f"node{rank}")[-3000:] for rank in (0, 1))
    (run_dir,) = _run_dirs(cwd)  # one run directory: the other node's launcher removed its own
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == [f"rank{r}.log" for r in range(4)]
    return run_dir


@pytest.mark.matrix
@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("stage, strategy, axis, node_args", [
    (0, "ddp", "dp_replicate", launcher_node_args), (1, "zero1", "dp_replicate", launcher_node_args),
    (2, "zero2", "dp_shard", launcher_node_args), (3, "fsdp2", "dp_shard", torchrun_node_args)],
    ids=["0-ddp-launcher", "1-zero1-launcher", "2-zero2-launcher", "3-fsdp2-torchrun"])
def test_two_nodes_reproduce_single_process_at_every_zero_stage(tmp_path, datasets_cache, single_gpt,
                                                                stage, strategy, axis, node_args):
    """Two simulated nodes x 2 ranks at each ZeRO stage. Stage 3 meets through torchrun on each node (its workers
    are fresh interpreters, as torchrun starts them); stages 0-2 through `python -m dsrecipes launcher.nnodes=2`,
    the same c10d rendezvous and elastic agent with forked workers, a third of the CPU."""
    run_dir = _two_nodes(tmp_path / "nodes", node_args, common(datasets_cache) + [
        f"zero.stage={stage}", "trainer.train_micro_batch_size_per_gpu=2"])
    assert_matches_single_process(*_read(run_dir), *single_gpt)
    layout = json.loads((run_dir / "summary.json").read_text())["layout"]
    assert f"nodes: 2 nodes x 2 ranks: {axis} crosses nodes" in layout
    assert f"data parallel: {strategy}:" in layout


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("layout, crossing", [
    (["parallel.tp=2", "zero.stage=3"], "dp_shard crosses nodes, tp inside a node"),   # TP inside a node, DP across
    (["parallel.pp=2"], "pp crosses nodes, dp_replicate inside a node"),               # one pipeline stage per node
])
@pytest.mark.matrix
def test_model_parallel_layouts_across_two_nodes_reproduce_single_process(tmp_path, datasets_cache, single_gpt,
                                                                          layout, crossing):
    run_dir = _two_nodes(tmp_path / "nodes", launcher_node_args, common(datasets_cache) + layout + [
        "trainer.train_micro_batch_size_per_gpu=4"])
    assert_matches_single_process(*_read(run_dir), *single_gpt)
    assert f"nodes: 2 nodes x 2 ranks: {crossing}" in json.loads((run_dir / "summary.json").read_text())["layout"]


@pytest.mark.matrix
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_hybrid_shard_per_node_via_launcher_keys_and_its_checkpoint_resumes_on_one_node(
        tmp_path, datasets_cache, single_gpt):
    """`python -m dsrecipes launcher.nnodes=2 ...` on each node, HSDP with one shard group per node; the step-5
    checkpoint (one shard file per rank) resumes at 1 node x 2 ranks with the same losses."""
    base = common(datasets_cache) + ["zero.stage=3", "checkpoint.interval=5"]
    run_dir = _two_nodes(tmp_path / "nodes", launcher_node_args, base + [
        "zero.hybrid_shard_size=node", "trainer.train_micro_batch_size_per_gpu=2"])
    losses, params = _read(run_dir)
    assert_matches_single_process(losses, params, *single_gpt)
    layout = json.loads((run_dir / "summary.json").read_text())["layout"]
    assert "replicate 2 x shard 2" in layout
    assert "nodes: 2 nodes x 2 ranks: dp_replicate crosses nodes, dp_shard inside a node" in layout
    checkpoint = run_dir / "checkpoints" / "step_5"
    assert sorted(p.name for p in (checkpoint / "dcp").glob("*.distcp")) == [f"__{r}_0.distcp" for r in range(4)]

    cwd = tmp_path / "one_node"
    cwd.mkdir()
    result = run_cli(base + ["launcher.nproc_per_node=2", "trainer.train_micro_batch_size_per_gpu=4",
                             f"trainer.resume={checkpoint}"], cwd=cwd, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    resumed, resumed_params = _read(_run_dirs(cwd)[0])
    assert len(resumed) == STEPS - 5
    torch.testing.assert_close(torch.tensor(resumed), torch.tensor(losses[5:]), rtol=0, atol=2e-5)
    for name, tensor in params.items():
        torch.testing.assert_close(resumed_params[name], tensor, rtol=0, atol=5e-5, msg=name)


@pytest.mark.matrix
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_killed_node_is_replaced_and_the_job_ends_with_the_uninterrupted_losses(
        tmp_path, datasets_cache, single_gpt):
    """Node 1 (its launcher and both workers) is SIGKILLed after the step-5 checkpoint; node 0's agent restarts its
    workers (launcher.max_restarts=1) and waits at the rendezvous, a replacement node 1 joins, every rank resumes
    from step 5 and the run ends with the single process's losses."""
    cwd = tmp_path / "kill"
    cwd.mkdir()
    port = free_port()
    overrides = common(datasets_cache) + ["zero.stage=3", "trainer.train_micro_batch_size_per_gpu=2",
                                          "checkpoint.interval=5", "launcher.max_restarts=1"]
    node0 = start_node(cwd, launcher_node_args(2, 0, port) + overrides, "node0")
    node1 = start_node(cwd, launcher_node_args(2, 1, port) + overrides, "node1")
    deadline = time.monotonic() + 300
    while not any((d / "checkpoints" / "latest").is_file() and (d / "checkpoints" / "latest").read_text().strip()
                  == "step_5" for d in _run_dirs(cwd)):
        assert time.monotonic() < deadline and node0.poll() is None and node1.poll() is None, output(cwd, "node0")
        time.sleep(0.2)
    kill_node(node1)
    replacement = start_node(cwd, launcher_node_args(2, 1, port) + overrides, "node1_replacement")
    codes = wait_all([node0, replacement], timeout=360)
    assert codes == [0, 0], output(cwd, "node0")[-3000:] + output(cwd, "node1_replacement")[-3000:]

    (run_dir,) = [d for d in _run_dirs(cwd) if (d / "metrics.jsonl").is_file()]
    steps = _losses(run_dir)
    assert [step for step, _ in steps[-5:]] == list(range(6, 11))  # the last attempt resumed after step 5
    final = [loss for step, loss in steps if step == STEPS][-1]
    assert final == pytest.approx(single_gpt[0][-1], abs=2e-5)
    logs = "".join(p.read_text() for p in (run_dir / "logs").glob("rank*.log"))
    assert "resumed from" in logs


@pytest.mark.matrix
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_rendezvous_mistakes_end_each_node_with_one_line(tmp_path):
    """Two nodes both given node_rank 0: the second cannot host the rendezvous and says so at once; the first,
    alone, gives up after launcher.rdzv_timeout_s naming the keys to set on every node."""
    overrides = ["model=gpt_debug", "zero.stage=3", "launcher.rdzv_timeout_s=15"]
    port = free_port()
    first = start_node(tmp_path, launcher_node_args(2, 0, port) + overrides, "first")
    while not _listening(port) and first.poll() is None:  # the first node hosts the rendezvous
        time.sleep(0.2)
    second = start_node(tmp_path, launcher_node_args(2, 0, port) + overrides, "second")
    assert wait_all([second, first], timeout=200) == [2, 2]
    said = output(tmp_path, "second")
    assert f"launcher.node_rank=0 hosts the rendezvous at 127.0.0.1:{port}, but could not listen there" in said
    said = output(tmp_path, "first")
    assert f"not every node joined the rendezvous at launcher.rdzv_endpoint=127.0.0.1:{port} within " \
           "launcher.rdzv_timeout_s=15" in said
    assert "Traceback" not in said + output(tmp_path, "second")


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0
