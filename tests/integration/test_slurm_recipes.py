"""The multi-process, CLI and launcher tests (marked slow) whose in-process twins are tests/unit/test_slurm_recipes.py;
that module's docstring describes both halves.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dsrecipes.launch.slurm import template_text
from dsrecipes.models import load_exported
from tests.helpers.cli import run_cli
from tests.helpers.equivalence import STEPS, assert_matches_single_process, common
from tests.helpers.fake_slurm import fake_slurm_bin, job_environment, stop_fake_jobs

TINY = ["model=gpt_debug", "model.max_seq_len=64", "trainer.eval_batches=1", "trainer.sample_tokens=0",
        "trainer.progress_bar=false", "data.max_bytes=300000", "logger=jsonl"]


def run_template(tmp_path: Path, name: str, nodes: int, tasks_per_node: int, overrides: list[str],
                 extra_env: dict | None = None, timeout: int = 240) -> tuple[subprocess.CompletedProcess, Path]:
    """`bash <template> OVERRIDES` in a fresh working directory inside the fake allocation; the result and that directory."""
    cwd = tmp_path / "job"
    cwd.mkdir()
    script = cwd / "job.sbatch"
    script.write_text(template_text(name))
    env = job_environment(fake_slurm_bin(tmp_path / "bin"), nodes, tasks_per_node, extra_env)
    job = subprocess.Popen(["bash", str(script), *overrides], cwd=cwd, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = job.communicate(timeout=timeout)
    finally:  # a job that timed out (or a test interrupted) leaves no srun, torchrun or worker behind
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        job.wait()
    return subprocess.CompletedProcess(job.args, job.returncode, stdout, stderr), cwd


def only_run_dir(cwd: Path) -> Path:
    runs = [p for p in (cwd / "outputs").glob("*/*") if p.is_dir()]
    assert len(runs) == 1, runs  # every rank wrote into one run directory
    return runs[0]


def rank_logs(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "logs").iterdir())


def losses_and_export(run_dir: Path) -> tuple[list[float], dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    model, _ = load_exported(run_dir / "export")
    return [r["train/loss"] for r in records if "train/loss" in r], model.state_dict()


def test_an_unknown_template_is_one_line_naming_the_choices():
    result = subprocess.run([sys.executable, "-m", "dsrecipes.launch.slurm", "mpirun"], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr == "dsrecipes: error: unknown SLURM template 'mpirun'; choose one of: torchrun, srun\n"
    assert result.stdout == ""


def test_the_fake_scontrol_lists_the_allocation(tmp_path):
    env = job_environment(fake_slurm_bin(tmp_path), nodes=2, tasks_per_node=1)
    out = subprocess.run(["scontrol", "show", "hostnames", env["SLURM_JOB_NODELIST"]], env=env, capture_output=True,
                         text=True, check=True).stdout
    assert out.split() == ["localhost", "127.0.0.1"]


def test_the_fake_srun_gives_each_task_its_slurm_variables(tmp_path):
    env = job_environment(fake_slurm_bin(tmp_path), nodes=2, tasks_per_node=2)
    keys = "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS"
    show = f"import os; os.write(1, (' '.join(os.environ[k] for k in {keys}) + '\\n').encode())"  # one write: lines stay whole
    out = subprocess.run(["srun", "python", "-c", show], env=env, capture_output=True, text=True, check=True).stdout
    assert sorted(out.splitlines()) == ["0 0 0 4", "1 1 0 4", "2 0 1 4", "3 1 1 4"]
    failed = subprocess.run(["srun", "--kill-on-bad-exit=1", "--ntasks-per-node=1", "python", "-c",
                             "import os, sys, time; sys.exit(3) if os.environ['SLURM_PROCID'] == '1' else time.sleep(60)"],
                            env=env, capture_output=True, text=True, timeout=30)
    assert failed.returncode == 3


@pytest.mark.matrix
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_torchrun_template_two_nodes_zero3_reproduces_single_process(tmp_path, datasets_cache, single_gpt):
    """2 nodes x 2 workers (world 4): micro 2 x accumulation 2 x dp 4 against the reference's 8 x 2 x 1."""
    started = time.monotonic()
    result, cwd = run_template(tmp_path, "torchrun", nodes=2, tasks_per_node=1,
                               overrides=common(datasets_cache) + ["zero.stage=3", "trainer.train_micro_batch_size_per_gpu=2"],
                               extra_env={"GPUS_PER_NODE": "2"})
    print(f"torchrun template, world 4, {STEPS} steps: {time.monotonic() - started:.1f} s")
    assert result.returncode == 0, result.stderr[-4000:]
    run_dir = only_run_dir(cwd)
    assert rank_logs(run_dir) == ["rank0.log", "rank1.log", "rank2.log", "rank3.log"]
    assert "micro 2 x accumulation 2 x dp 4" in (run_dir / "logs" / "rank0.log").read_text()
    assert_matches_single_process(*losses_and_export(run_dir), *single_gpt)


