"""`--help` everywhere: the recipe's own help lists user-facing options only, and every `python -m dsrecipes.<tool>`
answers --help with its own usage (exit 0) instead of a traceback or the recipe's help.

The recipe's help imports no torch: tests/integration/test_cli_startup.py runs it in a fresh interpreter.
"""

from __future__ import annotations

import re
import runpy
import sys
from pathlib import Path

import dsrecipes.conf as dsrecipes_conf
import pytest

import dsrecipes
from dsrecipes.cli_help import default_choices, group_options, recipe_help

PACKAGE = Path(dsrecipes.__file__).parent


def _tool_modules() -> list[str]:
    """Every dsrecipes module a user runs with `python -m` (it has a __main__ guard), the recipe entry apart."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name != "__main__.py" and 'if __name__ == "__main__":' in path.read_text():
            names.append("dsrecipes." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts))
    return names


def _run_module_help(module: str, capsys) -> tuple[int, str]:
    saved = sys.argv
    sys.argv = [module, "--help"]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=False)
        code = 0
    except SystemExit as exit_:
        code = exit_.code or 0
    finally:
        sys.argv = saved
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_the_recipe_help_lists_every_group_with_its_default_and_no_schema_entry():
    text = recipe_help()
    conf_dir = Path(dsrecipes_conf.__file__).parent
    groups = group_options(conf_dir)
    assert {"model", "zero", "optimizer", "lr_scheduler", "precision", "experiment"} <= set(groups)
    assert "_schema" not in text and "hydra" not in groups
    assert "adamw*" in text and "gpt_tiny*" in text and "warmup_cosine*" in text
    assert default_choices(conf_dir)["fp8"] == "none"
    for group in groups:
        assert re.search(rf"^  \+?{group}\s", text, flags=re.MULTILINE), group
    assert max(len(line) for line in text.splitlines()) <= 112


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_the_cli_prints_its_own_help_without_composing(flag, capsys, monkeypatch):
    from dsrecipes import __main__ as cli

    monkeypatch.setattr(sys, "argv", ["dsrecipes", "+experiment=gpt_zero3", flag])
    monkeypatch.setattr(cli, "run", lambda: pytest.fail("--help must not compose the recipe"))
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == 0
    assert capsys.readouterr().out == recipe_help()


def test_every_tool_is_found():
    tools = _tool_modules()
    assert {"dsrecipes.estimate", "dsrecipes.autotune", "dsrecipes.export", "dsrecipes.report",
            "dsrecipes.convert_ds_config", "dsrecipes.launch.hostfile", "dsrecipes.launch.slurm"} <= set(tools)


@pytest.mark.parametrize("module", _tool_modules())
def test_every_tool_answers_help_with_its_own_usage(module, capsys):
    code, text = _run_module_help(module, capsys)
    assert code == 0, text[-2000:]
    assert "Traceback" not in text and "config groups (GROUP=OPTION" not in text
    assert len(text.strip().splitlines()) >= 3, text


def test_the_autotuner_help_lists_its_keys(capsys):
    from dataclasses import fields

    from dsrecipes.profiling.autotuning.config import AutotuneConfig

    _, text = _run_module_help("dsrecipes.autotune", capsys)
    for item in fields(AutotuneConfig):
        assert re.search(rf"^  {item.name}=", text, flags=re.MULTILINE), item.name
    assert "  metric=throughput " in text and "  zero_stages=[0,1,2,3]" in text and "max_memory_gib=null" in text
