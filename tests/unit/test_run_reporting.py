"""What a run reports is true: the layout line, and throughput over training steps only.

The layout line's real-run form is also checked by the layout-equivalence tests (gpt_3d's dp 2 x tp 2
x pp 2 in tests/integration/equivalence/table.py, EP=2 in tests/integration/equivalence/table.py, ZeRO-3 with
parameter offload in tests/integration/equivalence/table.py), which read it from their runs' summary.json.
"""

import json
import re
import time
from types import SimpleNamespace

import pytest
import torch

from dsrecipes.config import validate_recipe
from dsrecipes.config.store import compose
from dsrecipes.distributed.data_parallel import STRATEGIES, choose_strategy
from dsrecipes.distributed.data_parallel.fsdp2 import FSDP2Strategy
from dsrecipes.distributed.parallel_dims import ParallelDims
from dsrecipes.distributed.parallelize import ParallelPlan
from dsrecipes.distributed.pipeline_parallel import describe_pipeline
from dsrecipes.training.layout import describe_layout
from dsrecipes.training.precision import Precision
from dsrecipes.training.reporting.throughput import ThroughputMeter
from dsrecipes.training.trainer import Trainer


def layout_of(overrides: list[str], world: int, applied=()) -> str:
    """The layout line of a recipe at `world` ranks, without starting them: strategies whose constructor
    makes process groups are stood in for by their class description."""
    root, batch = validate_recipe(compose(overrides), dp_world_size=world)
    dims = ParallelDims.from_config(root, world)
    precision = Precision(root.precision, torch.device("cpu"))
    name = choose_strategy(root.zero, dims)
    if name == "fsdp2":
        strategy = FSDP2Strategy(dims, root.zero, precision, torch.device("cpu"))
    else:
        strategy = SimpleNamespace(name=name, describe=lambda: STRATEGIES[name].description)
    par = root.parallel  # a pipeline's description without its process groups
    pipeline = SimpleNamespace(describe=lambda: describe_pipeline(par.pp_schedule, batch.gradient_accumulation_steps,
                                                                  par.pp_partition))
    plan = ParallelPlan(module=None, dims=dims, strategy=strategy, pipeline=pipeline if dims.pp > 1 else None,
                        applied=list(applied))
    return describe_layout(plan, root, precision)


def test_layout_line_of_gpt_3d_names_every_axis_and_the_schedule():
    layout = layout_of(["+experiment=gpt_3d"], 8)
    assert layout.startswith("world 8 = pp 2 x dp 2 (replicate 2 x shard 1) x sp 1 x tp 2; ep 1 | "
                             "pipeline: 1f1b, 4 micro-batches per step, partition by ")
    assert "tensor parallel: sequence-parallel activations" in layout
    assert "data parallel: allreduce: gradients averaged" in layout
    # gpt_3d says precision=auto: bf16 autocast on a CPU with AMX bf16 tiles (this kind of machine), else fp32
    from dsrecipes.training.precision import fast_bf16

    chosen = "bf16 autocast compute over fp32 weights" if fast_bf16(torch.device("cpu"))[0] else "fp32 weights and compute"
    assert f"| precision: {chosen} | kernels: torch | compile: off | activation checkpointing: none" in layout


def test_layout_line_of_gpt_moe_ep_and_zero3_offload():
    moe = layout_of(["+experiment=gpt_moe_ep"], 2)
    assert moe.startswith("world 2 = pp 1 x dp 2 (replicate 1 x shard 2) x sp 1 x tp 1; ep 2 | data parallel: fsdp2: "
                          "FSDP2 (zero.stage=2)")
    offload = layout_of(["zero.stage=3", "zero.offload_param=cpu", "zero.offload_optimizer=cpu", "precision=bf16",
                         "precision.master_weights=true", "activation_checkpointing=full",
                         "activation_checkpointing.cpu_offload=true", "launcher.nproc_per_node=2"], 2)
    assert "FSDP2 (zero.stage=3): parameters, gradients and optimizer state sharded (over 2 ranks), CPU offload" in offload
    assert "| offload: parameters -> cpu, optimizer -> cpu, checkpointed activations -> cpu |" in offload
    assert "| precision: bf16 weights and compute, fp32 master weights in the optimizer |" in offload
    assert offload.endswith("| activation checkpointing: every block")


def test_layout_line_names_precision_loss_scaling_and_injected_kernels():
    fp16 = layout_of(["precision=fp16", "kernels.backend=triton"], 1,
                     applied=["kernels: replaced 2 x LayerNorm -> FusedLayerNorm", "kernels: kept 1 x ..."])
    assert "| precision: fp16 weights and compute, fp32 master weights in the optimizer, dynamic loss scale 65536 |" \
        in fp16
    assert "| kernels: triton (2 x LayerNorm -> FusedLayerNorm) |" in fp16
    assert "| kernels: torch (kernels.backend=auto swapped nothing in) |" in layout_of(["kernels.backend=auto"], 1)


