"""Launching and running data-parallel jobs through the real CLI (CPU/gloo): the self-spawning launcher, torchrun,
a failing rank, restarts, multirun sweeps with auto workers, the offline export of a ZeRO-3 checkpoint, and
dsrecipes.initialize sharding a user's own module (and a Hugging Face causal LM) under every ZeRO stage.

That each ZeRO stage (and offload, activation checkpointing) at world 2 reproduces one process is the
layout-equivalence table's (tests/integration/equivalence/table.py: the dp2-* rows).
"""

import json

import pytest
import torch

from dsrecipes.models import load_exported
from tests.helpers.cli import run_cli
from tests.helpers.equivalence import STEPS, common
from tests.helpers.run_cache import cached_run
from tests.integration.equivalence.table import row


@pytest.mark.slow
def test_launcher_smoke_gpt_zero3_spawns_two_workers(tmp_path, datasets_cache):
    result = run_cli(["+experiment=gpt_zero3", "trainer.max_steps=3", "trainer.eval_batches=1", "trainer.sample_tokens=4",
                      "data.max_bytes=300000", f"data.cache_dir={datasets_cache}", "model.max_seq_len=64"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = list(tmp_path.glob("outputs/*/*_gpt_zero3"))
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == ["rank0.log", "rank1.log"]
    assert (run_dir / ".hydra" / "config.yaml").exists()
    assert "micro 16 x accumulation 1 x dp 2" in (run_dir / "logs" / "rank0.log").read_text()
    assert result.stdout.count("dsrecipes run summary") == 1  # console output from rank 0 only


@pytest.mark.slow
def test_torchrun_joins_instead_of_spawning(tmp_path, datasets_cache):
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "dsrecipes",
           "model=gpt_debug", "model.max_seq_len=64", "zero.stage=2", "trainer.max_steps=2", "trainer.eval_batches=1",
           "trainer.sample_tokens=0", "data.max_bytes=300000", f"data.cache_dir={datasets_cache}", "logger=jsonl"]
    result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = list(tmp_path.glob("outputs/*/*_gpt"))
    assert len(runs) == 1, runs  # both ranks agreed on one run directory
    assert sorted(p.name for p in (runs[0] / "logs").iterdir()) == ["rank0.log", "rank1.log"]


@pytest.mark.slow
def test_a_failing_rank_ends_the_job_with_its_traceback(tmp_path, datasets_cache):
    result = run_cli(["model=gpt_debug", "model.max_seq_len=64", "zero.stage=1", "launcher.nproc_per_node=2",
                      "trainer.max_steps=50", "data.max_bytes=300000", f"data.cache_dir={datasets_cache}",
                      "launcher.collective_timeout_s=60"], cwd=tmp_path, timeout=240,
                     env_extra={"DSRECIPES_TEST_FAIL_RANK": "1", "DSRECIPES_TEST_FAIL_STEP": "3"})
    assert result.returncode != 0
    assert "injected failure on rank 1 at step 3" in result.stdout + result.stderr


@pytest.mark.slow
def test_offline_export_of_a_zero3_checkpoint_loads_into_a_plain_model(tmp_path, tmp_path_factory, capsys):
    """The zero_to_fp32 use case: a world-size-2 ZeRO-3 checkpoint (the equivalence table's dp2-zero3 run) -> one
    safetensors file, same outputs; `python -m dsrecipes.export` says what it wrote."""
    from dsrecipes.export import main

    run = cached_run(tmp_path_factory, row("dp2-zero3").overrides())
    live = run.params  # the engine's own export while running
    main([str(run.run_dir / "checkpoints"), str(tmp_path / "offline")])
    said = capsys.readouterr().out
    assert said.startswith(f"exported to {tmp_path / 'offline'}: Hugging Face layout (model_type gpt2")
    assert "  model.safetensors  " in said and "  config.json  " in said and " bytes" in said
    model, config = load_exported(tmp_path / "offline")
    assert config["model"]["name"] == "gpt_debug"
    for name, tensor in live.items():
        assert torch.equal(model.state_dict()[name], tensor), name
    ids = torch.randint(0, 257, (2, 16))
    reference = load_exported(run.run_dir / "export")[0]
    torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_max_restarts_restarts_failed_workers_which_resume(tmp_path, datasets_cache, single_gpt):
    """Rank 1 dies at step 7 while rank 0 waits in a gloo collective; with one restart allowed the agent
    restarts both workers, they resume from step 5 and end where an uninterrupted run ends. Started with
    spawn, the launcher's default for users (the rest of the suite forks its workers: tests/conftest.py)."""
    ref_losses, _ = single_gpt
    cwd = tmp_path / "restart"
    cwd.mkdir()
    result = run_cli(common(datasets_cache) + ["launcher.nproc_per_node=2", "trainer.train_micro_batch_size_per_gpu=4",
                                               "launcher.max_restarts=1", "checkpoint.interval=5",
                                               "launcher.start_method=spawn"],
                     cwd=cwd, timeout=300, env_extra={"DSRECIPES_TEST_FAIL_RANK": "1", "DSRECIPES_TEST_FAIL_STEP": "7"})
    assert result.returncode == 0, result.stderr[-4000:]
    assert "connectFullMesh" not in result.stderr
    (run_dir,) = [p for p in (cwd / "outputs").glob("*/*") if p.is_dir()]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "train/loss" in r]
    assert steps[:5] == list(range(1, 6)) and steps[-5:] == list(range(6, 11))  # resumed after step 5
    assert len(steps) > 10  # the first attempt got past step 5 before rank 1 died
    final = [r["train/loss"] for r in records if r.get("step") == STEPS and "train/loss" in r][-1]
    assert final == pytest.approx(ref_losses[-1], abs=2e-5)
    assert "resumed from" in (run_dir / "logs" / "rank0.log").read_text()


