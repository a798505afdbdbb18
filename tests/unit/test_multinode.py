"""Multi-node runs, simulated on one machine: two launchers x 2 local ranks meeting at a c10d rendezvous on
127.0.0.1 (tests/helpers/nodes.py), against the single-process reference of tests/integration/equivalence/table.py.

The fast tests cover the node-aware layout (which axis crosses nodes, `node`-sized groups), the launcher.* keys
and their errors. The slow ones train: ZeRO 0-3 under two torchrun agents; through `python -m dsrecipes launcher.nnodes=2`, TP
inside a node with DP across, one pipeline stage per node, and hybrid sharding with one shard group per node,
whose checkpoint then resumes on one node; a node killed mid-run that the job survives (max_restarts=1, a
replacement node joins); and the rendezvous mistakes' one-line errors. Tolerances as in
tests/helpers/equivalence.py: losses 2e-5, exported parameters 5e-5.
"""

from __future__ import annotations

import pytest

from dsrecipes.distributed.parallel_dims import ParallelDims


# ---------------------------------------------------------------------------------------------- layout
@pytest.mark.parametrize("degrees, node_size, crossing, inside", [
    (dict(world_size=4, zero_stage=3), 2, ["dp_shard"], []),                                 # ZeRO-3 over both nodes
    (dict(world_size=4, zero_stage=3, hybrid_shard_size=2), 2, ["dp_replicate"], ["dp_shard"]),  # HSDP, group = node
    (dict(world_size=4, zero_stage=3, tp=2), 2, ["dp_shard"], ["tp"]),                      # TP inside, DP across
    (dict(world_size=8, tp=2, pp=2), 4, ["pp"], ["dp_replicate", "tp"]),                    # stages across nodes
    (dict(world_size=4, tp=4), 2, ["tp"], []),                                              # TP across: warned
    (dict(world_size=4, ep=2), 2, ["dp_replicate"], ["ep"]),                                # experts inside a node
])
def test_layout_names_the_axes_that_cross_nodes(degrees, node_size, crossing, inside):
    dims = ParallelDims.from_degrees(**degrees).on_nodes(node_size)
    assert dims.crossing_axes() == crossing
    text = dims.describe_nodes()
    assert text.startswith(f"{dims.world_size // node_size} nodes x {node_size} ranks: {', '.join(crossing)} cross")
    assert text.endswith(f", {', '.join(inside)} inside a node" if inside else "nodes")
    assert bool(dims.node_warnings()) == ("tp" in crossing)


def test_one_node_layouts_say_nothing_about_nodes():
    dims = ParallelDims.from_degrees(4, zero_stage=3).on_nodes(4)
    assert (dims.nodes, dims.crossing_axes(), dims.node_warnings()) == (1, [], [])
    assert "node" not in dims.describe()


def test_node_sized_groups_take_the_ranks_per_node(monkeypatch):
    from dsrecipes.config import validate_recipe
    from dsrecipes.config.store import compose

    cfg = compose(["zero.stage=3", "zero.hybrid_shard_size=node"])
    root, _ = validate_recipe(cfg, dp_world_size=8, node_size=4)
    assert root.zero.hybrid_shard_size == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # a worker under torchrun / the agent: its node's ranks
    root, _ = validate_recipe(compose(["zero.stage=3", "zero.zero_hpz_partition_size=node"]), dp_world_size=4)
    assert root.zero.zero_hpz_partition_size == 2
    with pytest.raises(ValueError, match=r"zero.hybrid_shard_size='rack' is not valid; use a number of ranks or 'node'"):
        validate_recipe(compose(["zero.stage=3", "zero.hybrid_shard_size=rack"]), dp_world_size=4)


def test_tensor_parallel_across_nodes_is_warned():
    from dsrecipes.config import validate_recipe
    from dsrecipes.config.store import compose

    with pytest.warns(UserWarning, match=r"parallel.tp=4 spans nodes \(2 ranks per node\).*keep parallel.tp <= 2"):
        validate_recipe(compose(["parallel.tp=4", "zero.stage=3", "model=gpt_debug"]), dp_world_size=4, node_size=2)


def test_rendezvous_settings_map_onto_the_elastic_agent():
    from dsrecipes.launch.multinode import rendezvous

    one = rendezvous({"nnodes": 1})
    assert (one["min_nodes"], one["max_nodes"], one["rdzv_endpoint"]) == (1, 1, "localhost:0")
    assert one["run_id"].startswith("dsrecipes-")
    two = rendezvous({"nnodes": 2, "node_rank": 1, "rdzv_endpoint": "node0:29500", "rdzv_id": "job7"})
    assert two == {"min_nodes": 2, "max_nodes": 2, "run_id": "job7", "rdzv_endpoint": "node0:29500",
                   "rdzv_configs": {"is_host": False, "join_timeout": 600}}
    assert rendezvous({"nnodes": 2, "node_rank": 0, "rdzv_endpoint": "n:1", "rdzv_id": "j"})["rdzv_configs"]["is_host"]
