"""A corpus of DeepSpeed configs shaped like real projects' (tests/data/ds_configs/), each trained or refused as it should be.

Each file is written for this test after the shape a project ships (the table below names it). A file
that trains is held to DeepSpeed's semantics: the ZeRO stage, the precision, the batch triple at a
data-parallel world of 2, and the lr of 50 optimizer steps equal to what DeepSpeed 0.19.8's own
scheduler class (deepspeed.runtime.lr_schedules, stepped in-process on a dummy optimizer) gives for the
file's scheduler block, or a constant lr where the file has none (DeepSpeed builds no scheduler); the
report gives a number for every mapped, auto and default key. A refused file is refused with its true
reason, before any work. A few files train against DeepSpeed itself in
tests/integration/test_deepspeed_config.py.
"""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch

from dsrecipes.config.auto_workers import workers_the_batch_allows
from dsrecipes.config.ds_import import load_translation
from dsrecipes.config.loading import load_config
from dsrecipes.config.validate import to_root, validate_engine_config
from dsrecipes.training.optim.lr_schedules import build_lr_scheduler
from tests.helpers.paths import TEST_DATA

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed's CPU accelerator when its schedules are imported
CORPUS = TEST_DATA / "ds_configs"
STEPS = 50

# file -> (the project shape it follows, (zero.stage, precision.dtype, (train_batch, micro, accumulation) at dp 2)
# or the refusal's reason)
EXPECTED: dict[str, tuple[str, tuple | str]] = {
    "hf_trainer_zero2_auto": ("transformers docs' ds_config_zero2.json (every value auto, WarmupLR)",
                              (2, "fp32", (32, 16, 1))),
    "hf_trainer_zero3_auto": ("transformers docs' ds_config_zero3.json (auto, WarmupDecayLR, CPU offload)",
                              (3, "fp32", (32, 16, 1))),
    "hf_trainer_zero3_bf16_no_blocks": ("HF Trainer ZeRO-3 without optimizer / scheduler blocks",
                                        (3, "bf16", (32, 16, 1))),
    "accelerate_zero3_offload": ("accelerate's ZeRO-3 offload template (accumulation 1, micro-batch auto)",
                                 (3, "fp32", (32, 16, 1))),
    "accelerate_zero2_fp16": ("accelerate's ZeRO-2 fp16 config file", (2, "fp16", (16, 2, 4))),
    "dsexamples_bing_bert_lamb": ("DeepSpeedExamples bing_bert LAMB (no scheduler block)", (0, "fp16", (4096, 64, 32))),
    "dsexamples_bert_onebit_adam": ("DeepSpeedExamples 1-bit Adam BERT (DeepSpeed <= 0.19.6's OneBitAdam)",
                                    (0, "fp16", (4096, 16, 128))),
    "dsexamples_cifar_warmup_lr": ("DeepSpeedExamples cifar (WarmupLR, legacy zero_optimization: false)",
                                   (0, "fp32", (16, 8, 1))),
    "dsexamples_onecycle": ("DeepSpeed's OneCycle tutorial", (0, "fp32", (16, 8, 1))),
    "dsexamples_lr_range_test": ("DeepSpeed's LR range test tutorial", (0, "fp32", (32, 8, 2))),
    "megatron_zero_offload_10b": ("Megatron ZeRO-Offload 10B (cpu_offload flag, no scheduler)", (2, "fp16", (8, 4, 1))),
    "megatron_ds_gpt_zero1_bf16": ("Megatron-DeepSpeed pretrain_gpt (ZeRO-1 bf16, Megatron's own optimizer)",
                                   (1, "bf16", (16, 4, 2))),
    "megatron_ds_random_ltd": ("Megatron-DeepSpeed GPT random-LTD", (0, "fp32", (16, 8, 1))),
    "axolotl_zero2": ("axolotl deepspeed_configs/zero2.json", (2, "fp32", (32, 16, 1))),
    "axolotl_zero3_compile": ("axolotl ZeRO-3 with a torch.compile block", "not a key of DeepSpeed's compile block: "
                                                                           "DeepSpeed refuses the config too"),
    "llamafactory_z0": ("LLaMA-Factory ds_z0_config.json", (0, "fp32", (32, 16, 1))),
    "llamafactory_z3_offload": ("LLaMA-Factory ds_z3_offload_config.json", (3, "fp32", (32, 16, 1))),
    "llamafactory_z3_fp8_block": ("LLaMA-Factory's ZeRO-3 fp8 config: a top-level fp8 block DeepSpeed does not read "
                                  "(ignored: its keys are not dsrecipes' fp8 keys)", (3, "fp32", (32, 16, 1))),
    "openrlhf_zero2_bf16": ("OpenRLHF get_train_ds_config (ZeRO-2, bf16)", (2, "bf16", (8, 2, 2))),
    "zero1_cpu_offload": ("ZeRO-1 with CPU optimizer offload (trains as zero.stage=2: same update)",
                          (2, "fp32", (8, 2, 2))),
    "fp16_auto_cast": ("fp16 with auto_cast (DeepSpeed casts the forward's inputs)", (0, "fp16", (8, 2, 2))),
    "bf16_with_torch_autocast": ("bf16 with torch_autocast (DeepSpeed 0.19.8 trains it)", (2, "bf16", (8, 4, 1))),
    "comments_and_launcher_keys": ("_comment, cuda_visible_devices, comms_config, monitor_config beside the keys",
                                   (2, "fp32", (32, 4, 4))),
    "xtc_quantization_period_0": ("DeepSpeedExamples XTC / ZeroQuant (quantization_period 0)", (0, "fp32", (8, 4, 1))),
    "refused_zenflow": ("ZenFlow asynchronous updates", "ZenFlow applies low-priority gradient updates asynchronously"),
    "refused_fp16_and_bf16": ("fp16 and bf16 both on (DeepSpeed refuses it too)",
                              "'bfloat16 and fp16 modes cannot be simultaneously enabled'"),
    "train_batch_1_zero2": ("train_batch_size 1 on a sharding stage (one worker under nproc_per_node=auto)",
                            (2, "fp32", (1, 1, 1))),
}
_ONE_RANK = {"train_batch_1_zero2"}  # its batch allows one data-parallel rank