@pytest.mark.slow
def test_bad_layouts_fail_before_any_worker_starts(tmp_path):
    from dsrecipes.config import validate_recipe
    from dsrecipes.config.store import compose
    from dsrecipes.distributed.config import LauncherConfig, ZeroConfig, resolve_nproc

    with pytest.raises(ValueError, match="zero.hybrid_shard_size=3 does not divide the world size 4; valid sizes: 1, 2, 4"):
        validate_recipe(compose(["zero.stage=3", "zero.hybrid_shard_size=3"]), dp_world_size=4)
    with pytest.raises(ValueError, match="zero.offload_param=cpu needs zero.stage=3"):
        validate_recipe(compose(["zero.stage=2", "zero.offload_param=cpu"]), dp_world_size=2)
    with pytest.raises(ValueError, match="launcher.nproc_per_node=8 but only 2 GPU"):
        resolve_nproc(LauncherConfig(nproc_per_node="8"), ZeroConfig(), gpus=2)
    assert resolve_nproc(LauncherConfig(), ZeroConfig(stage=3), gpus=0) == 2
    assert resolve_nproc(LauncherConfig(), ZeroConfig(stage=0), gpus=0) == 1
    assert resolve_nproc(LauncherConfig(), ZeroConfig(stage=0), gpus=4) == 4
    result = run_cli(["zero.stage=3", "zero.hybrid_shard_size=3", "launcher.nproc_per_node=2"], cwd=tmp_path)
    assert result.returncode != 0 and "does not divide the world size 2" in result.stderr
    assert not list(tmp_path.glob("outputs/*/*/logs"))  # no worker got as far as logging


