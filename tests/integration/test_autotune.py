"""The multi-process, CLI and launcher tests (marked slow) whose in-process twins are tests/unit/test_autotune.py;
that module's docstring describes both halves.
"""

import csv
import json
import subprocess
import sys

import pytest

from dsrecipes.profiling.autotuning.pruning import GIB, memory_need
from dsrecipes.profiling.autotuning.space import Candidate
from tests.helpers.environment import subprocess_env


# ------------------------------------------------------------------ end to end
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_autotune_sweep_on_two_cpu_workers_then_the_best_experiment_runs(tmp_path, datasets_cache):
    from dsrecipes.config import validate_recipe
    from dsrecipes.config.store import compose
    from dsrecipes.profiling.autotuning.recipe import recipe_facts
    from dsrecipes.training.trainer import Trainer

    # launcher.nproc_per_node=auto: z0 trains on 1 CPU worker, z3 on 2, which would split the recipe's global batch
    # (dsrecipes.config.auto_workers) unless the trial pins the worker count (issue 39)
    recipe = ["+experiment=gpt_tiny", "model=gpt_debug", "model.max_seq_len=64", "data.max_bytes=300000",
              f"data.cache_dir={datasets_cache}", "trainer.gradient_accumulation_steps=2"]
    facts = recipe_facts(validate_recipe(compose([*recipe, "trainer.train_micro_batch_size_per_gpu=1"]), dp_world_size=2)[0])
    cap = memory_need(facts.memory, Candidate(0, micro_batch=4), 2, 0).total + 1  # z0: micro 4 fits, 16 does not
    sweep = tmp_path / "sweep"
    args = [*recipe, "zero_stages=[0,3]", "max_train_micro_batch_size_per_gpu=16", "num_tuning_micro_batch_sizes=1",
            f"max_memory_gib={cap / GIB}", "start_profile_step=1", "end_profile_step=3", f"hydra.sweep.dir={sweep}"]
    env = subprocess_env()
    result = subprocess.run([sys.executable, "-m", "dsrecipes.autotune", *args], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    rows = (sweep / "autotune_results.csv").read_text().splitlines()
    assert len(rows) == 1 + 4, rows  # header + 4 candidates: z0/z3 at the largest that fits, z0/z3 mb16 rejected
    assert sum(",ok," in r for r in rows) == 2 and sum(",rejected," in r and "> cap" in r for r in rows) == 2
    assert (sweep / "0" / "metrics.jsonl").is_file() and (sweep / "1" / "metrics.jsonl").is_file()
    with open(sweep / "autotune_results.csv") as f:
        ran = [row for row in csv.DictReader(f) if row["status"] == "ok"]
    assert sorted(row["ranks"] for row in ran) == ["1", "2"], ran
    block = compose(recipe).data.block_size
    for row in ran:  # what each trial trained (its tokens per step) is the global batch its row says
        micro, accumulation, ranks, global_batch = (int(row[k]) for k in (
            "micro_batch", "gradient_accumulation_steps", "ranks", "train_batch_size"))
        assert accumulation == 2 and global_batch == micro * accumulation * ranks, row
        metrics = json.loads((sweep / row["job"] / "summary.json").read_text())["metrics"]
        assert metrics["train/tokens"] == metrics["train/steps"] * global_batch * block, (row, metrics)
    experiment = sweep / "conf" / "experiment" / "autotune_best.yaml"
    command = experiment.read_text().splitlines()[1][2:]
    assert command == f"python -m dsrecipes --config-dir {sweep / 'conf'} +experiment=autotune_best"
    assert "".join(command.split()) in "".join(result.stdout.split())  # printed, however the console wraps it

    cfg = compose([f"hydra.searchpath=[file://{sweep / 'conf'}]", "+experiment=autotune_best", "launcher.nproc_per_node=1",
                   "trainer.max_steps=2", "trainer.eval_batches=1", "trainer.sample_tokens=0", "trainer.progress_bar=false",
                   "checkpoint.save_final=false", "checkpoint.export_safetensors=false", "logger=none"])
    assert cfg.model.name == "gpt_debug" and cfg.zero.stage in (0, 3) and cfg.launcher.nproc_per_node == "1"
    root, batch = validate_recipe(cfg, dp_world_size=1)
    summary = Trainer(root, tmp_path / "best_run", batch).fit()
    assert summary["metrics"]["train/steps"] == 2