@pytest.mark.matrix
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_srun_template_two_nodes_one_task_each_trains_as_world_2(tmp_path, datasets_cache):
    started = time.monotonic()
    result, cwd = run_template(tmp_path, "srun", nodes=2, tasks_per_node=1,
                               overrides=TINY + [f"data.cache_dir={datasets_cache}", "zero.stage=2", "trainer.max_steps=3"])
    print(f"srun template, world 2, 3 steps: {time.monotonic() - started:.1f} s")
    assert result.returncode == 0, result.stderr[-4000:]
    run_dir = only_run_dir(cwd)
    assert rank_logs(run_dir) == ["rank0.log", "rank1.log"]
    assert "dp 2" in (run_dir / "logs" / "rank0.log").read_text()
    assert (run_dir / ".hydra" / "config.yaml").exists() and (run_dir / "export").is_dir()


@pytest.mark.matrix
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_submitit_local_preset_runs_a_two_task_job_as_world_2(tmp_path, datasets_cache):
    """hydra/launcher=slurm_local: submitit's local executor starts the job's two tasks with SUBMITIT_LOCAL_*
    variables only; they become ranks 0 and 1 of one run in the job's directory, and rank 0's summary is the
    job's return value (the multirun summary shows it)."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    started = time.monotonic()
    result = run_cli(["-m", "hydra/launcher=slurm_local", *TINY, f"data.cache_dir={datasets_cache}", "zero.stage=2",
                      "trainer.max_steps=3"], cwd=tmp_path, timeout=200, fresh_interpreter=True,
                     env_extra={"OMP_NUM_THREADS": "1"})
    print(f"submitit local job, 2 tasks, 3 steps: {time.monotonic() - started:.1f} s")
    assert result.returncode == 0, result.stderr[-4000:]
    (sweep,) = list(tmp_path.glob("outputs/multirun/*/*"))
    job = sweep / "0"
    assert rank_logs(job) == ["rank0.log", "rank1.log"]
    rank0 = (job / "logs" / "rank0.log").read_text()
    assert "layout: world 2 " in rank0 and "dp 2" in rank0
    summary = json.loads((job / "summary.json").read_text())  # rank 0's
    assert summary["layout"].startswith("world 2 ") and summary["metrics"]["train/loss"] > 0
    assert "multirun summary" in result.stdout and len(list((sweep / ".submitit").glob("*/*_result.pkl"))) == 2
    assert OmegaConf.load(job / ".hydra" / "config.yaml").zero.stage == 2


@pytest.mark.matrix
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_submitit_slurm_preset_runs_a_two_node_job_through_a_fake_sbatch(tmp_path, datasets_cache):
    """hydra/launcher=slurm as submitted to SLURM (submitit's SLURM executor: sbatch, then srun in the job), with
    the fake sbatch/srun/sacct: a job of 2 nodes x 1 task trains as world 2 in the job's directory, its ranks
    meeting at the port submitit derives from the job id (no MASTER_PORT exported)."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    bin_dir = fake_slurm_bin(tmp_path / "bin")
    started = time.monotonic()
    try:
        result = run_cli(["-m", "hydra/launcher=slurm", "hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=1",
                          "hydra.launcher.gpus_per_node=null", *TINY, f"data.cache_dir={datasets_cache}",
                          "zero.stage=2", "trainer.max_steps=3"], cwd=tmp_path, timeout=240, fresh_interpreter=True,
                         env_extra={"OMP_NUM_THREADS": "1", "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    finally:
        stop_fake_jobs(bin_dir)
    print(f"submitit SLURM job, 2 nodes x 1 task, 3 steps: {time.monotonic() - started:.1f} s")
    assert result.returncode == 0, result.stderr[-4000:]
    (sweep,) = list(tmp_path.glob("outputs/multirun/*/*"))
    assert rank_logs(sweep / "0") == ["rank0.log", "rank1.log"]
    summary = json.loads((sweep / "0" / "summary.json").read_text())
    assert summary["layout"].startswith("world 2 ") and "data parallel: zero2" in summary["layout"]
    assert "#SBATCH --nodes=2" in next(sweep.glob(".submitit/*/*_submission.sh")).read_text()
