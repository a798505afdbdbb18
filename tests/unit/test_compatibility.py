"""The compatibility matrix (dsrecipes.config.compatibility): every refused row fires before any work,
naming its keys, through validate_recipe (what the CLI runs before spawning workers), and the docs
(docs/model-parallelism.md) show exactly the table the code holds."""

from __future__ import annotations

import re

import pytest

from dsrecipes.config import validate_recipe
from dsrecipes.config.compatibility import REFUSED, SUPPORTED, matrix_markdown
from dsrecipes.config.store import compose
from tests.helpers.hf_models import resolve_checkpoints
from tests.helpers.paths import DOCS, REPO

HF = ["model=hf", "model.path=@hf:gemma3"]  # a tiny transformers-path checkpoint (made once per test session)

# combination -> (overrides, world size, a fragment of the message)
PP_BATCH = ("trainer.gradient_accumulation_steps=2", "trainer.train_micro_batch_size_per_gpu=16")
CASES = {
    "pp with compression": (["parallel.pp=2", "compression=qat_int8", "trainer.gradient_accumulation_steps=2",
                             "trainer.train_micro_batch_size_per_gpu=16"], 2,
                            "parallel.pp=2 with compression"),
    "pp x tp x dp with zero.stage >= 1": (
        ["parallel.pp=2", "parallel.tp=2", "zero.stage=2", "trainer.gradient_accumulation_steps=2",
         "trainer.train_micro_batch_size_per_gpu=16"], 8,
        "parallel.pp=2 x parallel.tp=2 with 2 data-parallel ranks and zero.stage=2 is not supported yet"),
    "sp with random-LTD": (["parallel.sp=2", "data_efficiency=random_ltd"], 2,
                           "data_efficiency.random_ltd.enabled=true is not supported with parallel.sp=2"),
    "sp with the sequence-length curriculum": (["parallel.sp=2", "data_efficiency=seqlen_curriculum"], 2,
                                               "data_efficiency.curriculum_learning.metric=seqlen is not supported"),
    "pp x sp with zero.stage > 0": (["parallel.pp=2", "parallel.sp=2", "zero.stage=1",
                                     "trainer.gradient_accumulation_steps=2", "trainer.train_micro_batch_size_per_gpu=16"],
                                    4, "parallel.pp=2 with parallel.sp=2 needs zero.stage=0"),
    "sp x tp with zero.stage 1": (["parallel.sp=2", "parallel.tp=2", "model.n_head=4", "model.d_model=128",
                                   "zero.stage=1"], 4, "parallel.sp=2 with parallel.tp=2 needs zero.stage 0, 2 or 3"),
    "sp with MoE": (["parallel.sp=2", "moe=top2"], 2, "parallel.sp=2 with moe.num_experts=8"),
    "tp x dp with zero.stage 0/1": (["parallel.tp=2"], 4,
                                    "parallel.tp=2 with 2 data-parallel ranks needs zero.stage 2 or 3"),
    "tp with fp32 master weights at dp 1": (["parallel.tp=2", "precision=bf16_master"], 2,
                                            "parallel.tp=2 with precision.master_weights=true"),
    "tp with optimizer.impl fused/foreach": (["parallel.tp=2", "optimizer.impl=foreach"], 2,
                                             "parallel.tp=2 with optimizer.impl=foreach"),
    "tp with activation quantization or layer reduction": (
        ["parallel.tp=2", "compression=qat_int8", "compression.activation_quantization.enabled=true"], 2,
        "parallel.tp=2 with compression.activation_quantization.enabled=true"),
    "tp with random-LTD": (["parallel.tp=2", "data_efficiency=random_ltd"], 2,
                           "parallel.tp=2 with data_efficiency.random_ltd.enabled=true"),
    "1-bit optimizers with zero.stage >= 1": (["optimizer=onebitadam", "zero.stage=1"], 2,
                                              "optimizer=onebitadam with zero.stage=1 is not supported"),
    "1-bit optimizers with tp / pp / sp / ep": (["optimizer=onebitlamb", "parallel.sp=2"], 2,
                                                "optimizer=onebitlamb with parallel.sp=2 is not supported yet"),
    "compact optimizer state (state_dtype=bf16, adamw8bit) with precision.master_dtype=bf16": (
        ["precision=bf16_master", "precision.master_dtype=bf16", "optimizer.state_dtype=bf16", "zero.stage=2"], 2,
        "optimizer.state_dtype=bf16 with precision.master_dtype=bf16 is not supported"),
    "optimizer=adamw8bit with NVMe optimizer offload": (
        ["optimizer=adamw8bit", "zero.stage=3", "zero.offload_optimizer=nvme", "zero.nvme_path=/tmp"], 2,
        "optimizer=adamw8bit with zero.offload_optimizer=nvme is not supported"),
    "NVMe offload with tp / sp / pp / ep, hybrid sharding, qwZ or hpZ": (
        ["zero.stage=3", "zero.offload_param=nvme", "zero.nvme_path=/tmp", "parallel.tp=2"], 4,
        "zero.offload_param=nvme with parallel.tp is not supported yet"),
    "compile=full with any parallel layout (dp, tp, pp, sp, ep > 1)": (
        ["compile=full", "parallel.tp=2"], 2, "compile=full with parallel.tp=2 is not supported"),
    "fp8 with tp": (["fp8=tensorwise", "parallel.tp=2"], 2, "fp8=tensorwise with parallel.tp=2 is not supported"),
    "fp8 with compression": (["fp8=rowwise", "compression=qat_int8"], 1,
                             "fp8=rowwise with compression.weight_quantization.enabled=true is not supported"),
    "model.style=hf with kernels.backend=triton": ([*HF, "kernels.backend=triton"], 1,
                                                   "kernels.backend=triton with model.style=hf"),
    "model.style=hf with compression": ([*HF, "compression=qat_int8"], 1,
                                        "compression.weight_quantization.enabled=true with model.style=hf"),
    "model.style=hf with random-LTD": ([*HF, "data_efficiency=random_ltd"], 1,
                                       "data_efficiency.random_ltd.enabled=true with model.style=hf"),
    "model.style=hf with the moe group or moe.ep_size > 1": ([*HF, "moe=top2"], 1,
                                                             "moe.num_experts=8 with model.style=hf"),
    "model.style=hf with sparse_attention": ([*HF, "sparse_attention=fixed"], 1,
                                             "sparse_attention.mode=fixed with model.style=hf"),
    "model.style=hf with pp": ([*HF, "parallel.pp=2", "trainer.gradient_accumulation_steps=2",
                                      "trainer.train_micro_batch_size_per_gpu=16"], 2,
                               "parallel.pp=2 with model.style=hf"),
    # instruction data (dsrecipes.data.config) and LoRA (dsrecipes.peft.config)
    "pp with data.packing=documents": (["parallel.pp=2", "data.packing=documents", "data.loss_mean=micro_batch",
                                        *PP_BATCH], 2, "data.packing=documents is not supported with parallel.pp=2"),
    "pp with data.loss_mean=global_tokens": (["parallel.pp=2", "data.packing=none", *PP_BATCH], 2,
                                             "data.loss_mean=global_tokens is not supported with parallel.pp=2"),
    "sp with data.packing=documents": (["parallel.sp=2", "data.packing=documents"], 2,
                                       "data.packing=documents is not supported with parallel.sp=2"),
    "sparse attention with data.packing=documents": (["sparse_attention=fixed", "data.packing=documents"], 1,
                                                     "data.packing=documents is not supported with sparse_attention"),
    "random-LTD or the curriculum with prompt/chat data or packing other than concat": (
        ["data_efficiency=random_ltd", "data.packing=none"], 1, "data_efficiency.random_ltd.enabled=true is not "
                                                                  "supported with data.format=text data.packing=none"),
    "LoRA with pp": (["peft=lora", "parallel.pp=2", *PP_BATCH], 2, "peft.method=lora is not supported with "
                                                                   "parallel.pp=2"),
    "LoRA with tp on the transformers path": ([*HF, "peft=lora", "parallel.tp=2"], 2,
                                              "peft.method=lora is not supported with parallel.tp=2 on the "
                                              "transformers path"),
    "LoRA with compression, dsrecipes MoE or fp8": (["peft=lora", "moe=top2"], 1,
                                                    "peft.method=lora is not supported with moe on"),
    "LoRA with a quantized base under ZeRO-3, tp or pp": (["peft=lora", "peft.quantize_base=int8", "zero.stage=3"], 2,
                                                          "peft.quantize_base=int8 is not supported with zero.stage=3"),
    "DPO with pp, tp or sp": (["data.format=preference", "data.packing=none", "dpo=dpo", "parallel.tp=2"], 2,
                              "dpo.enabled=true is not supported with parallel.pp=1 parallel.tp=2"),
}