def _ds(name: str) -> dict:
    return json.loads((CORPUS / f"{name}.json").read_text())


def test_the_corpus_is_the_table():
    assert sorted(p.stem for p in CORPUS.glob("*.json")) == sorted(EXPECTED) and len(EXPECTED) >= 20


def _deepspeed_lrs(ds: dict, root, lr: float) -> list[float]:
    """The lr DeepSpeed's engine steps with at each of STEPS optimizer steps: its scheduler class on the file's
    params ("auto" filled with the numbers the translation reports), or the optimizer's lr with no scheduler."""
    if "scheduler" not in ds:
        return [lr] * STEPS
    from deepspeed.runtime import lr_schedules

    block, s = ds["scheduler"], root.lr_scheduler
    resolved = {"warmup_max_lr": getattr(s, "warmup_max_lr", None) or lr,
                "total_num_steps": getattr(s, "total_num_steps", None) or root.trainer.max_steps}
    params = {k: (resolved[k] if k in resolved else getattr(s, k)) if v == "auto" else v
              for k, v in block["params"].items()}
    if block["type"] == "WarmupCosineLR":
        params.setdefault("total_num_steps", root.trainer.max_steps)
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    return _trace(getattr(lr_schedules, block["type"])(optimizer, **params), optimizer)


def _trace(scheduler, optimizer) -> list[float]:
    out = []
    for _ in range(STEPS):
        out.append(float(optimizer.param_groups[0]["lr"]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            scheduler.step()
    return out


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_corpus_file_trains_as_deepspeed_trains_it_or_is_refused_for_its_true_reason(name):
    ds, (_, expected) = _ds(name), EXPECTED[name]
    path = CORPUS / f"{name}.json"
    if isinstance(expected, str):
        with pytest.raises(ValueError) as error:
            load_config(path)
        assert expected in str(error.value) and "\n" not in str(error.value), str(error.value)
        return
    stage, dtype, triple = expected
    cfg = load_config(path)
    root = to_root(cfg)
    assert (root.zero.stage, str(root.precision.dtype)) == (stage, dtype)
    batch = validate_engine_config(root, 1 if name in _ONE_RANK else 2)
    assert (batch.train_batch_size, batch.micro_batch_size, batch.gradient_accumulation_steps) == triple
    lr = root.optimizer.lr
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    ours = _trace(build_lr_scheduler(root.lr_scheduler, optimizer, root.trainer.max_steps), optimizer)
    pytest.importorskip("deepspeed")
    theirs = _deepspeed_lrs(ds, root, lr)
    assert all(abs(a - b) <= 1e-12 * max(1.0, abs(b)) for a, b in zip(ours, theirs, strict=True)), (ours, theirs)
    if "scheduler" not in ds:
        assert str(root.lr_scheduler.name) == "constant"
    # the report: a number (or a named key) for every mapped, auto and default key, never "the recipe's value"
    for fate in load_translation(path).fates:
        assert "=?" not in fate.detail and "recipe's value" not in fate.detail, fate
        if fate.kind in ("auto", "default"):
            assert "=" in fate.detail, fate


def test_auto_cast_and_ignored_keys_are_reported():
    t = load_translation(CORPUS / "fp16_auto_cast.json")
    assert t.values["precision"]["auto_cast"] is True
    t = load_translation(CORPUS / "comments_and_launcher_keys.json")
    for key in ("_comment", "cuda_visible_devices", "comms_config", "monitor_config"):
        assert t.fate(key).kind == "no effect" and "DeepSpeed ignores it" in t.fate(key).detail
    fp8 = load_translation(CORPUS / "llamafactory_z3_fp8_block.json").fate("fp8")  # also a dsrecipes key
    assert fp8.kind == "no effect" and "DeepSpeed ignores it" in fp8.detail and "beside the DeepSpeed config" in fp8.detail
    stage = load_translation(CORPUS / "zero1_cpu_offload.json").fate("zero_optimization.stage")
    assert stage.value == 1 and "zero.stage=2" in stage.detail and "same" in stage.detail


def test_no_scheduler_block_is_a_constant_lr_on_every_entry_point(tmp_path):
    """The same file through dsrecipes.initialize's loader and the CLI's composition: the same schedule and numbers."""
    from dsrecipes.config.store import compose

    path = CORPUS / "dsexamples_bing_bert_lamb.json"
    library = to_root(load_config(path))
    cli = to_root(compose([f"deepspeed_config={path}"]))
    for root in (library, cli):
        assert str(root.lr_scheduler.name) == "constant" and root.optimizer.lr == 4e-3
    auto = CORPUS / "hf_trainer_zero3_auto.json"
    library, cli = to_root(load_config(auto)), to_root(compose([f"deepspeed_config={auto}"]))
    keys = ("warmup_num_steps", "warmup_type", "warmup_min_lr", "warmup_max_lr", "total_num_steps")
    assert [getattr(library.lr_scheduler, k) for k in keys] == [getattr(cli.lr_scheduler, k) for k in keys]
    assert (library.optimizer.lr, list(library.optimizer.betas), library.optimizer.weight_decay) == \
        (cli.optimizer.lr, list(cli.optimizer.betas), cli.optimizer.weight_decay)
    # a dsrecipes key given beside the file wins over an "auto", on both paths
    assert to_root(compose([f"deepspeed_config={auto}", "optimizer.lr=3e-4"])).optimizer.lr == 3e-4
    assert to_root(load_config({"deepspeed_config": str(auto), "optimizer": {"lr": 3e-4}})).optimizer.lr == 3e-4


def test_nproc_auto_starts_one_worker_where_the_batch_cannot_be_split():
    cfg = load_config(CORPUS / "train_batch_1_zero2.json")
    workers, why = workers_the_batch_allows(cfg, 2, gpus=0)
    assert workers == 1 and "train_batch_size=1" in why and "launcher.nproc_per_node" in why
    assert workers_the_batch_allows(load_config(CORPUS / "openrlhf_zero2_bf16.json"), 2, gpus=0) == (2, None)


class _NormFirst(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)
        self.proj = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.proj(self.norm(x)).float().pow(2).mean()


def test_fp16_auto_cast_casts_the_inputs_as_deepspeed_does():
    """A model whose first op is a LayerNorm, fed fp32: fp16 with auto_cast casts the input to fp16 (DeepSpeed's
    _cast_inputs_half), so the half-precision norm runs; without it the fp32 input meets fp16 weights."""
    import dsrecipes

    ds = {**_ds("fp16_auto_cast"), "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1}
    torch.manual_seed(0)
    engine, *_ = dsrecipes.initialize(model=_NormFirst(), config={"deepspeed_config": ds, "trainer": {"device": "cpu"}})
    x = torch.randn(2, 8)
    loss = engine(x)
    engine.backward(loss)
    engine.step()
    assert torch.isfinite(loss)
    plain = {**ds, "fp16": {"enabled": True, "initial_scale_power": 8}}
    engine, *_ = dsrecipes.initialize(model=_NormFirst(), config={"deepspeed_config": plain,
                                                                   "trainer": {"device": "cpu"}})
    with pytest.raises(RuntimeError, match="dtype"):
        engine(x)
