"""The DeepSpeed checkpoint reader on small folders built with torch.save in DeepSpeed's shapes (no DeepSpeed needed).

Real DeepSpeed 0.19.8 checkpoints (ZeRO 0-3, world 1 and 2, fp32 and bf16) are read and resumed in
tests/integration/test_deepspeed_checkpoint_import.py; here: the layouts' arithmetic and the errors.
"""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

from dsrecipes.training.checkpointing.deepspeed_checkpoint import looks_like_deepspeed_checkpoint, read_deepspeed_checkpoint


def _model_states(**extra):
    module = OrderedDict(w=torch.arange(6.0).view(2, 3), b=torch.tensor([7.0]))
    return {"module": module, "buffer_names": [], "lr_scheduler": {"last_batch_iteration": 4}, "global_steps": 5,
            "global_samples": 40, "skipped_steps": 0, "dp_world_size": 1, "mp_world_size": 1, "ds_version": "0.19.8",
            "my_client_key": 3, **extra}


def _tag(tmp_path, files: dict):
    folder = tmp_path / "ckpt" / "global_step5"
    folder.mkdir(parents=True)
    for name, value in files.items():
        torch.save(value, folder / name)
    (tmp_path / "ckpt" / "latest").write_text("global_step5")
    return tmp_path / "ckpt"


def test_zero0_state_by_position_in_module_order(tmp_path):
    optimizer = {"state": {0: {"step": torch.tensor(5.0), "exp_avg": torch.ones(2, 3)}, 1: {"step": torch.tensor(5.0),
                 "exp_avg": torch.full((1,), 2.0)}}, "param_groups": [{"lr": 0.1, "params": [0]}, {"lr": 0.2, "params": [1]}]}
    ckpt = read_deepspeed_checkpoint(_tag(tmp_path, {"mp_rank_00_model_states.pt": _model_states(optimizer=optimizer)}))
    assert ckpt.zero_stage == 0 and ckpt.global_steps == 5 and ckpt.lr_scheduler == {"last_batch_iteration": 4}
    assert torch.equal(ckpt.weights["w"], torch.arange(6.0).view(2, 3))
    assert torch.equal(ckpt.optimizer_state["b"]["exp_avg"], torch.full((1,), 2.0))
    assert [g["params"] for g in ckpt.param_groups] == [["w"], ["b"]] and ckpt.client_state == {"my_client_key": 3}


def test_zero0_state_out_of_module_order_is_refused(tmp_path):
    optimizer = {"state": {0: {"exp_avg": torch.ones(1)}, 1: {"exp_avg": torch.ones(2, 3)}},
                 "param_groups": [{"params": [0, 1]}]}
    with pytest.raises(ValueError, match="not in module order"):
        read_deepspeed_checkpoint(_tag(tmp_path, {"mp_rank_00_model_states.pt": _model_states(optimizer=optimizer)}))


def _zero3_rank(rank):
    """w (6 elements) and b (1) over 2 ranks: 3 + 1 elements each, b's second slot padding."""
    w = torch.arange(6.0)[3 * rank:3 * rank + 3]
    b = torch.tensor([7.0 if rank == 0 else 0.0])
    flat = torch.cat([w, b])
    return {"optimizer_state_dict": {"fp32_flat_groups": [flat], "optimizer_state_dict": {
        "state": {0: {"step": torch.tensor(5.0), "exp_avg": flat * 10}}, "param_groups": [{"lr": 0.1, "params": [0]}]}}}


def test_zero3_slices_are_joined_and_padding_dropped(tmp_path):
    states = _model_states(param_shapes=[OrderedDict(w=torch.Size([2, 3]), b=torch.Size([1]))], dp_world_size=2)
    states["module"] = {k: torch.empty(0) for k in states["module"]}
    files = {f"zero_pp_rank_{r}_mp_rank_00_model_states.pt": states for r in (0, 1)}
    files.update({f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt": _zero3_rank(r) for r in (0, 1)})
    folder = _tag(tmp_path, files)
    assert looks_like_deepspeed_checkpoint(folder) and looks_like_deepspeed_checkpoint(folder / "global_step5")
    ckpt = read_deepspeed_checkpoint(folder)
    assert ckpt.zero_stage == 3 and ckpt.dp_world_size == 2
    assert torch.equal(ckpt.weights["w"], torch.arange(6.0).view(2, 3)) and torch.equal(ckpt.weights["b"], torch.tensor([7.0]))
    assert torch.equal(ckpt.optimizer_state["w"]["exp_avg"], torch.arange(6.0).view(2, 3) * 10)


def test_missing_rank_file_names_it(tmp_path):
    states = _model_states(param_shapes=[OrderedDict(w=torch.Size([2, 3]), b=torch.Size([1]))], dp_world_size=2)
    files = {f"zero_pp_rank_{r}_mp_rank_00_model_states.pt": states for r in (0, 1)}
    files["zero_pp_rank_0_mp_rank_00_optim_states.pt"] = _zero3_rank(0)
    with pytest.raises(FileNotFoundError, match=r"rank\(s\) \[1\]"):
        read_deepspeed_checkpoint(_tag(tmp_path, files))


def test_not_a_deepspeed_checkpoint(tmp_path):
    assert not looks_like_deepspeed_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError, match="latest"):
        read_deepspeed_checkpoint(tmp_path)
    (tmp_path / "latest").write_text("global_step9")
    with pytest.raises(FileNotFoundError, match="global_step9"):
        read_deepspeed_checkpoint(tmp_path)


def test_tensor_parallel_checkpoint_is_refused(tmp_path):
    folder = _tag(tmp_path, {"mp_rank_00_model_states.pt": _model_states(), "mp_rank_01_model_states.pt": _model_states()})
    with pytest.raises(ValueError, match="tensor \\(model\\) parallelism"):
        read_deepspeed_checkpoint(folder)


def test_trainer_resume_finds_the_tag_folder(tmp_path):
    """trainer.resume=<DeepSpeed folder> resumes from the tag `latest` names (the Trainer loads parent/tag)."""
    from dsrecipes.training.checkpointing.checkpoint import find_resume_checkpoint

    folder = _tag(tmp_path, {"mp_rank_00_model_states.pt": _model_states()})
    assert find_resume_checkpoint(str(folder), tmp_path / "run", "checkpoints", "x") == folder / "global_step5"
    assert find_resume_checkpoint(str(folder / "global_step5"), tmp_path / "run", "checkpoints", "x") == folder / "global_step5"
