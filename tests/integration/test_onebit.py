"""The multi-process, CLI and launcher tests (marked slow) whose in-process twins are tests/unit/test_onebit.py;
that module's docstring describes both halves.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from dsrecipes.distributed.compressed_allreduce import (
    CompressionErrors,
    compressed_allreduce,
    padded_size,
)
from tests.helpers.distributed import run_distributed
from tests.unit.test_onebit import _sign

SIZES = [(1,), (13,), (5, 7), (100,)]  # odd sizes: every one is padded
CALLS = 3


def torch_sim(inputs: list[torch.Tensor], worker_errors: list[torch.Tensor], server_errors: list[torch.Tensor]):
    """Every rank's compressed all-reduce in one process: inputs[r] is rank r's tensor; the error lists are
    updated in place. Returns the result (the same on every rank)."""
    world = len(inputs)
    numel = inputs[0].numel()
    n = worker_errors[0].numel()
    compressed = []
    for r, a in enumerate(inputs):
        x = torch.zeros(n)
        x[:numel] = a.reshape(-1)
        x += worker_errors[r]
        scale = x.norm() / math.sqrt(n)
        c = scale * _sign(x)
        worker_errors[r].copy_(x - c)
        compressed.append(c)
    average = torch.stack(compressed).sum(0) / world  # what a plain all-reduce of the compressed values gives
    out = []
    for r, chunk in enumerate(average.chunk(world)):
        y = chunk + server_errors[r]
        scale = y.norm() / math.sqrt(y.numel())
        out.append(scale * _sign(y))
        server_errors[r].copy_(y - out[-1])
    return torch.cat(out)[:numel].reshape(inputs[0].shape)


def _inputs(call: int, shape: tuple, world: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * call + sum(shape))
    return [torch.rand(shape, generator=g) - 0.5 + 0.01 * r for r in range(world)]


def _backend_matches_sim(rank: int, world: int) -> None:
    for force_p2p in (False, True):
        for shape in SIZES:
            numel = math.prod(shape)
            errors = CompressionErrors.for_tensor(numel, world, "cpu")
            sim_worker = [torch.zeros(padded_size(numel, world)) for _ in range(world)]
            sim_server = [torch.zeros(padded_size(numel, world) // world) for _ in range(world)]
            for call in range(CALLS):
                inputs = _inputs(call, shape, world)
                expected = torch_sim(inputs, sim_worker, sim_server)
                got = compressed_allreduce(inputs[rank].clone(), errors, force_p2p=force_p2p)
                torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6,
                                           msg=f"shape {shape} call {call} p2p {force_p2p}")
                torch.testing.assert_close(errors.worker, sim_worker[rank], rtol=1e-6, atol=1e-6)
                torch.testing.assert_close(errors.server, sim_server[rank], rtol=1e-6, atol=1e-6)
                exact = torch.stack(inputs).mean(0)  # the compressed mean points the same way as the exact one
                assert torch.nn.functional.cosine_similarity(got.reshape(-1), exact.reshape(-1), dim=0) > 0.3 \
                    or numel < 8


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 4])
def test_compressed_allreduce_equals_simulation(world):
    run_distributed(_backend_matches_sim, world, timeout_s=100)


def _bytes_sent(rank: int, world: int) -> None:
    sent = []
    original = dist.all_to_all_single, dist.all_gather_single

    def count(fn):
        def wrapper(output, tensor, *args, **kwargs):
            sent.append(tensor.numel() * tensor.element_size())
            return fn(output, tensor, *args, **kwargs)
        return wrapper

    dist.all_to_all_single, dist.all_gather_single = count(original[0]), count(original[1])
    try:
        n = 4096
        compressed_allreduce(torch.randn(n), CompressionErrors.for_tensor(n, world, "cpu"))
    finally:
        dist.all_to_all_single, dist.all_gather_single = original
    assert sum(sent) == n // 8 + n // 8 // world + 8
    assert sum(sent) <= 4 * n / 20


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_compressed_allreduce_sends_under_a_twentieth_of_fp32():
    """The collectives are looked up at call time (a logger wrapping them sees them) and send n/8 + n/16 + 8 bytes."""
    run_distributed(_bytes_sent, 2, timeout_s=50)


# ---------------------------------------------------------------------------------------------------
# the optimizers in one process: warm-up = the uncompressed counterpart, 0/1 Adam's schedule
# ---------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------
# at world 2 through dsrecipes.initialize: the onebit strategy, warm-up = counterpart, compression, reload
# ---------------------------------------------------------------------------------------------------


def _engine(optimizer: dict, world: int):
    import dsrecipes

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    cfg = {"zero": {"stage": 0}, "lr_scheduler": {"name": "constant"}, "optimizer": optimizer,
           "trainer": {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 16 // world,
                       "gradient_accumulation_steps": None, "device": "cpu", "gradient_clipping": 1.0}}
    engine, *_ = dsrecipes.initialize(model=model, config=cfg)
    return engine


def _train(engine, rank: int, world: int, steps: range) -> None:
    for step in steps:
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(16, 6, generator=g), torch.randn(16, 3, generator=g)
        loss = torch.nn.functional.mse_loss(engine(x.chunk(world)[rank]), y.chunk(world)[rank])
        engine.backward(loss)
        engine.step()


def _flat(engine) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in engine.module.parameters()])


def _same_on_every_rank(engine, world: int, atol: float = 0.0) -> None:
    mine = _flat(engine)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    for other in every:
        torch.testing.assert_close(other, mine, rtol=0, atol=atol, msg=type(engine.optimizer).__name__)


ADAMW = {"name": "adamw", "lr": 1e-2, "betas": [0.9, 0.95], "weight_decay": 0.1}
ONEBIT = {"lr": 1e-2, "betas": [0.9, 0.95], "weight_decay": 0.1}


def _world2_checks(rank: int, world: int, folder: str) -> None:
    adamw = _engine(ADAMW, world)
    _train(adamw, rank, world, range(4))
    lamb = _engine({"name": "lamb", **ONEBIT, "bias_correction": False}, world)
    _train(lamb, rank, world, range(4))
    for cfg, reference in (({"name": "onebitadam", "freeze_step": 10, "bias_correction": True}, adamw),
                           ({"name": "zerooneadam", "var_freeze_step": 10, "var_update_scaler": 100,
                             "bias_correction": True}, adamw),
                           ({"name": "onebitlamb", "freeze_step": 10}, lamb)):
        engine = _engine({**ONEBIT, **cfg}, world)
        assert engine.strategy.name == "onebit"
        _train(engine, rank, world, range(4))
        assert torch.equal(_flat(engine), _flat(reference)), cfg["name"]  # warm-up: exactly the counterpart

    for cfg in ({"name": "onebitadam", "freeze_step": 2}, {"name": "onebitlamb", "freeze_step": 2},
                {"name": "zerooneadam", "var_freeze_step": 3, "var_update_scaler": 1, "local_step_scaler": 2,
                 "local_step_clipper": 2}):
        engine = _engine({**ONEBIT, **cfg}, world)
        _train(engine, rank, world, range(8))
        assert engine.module.require_backward_grad_sync is False  # DDP's all-reduce is off after the freeze
        assert engine.optimizer.compression_errors, cfg["name"]
        assert all(torch.isfinite(p).all() for p in engine.module.parameters())
        _same_on_every_rank(engine, world)  # the compressed average is the same everywhere

    # checkpoint reload after the freeze: moments and steps come back, the compression errors do not
    engine = _engine({**ONEBIT, "name": "onebitadam", "freeze_step": 2}, world)
    _train(engine, rank, world, range(4))
    engine.save_checkpoint(folder)
    resumed = _engine({**ONEBIT, "name": "onebitadam", "freeze_step": 2}, world)
    resumed.load_checkpoint(folder)
    assert resumed.optimizer.compression_errors == {} and resumed.optimizer.steps_taken() == 4
    assert torch.equal(_flat(resumed), _flat(engine))
    assert not resumed.optimizer.needs_gradient_allreduce()
    _train(resumed, rank, world, range(4, 6))
    assert resumed.optimizer.compression_errors and resumed.module.require_backward_grad_sync is False
    _same_on_every_rank(resumed, world)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_world_2_strategy_warmup_compression_and_reload(tmp_path):
    """At world 2 (gloo): the onebit strategy is chosen; before the freeze each optimizer equals its
    counterpart bit for bit (the same DDP all-reduce feeds both); after it DDP's sync is off, the ranks
    stay identical and errors exist; a reload restores the step and resets the errors."""
    run_distributed(_world2_checks, 2, str(tmp_path / "ckpt"), timeout_s=140)


# ---------------------------------------------------------------------------------------------------
# a tiny recipe run, and bad input
# ---------------------------------------------------------------------------------------------------


# each compressed run and its uncompressed twin: the same optimizer, every step uncompressed (the freeze past the
# end). onebitadam and zerooneadam share theirs: their recipe hyperparameters are the same (checked below) and,
# uncompressed, both are DeepSpeed's Adam update on the averaged gradient, bit for bit.
FREEZE, STEPS = 10, 40
RUNS = {
    "adam_twin": ["optimizer=onebitadam", "optimizer.freeze_step=100000"],
    "onebitadam": ["optimizer=onebitadam", f"optimizer.freeze_step={FREEZE}"],
    "zerooneadam": ["optimizer=zerooneadam", f"optimizer.var_freeze_step={FREEZE}"],
    "lamb_twin": ["optimizer=onebitlamb", "optimizer.freeze_step=100000"],
    "onebitlamb": ["optimizer=onebitlamb", f"optimizer.freeze_step={FREEZE}"],
}
TWIN = {"onebitadam": "adam_twin", "zerooneadam": "adam_twin", "onebitlamb": "lamb_twin"}


def _recipe_runs(rank: int, world: int, overrides: list[str], folder: str, results: str) -> None:
    import warnings

    from dsrecipes.config import validate_recipe
    from dsrecipes.config.store import compose
    from dsrecipes.training.trainer import Trainer

    summaries = {}
    for name, extra in RUNS.items():
        with warnings.catch_warnings():  # the twins' "freeze_step is not before max_steps: never compresses"
            warnings.simplefilter("ignore", UserWarning)
            root, batch = validate_recipe(compose(overrides + extra), dp_world_size=world)
        trainer = Trainer(root, f"{folder}/{name}", batch, overrides=overrides + extra)
        summaries[name] = trainer.fit()
        summaries[name]["strategy"] = trainer.engine.strategy.name
        summaries[name]["sync_off"] = trainer.engine.module.require_backward_grad_sync is False
        summaries[name]["compressed"] = bool(trainer.engine.optimizer.compression_errors)
    if rank == 0:
        torch.save(summaries, results)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_gpt_debug_onebit_optimizers_track_their_uncompressed_twins_at_world_2(tmp_path, fast_overrides):
    """model=gpt_debug at world 2, 40 steps, compression from step 11 (issue 39): 1-bit Adam, 0/1 Adam and 1-bit
    LAMB each end with a validation loss within 5% of their uncompressed twin's, and learn after the freeze.
    Measured (val loss, twin): onebitadam 3.024 and zerooneadam 3.057 (adam twin 2.951), onebitlamb 3.146 (twin
    3.094); onebitlamb with DeepSpeed's scaling coefficients, fixed at the first compressed step, 3.730 (+21%;
    +15 to +21% over four seeds, the refreshed ones +1 to +3%): see dsrecipes.training.optim.onebit_lamb, "Scaling
    coefficients". Five runs of ~10-35 s each on two CPU cores."""
    from dsrecipes.config.store import compose

    adam_keys = ("lr", "betas", "eps", "weight_decay", "bias_correction")
    onebitadam, zerooneadam = (compose(["model=gpt_debug", f"optimizer={n}"]).optimizer
                               for n in ("onebitadam", "zerooneadam"))
    assert {k: onebitadam[k] for k in adam_keys} == {k: zerooneadam[k] for k in adam_keys}  # one twin for both

    # gpt_debug's own 128-token blocks, 16 per rank (the issue's run, on fast_overrides' 300 kB of the corpus): with
    # 64-token blocks of 4, DeepSpeed's stale coefficients did no visible harm (measured: 3.730, its twin 3.741)
    overrides = [o for o in fast_overrides if not o.startswith(("trainer.train_micro_batch_size_per_gpu",
                                                                "model.max_seq_len", "trainer.max_steps",
                                                                "trainer.eval_interval", "lr_scheduler"))]
    overrides += ["model.max_seq_len=128", "trainer.train_micro_batch_size_per_gpu=16", "trainer.sample_tokens=0",
                  "trainer.device=cpu", f"trainer.max_steps={STEPS}", f"trainer.eval_interval={STEPS}",
                  "lr_scheduler=constant"]
    results = tmp_path / "summaries.pt"
    run_distributed(_recipe_runs, 2, overrides, str(tmp_path), str(results), timeout_s=580)
    summaries = torch.load(results)
    val = {name: s["metrics"]["val/loss"] for name, s in summaries.items()}
    for name, twin in TWIN.items():
        run, reference = summaries[name], summaries[twin]
        assert run["strategy"] == reference["strategy"] == "onebit", name
        assert run["sync_off"] and run["compressed"] and not reference["compressed"], name  # only one compresses
        assert run["metrics"]["val/loss"] < 0.85 * run["metrics"]["train/first_loss"], name  # it learns
        assert val[name] < 1.05 * val[twin], f"{name} {val[name]:.3f} against its uncompressed twin {val[twin]:.3f}"
