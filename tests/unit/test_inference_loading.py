"""Loading trained models for inference (dsrecipes.inference.loading) from every format the project
writes: sharded dcp/ checkpoints and full-state model.pt checkpoints (written by the real Engine),
checkpoints folders (`latest`), run directories and the safetensors export; generation from each equals
generation from the in-memory model. Plus the CLI: mode=generate and mode=serve-bench, and clear errors."""

from __future__ import annotations

import json
import re

import pytest
import torch
from omegaconf import OmegaConf

import dsrecipes
from dsrecipes.inference import init_inference, load_model
from dsrecipes.models import GPT, ModelConfig, export_safetensors

CFG = ModelConfig(name="t", n_layer=2, n_head=4, d_model=32, vocab_size=320, max_seq_len=64)
PROMPTS = [[104, 101, 108], [119, 111]]


def _trained(precision: dict) -> tuple[GPT, object]:
    torch.manual_seed(0)
    model = GPT(CFG)
    engine, *_ = dsrecipes.initialize(model=model, config={
        "model": dict(vars(CFG)),  # the checkpoint's config.yaml records the model's shape
        "trainer": {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1},
        "optimizer": {"lr": 1e-2}, "precision": precision})
    ids = torch.randint(0, 256, (2, 16))
    for _ in range(2):
        engine.backward(engine(ids, labels=ids).loss)
        engine.step()
    return model, engine


def _write_run(tmp_path, engine, name: str):
    run = tmp_path / name
    (run / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create({"model": {**vars(CFG), "vocab_size": None}, "data": {"tokenizer": "byte"},
                                     "checkpoint": {"dirname": "checkpoints"}}), run / ".hydra" / "config.yaml")
    step = engine.save_checkpoint(run / "checkpoints")
    return run, step


def _reference(model: GPT) -> list[list[int]]:
    copy = GPT(CFG)
    copy.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    return init_inference(copy.eval()).generate(PROMPTS, max_new_tokens=8).tokens


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("inference_runs")
    dcp_model, dcp_engine = _trained({"dtype": "fp32"})
    dcp_run, dcp_step = _write_run(tmp, dcp_engine, "dcp_run")
    full_model, full_engine = _trained({"dtype": "bf16", "master_weights": True})
    full_run, full_step = _write_run(tmp, full_engine, "full_run")
    export = tmp / "export"
    export_safetensors(dcp_model.state_dict(), CFG, export, extra={"tokenizer": "byte"})
    return {"dcp": (dcp_run, dcp_step, dcp_model), "full": (full_run, full_step, full_engine), "export": export}


def test_checkpoint_layouts_are_what_the_engine_writes(runs):
    assert (runs["dcp"][1] / "dcp").is_dir() and not (runs["dcp"][1] / "model.pt").exists()
    assert (runs["full"][1] / "model.pt").exists() and not (runs["full"][1] / "dcp").exists()


@pytest.mark.parametrize("which", ["run_dir", "checkpoints_folder", "step_dir"])
def test_sharded_dcp_checkpoint_loads_and_generates_like_the_trained_model(runs, which):
    run, step, model = runs["dcp"]
    path = {"run_dir": run, "checkpoints_folder": run / "checkpoints", "step_dir": step}[which]
    loaded, info = load_model(path)
    assert info.kind == "checkpoint" and info.path == step and info.model_cfg.vocab_size == 320
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert loaded.lm_head.weight is loaded.tok_emb.weight
    assert init_inference(loaded).generate(PROMPTS, max_new_tokens=8).tokens == _reference(model)


def test_full_state_checkpoint_loads_fp32_master_weights(runs):
    run, step, engine = runs["full"]
    loaded, info = load_model(run)
    master = engine.module_state_dict()
    for name, tensor in master.items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor.float(), atol=0, rtol=0)
    assert loaded.tok_emb.weight.dtype == torch.float32


def test_safetensors_export_loads(runs):
    loaded, info = load_model(runs["export"])
    assert info.kind == "export" and info.tokenizer == "byte"
    assert init_inference(loaded).generate(PROMPTS, max_new_tokens=8).tokens == _reference(runs["dcp"][2])


def test_checkpoint_not_matching_the_model_config_is_a_clear_error(runs):
    wrong_width = ModelConfig(**{**vars(CFG), "d_model": 64})
    with pytest.raises(ValueError, match=r"model.d_model=64 \(checkpoint: 32\)"):
        load_model(runs["dcp"][0], wrong_width)
    wrong_heads = ModelConfig(**{**vars(CFG), "n_head": 2})
    with pytest.raises(ValueError, match=r"model.n_head=2 \(checkpoint: 4\)"):
        load_model(runs["export"], wrong_heads)
    with pytest.raises(FileNotFoundError, match="is not a dsrecipes run directory, checkpoints folder"):
        load_model(runs["export"].parent)