def test_throughput_meter_leaves_paused_time_out():
    meter = ThroughputMeter(dense_tokens_per_step=100)
    meter.start_training()
    time.sleep(0.05)
    meter.add_step(50)
    with meter.paused("eval"):
        time.sleep(0.2)
    window = meter.window()
    totals = meter.totals()
    assert 0.05 <= totals["perf/train_s"] < 0.15 and totals["perf/eval_s"] >= 0.2
    assert window["perf/tokens_per_s"] == pytest.approx(50 / totals["perf/train_s"], rel=0.05)
    assert totals["train/tokens"] == 50 and totals["train/dense_tokens"] == 100
    assert totals["perf/dense_tokens_per_s"] == pytest.approx(2 * totals["perf/tokens_per_s"])


def test_curriculum_tokens_per_s_is_processed_tokens_over_training_time(tmp_path, fast_overrides):
    """A sequence-length curriculum at 16 of 64 tokens: tokens/s = the tokens it fed / the time of its
    training steps (timed here, around every step, independently of the Trainer), within 5%; the long
    evaluations in between are reported as perf/eval_s, not averaged in."""
    overrides = fast_overrides + ["data_efficiency=seqlen_curriculum",
                                  "data_efficiency.curriculum_learning.total_curriculum_step=1000",
                                  "trainer.eval_interval=5", "trainer.eval_batches=20", "trainer.sample_tokens=0"]
    root, batch = validate_recipe(compose(overrides), dp_world_size=1)
    trainer = Trainer(root, tmp_path, batch)
    step_seconds = []
    train_step = trainer.train_step

    def timed(step, reduce_across_ranks=True):
        started = time.perf_counter()
        out = train_step(step, reduce_across_ranks)
        step_seconds.append(time.perf_counter() - started)
        return out

    trainer.train_step = timed
    metrics = trainer.fit()["metrics"]
    processed = metrics["data/consumed_tokens"]
    assert processed == metrics["train/tokens"] == 20 * 8 * 16
    assert metrics["train/dense_tokens"] == 20 * 8 * 64
    assert metrics["perf/tokens_per_s"] == pytest.approx(processed / sum(step_seconds), rel=0.05)
    assert metrics["perf/eval_s"] > 0 and metrics["perf/checkpoint_s"] > 0 and metrics["perf/startup_s"] > 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["layout"].startswith("world 1 = pp 1 x dp 1")
    assert f"layout: {summary['layout']}" in (tmp_path / "logs" / "rank0.log").read_text()


# ---------------------------------------------------------------------------------------------------
# Sweeps compare like with like (dsrecipes.config.auto_workers)
# ---------------------------------------------------------------------------------------------------


def test_auto_workers_keep_the_recipes_global_batch():
    from dsrecipes.config.preflight import check_train_job

    with pytest.warns(UserWarning, match=r"starts 2 CPU workers for zero.stage=2 .*stays the recipe's 16 "
                                         r"\(trainer.train_micro_batch_size_per_gpu 16 -> 8 per worker\)"):
        _, batch, nproc, _ = check_train_job(compose(["zero.stage=2"]))
    assert (nproc, batch.train_batch_size, batch.micro_batch_size, batch.dp_world_size) == (2, 16, 8, 2)
    with pytest.warns(UserWarning, match=r"trainer.gradient_accumulation_steps 2 -> 1\)"):
        _, batch, _, _ = check_train_job(compose(["zero.stage=3", "trainer.train_micro_batch_size_per_gpu=3",
                                                  "trainer.gradient_accumulation_steps=2"]))
    assert (batch.train_batch_size, batch.micro_batch_size, batch.gradient_accumulation_steps) == (6, 3, 1)
    with pytest.warns(UserWarning, match=r"the global batch changes from 3 \(one rank\) to 6"):
        _, batch, _, _ = check_train_job(compose(["zero.stage=1", "trainer.train_micro_batch_size_per_gpu=3"]))
    assert batch.train_batch_size == 6


@pytest.mark.parametrize("overrides", [
    ["zero.stage=2", "launcher.nproc_per_node=2"],  # chosen by the user: DeepSpeed's rule, micro 16 per rank
    ["zero.stage=2", "trainer.train_batch_size=32"],  # train_batch_size given: DeepSpeed's rule keeps it
])
def test_auto_workers_leave_explicit_choices_alone(overrides, recwarn):
    from dsrecipes.config.preflight import check_train_job

    _, batch, _, _ = check_train_job(compose(overrides))
    assert batch.micro_batch_size == 16 and not [w for w in recwarn if "CPU workers" in str(w.message)]


