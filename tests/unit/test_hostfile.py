"""python -m dsrecipes.launch.hostfile: DeepSpeed's hostfile, its filters and the torchrun commands made from them.

(a) parsing and filtering against written-out results and, where DeepSpeed is installed, against DeepSpeed
0.19.8's own fetch_hostfile / parse_inclusion_exclusion (parse_resource_filter) / apply_num_nodes_and_gpus;
(b) the print, ssh and pdsh commands, CUDA_VISIBLE_DEVICES and the forwarded environment as exact strings;
(c) bad input: exit status 2, one line, nothing started; (d) a real world-2 run through --launch ssh with a
fake ssh that runs the remote command on this machine.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from dsrecipes.launch.hostfile import Node, parse_hostfile, read_hostfile, select_nodes
from dsrecipes.launch.layout import check_layout, split_overrides
from dsrecipes.launch.remote_env import forwarded_env, read_env_file
from dsrecipes.launch.torchrun_commands import (
    Launch,
    node_command,
    pdsh_argv,
    pdsh_command,
    ssh_argv,
    ssh_command,
)

TWO_BY_FOUR = "# two nodes\nworker-0 slots=4\nworker-1 slots=4\n"
FORWARDED_PREFIXES = ("MLFLOW", "PYTHON", "MV2", "UCX", "NCCL")


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def chosen(nodes: list[Node]) -> list[tuple[str, list[int]]]:
    return [(node.host, list(node.slot_ids)) for node in nodes]


# (a) parsing and filtering ------------------------------------------------------------------------------------

def test_hostfile_lines_comments_and_trailing_text():
    lines = ["# cluster\n", "\n", "worker-0 slots=4\n", "   # indented comment\n", "worker-1\tslots=2 max_slots=2\n",
             "  10.0.0.3 slots=8   \n"]
    assert parse_hostfile(lines) == [("worker-0", 4), ("worker-1", 2), ("10.0.0.3", 8)]


# (hostfile, include, exclude, num_nodes, num_gpus) -> the nodes and slot ids, hand-written
FILTER_CASES = {
    "plain": ("worker-0 slots=4\nworker-1 slots=4\n", "", "", -1, -1, [("worker-0", [0, 1, 2, 3]), ("worker-1", [0, 1, 2, 3])]),
    "comments": ("# head\n\nworker-0 slots=2 # gpu box\n  # off: worker-9 slots=2\nworker-1 slots=2\n", "", "", -1, -1,
                 [("worker-0", [0, 1]), ("worker-1", [0, 1])]),
    "include_slot_lists": (TWO_BY_FOUR, "worker-0:0,1@worker-1", "", -1, -1, [("worker-0", [0, 1]), ("worker-1", [0, 1, 2, 3])]),
    "include_unordered_keeps_hostfile_order": (TWO_BY_FOUR, "worker-1:3,1@worker-0:2", "", -1, -1,
                                               [("worker-0", [2]), ("worker-1", [1, 3])]),
    "include_bare_and_slots_merge": (TWO_BY_FOUR, "worker-0@worker-0:1", "", -1, -1, [("worker-0", [1])]),
    "exclude_whole_host": ("worker-0 slots=2\nworker-1 slots=2\nworker-2 slots=2\n", "", "worker-1", -1, -1,
                           [("worker-0", [0, 1]), ("worker-2", [0, 1])]),
    "exclude_slots": (TWO_BY_FOUR, "", "worker-1:0,2", -1, -1, [("worker-0", [0, 1, 2, 3]), ("worker-1", [1, 3])]),
    "num_nodes": ("a slots=2\nb slots=2\nc slots=2\n", "", "", 2, -1, [("a", [0, 1]), ("b", [0, 1])]),
    "num_gpus": (TWO_BY_FOUR, "", "", -1, 2, [("worker-0", [0, 1]), ("worker-1", [0, 1])]),
    "num_nodes_and_num_gpus": ("a slots=4\nb slots=4\nc slots=4\n", "", "", 1, 3, [("a", [0, 1, 2])]),
}


@pytest.mark.parametrize("case", list(FILTER_CASES))
def test_filters_pick_these_slots(case):
    text, include, exclude, num_nodes, num_gpus, expected = FILTER_CASES[case]
    hosts = parse_hostfile(text.splitlines(keepends=True))
    assert chosen(select_nodes(hosts, include, exclude, num_nodes, num_gpus)) == expected


@pytest.fixture(scope="module")
def deepspeed_runner():
    pytest.importorskip("deepspeed")
    import deepspeed.launcher.runner as runner

    return runner


@pytest.mark.parametrize("case", list(FILTER_CASES))
def test_same_hosts_and_slots_as_deepspeed(case, tmp_path, deepspeed_runner):
    text, include, exclude, num_nodes, num_gpus, _ = FILTER_CASES[case]
    path = write(tmp_path / "hostfile", text)
    pool = deepspeed_runner.fetch_hostfile(str(path))
    active = deepspeed_runner.parse_inclusion_exclusion(pool, include, exclude)
    active = deepspeed_runner.apply_num_nodes_and_gpus(active, num_nodes, num_gpus)
    assert list(pool.items()) == read_hostfile(path)
    assert [(host, list(slots)) for host, slots in active.items()] == \
        chosen(select_nodes(read_hostfile(path), include, exclude, num_nodes, num_gpus))


@pytest.mark.parametrize("text", ["worker-0 slots=4\nworker-1 slot=4\n", "a slots=2\nb slots=2\na slots=2\n", "# none\n"])
def test_deepspeed_refuses_the_same_hostfiles(text, deepspeed_runner):
    with pytest.raises(ValueError):
        deepspeed_runner._parse_hostfile(text.splitlines())
    with pytest.raises(ValueError):
        parse_hostfile(text.splitlines())


@pytest.mark.parametrize("text", ["worker-0 slots=0\n", "worker-0 slots=4x\n"])
def test_refused_here_where_deepspeed_goes_on(text, deepspeed_runner):
    """slots=0 (a host without processes) and slots=4x (read as 4 by DeepSpeed's regex): deliberate deviations."""
    assert len(deepspeed_runner._parse_hostfile(text.splitlines())) == 1
    with pytest.raises(ValueError, match="is not valid; slots must be a whole number >= 1"):
        parse_hostfile(text.splitlines())


def test_narrowed_nodes_are_the_ones_with_picked_slots():
    hosts = [("worker-0", 4), ("worker-1", 4)]
    assert [node.narrowed for node in select_nodes(hosts)] == [False, False]
    assert [node.narrowed for node in select_nodes(hosts, include="worker-0@worker-1:0,1")] == [False, True]


# (b) the commands ---------------------------------------------------------------------------------------------

def launch_of(text: str, overrides=("+experiment=gpt_zero3", "zero.stage=2"), env=None, **filters) -> Launch:
    nodes = select_nodes(parse_hostfile(text.splitlines()), **filters)
    return Launch(nodes=tuple(nodes), overrides=tuple(overrides), cwd="/shared/runs", env=env or {})


def test_print_form_one_torchrun_per_node():
    launch = launch_of(TWO_BY_FOUR)
    assert [node_command(launch, i) for i in range(2)] == [
        "torchrun --nnodes 2 --node-rank 0 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint worker-0:29500 "
        "--rdzv-id dsrecipes -m dsrecipes +experiment=gpt_zero3 zero.stage=2",
        "torchrun --nnodes 2 --node-rank 1 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint worker-0:29500 "
        "--rdzv-id dsrecipes -m dsrecipes +experiment=gpt_zero3 zero.stage=2",
    ]
    custom = Launch(nodes=launch.nodes, overrides=(), cwd="/", master_addr="10.0.0.1", master_port=29600,
                    rdzv_id="job7", torchrun=("/venv/bin/torchrun",), torchrun_args=("--max-restarts", "2"))
    assert node_command(custom, 1) == ("/venv/bin/torchrun --nnodes 2 --node-rank 1 --nproc-per-node 4 --rdzv-backend "
                                       "c10d --rdzv-endpoint 10.0.0.1:29600 --rdzv-id job7 --max-restarts 2 -m dsrecipes")


def test_ssh_form_quotes_the_remote_command():
    launch = launch_of(TWO_BY_FOUR, overrides=("model=gpt_debug", "prompt=a b"))
    torchrun = ("torchrun --nnodes 2 --node-rank 1 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint worker-0:29500 "
                "--rdzv-id dsrecipes -m dsrecipes model=gpt_debug")
    assert ssh_argv(launch, 1) == ["ssh", "worker-1", f"cd /shared/runs && {torchrun} 'prompt=a b'"]
    assert ssh_command(launch, 1) == f"ssh worker-1 'cd /shared/runs && {torchrun} '\"'\"'prompt=a b'\"'\"''"
    tricky = launch_of(TWO_BY_FOUR, overrides=("prompt=it's $HOME `x`",))
    remote = shlex.split(ssh_command(tricky, 0))[2]  # what ssh hands the remote shell, split as that shell splits it
    assert shlex.split(remote)[-1] == "prompt=it's $HOME `x`"


def test_picked_slots_set_cuda_visible_devices():
    launch = launch_of(TWO_BY_FOUR, overrides=("zero.stage=3",), include="worker-0:1,3@worker-1:0,2")
    tail = "--rdzv-backend c10d --rdzv-endpoint worker-0:29500 --rdzv-id dsrecipes -m dsrecipes zero.stage=3"
    assert node_command(launch, 0) == f"CUDA_VISIBLE_DEVICES=1,3 torchrun --nnodes 2 --node-rank 0 --nproc-per-node 2 {tail}"
    assert node_command(launch, 1) == f"CUDA_VISIBLE_DEVICES=0,2 torchrun --nnodes 2 --node-rank 1 --nproc-per-node 2 {tail}"
    whole = launch_of("worker-0 slots=2\nworker-1 slots=2\n", overrides=("zero.stage=3",), num_gpus=2)
    assert not node_command(whole, 0).startswith("CUDA_VISIBLE_DEVICES")  # every slot of the host: nothing to hide


def test_pdsh_form_mirrors_deepspeeds_pdsh_runner():
    env = {"NCCL_DEBUG": "INFO", "LD_LIBRARY_PATH": "/opt/nccl/lib:$LD_LIBRARY_PATH"}
    launch = launch_of("worker-0 slots=2\nworker-1 slots=4\n", overrides=("zero.stage=2",), env=env,
                       include="worker-0@worker-1:2,3")
    remote = ('export NCCL_DEBUG=INFO; export LD_LIBRARY_PATH="/opt/nccl/lib:$LD_LIBRARY_PATH"; cd /shared/runs; '
              "case %n in 1) export CUDA_VISIBLE_DEVICES=2,3;; esac; torchrun --nnodes 2 --node-rank %n --nproc-per-node 2 "
              "--rdzv-backend c10d --rdzv-endpoint worker-0:29500 --rdzv-id dsrecipes -m dsrecipes zero.stage=2")
    assert pdsh_argv(launch) == ["pdsh", "-S", "-f", "1024", "-w", "worker-0,worker-1", remote]
    assert pdsh_command(launch) == f"PDSH_RCMD_TYPE=ssh pdsh -S -f 1024 -w worker-0,worker-1 '{remote}'"


def test_deepspeed_env_files_and_forwarded_variables(tmp_path):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    write(home / ".deepspeed_env", "NCCL_SOCKET_IFNAME=eth0\n# a comment\n\nOMP_NUM_THREADS=4\n")
    write(cwd / ".deepspeed_env", "OMP_NUM_THREADS=8\nMY_FLAG = a b\n")
    environ = {"NCCL_DEBUG": "WARN", "PYTHONPATH": "/src", "CUDA_HOME": "/usr/local/cuda", "UCX_TLS": "tcp"}
    env = forwarded_env(environ, home, cwd)
    assert env == {"NCCL_DEBUG": "WARN", "PYTHONPATH": "/src", "UCX_TLS": "tcp", "NCCL_SOCKET_IFNAME": "eth0",
                   "OMP_NUM_THREADS": "8", "MY_FLAG": "a b"}
    launch = launch_of("worker-0 slots=1\nworker-1 slots=1\n", overrides=(), env=env)
    assert node_command(launch, 1) == (
        'NCCL_DEBUG=WARN PYTHONPATH=/src UCX_TLS=tcp NCCL_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=8 MY_FLAG="a b" torchrun '
        "--nnodes 2 --node-rank 1 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint worker-0:29500 --rdzv-id "
        "dsrecipes -m dsrecipes")
    # DS_ENV_FILE names the file; AISC_JOB_NAME keeps the per-node NCCL_IB_HCA behind, as in DeepSpeed
    write(cwd / "cluster.env", "X=1\n")
    assert forwarded_env({"DS_ENV_FILE": "cluster.env", "AISC_JOB_NAME": "j", "NCCL_IB_HCA": "mlx5"}, home, cwd) == {"X": "1"}


def test_a_bad_deepspeed_env_line_names_file_and_line(tmp_path):
    path = write(tmp_path / ".deepspeed_env", "A=1\nexport B=2\n")
    with pytest.raises(ValueError, match=r"\.deepspeed_env line 2: 'export B=2' is not a KEY=VALUE line"):
        read_env_file(path)


def test_launcher_keys_become_torchrun_flags_or_are_refused():
    with pytest.raises(ValueError,
                       match=r"launcher.nproc_per_node=2: not used under dsrecipes.launch.hostfile: the hostfile's slots"):
        split_overrides(["zero.stage=2", "launcher.nproc_per_node=2"])
    for key in ("nnodes=2", "node_rank=1", "rdzv_endpoint=h:1", "rdzv_id=x", "rdzv_timeout_s=9"):
        with pytest.raises(ValueError, match=rf"launcher.{key}: not used under dsrecipes.launch.hostfile: the hostfile's hosts"):
            split_overrides([f"launcher.{key}"])
    nodes = select_nodes([("a", 1), ("b", 1)])
    layout = check_layout(["model=gpt_debug", "zero.stage=2", "launcher.max_restarts=2", "launcher.start_method=forkserver",
                           "launcher.collective_timeout_s=30"], nodes, "hosts")
    assert layout.overrides == ("model=gpt_debug", "zero.stage=2", "launcher.collective_timeout_s=30")
    assert layout.torchrun_args == ("--max-restarts", "2", "--start-method", "forkserver")
    assert layout.world == 2


def test_cli_prints_the_commands(tmp_path, monkeypatch, capsys):
    from dsrecipes.launch.hostfile import default_torchrun, main

    for name in list(os.environ):
        if name.startswith(FORWARDED_PREFIXES) or name in ("DS_ENV_FILE", "AISC_JOB_NAME"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    write(tmp_path / ".deepspeed_env", "NCCL_DEBUG=INFO\n")
    write(tmp_path / "hosts", "worker-0 slots=2\nworker-1 slots=2\n")
    assert main(["hosts", "--include", "worker-0:1@worker-1:0", "--master_port", "29611", "model=gpt_debug", "zero.stage=2"]) == 0
    out, err = capsys.readouterr()
    torchrun = shlex.join(default_torchrun())
    assert out.splitlines() == [line for rank, slot in ((0, 1), (1, 0)) for line in (
        f"# on worker-{rank} (node {rank}):",
        f"NCCL_DEBUG=INFO CUDA_VISIBLE_DEVICES={slot} {torchrun} --nnodes 2 --node-rank {rank} --nproc-per-node 1 "
        f"--rdzv-backend c10d --rdzv-endpoint worker-0:29611 --rdzv-id dsrecipes -m dsrecipes model=gpt_debug zero.stage=2")]
    assert "dsrecipes.launch.hostfile: 2 nodes x 1 process(es) = world 2; rendezvous worker-0:29611 (id dsrecipes)" in err