class UserMLP(torch.nn.Module):
    """A user's own model: input layer, a ModuleList of hidden layers (FSDP2 shards each), output."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(8, 32)
        self.hidden = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(2))
        self.out = torch.nn.Linear(32, 1)

    def forward(self, x):
        x = torch.tanh(self.inp(x))
        for layer in self.hidden:
            x = torch.tanh(layer(x))
        return self.out(x)


def _tiny_hf_causal_lm():
    """A Hugging Face causal LM of an architecture dsrecipes does not import into its GPT (GPT-NeoX), or None
    without transformers: it trains through dsrecipes.initialize as any nn.Module does."""
    try:
        from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    except ImportError:
        return None
    config = GPTNeoXConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=32, hidden_dropout=0.0,
                           attention_dropout=0.0, use_cache=False)
    return GPTNeoXForCausalLM(config).float()


def _user_module_under_zero(rank, world_size, stages, results):
    """A plain nn.Module (not dsrecipes' GPT), and a Hugging Face causal LM, trained through dsrecipes.initialize
    under each ZeRO stage in turn (one process group for all of them); rank 0 saves {(kind, stage): full state}."""
    import dsrecipes

    states = {}
    for kind in ("mlp", "hf"):
        for stage in stages:
            torch.manual_seed(0)
            model = UserMLP() if kind == "mlp" else _tiny_hf_causal_lm()
            if model is None:
                continue
            cfg = {"zero": {"stage": stage}, "lr_scheduler": {"name": "constant"}, "optimizer": {"lr": 1e-2},
                   "trainer": {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 8 // world_size,
                               "gradient_accumulation_steps": None, "device": "cpu"}}
            engine, *_ = dsrecipes.initialize(model=model, config=cfg)
            g = torch.Generator().manual_seed(1)
            x, y = torch.randn(80, 8, generator=g), torch.randn(80, 1, generator=g)
            ids = torch.randint(0, 64, (80, 16), generator=g)
            micro = engine.train_micro_batch_size_per_gpu
            for step in range(5):
                for m in range(engine.gradient_accumulation_steps):
                    start = step * 16 + m * micro * world_size + rank * micro
                    rows = slice(start, start + micro)
                    if kind == "mlp":
                        loss = torch.nn.functional.mse_loss(engine(x[rows]), y[rows])
                    else:  # the model's own (shifted) causal-LM loss
                        loss = engine(input_ids=ids[rows], labels=ids[rows]).loss
                    engine.backward(loss)
                    engine.step()
            states[kind, stage] = engine.module_state_dict()  # a collective under FSDP2: every rank calls it
    if rank == 0:
        torch.save(states, results)


@pytest.fixture(scope="module")
def user_module_runs(tmp_path_factory):
    """({kind: state} of one process, {(kind, stage): state} at world 2): every stage shares one world-2 group."""
    from tests.helpers.distributed import run_distributed

    folder = tmp_path_factory.mktemp("user_module")
    reference_file, sharded_file = folder / "ref.pt", folder / "sharded.pt"
    run_distributed(_user_module_under_zero, 1, [0], str(reference_file))
    run_distributed(_user_module_under_zero, 2, [0, 1, 2, 3], str(sharded_file), timeout_s=280)
    reference = {kind: state for (kind, _), state in torch.load(reference_file).items()}
    return reference, torch.load(sharded_file)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_engine_api_shards_a_user_module(user_module_runs, stage):
    reference, sharded = user_module_runs
    for name in reference["mlp"]:
        torch.testing.assert_close(sharded["mlp", stage][name], reference["mlp"][name], rtol=0, atol=1e-5, msg=name)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_engine_api_shards_a_hugging_face_causal_lm(user_module_runs, stage):
    """Any transformers causal LM (here GPT-NeoX, which dsrecipes does not import into its GPT) trains under
    every ZeRO stage at world 2 to the single process's weights (5 steps of Adam at lr 1e-2; 5e-5, the
    layout-equivalence tolerance for parameters: Adam's normalisation lifts the fp32 summation-order
    differences of near-zero gradients, such as the qkv biases', to ~2e-5)."""
    pytest.importorskip("transformers")
    reference, sharded = user_module_runs
    assert reference["hf"].keys() == sharded["hf", stage].keys()
    for name in reference["hf"]:
        torch.testing.assert_close(sharded["hf", stage][name], reference["hf"][name], rtol=0, atol=5e-5,
                                   msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.slow
def test_multirun_sweep_with_auto_workers_keeps_the_global_batch(tmp_path, datasets_cache):
    """`-m zero.stage=0,2` on CPU: job 0 trains in one process, job 1 on 2 auto-chosen workers, and both
    train the recipe's global batch of 8 (micro 4 x accumulation 2 on one rank; 2 x 2 x 2 on two)."""
    result = run_cli(["-m", "zero.stage=0,2"] + common(datasets_cache)[:-1] + [
        "trainer.max_steps=2", "trainer.train_micro_batch_size_per_gpu=4"], cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = sorted(p for p in tmp_path.glob("outputs/multirun/*/*/*") if p.is_dir())
    assert [p.name for p in jobs] == ["0", "1"]
    assert [len(list((job / "logs").iterdir())) for job in jobs] == [1, 2]
    logs = [(job / "logs" / "rank0.log").read_text() for job in jobs]
    assert "batch: train_batch_size=8 = micro 4 x accumulation 2 x dp 1" in logs[0]
    assert "batch: train_batch_size=8 = micro 2 x accumulation 2 x dp 2" in logs[1]
    assert "the global batch stays the recipe's 8 (trainer.train_micro_batch_size_per_gpu 4 -> 2 per worker)" \
        in " ".join(result.stderr.split())
    assert "different global batches" not in result.stderr
    assert "multirun summary" in result.stdout
