"""The `profiler` group: torch.profiler traces of the scheduled steps in <run dir>/profiler/."""


import pytest

from dsrecipes.config import validate_recipe
from dsrecipes.config.store import compose
from dsrecipes.training.trainer import Trainer


def _run(tmp_path, fast_overrides, extra):
    overrides = fast_overrides + [
        "trainer.max_steps=4", "trainer.log_interval=2", "trainer.eval_interval=0", "trainer.sample_tokens=0",
        "checkpoint.save_final=false", "checkpoint.export_safetensors=false", "logger=jsonl", "profiler=trace",
    ] + extra
    root, batch = validate_recipe(compose(overrides), dp_world_size=1)
    trainer = Trainer(root, tmp_path / "run", batch)
    trainer.fit()
    return trainer


@pytest.mark.gpu
def test_memory_snapshot_on_cuda(tmp_path, fast_overrides):
    _run(tmp_path, fast_overrides, ["profiler=memory", "trainer.device=cuda"])
    snapshot = tmp_path / "run/profiler/memory_snapshot_rank0.pickle"
    assert snapshot.stat().st_size > 0