def test_a_sweep_of_unequal_global_batches_warns_before_the_first_job(tmp_path, monkeypatch):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from omegaconf import open_dict

    from dsrecipes.config.preflight import Preflight
    from dsrecipes.config.store import register_configs

    monkeypatch.chdir(tmp_path)  # the sweep directory is claimed under ./outputs
    register_configs()
    with initialize_config_module(config_module="dsrecipes.conf", version_base="1.3"):
        cfg = hydra_compose(config_name="config", return_hydra_config=True)
        with open_dict(cfg):
            cfg.hydra.overrides.task = ["launcher.nproc_per_node=1,2"]
        with pytest.warns(UserWarning, match=r"different global batches .*#0 \(launcher.nproc_per_node=1\): 16; "
                                             r"#1 \(launcher.nproc_per_node=2\): 32"):
            Preflight().on_multirun_start(cfg)
        with open_dict(cfg):
            cfg.hydra.overrides.task = ["zero.stage=0,2"]  # auto workers: 1 and 2, both 16
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            Preflight().on_multirun_start(cfg)
        assert not [w for w in caught if "different global batches" in str(w.message)]


# ---------------------------------------------------------------------------------------------------
# A technique that never takes effect warns at start (dsrecipes.config.never_fires)
# ---------------------------------------------------------------------------------------------------

NEVER_FIRES = [
    (["compression=prune_heads", "trainer.max_steps=50"],
     "compression.head_pruning.schedule_offset=200 is after trainer.max_steps=50, so the run trains and exports"),
    (["compression=qat_int8", "compression.weight_quantization.schedule_offset=60", "trainer.max_steps=50"],
     "compression.weight_quantization.schedule_offset=60 is after trainer.max_steps=50"),
    (["compression=qat_int4", "trainer.max_steps=152"],
     "at trainer.max_steps=152 they reach 6, not target_bits=4"),
    (["compression.activation_quantization.enabled=true", "trainer.max_steps=1000"],
     "compression.activation_quantization.schedule_offset=1000 is not before the last step"),
    (["compression=prune_sparse", "trainer.max_steps=200"],
     "compression.sparse_pruning.schedule_offset_end=300 is after trainer.max_steps=200: the run stops part-way"),
    (["compression=prune_heads", "compression.head_pruning.dense_ratio=1.0"],
     "compression.head_pruning.dense_ratio=1.0 keeps every weight: nothing is pruned"),
    (["data_efficiency=seqlen_curriculum", "data_efficiency.curriculum_learning.min_difficulty=128"],
     "data_efficiency.curriculum_learning.min_difficulty=128 is not shorter than data.block_size=128"),
    (["+experiment=gpt_random_ltd", "data_efficiency.random_ltd.min_value=128"],
     "data_efficiency.random_ltd.min_value=128 keeps every token of data.block_size=128"),
    (["optimizer=onebitadam", "trainer.max_steps=40"],
     "optimizer.freeze_step=100000 is not before trainer.max_steps=40: optimizer=onebitadam runs every step "
     "uncompressed"),
    (["optimizer=onebitlamb", "optimizer.freeze_step=40", "trainer.max_steps=40"],
     "optimizer.freeze_step=40 is not before trainer.max_steps=40: optimizer=onebitlamb runs every step uncompressed"),
    (["optimizer=zerooneadam", "trainer.max_steps=40"],
     "optimizer.var_freeze_step=100000 is not before trainer.max_steps=40: optimizer=zerooneadam never freezes"),
]


@pytest.mark.parametrize("overrides, message", NEVER_FIRES, ids=[case[1].split("=")[0] for case in NEVER_FIRES])
def test_a_technique_that_never_takes_effect_warns_naming_the_key(overrides, message):
    with pytest.warns(UserWarning, match=re.escape(message)):
        validate_recipe(compose(overrides), dp_world_size=1)


@pytest.mark.parametrize("overrides", [["compression=prune_heads", "trainer.max_steps=200"],
                                       ["compression=qat_int4", "trainer.max_steps=250"],
                                       ["data_efficiency=seqlen_curriculum"], ["+experiment=gpt_random_ltd"],
                                       ["optimizer=onebitadam", "optimizer.freeze_step=10", "trainer.max_steps=40"],
                                       ["optimizer=onebitlamb", "optimizer.freeze_step=39", "trainer.max_steps=40"],
                                       ["optimizer=zerooneadam", "optimizer.var_freeze_step=20",
                                        "trainer.max_steps=40"]])
def test_a_technique_that_takes_effect_does_not_warn(overrides, recwarn):
    from dsrecipes.config.never_fires import never_firing

    root, _ = validate_recipe(compose(overrides), dp_world_size=1)
    assert never_firing(root) == []
