"""Bad input, one rule (issue 18): every value is checked before the run directory and any worker exist,
and fails with one line naming the key, the value and what would be valid; a key that has no effect
(its group is off) is a warning naming it.

The table runs in this process: compose the recipe (compose() merges each set of group options once and
applies the key=value overrides with Hydra's own step), then validate_recipe (or the inference checks for
mode=generate / serve-bench). A few real-CLI runs (marked slow) check what
the user sees: a multirun refused before its first job, one line and no traceback, no run directory.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException

from dsrecipes.config.inactive import inactive_keys
from dsrecipes.config.preflight import Preflight, check_inference_job, check_sweep, check_train_job
from dsrecipes.config.schema import CONFIG_GROUPS, RootConfig
from dsrecipes.config.store import compose
from dsrecipes.config.validate import to_root, validate_recipe
from dsrecipes.distributed.config import nccl_unavailable_reason
from dsrecipes.utils.paths import check_writable_dir
from dsrecipes.utils.ranges import check_ranges, numeric_keys, schema_ranges

_PARSER = OverridesParser.create()
NO_NCCL = nccl_unavailable_reason() is not None


def check(overrides: list[str]) -> None:
    """What the CLI runs before any run directory exists, for a train or an inference mode (world size: the
    recipe's launcher.nproc_per_node, 1 for auto)."""
    cfg = compose(overrides)
    nproc = str(cfg.launcher.nproc_per_node)
    if cfg.mode == "train":
        validate_recipe(cfg, dp_world_size=int(nproc) if nproc.isdigit() else 1)
    else:
        check_inference_job(cfg)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Data files that are not what they claim, a file where a directory belongs, a file that is no tokenizer."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path_factory.mktemp("bad_input")
    (d / "empty.txt").write_bytes(b"")
    (d / "binary.txt").write_bytes(b"\x7fELF\x02\x01\x00\x00" * 8)
    (d / "fake.parquet").write_text("a,b\n1,2\n")
    (d / "broken.jsonl").write_text('{"text": "one"\n{"text": "two"}\n')
    (d / "body.jsonl").write_text('{"body": "one"}\n')
    pq.write_table(pa.table({"body": ["one", "two"]}), d / "body.parquet")
    (d / "not_a_dir").write_text("a file")
    (d / "tokenizer.json").write_text("this is not a tokenizer\n")
    return d


# (overrides, fragments the one-line message must hold); {d} is the files fixture's directory
ERRORS = [
    # model: every numeric field has a range
    (["model.init_std=-0.02"], ["model.init_std=-0.02", "must be > 0"]),
    (["model.init_std=nan"], ["model.init_std=nan", "must be > 0"]),
    (["model.d_ff=0"], ["model.d_ff=0", "must be >= 1", "or null"]),
    (["model.norm_eps=0"], ["model.norm_eps=0.0", "must be > 0"]),
    (["model=llama_debug", "model.rope_theta=0"], ["model.rope_theta=0.0", "must be > 0"]),
    (["model.dropout=1.0"], ["model.dropout=1.0", "must be in [0, 1)"]),
    (["model.vocab_size=0"], ["model.vocab_size=0", "must be >= 1", "the tokenizer's"]),
    (["model.n_layer=0"], ["model.n_layer=0", "must be >= 1"]),
    # data: values, files, tokenizer, cache directory
    (["data.val_fraction=0.99"], ["data.val_fraction=0.99", "(0, 0.5]"]),
    (["data.val_fraction=0"], ["data.val_fraction=0.0", "(0, 0.5]"]),
    (["data.max_bytes=0"], ["data.max_bytes=0", ">= 1", "no cap"]),
    (["data=files", "data.paths=[{d}/empty.txt]"], ["data.paths", "empty.txt", "is empty"]),
    (["data=files", "data.paths=[{d}/binary.txt]"], ["data.paths", "binary.txt", "NUL bytes"]),
    (["data=files", "data.paths=[{d}/fake.parquet]"], ["data.paths", "fake.parquet", "not a Parquet file"]),
    (["data=files", "data.paths=[{d}/broken.jsonl]"], ["data.paths", "broken.jsonl", "not JSON lines", "line 1"]),
    (["data=files", "data.paths=[{d}/body.jsonl]"], ["data.text_field='text'", "body.jsonl", "available columns: body"]),
    (["data=files", "data.paths=[{d}/body.parquet]"], ["data.text_field='text'", "body.parquet", "available columns: body"]),
    (["data.tokenizer={d}/tokenizer.json"], ["data.tokenizer=", "tokenizer.json", "is not a tokenizers tokenizer.json",
                                             "'byte'"]),
    (["data.cache_dir={d}/not_a_dir"], ["data.cache_dir=", "not_a_dir", "is a file, not a directory"]),
    (["data.cache_dir={d}/not_a_dir/cache"], ["data.cache_dir=", "not_a_dir", "is a file"]),
    # optimizer
    (["optimizer.lr=-1"], ["optimizer.lr=-1.0", "must be > 0"]),
    (["optimizer.weight_decay=-0.1"], ["optimizer.weight_decay=-0.1", "must be >= 0"]),
    (["optimizer.betas=[0.9,1.5]"], ["optimizer.betas=[0.9, 1.5]", "entry 1 is 1.5", "in [0, 1)"]),
    (["optimizer=sgd", "optimizer.momentum=-0.9"], ["optimizer.momentum=-0.9", "must be >= 0"]),
    # lr_scheduler
    (["lr_scheduler.warmup_num_steps=0"], ["lr_scheduler.warmup_num_steps=0", "must be >= 1"]),
    (["lr_scheduler.cos_min_ratio=2"], ["lr_scheduler.cos_min_ratio=2.0", "in [0, 1]"]),
    (["lr_scheduler=torch_step", "lr_scheduler.step_size=0"], ["lr_scheduler.step_size=0", "must be >= 1"]),
    (["lr_scheduler=one_cycle", "lr_scheduler.cycle_min_lr=-1", "lr_scheduler.cycle_max_lr=1"],
     ["lr_scheduler.cycle_min_lr=-1.0", "must be >= 0"]),
    # precision
    (["precision.loss_scale=-1"], ["precision.loss_scale=-1.0", "must be >= 0"]),
    (["precision=fp16", "precision.initial_scale_power=200"], ["precision.initial_scale_power=200", "in [0, 127]"]),
    (["precision=fp16", "precision.hysteresis=0"], ["precision.hysteresis=0", "must be >= 1"]),
    # trainer
    (["trainer.peak_tflops=-1"], ["trainer.peak_tflops=-1.0", "must be > 0", "or null"]),
    (["trainer.sample_temperature=-0.5"], ["trainer.sample_temperature=-0.5", "must be >= 0"]),
    (["trainer.sample_top_k=-1"], ["trainer.sample_top_k=-1", "must be >= 0"]),
    (["trainer.max_steps=0"], ["trainer.max_steps=0", "must be >= 1"]),
    (["trainer.seed=-1"], ["trainer.seed=-1", "must be in [0, 2**63 - 1]"]),
    (["trainer.gradient_clipping=-1"], ["trainer.gradient_clipping=-1.0", "must be >= 0"]),
    # checkpoint: a directory inside the run directory
    (["checkpoint.dirname="], ["checkpoint.dirname=''", "relative directory name inside the run directory"]),
    (["checkpoint.dirname=/tmp/ckpt"], ["checkpoint.dirname='/tmp/ckpt'", "not absolute"]),
    (["checkpoint.dirname=../ckpt"], ["checkpoint.dirname='../ckpt'", "no '..'"]),
    (["checkpoint.keep_last=-1"], ["checkpoint.keep_last=-1", "must be >= 0"]),
    # zero, parallel, launcher
    (["zero.stage=4"], ["zero.stage=4", "choose one of: 0, 1, 2, 3"]),
    (["zero.hybrid_shard_size=-2"], ["zero.hybrid_shard_size=-2", "must be >= 0"]),
    (["parallel.tp=0"], ["parallel.tp=0", "must be >= 1"]),
    (["parallel.sp=-1"], ["parallel.sp=-1", "must be >= 1"]),
    (["launcher.max_restarts=-1"], ["launcher.max_restarts=-1", "must be >= 0"]),
    (["launcher.collective_timeout_s=0"], ["launcher.collective_timeout_s=0", "must be >= 1"]),
    pytest.param(["launcher.backend=nccl", "launcher.nproc_per_node=2"],
                 ["launcher.backend=nccl needs CUDA GPUs and NCCL", "gloo or auto"],
                 marks=pytest.mark.skipif(not NO_NCCL, reason="NCCL is available here"), id="nccl-without-nccl"),
    # activation_checkpointing, moe
    (["activation_checkpointing=every_k", "activation_checkpointing.every_k=0"],
     ["activation_checkpointing.every_k=0", "must be >= 1"]),
    (["moe=top2", "moe.k=0"], ["moe.k=0", "must be >= 1"]),
    (["moe=top2", "moe.capacity_factor=0"], ["moe.capacity_factor=0.0", "must be > 0"]),
    (["moe.layers=[-1]"], ["moe.layers=[-1]", "entry 0 is -1", ">= 0"]),
    # data_efficiency, compression, sparse_attention
    (["data_efficiency=random_ltd", "data_efficiency.random_ltd.min_value=0"],
     ["data_efficiency.random_ltd.min_value=0", "must be >= 1"]),
    (["data_efficiency.seed=-5"], ["data_efficiency.seed=-5", "must be in [0, 2**63 - 1]"]),
    (["compression.sparse_pruning.dense_ratio=0"], ["compression.sparse_pruning.dense_ratio=0.0", "in (0, 1]"]),
    (["compression.weight_quantization.start_bits=1"], ["compression.weight_quantization.start_bits=1", "in [2, 16]"]),
    (["compression.export_dirname=../out"], ["compression.export_dirname='../out'", "inside the run directory"]),
    (["sparse_attention.block=0"], ["sparse_attention.block=0", "must be >= 1"]),
    # generate (also checked when training: a negative temperature is never valid)
    (["generate.temperature=-1"], ["generate.temperature=-1.0", "must be >= 0"]),
    (["generate.top_k=-3"], ["generate.top_k=-3", "must be >= 0"]),
    (["mode=serve-bench", "generate.bench_batch_sizes=[0]"], ["generate.bench_batch_sizes=[0]", "entry 0 is 0", ">= 1"]),
    (["mode=serve-bench", "generate.bench_batch_sizes=[]"], ["generate.bench_batch_sizes=[]", "at least one"]),
    (["mode=generate", "generate.prompt=hi", "generate.checkpoint={d}", "generate.top_p=0"],
     ["generate.top_p=0.0", "in (0, 1]"]),
    (["mode=generate", "generate.prompt=hi", "generate.checkpoint={d}/no_such_run"],
     ["generate.checkpoint=", "no_such_run", "does not exist"]),
    # flops_profiler, profiler (dsrecipes.profiling.config)
    (["flops_profiler=enabled", "trainer.max_steps=10", "flops_profiler.profile_step=10"],
     ["flops_profiler.profile_step=10", "trainer.max_steps=10", "[0, 9]"]),
    (["flops_profiler.module_depth=-2"], ["flops_profiler.module_depth=-2", "must be >= -1"]),
    (["profiler=trace", "trainer.max_steps=2"], ["profiler.wait=1", "profiler.warmup=1", "trainer.max_steps=2"]),
    (["profiler.active=0"], ["profiler.active=0", "must be >= 1"]),
    # comms_logger (dsrecipes.distributed.comms_config)
    (["comms_logger=enabled", "comms_logger.prof_ops=[allreduce]"],
     ["comms_logger.prof_ops=['allreduce']", "unknown op name(s) ['allreduce']", "valid: all_reduce"]),
    # compile (dsrecipes.distributed.torch_compile)
    (["compile=blocks", "compile.backend=tensorrt"],
     ["compile.backend='tensorrt'", "is not an installed torch.compile backend", "inductor"]),
    # fp8 (dsrecipes.distributed.float8; the CPU refusal: tests/unit/test_float8.py)
    (["fp8=rowwise", "fp8.enable_fsdp_float8_all_gather=true"],
     ["fp8.enable_fsdp_float8_all_gather=true", "needs fp8=tensorwise", "fp8.recipe=rowwise"]),
    # instruction data (dsrecipes.data.config): the format's own keys, before any data is read
    (["data=files", "data.paths=[{d}/body.jsonl]", "data.format=chat", "data.chat_template=plain"],
     ["data.messages_field='messages'", "body.jsonl", "available columns: body"]),
    (["data.format=chat"], ["data.chat_template is null and data.tokenizer=byte has no chat template",
                            "chatml, llama3, plain"]),
    (["data.format=preference", "data.packing=documents", "dpo=dpo"],
     ["data.packing=documents is not valid for data.format=preference", "data.packing=none"]),
    # peft (dsrecipes.peft.config)
    (["peft=lora", "peft.r=0"], ["peft.r=0", "must be >= 1"]),
    (["peft=lora", "peft.target_modules=[]"], ["peft.target_modules=[]", "is empty"]),
    (["peft=lora", "peft.quantize_base=int4", "peft.bias=all"], ["peft.bias=all is not valid with "
                                                                 "peft.quantize_base=int4", "peft.bias=none"]),
    # dpo (dsrecipes.training.preference.config)
    (["dpo=dpo"], ["dpo.enabled=true trains on preference pairs", "data.format=text", "data.format=preference"]),
    (["data.format=preference", "data.packing=none", "dpo=dpo", "dpo.loss_type=ipo", "dpo.label_smoothing=0.1"],
     ["dpo.label_smoothing=0.1", "dpo.loss_type=sigmoid only"]),
    # name: part of the run directory's name
    (["name="], ["name=''", "must not be empty"]),
    (["name=a/b"], ["name='a/b'", "single file name"]),
]


def _params(rows):
    """Each row as a pytest.param whose id is its overrides."""
    return [row if hasattr(row, "values") else pytest.param(*row, id=" ".join(row[0])) for row in rows]


def _fill(overrides: list[str], d) -> list[str]:
    return [o.replace("{d}", str(d)) for o in overrides]


@pytest.mark.parametrize("overrides, fragments", _params(ERRORS))
def test_bad_value_fails_with_one_line_naming_key_value_and_what_is_valid(files, overrides, fragments):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises((ValueError, FileNotFoundError)) as err:
            check(_fill(overrides, files))
    message = str(err.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_groups_covered_by_the_table():
    """The table has a row for every config group, the run name and (below) hydra.run.dir."""
    keys = {o.split("=", 1)[0] for row in _params(ERRORS) for o in row.values[0]}
    touched = {k.split(".", 1)[0] for k in keys} | {k for k in keys if "." not in k}
    assert set(CONFIG_GROUPS) - {"logger", "kernels"} <= touched, set(CONFIG_GROUPS) - touched  # both: enums only
    assert "name" in touched


@pytest.mark.parametrize("override, fragments", [
    ("logger.level=LOUD", ["Invalid value 'LOUD'", "DEBUG", "full_key: logger.level"]),
    ("logger.wandb_mode=sometimes", ["Invalid value 'sometimes'", "offline", "full_key: logger.wandb_mode"]),
    ("kernels.backend=cuda", ["Invalid value 'cuda'", "triton", "full_key: kernels.backend"]),
    ("launcher.backend=mpi", ["Invalid value 'mpi'", "gloo", "full_key: launcher.backend"]),
])
def test_a_fixed_choice_fails_at_composition_listing_the_choices(override, fragments):
    with pytest.raises(ConfigCompositionException) as err:
        compose([override])
    for fragment in fragments:
        assert fragment in str(err.value.__cause__)


def test_every_numeric_key_of_the_schema_has_a_range():
    from dsrecipes.training.config import OPTION_SCHEMAS

    keys = numeric_keys(RootConfig, OPTION_SCHEMAS)
    ranges = schema_ranges(RootConfig, OPTION_SCHEMAS)
    assert keys - set(ranges) == set(), "declare these fields' ranges: `ranged(default, rule)` (dsrecipes.utils.ranges)"
    assert set(ranges) - keys == set(), "ranges declared on fields that are not numbers"
    check_ranges(RootConfig())  # the schema's defaults are in range
    check_ranges(to_root(compose([])))  # so is the default recipe


def test_run_directory_under_a_file_is_refused_naming_hydra_run_dir(files, capsys):
    with pytest.raises(ValueError, match=r"hydra\.run\.dir=.*not_a_dir.*is a file"):
        check_writable_dir("hydra.run.dir", str(files / "not_a_dir" / "run"))
    cfg = compose([f"hydra.run.dir={files}/not_a_dir/run"], return_hydra_config=True)
    with pytest.raises(SystemExit) as exit_:
        Preflight().on_run_start(config=cfg)  # what Hydra calls before creating the run directory
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("dsrecipes: error: hydra.run.dir=") and err.count("\n") == 1
    assert not (files / "not_a_dir" / "run").exists()


def test_run_directory_where_no_directory_can_be_made_is_refused_in_one_line(capsys):
    """/proc passes the permission check for root, yet mkdir there fails: the probe finds it before Hydra's mkdir
    would end in a FileNotFoundError traceback."""
    cfg = compose(["hydra.run.dir=/proc/dsrecipes_run"], return_hydra_config=True)
    with pytest.raises(SystemExit) as exit_:
        Preflight().on_run_start(config=cfg)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err == ("dsrecipes: error: hydra.run.dir='/proc/dsrecipes_run' is not valid: no directory can be created "
                   "in '/proc' (No such file or directory)\n")


@pytest.mark.parametrize("value", ["2", "yes", "0", "'true'"])
def test_a_boolean_key_takes_only_true_or_false(value, capsys):
    """OmegaConf would compose logger.jsonl=2 (or yes, 0) as a boolean; the override as typed is refused."""
    cfg = compose([f"logger.jsonl={value}"], return_hydra_config=True)
    with pytest.raises(SystemExit) as exit_:
        Preflight().on_run_start(config=cfg)
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (f"dsrecipes: error: logger.jsonl={value} is not valid: logger.jsonl is a "
                                       "boolean; choose one of: true, false\n")


@pytest.mark.parametrize("override, message", [
    ("+trainer.max_stepz=30", "+trainer.max_stepz=30 is not valid: trainer has no key 'max_stepz' (`+` adds a key "
                              "that nothing reads); did you mean trainer.max_steps? trainer's keys: "),
    ("+zero.overlap_comm=true", "+zero.overlap_comm=true is not valid: zero has no key 'overlap_comm'"),
    ("++model.n_layr=3", "++model.n_layr=3 is not valid: model has no key 'n_layr'"),
    ("+model.n_layerz=3", "+model.n_layerz=3 is not valid: model has no key 'n_layerz' (`+` adds a key that nothing "
                          "reads); did you mean model.n_layer? model's keys: "),
])
def test_a_plus_that_adds_a_key_the_schema_lacks_is_refused_in_one_line(override, message, capsys):
    """Hydra's + adds a key even where the group's schema has none (the typo would train with the real key
    untouched); the Preflight refuses it, naming the node's keys."""
    cfg = compose([override], return_hydra_config=True)
    with pytest.raises(SystemExit) as exit_:
        Preflight().on_run_start(config=cfg)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dsrecipes: error: {message}") and err.count("\n") == 1


@pytest.mark.parametrize("yaml_text, override, message", [
    ("# @package _global_\ntrainer:\n  max_stepz: 3\n", "+experiment=mine",
     "trainer.max_stepz is not a key of trainer: did you mean trainer.max_steps? trainer's keys: "),
    ("# @package _global_\nmodel:\n  n_layerz: 3\n", "+experiment=mine",
     "model.n_layerz is not a key of model: did you mean model.n_layer? model's keys: "),
    (None, "zero.overlap_com=true", "zero.overlap_com is not a key of zero: "),
])
def test_an_unknown_key_in_a_yaml_file_or_without_plus_gets_the_closest_key(yaml_text, override, message, tmp_path,
                                                                             capsys, monkeypatch):
    """Hydra refuses a key a YAML file (or an override without +) sets where the schema has none, naming the
    full key only; when Hydra exits before the first job, the CLI composes again and prints the closest keys."""
    import sys

    from dsrecipes import __main__ as cli

    args = [override, "trainer.max_steps=2"]
    if yaml_text:
        (tmp_path / "experiment").mkdir()
        (tmp_path / "experiment" / "mine.yaml").write_text(yaml_text)
        args = ["--config-dir", str(tmp_path), *args]

    def hydra_fails_to_compose():
        raise SystemExit(1)

    monkeypatch.setattr(sys, "argv", ["dsrecipes", *args])
    monkeypatch.setattr(cli, "run", hydra_fails_to_compose)
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith(f"dsrecipes: error: {message}") and err.count("\n") == 1


def test_a_plus_where_the_node_takes_any_key_or_on_a_group_passes():
    from dsrecipes.config.override_values import check_override_values

    for overrides in (["optimizer=custom", "optimizer._target_=torch.optim.RMSprop", "+optimizer.centered=true"],
                      ["+experiment=gpt_zero3"], ["++trainer.max_steps=3"]):
        check_override_values(overrides, compose(overrides))


def test_boolean_overrides_spelled_as_booleans_pass():
    from dsrecipes.config.override_values import check_override_values

    overrides = ["logger.jsonl=false", "trainer.progress_bar=True", "+experiment=gpt_zero3", "~logger.wandb_tags",
                 "trainer.max_steps=3"]
    check_override_values(overrides, compose(["logger.jsonl=false", "trainer.progress_bar=True"]))


@pytest.mark.parametrize("override, reason", [
    ("prompt=def main(", "extraneous input '('"),
    ("trainer.max_steps=[1", "no viable alternative at input '[1'"),
    ("prompt=it's (x)", "LexerNoViableAltException"),
    ('generate.prompt=say "x" ($y)', "mismatched input"),
])
def test_an_override_hydra_cannot_parse_is_refused_with_how_to_quote_it(override, reason, capsys, monkeypatch):
    """Hydra's own message names the grammar error only; the CLI adds the override quoted so that it parses,
    and the suggestion, split by a POSIX shell, is an override whose value is the text the user typed."""
    import shlex
    import sys

    from dsrecipes import __main__ as cli
    from dsrecipes.config.override_values import quoted_override

    monkeypatch.setattr(sys, "argv", ["dsrecipes", "-m", "trainer.max_steps=3", override])
    monkeypatch.setattr(cli, "run", lambda: pytest.fail("a bad override must stop before Hydra runs"))
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dsrecipes: error: cannot parse the override {override!r}: ") and reason in err
    assert f"quote the value: {quoted_override(override)}" in err
    (word,) = shlex.split(quoted_override(override))
    parsed = _PARSER.parse_override(word)
    assert (parsed.key_or_group, parsed.value()) == tuple(override.split("=", 1))


def test_overrides_hydra_parses_and_option_values_pass_the_syntax_check():
    from dsrecipes.config.override_values import check_override_syntax

    check_override_syntax(["--cfg", "job", "-p", "zero", "-m", "optimizer.lr=1e-3,3e-3", "x=interval(1,2)",
                           "prompt='def main('", "+experiment=gpt_zero3", "~logger.wandb_tags", "--config-name",
                           "a=(b"])


def test_preflight_checks_the_recipe_and_exits_with_one_line(capsys):
    cfg = compose(["model.init_std=-1"], return_hydra_config=True)
    with pytest.raises(SystemExit) as exit_:
        Preflight().on_run_start(config=cfg)
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "dsrecipes: error: model.init_std=-1.0 must be > 0\n"


def test_a_sweep_is_checked_job_by_job_before_any_starts():
    """What on_multirun_start runs: the basic sweeper's jobs, each composed as the launcher will compose it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from omegaconf import open_dict

    from dsrecipes.config.store import register_configs

    register_configs()
    with initialize_config_module(config_module="dsrecipes.conf", version_base="1.3"):
        cfg = hydra_compose(config_name="config", return_hydra_config=True)
        with open_dict(cfg):
            cfg.hydra.overrides.task = ["optimizer.lr=1e-3,3e-3", "trainer.max_steps=10,-1"]
        with pytest.raises(ValueError) as err:
            check_sweep(cfg)
        assert str(err.value) == ("multirun job #1 (optimizer.lr=0.001 trainer.max_steps=-1), before any job started: "
                                  "trainer.max_steps=-1 must be >= 1")
        with open_dict(cfg):
            cfg.hydra.overrides.task = ["optimizer.lr=1e-3,3e-3", "parallel.tp=1,2"]
        with pytest.raises(ValueError, match=r"job #1 \(optimizer.lr=0.001 parallel.tp=2\).*does not divide the world"):
            check_sweep(cfg)
        # jobs that run elsewhere (hydra/launcher=slurm): only what holds on any machine is checked here
        with open_dict(cfg):
            cfg.hydra.launcher._target_ = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
        assert len(check_sweep(cfg)) == 4
        with open_dict(cfg):
            cfg.hydra.overrides.task = ["model.init_std=0.02,-1"]
        with pytest.raises(ValueError, match=r"job #1 \(model.init_std=-1\).*model.init_std=-1.0 must be > 0"):
            check_sweep(cfg)


def test_an_optimising_sweeper_without_optimized_metric_is_refused_before_the_first_job(tmp_path, capsys):
    """Issue 39 (8): hydra/sweeper=optuna casts each job's return value to a float; without optimized_metric a job
    returns its summary dict, so the sweep trained one job and then died in the sweeper with a traceback."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    sweep = tmp_path / "sweep"
    cfg = compose(["hydra/sweeper=optuna", f"hydra.sweep.dir={sweep}"], return_hydra_config=True)
    with pytest.raises(ValueError) as err:
        check_sweep(cfg)  # what on_multirun_start runs, before the sweeper launches anything
    message = str(err.value)
    assert message.startswith("optimized_metric=null, but hydra/sweeper=optuna optimises the number each job returns: "
                              "set optimized_metric to the run-summary metric to optimise; choose one of: val/loss, "
                              "val/ppl, train/loss,") and "\n" not in message
    with pytest.raises(SystemExit) as exit_:
        Preflight().on_multirun_start(config=cfg)
    assert exit_.value.code == 2
    shown = capsys.readouterr().err
    assert shown.startswith("dsrecipes: error: optimized_metric=null, but hydra/sweeper=optuna") and shown.count("\n") == 1
    assert not sweep.exists()  # refused before the sweep directory was made
    with pytest.raises(ValueError, match=r"optimized_metric='val/los' is not a metric of the run summary; choose one of"):
        check_sweep(compose(["hydra/sweeper=optuna", "optimized_metric=val/los", f"hydra.sweep.dir={sweep}"],
                            return_hydra_config=True))
    with pytest.raises(ValueError, match=r"optimized_metric=null, .* set optimized_metric with mode=train \(mode=generate"):
        check_sweep(compose(["hydra/sweeper=optuna", "mode=generate", f"hydra.sweep.dir={sweep}"], return_hydra_config=True))
    assert check_sweep(compose(["hydra/sweeper=optuna", "optimized_metric=val/loss", f"hydra.sweep.dir={sweep}"],
                               return_hydra_config=True)) == []


# (overrides, the warning's fragments): the run is valid, the key does nothing
INACTIVE = [
    (["moe.k=2"], "moe.k=2 has no effect: moe is off (moe.num_experts=0)"),
    (["precision.loss_scale=128"], "precision.loss_scale=128.0 has no effect: loss scaling is fp16's"),
    (["precision=fp16", "precision.loss_scale=128", "precision.hysteresis=4"], "precision.hysteresis=4 has no effect"),
    (["logger.wandb_project=mine"], "logger.wandb_project=mine has no effect: logger.wandb=false"),
    (["trainer.sample_tokens=0", "trainer.sample_top_k=5"], "trainer.sample_top_k=5 has no effect"),
    (["generate.top_k=5"], "generate.top_k=5 has no effect: mode=train"),
    (["activation_checkpointing.every_k=4"], "activation_checkpointing.every_k=4 has no effect"),
    (["parallel.pp_schedule=gpipe"], "parallel.pp_schedule=gpipe has no effect: parallel.pp=1"),
    (["zero.hybrid_shard_size=2"], "zero.hybrid_shard_size=2 has no effect"),
    (["data.hub_name=wikitext"], "data.hub_name=wikitext has no effect: data.source=builtin"),
    (["model.rope_theta=500000"], "model.rope_theta=500000.0 has no effect: model.style=gpt2"),
    (["compression.sparse_pruning.dense_ratio=0.5"], "compression.sparse_pruning.dense_ratio=0.5 has no effect"),
    (["data_efficiency.random_ltd.min_value=16"], "data_efficiency.random_ltd.min_value=16 has no effect"),
    (["sparse_attention.block=32"], "sparse_attention.block=32 has no effect: sparse_attention.mode=none"),
    pytest.param(["precision=fp16"], "precision.dtype=fp16 on a CPU", id="fp16-on-cpu",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="runs on the GPU here")),
    pytest.param(["launcher.backend=nccl"], "launcher.backend=nccl has no effect with one process", id="nccl-one-process",
                 marks=pytest.mark.skipif(not NO_NCCL, reason="NCCL is available here")),
]


@pytest.mark.parametrize("overrides, fragment", _params(INACTIVE))
def test_a_key_without_effect_is_a_warning_naming_it(overrides, fragment):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        validate_recipe(compose(overrides), dp_world_size=1)  # valid: it returns
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert any(fragment in m for m in messages), messages


def test_max_restarts_without_spawned_workers_is_a_warning(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.warns(UserWarning, match=r"launcher.max_restarts=2 has no effect with one process"):
        _, _, nproc, joined = check_train_job(compose(["launcher.nproc_per_node=1", "launcher.max_restarts=2"]))
    assert (nproc, joined) == (1, False)


def test_the_shipped_group_options_set_no_key_without_effect():
    """Each group's default option is what a run gets without choosing: it must not warn."""
    assert inactive_keys(to_root(compose([]))) == []
    assert inactive_keys(to_root(compose(["moe=top2", "precision=fp16", "logger=wandb", "lr_scheduler=one_cycle",
                                         "activation_checkpointing=every_k", "compression=prune_heads"]))) == []