def _in_process(args, run_dir):
    """What `python -m dsrecipes ARGS` does after composing, without a new interpreter."""
    from dsrecipes.config.store import compose
    from dsrecipes.inference_cli import rewrite_aliases, run_inference_mode

    overrides = rewrite_aliases(args)
    return run_inference_mode(compose(overrides), str(run_dir), overrides)


def test_generate_mode_streams_one_prompt_with_int8(runs, tmp_path, capsys):
    out = _in_process(["mode=generate", f"checkpoint={runs['export']}", "prompt=hel", "generate.max_new_tokens=4",
                       "generate.quant=int8", "generate.stop_tokens=[]"], tmp_path)
    printed = capsys.readouterr().out
    assert "int8 weight-only" in printed and "saved" in printed
    assert printed.count("hel" + out["generations"][0]["completion"]) == 1  # streamed once, not re-printed


@pytest.mark.parametrize("args,error,message", [
    (["prompt=" + "x" * 70], ValueError, "longer than the model's context model.max_seq_len=64"),
    (["prompt=hi", "model.d_model=64"], ValueError, "model.d_model=64 (checkpoint: 32)"),
    (["prompt=hi", "generate.tp_size=3"], ValueError, "generate.tp_size=3 needs exactly that many processes"),
    (["prompt=hi", "generate.stop_tokens=[99999]"], ValueError,
     "generate.stop_tokens=[99999]: [99999] lie outside the model's vocabulary"),
    ([], ValueError, "needs exactly one of generate.prompt and generate.prompts_file"),
    (["generate.prompts_file=/nonexistent.txt"], FileNotFoundError, "generate.prompts_file='/nonexistent.txt' does not exist"),
])
def test_generate_mode_bad_input_errors(runs, tmp_path, args, error, message):
    with pytest.raises(error, match=re.escape(message)):
        _in_process(["mode=generate", f"checkpoint={runs['dcp'][0]}", *args], tmp_path)


def _composition_error(args, run_dir) -> str:
    """The message of the error composing `args` raises (an Enum field given a value it does not have)."""
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as err:
        _in_process(args, run_dir)
    return str(err.value.__cause__)


@pytest.mark.parametrize("args, message", [
    (["mode=decode"], "Invalid value 'decode', expected one of [train, generate, serve-bench]"),
    (["mode=generate", "prompt=hi", "generate.quant=int2"], "Invalid value 'int2', expected one of [none, int8, int4]"),
    (["mode=generate", "prompt=hi", "generate.dtype=fp8"], "Invalid value 'fp8', expected one of [fp32, bf16, fp16, int8]"),
    (["mode=serve-bench", "generate.bench_impls=[vllm]"], "Invalid value 'vllm', expected one of [plain, engine, kernels"),
])
def test_bad_choices_fail_at_composition_naming_the_key(tmp_path, args, message):
    text = _composition_error(args, tmp_path)
    key = args[-1].split("=")[0]
    assert message in text and f"full_key: {key}" in text


def test_mode_and_checkpoint_errors(tmp_path):
    with pytest.raises(ValueError, match="mode=generate needs generate.checkpoint"):
        _in_process(["mode=generate", "prompt=hi"], tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        _in_process(["mode=generate", f"checkpoint={tmp_path}/missing", "prompt=hi"], tmp_path)


def test_serve_bench_mode_writes_rows(runs, tmp_path):
    _in_process(["mode=serve-bench", f"checkpoint={runs['export']}", "generate.bench_batch_sizes=[1,2]",
                 "generate.bench_prompt_len=8", "generate.bench_new_tokens=4", "generate.bench_repeats=1",
                 "generate.bench_impls=[plain,engine,int8]"], tmp_path)
    rows = json.loads((tmp_path / "serve_bench.json").read_text())
    assert {(r["impl"], r["batch"]) for r in rows} == {(i, b) for i in ("plain", "engine", "int8") for b in (1, 2)}
    assert all(r["decode_tok_s"] > 0 and r["ttft_ms"] > 0 for r in rows)
    engine_row = next(r for r in rows if r["impl"] == "engine" and r["batch"] == 1)
    assert engine_row["decode_x_plain"] is not None


def test_serve_bench_without_checkpoint_uses_the_recipe_model(tmp_path):
    out = _in_process(["mode=serve-bench", "model=gpt_debug", "model.n_layer=1", "generate.bench_batch_sizes=[1]",
                       "generate.bench_prompt_len=4", "generate.bench_new_tokens=3", "generate.bench_repeats=1",
                       "generate.bench_impls=[engine]"], tmp_path)
    assert [r["impl"] for r in out["serve_bench"]] == ["engine"]
    assert "full_key: generate.bench_impls[0]" in _composition_error(
        ["mode=serve-bench", "model=gpt_debug", "generate.bench_impls=[vllm]"], tmp_path)
