"""The memory estimator against the bytes the running engine really holds, per rank, every ZeRO stage."""

import pytest
import torch

from dsrecipes.distributed.parallel_dims import ParallelDims
from dsrecipes.profiling.memory_estimator import (
    deepspeed_gap,
    deepspeed_model_states,
    deepspeed_zero3_bytes,
    estimate_model_states,
    largest_layer_params,
)


def test_formulas():
    n, layer = 1_000_000, 10_000
    zero2 = deepspeed_model_states(2, n, layer, 4, 1)  # DeepSpeed's estimator: 2Ψ + 18Ψ/N, 4L + 18Ψ/N per GPU
    assert (zero2.gpu, zero2.cpu) == (2 * n + 18 * n // 4, 4 * n * 4 * 1.5)  # host: each process's fp32 copy
    assert deepspeed_model_states(3, n, layer, 4, 1).gpu == 4 * layer + 18 * n // 4
    assert deepspeed_model_states(0, n, layer, 4, 1) is None and deepspeed_model_states(1, n, layer, 4, 1) is None
    est = estimate_model_states(n, 4, 3)
    assert (est.parameters, est.gradients, est.optimizer_states) == (n, n, 2 * n)
    est2 = estimate_model_states(n, 4, 2)  # replicated fp32 parameters, sharded gradients and states
    assert (est2.parameters, est2.gradients, est2.optimizer_states) == (4 * n, n, 2 * n)
    est2_master = estimate_model_states(n, 4, 2, precision="bf16", master_weights=True)
    assert est2_master.parameters == 2 * n + n  # bf16 model + fp32 master shards: DeepSpeed's 2Ψ + ...
    est1 = estimate_model_states(n, 4, 1)
    assert est1.total == 4 * n + 4 * n + 2 * n
    assert estimate_model_states(n, 1, 3).total == 16 * n  # one process shards nothing
    master = estimate_model_states(n, 1, 0, precision="bf16", master_weights=True)
    assert (master.parameters, master.optimizer_states) == (2 * n + 4 * n, 8 * n)


def test_estimate_cli_prints_every_stage(capsys):
    from dsrecipes.estimate import main

    rows = main(["model=llama_7b", "world_size=64", "vocab_size=32000"])
    assert [r.stage for r in rows] == [0, 1, 2, 3]
    assert rows[3].total == pytest.approx(16 * 6_738_415_616 / 64)
    out = " ".join(capsys.readouterr().out.split())
    assert "6,738,415,616 parameters (6.74B)" in out and "8 node(s) x 8 GPU(s)" in out
    assert "14.32 GiB" in out and "2.25 GiB" in out  # DeepSpeed's ZeRO-2 / ZeRO-3 per GPU (was 13.92 / 1.57)
    assert "n/a: DeepSpeed has no estimator for ZeRO stages 0 and 1" in out


def test_sizes_are_printed_in_the_binary_unit_that_suits_them():
    from dsrecipes.estimate import format_bytes, format_params

    assert [format_bytes(b) for b in (0, 512, 1023, 1024, 3.5 * 2**20, 1.28 * 2**30, 2 * 2**40, 2**50)] == \
        ["0 B", "512 B", "1023 B", "1.00 KiB", "3.50 MiB", "1.28 GiB", "2.00 TiB", "1024.00 TiB"]
    assert format_params(124_439_808) == "124,439,808 parameters (124.4M)"
    assert format_params(6_738_415_616) == "6,738,415,616 parameters (6.74B)"


def test_estimate_cli_prints_a_small_model_in_mib_with_its_exact_parameter_count(capsys):
    from dsrecipes.estimate import main

    main(["model=gpt_debug", "world_size=2", "vocab_size=256"])
    out = capsys.readouterr().out
    assert "842,496 parameters (0.8M)" in out
    assert "0.00 GiB" not in out and " MB" not in out and "GB" not in out
    lines = {line.split()[1]: line for line in out.splitlines() if line.startswith("│")}
    assert lines["0"].count("n/a") == 2 and lines["1"].count("n/a") == 2  # DeepSpeed has no stage 0 / 1 figure
    assert "3.21 MiB" in lines["0"] and "MiB" in lines["2"] and "n/a" not in lines["3"]


def test_deepspeed_is_not_credited_with_figures_it_does_not_compute(capsys):
    assert deepspeed_gap(3, "nvme", "nvme") == deepspeed_gap(2, "nvme") == "DeepSpeed's estimator has no NVMe offload"
    assert deepspeed_gap(2, "none", "cpu") is None  # DeepSpeed's ZeRO-2 has no parameter offload: not an input
    assert "offload_optimizer=cpu" in deepspeed_gap(3, "none", "cpu")
    assert deepspeed_model_states(3, 10**6, 10**4, 2, 1, "nvme", "nvme") is None
    from dsrecipes.estimate import main

    main(["model=gpt_debug", "world_size=12", "ranks_per_node=8", "zero.stage=2"])
    out = " ".join(capsys.readouterr().out.split())
    assert "n/a: world_size=12 is not a whole number of nodes of ranks_per_node=8" in out
    assert "DeepSpeed: estimate_zero" not in out


# ------------------------------------------------------------------------------------------------
# The DeepSpeed columns against DeepSpeed 0.19.8's own estimator functions
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def deepspeed_zero():
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero import stage3, stage_1_and_2

    return stage_1_and_2, stage3


MODELS = {  # total parameters, largest layer (the token embedding / LM head), as dsrecipes.estimate counts them
    "gpt2_124m": (124_475_904, 50304 * 768),
    "llama_7b": (6_738_415_616, 32000 * 4096),
    "odd": (1_000_003, 12_347),
}
OFFLOADS = [("none", "none"), ("cpu", "none"), ("cpu", "cpu")]  # the settings DeepSpeed's estimator covers


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("gpus_per_node, num_nodes", [(1, 1), (2, 1), (8, 8), (4, 3), (3, 2)])
def test_deepspeed_columns_match_deepspeeds_estimator(deepspeed_zero, model, gpus_per_node, num_nodes):
    zero2, zero3 = deepspeed_zero
    total, layer = MODELS[model]
    for offload_optimizer, offload_param in OFFLOADS:
        cpu_offload, cpu_offload_params = offload_optimizer == "cpu", offload_param == "cpu"
        for factor in (1.5, 1.0):
            ours = deepspeed_model_states(2, total, layer, gpus_per_node, num_nodes, offload_optimizer,
                                          offload_param, additional_buffer_factor=factor)
            cpu, gpu = zero2.estimate_zero2_model_states_mem_needs(
                total, gpus_per_node, num_nodes, cpu_offload=cpu_offload, additional_buffer_factor=factor)
            assert (ours.gpu, ours.cpu) == (gpu, cpu), (model, offload_optimizer, factor)
            for zero_init in (False, True):
                ours = deepspeed_model_states(3, total, layer, gpus_per_node, num_nodes, offload_optimizer,
                                              offload_param, zero_init, factor)
                cpu, gpu, _ = zero3.estimate_zero3_model_states_mem_needs(
                    total, layer, gpus_per_node, num_nodes, cpu_offload=cpu_offload,
                    cpu_offload_params=cpu_offload_params, zero_init=zero_init, additional_buffer_factor=factor)
                assert (ours.gpu, ours.cpu) == (gpu, cpu), (model, offload_optimizer, offload_param, zero_init)
    # the one combination DeepSpeed's function takes but its table leaves out: parameters offloaded alone
    cpu, gpu, _ = zero3.estimate_zero3_model_states_mem_needs(total, layer, gpus_per_node, num_nodes,
                                                              cpu_offload=False, cpu_offload_params=True)
    ours = deepspeed_zero3_bytes(total, layer, gpus_per_node, num_nodes, cpu_offload=False,
                                 cpu_offload_params=True, zero_init=True)
    assert (ours.gpu, ours.cpu) == (gpu, cpu)


def test_largest_layer_and_total_are_counted_as_deepspeed_counts_them(deepspeed_zero):
    from dsrecipes.models import GPT, load_flavor

    torch.manual_seed(0)
    model = GPT(load_flavor("gpt_debug", vocab_size=320))  # real tensors: DeepSpeed tells tied weights by data_ptr
    assert deepspeed_zero[1].model_to_params(model) == (model.num_params(), largest_layer_params(model))
    assert largest_layer_params(model) == 128 * 512 + 512  # at 320 tokens the MLP's fc_in outgrows the embedding


def test_gpt2_124m_at_two_ranks_shows_deepspeeds_figures(deepspeed_zero, capsys):
    from dsrecipes.estimate import format_bytes, main

    main(["model=gpt2_124m", "world_size=2"])
    out = capsys.readouterr().out
    total, layer = MODELS["gpt2_124m"]
    assert "124,475,904 parameters (124.5M)" in out and f"largest layer {layer:,} parameters" in " ".join(out.split())
    cpu2, gpu2 = deepspeed_zero[0].estimate_zero2_model_states_mem_needs(total, 2, 1, cpu_offload=False)
    cpu3, gpu3, _ = deepspeed_zero[1].estimate_zero3_model_states_mem_needs(
        total, layer, 2, 1, cpu_offload=False, cpu_offload_params=False, zero_init=False)
    assert (format_bytes(gpu2), format_bytes(gpu3)) == ("1.28 GiB", "1.19 GiB")  # the column said 1.04 / 0.93
    lines = {line.split()[1]: line for line in out.splitlines() if line.startswith("│")}
    assert lines["2"].split("│")[-3:-1] == [f" {format_bytes(gpu2):>17} ", f" {format_bytes(cpu2):>22} "]
    assert lines["3"].split("│")[-3:-1] == [f" {format_bytes(gpu3):>17} ", f" {format_bytes(cpu3):>22} "]


def _layout(overrides: list[str], world_size: int):
    from dsrecipes.config.store import compose
    from dsrecipes.config.validate import to_root
    from dsrecipes.models import GPT
    from dsrecipes.profiling.layout_memory import estimate_layout

    cfg = to_root(compose(["model=gpt_debug", "model.vocab_size=320", *overrides]))
    dims = ParallelDims.from_config(cfg, world_size, node_size=world_size)
    with torch.device("meta"):
        gpt = GPT(cfg.model, cfg.moe)
    return gpt, estimate_layout(gpt, cfg, dims)


def test_layout_arithmetic_follows_the_shapes():
    gpt, single = _layout([], 1)
    n = gpt.num_params()
    assert single.heaviest.num_params == n and single.heaviest.total == 16 * n  # one rank: nothing split
    _, tp = _layout(["parallel.tp=2"], 2)  # tp: everything but norms, position embeddings and row biases halves
    norms_and_replicated = 128 * 128 + 4 * (4 * 128 + 2 * 128) + 2 * 128
    assert tp.heaviest.num_params == (n - norms_and_replicated) // 2 + norms_and_replicated
    _, pp = _layout(["parallel.pp=2"], 2)  # the tied embedding is held by both ends
    assert [r.num_params for r in pp.ranks] == [453888, 437760] and pp.heaviest.pp_rank == 0
    assert sum(r.num_params for r in pp.ranks) == n + 320 * 128
    _, interleaved = _layout(["parallel.pp=2", "parallel.pp_schedule=interleaved_1f1b"], 2)
    assert sum(r.num_params for r in interleaved.ranks) == n + 320 * 128  # stages 0, 2 and 1, 3
    gpt_moe, moe = _layout(["moe.num_experts=4", "moe.ep_size=2", "zero.stage=3"], 4)
    rank = moe.heaviest
    assert rank.expert_params == sum(p.numel() for name, p in gpt_moe.named_parameters() if ".experts." in name) // 2
    assert moe.strategy == "fsdp2" and moe.shard_ranks == 4
    assert rank.parameters == pytest.approx(4 * rank.dense_params / 4 + 4 * rank.expert_params)
    _, sp = _layout(["parallel.sp=2", "zero.stage=3"], 4)  # FSDP2 shards over dp x sp
    assert sp.shard_ranks == 4 and sp.heaviest.parameters == pytest.approx(4 * n / 4)


def test_uneven_tensor_parallel_shards_are_sized_as_dtensor_sizes_them():
    from dsrecipes.distributed.parameter_placement import shard_size

    assert [shard_size(10, 4, i) for i in range(4)] == [3, 3, 3, 1]
    assert [shard_size(2, 4, i) for i in range(4)] == [1, 1, 0, 0]
    _, tp = _layout(["model.vocab_size=321", "parallel.tp=2"], 2)
    first, second = tp.ranks
    assert first.num_params - second.num_params == 128 and tp.heaviest is first  # the odd vocabulary row


def test_estimate_cli_prints_the_layout(capsys):
    from dsrecipes.estimate import main

    ranks = main(["model=gpt_debug", "parallel.tp=2", "parallel.pp=2", "zero.stage=0", "world_size=8"])
    out = capsys.readouterr().out
    assert "world 8 = pp 2 x dp 2 x sp 1 x tp 2, ep 1" in " ".join(out.split())
    assert len(ranks) == 4 and "DeepSpeed" not in out  # the formula column is plain data parallelism's
    main(["model=gpt_debug", "moe.num_experts=4", "moe.ep_size=2", "zero.stage=3", "world_size=4"])
    assert "ep 2" in capsys.readouterr().out


@pytest.mark.parametrize("overrides, message", [
    (["parallel.tp=3", "world_size=8"], "parallel.tp=3 x parallel.sp=1 x parallel.pp=1 = 3 does not divide the world size 8"),
    (["moe.num_experts=4", "moe.ep_size=3", "world_size=4"], "moe.ep_size=3 must divide the world size 4"),
    (["parallel.tp=2", "zero.stage=0", "world_size=4"], "parallel.tp=2 with 2 data-parallel ranks needs zero.stage 2 or 3"),
    (["parallel.tp=3", "world_size=3"], "parallel.tp=3 does not divide model.n_head=4"),
    (["parallel.pp=2", "optimizer=onebitadam", "world_size=2"], "optimizer=onebitadam with parallel.pp=2 is not supported"),
    (["parallel.pp=8", "world_size=8"], "parallel.pp=8 with pp_schedule=1f1b makes 8 stages, more than model.n_layer=4"),
])
def test_estimate_cli_refuses_layouts_that_do_not_fit(overrides, message):
    from dsrecipes.estimate import main

    with pytest.raises(SystemExit) as err:
        main(["model=gpt_debug", *overrides])
    assert str(err.value).startswith("dsrecipes.estimate: ") and message in str(err.value)