def test_every_refused_row_has_a_case():
    assert sorted(CASES) == sorted(r.combination for r in REFUSED)


@pytest.mark.parametrize("combination", sorted(CASES))
def test_refused_combination_fails_before_work_naming_the_keys(combination, tmp_path_factory):
    overrides, world, fragment = CASES[combination]
    overrides = resolve_checkpoints(overrides, tmp_path_factory)
    with pytest.raises(ValueError, match=re.escape(fragment)):
        validate_recipe(compose(["model.dropout=0.0", *overrides]), dp_world_size=world)


def test_every_supported_row_names_the_tests_that_show_it():
    """Each supported combination names rows of the layout-equivalence table or tests (path::name) that exist."""
    import ast

    from tests.integration.equivalence.table import ROW_IDS

    for supported in SUPPORTED:
        assert supported.tests, f"supported row {supported.combination!r} names no test"
        for test in supported.tests:
            if "::" not in test:
                assert test in ROW_IDS, f"{supported.combination!r}: no row {test!r} in the equivalence table"
                continue
            path, name = test.split("::")
            tree = ast.parse((REPO / path).read_text())
            assert name in {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}, (
                f"{supported.combination!r}: {path} has no test {name}")


def test_every_layout_row_shows_a_supported_combination():
    """The other way round: a layout the table proves appears in the matrix (a new row names its combination)."""
    from tests.integration.equivalence.table import ROW_IDS

    named = {test for supported in SUPPORTED for test in supported.tests}
    assert ROW_IDS <= named, f"rows in no supported combination: {sorted(ROW_IDS - named)}"


def test_docs_matrix_is_the_table_in_the_code():
    page = (DOCS / "model-parallelism.md").read_text()
    assert matrix_markdown() in page
