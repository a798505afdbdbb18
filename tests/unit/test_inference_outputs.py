"""Where mode=generate and mode=serve-bench write: a single generate run makes no run directory (console,
and generate.output_file relative to the working directory); a generate job that has a directory
(hydra.run.dir=PATH, multirun jobs) writes generations.jsonl into it; serve-bench writes its CSV, JSON
and Markdown table into its run directory; a job that fails before writing anything leaves no directory."""

from __future__ import annotations

import json
import os

import pytest
import torch

from dsrecipes.config import run_directory
from dsrecipes.config.run_directory import config_subdir, remove_unused_run_dir
from dsrecipes.config.store import compose
from dsrecipes.inference_cli import GENERATIONS_FILE, rewrite_aliases, run_inference_mode
from dsrecipes.models import GPT, ModelConfig, export_safetensors

GENERATE = ["mode=generate", "prompt=Hi", "generate.max_new_tokens=4", "generate.stop_tokens=[]"]
SERVE_BENCH = ["mode=serve-bench", "generate.bench_batch_sizes=[1]", "generate.bench_prompt_len=4",
               "generate.bench_new_tokens=3", "generate.bench_repeats=1", "generate.bench_impls=[engine]"]


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """A one-layer model's safetensors export: the smallest checkpoint the inference modes load."""
    cfg = ModelConfig(name="t", n_layer=1, n_head=2, d_model=16, vocab_size=320, max_seq_len=64)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("export") / "export"
    export_safetensors(GPT(cfg).state_dict(), cfg, path, extra={"tokenizer": "byte"})
    return path


@pytest.fixture
def fresh_claims():
    run_directory.forget_claims()
    yield
    run_directory.forget_claims()


def _hydra_record(path) -> None:
    (path / ".hydra").mkdir(parents=True)
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        (path / ".hydra" / name).write_text("{}\n")


def test_generate_resolves_to_no_run_directory_and_serve_bench_claims_one(tmp_path, monkeypatch, fresh_claims):
    monkeypatch.chdir(tmp_path)
    cfg = compose(["mode=generate"], return_hydra_config=True)
    assert cfg.hydra.run.dir == "." and os.listdir(tmp_path) == []
    cfg = compose(["mode=serve-bench"], return_hydra_config=True)
    claimed = tmp_path / cfg.hydra.run.dir
    assert claimed.is_dir() and claimed.parent.parent == tmp_path / "outputs" and claimed.name.endswith("_gpt")


def test_hydra_records_the_config_in_every_run_directory_but_not_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert config_subdir("generate", str(tmp_path)) is None
    assert config_subdir("generate", str(tmp_path / "outputs" / "multirun" / "x" / "0")) == ".hydra"
    assert config_subdir("serve-bench", str(tmp_path / "outputs" / "x")) == ".hydra"
    assert config_subdir("train", str(tmp_path)) == ".hydra"  # hydra.run.dir=. when training: as before


def test_a_run_directory_with_only_hydras_record_is_removed(tmp_path, fresh_claims):
    claimed = run_directory.run_dir(str(tmp_path / "outputs" / "2026-01-01"), "10-00-00", "gpt")
    assert claimed == str(tmp_path / "outputs" / "2026-01-01" / "10-00-00_gpt")
    _hydra_record(tmp_path / claimed)
    assert remove_unused_run_dir(claimed)
    assert os.listdir(tmp_path / "outputs") == []  # the date folder made for it went too
    named = tmp_path / "mine" / "run"  # named with hydra.run.dir=PATH: its parent stays
    _hydra_record(named)
    assert remove_unused_run_dir(named) and os.listdir(tmp_path / "mine") == []
    kept = tmp_path / "kept"
    _hydra_record(kept)
    (kept / "serve_bench.csv").write_text("impl\n")
    assert not remove_unused_run_dir(kept) and (kept / ".hydra").is_dir()
    (tmp_path / "no_record").mkdir()  # no .hydra/: not a directory Hydra just made for a job
    assert not remove_unused_run_dir(tmp_path / "no_record") and (tmp_path / "no_record").is_dir()


def _in_process(args, run_dir):
    overrides = rewrite_aliases(args)
    return run_inference_mode(compose(overrides), str(run_dir), overrides)


def test_generate_without_a_run_directory_writes_only_the_output_file(export, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = _in_process([*GENERATE, f"checkpoint={export}", "generate.output_file=out.jsonl"], tmp_path)
    assert os.listdir(tmp_path) == ["out.jsonl"]  # relative to the working directory, as before
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert records == out["generations"] and records[0]["prompt"] == "Hi"
    assert "wrote out.jsonl" in capsys.readouterr().out


def test_generate_with_a_run_directory_writes_its_generations_there(export, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = tmp_path / "outputs" / "multirun" / "x" / "0"
    _hydra_record(job)
    out = _in_process([*GENERATE, f"checkpoint={export}"], job)
    assert sorted(os.listdir(job)) == [".hydra", GENERATIONS_FILE]
    assert [json.loads(line) for line in (job / GENERATIONS_FILE).read_text().splitlines()] == out["generations"]
    assert sorted(os.listdir(tmp_path)) == ["outputs"]


def test_a_failed_inference_job_removes_its_directory(export, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = tmp_path / "run"
    _hydra_record(job)
    with pytest.raises(ValueError, match=r"model.n_head=4 \(checkpoint: 2\)"):
        _in_process([*SERVE_BENCH, f"checkpoint={export}", "model.n_head=4"], job)
    assert os.listdir(tmp_path) == []


def test_serve_bench_writes_its_table_beside_its_rows(export, tmp_path):
    _hydra_record(tmp_path / "run")
    out = _in_process([*SERVE_BENCH, f"checkpoint={export}"], tmp_path / "run")
    from dsrecipes.utils.charts import charts_available

    chart = ["serve_bench.png"] if charts_available() else []  # a bar chart beside the rows, with matplotlib
    assert sorted(os.listdir(tmp_path / "run")) == [".hydra", "serve_bench.csv", "serve_bench.json", "serve_bench.md",
                                                    *chart]
    table = (tmp_path / "run" / "serve_bench.md").read_text().splitlines()
    assert table[0].startswith("## serve-bench: export ") and table[2].startswith("| impl | batch | TTFT ms |")
    assert len(table) == 4 + len(out["serve_bench"]) and table[4].startswith("| engine | 1 | ")
