"""dsrecipes.benchmarks.communication's arithmetic on hand-written run directories (no training: the
benchmark itself trains through the CLI; tests/integration/test_comms_logger.py checks the byte counts it reads)."""

from __future__ import annotations

import json
from pathlib import Path

from dsrecipes.benchmarks.communication import compare, hpz_overrides, read_run


def write_run(run_dir: Path, per_step: list[float], ops: dict[str, float], val_loss: float, steps: int = 4) -> Path:
    run_dir.mkdir(parents=True)
    lines = [{"step": i + 1, "comm/bytes_per_step": b} for i, b in enumerate(per_step)]
    lines += [{"step": steps, "perf/tokens_per_s": 1000.0, "perf/step_time_s": 0.1},
              {"step": steps, "perf/tokens_per_s": 1200.0, "perf/step_time_s": 0.1}, {"step": steps, "val/loss": val_loss}]
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(line) for line in lines))
    rows = [{"op": op, "total_bytes": total} for op, total in ops.items()]
    (run_dir / "comms.json").write_text(json.dumps({"bytes_per_step": sum(per_step) / len(per_step), "steps": steps,
                                                    "ops": rows}))
    return run_dir


def test_onebit_bytes_are_read_after_the_freeze_and_compared_with_adams(tmp_path):
    adamw = read_run(write_run(tmp_path / "adamw", [400.0] * 4, {"all_reduce": 1600.0}, 2.0), None)
    onebit = read_run(write_run(tmp_path / "onebit", [400.0, 400.0, 10.0, 10.0], {"all_reduce": 800.0,
                                                                                   "all_to_all_single": 20.0}, 2.05),
                      freeze=2)
    assert onebit["bytes_per_step_warmup"] == 400.0 and onebit["bytes_per_step_compressed"] == 10.0
    assert onebit["tokens_per_s"] == 1200.0  # the first window (start-up) is left out
    rows = compare({(2, "adamw"): adamw, (2, "onebitadam"): onebit}, None)
    row = next(r for r in rows if r["variant"] == "onebitadam")
    assert row["bytes_per_step"] == 10 and row["bytes_vs_baseline"] == 0.025
    assert row["loss_vs_baseline"] == "+2.50%" and row["target_met"] is True  # 1/40 <= 1/20, 2.5% <= 3%


def test_zeropp_rows_compare_the_collectives_they_replace(tmp_path):
    zero3 = read_run(write_run(tmp_path / "z3", [300.0] * 4, {"all_gather_into_tensor": 800.0,
                                                              "reduce_scatter_tensor": 400.0}, 2.0), None)
    qw = read_run(write_run(tmp_path / "qw", [150.0] * 4, {"all_gather_into_tensor": 208.0,
                                                           "reduce_scatter_tensor": 400.0}, 2.1), None)
    qg = read_run(write_run(tmp_path / "qg", [250.0] * 4, {"all_gather_into_tensor": 800.0,
                                                           "all_to_all_single": 160.0}, 2.01), None)
    rows = {r["variant"]: r for r in compare({(2, "zero3"): zero3, (2, "zero3+qwZ"): qw, (2, "zero3+qgZ"): qg}, None)}
    assert rows["zero3+qwZ"]["bytes_vs_baseline"] == 0.26  # all-gather bytes 52 / 200 per step
    assert rows["zero3+qwZ"]["target_met"] is False  # loss +5%
    assert rows["zero3+qgZ"]["bytes_vs_baseline"] == 0.4  # the all-to-all (40) against the reduce-scatter (100)
    assert rows["zero3+qgZ"]["target_met"] is False and rows["zero3"]["target_met"] is None


def test_hpz_runs_only_where_the_world_has_a_smaller_group():
    assert hpz_overrides("zero3+hpZ", 2, 2) is None
    assert hpz_overrides("zero3+hpZ", 4, 2) == ["zero.zero_hpz_partition_size=2"]
    assert hpz_overrides("zeropp", 2, 2) == [] and hpz_overrides("adamw", 4, 2) == []
