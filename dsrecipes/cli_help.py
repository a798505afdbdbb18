"""`python -m dsrecipes --help` (and `-h`): usage, the config groups and their options, and where to look next.

    python -m dsrecipes --help          # this help: well under a second, no torch, no composition
    python -m dsrecipes --hydra-help    # Hydra's own options (multirun, sweepers, launchers)
    python -m dsrecipes --cfg job       # the whole composed recipe, after the overrides given with it

Why not Hydra's --help: it composes the recipe and deep-copies its config repository once per group (6-9 s on
2 CPU cores), prints a 400-line config, and lists the schema entries of the ConfigStore (`adam_schema`,
`warmup_cosine_schema`, ...) beside the real options although choosing one trains nothing. This help reads the
group folders of the installed dsrecipes.conf package (one listing, one small YAML read for the defaults) and
imports neither torch nor Hydra. The tools' own `--help` (estimate, autotune, export, ...) stay theirs.
"""

from __future__ import annotations

import re
import sys
import textwrap
from dataclasses import MISSING, fields
from pathlib import Path

HELP_FLAGS = ("--help", "-h")
WIDTH = 110  # the help's lines wrap here, on a terminal or off one

# the tools a user runs as `python -m dsrecipes.<tool>` (each answers --help with its own usage)
TOOLS = {
    "report": "versions, devices and the features that run here (also `python -m dsrecipes report`)",
    "estimate": "per-rank memory of a recipe for every ZeRO stage, beside DeepSpeed's estimator",
    "autotune": "search ZeRO stage x micro-batch (x checkpointing) for the fastest recipe that fits",
    "convert_ds_config": "a DeepSpeed ds_config.json as a dsrecipes experiment, with a report",
    "convert_ds_checkpoint": "a DeepSpeed checkpoint (global_stepN/) as a dsrecipes checkpoint or safetensors",
    "export": "a (sharded) checkpoint as one safetensors file",
    "verify": "the recipe's layout against one process, step by step: equivalent, or where not",
    "launch.hostfile": "launch on the hosts of a DeepSpeed hostfile",
    "launch.slurm": "print an sbatch template",
    "benchmarks.<name>": "side-by-side benchmarks (train_throughput, kernels, communication, inference, ...)",
}


def wants_help(argv: list[str]) -> bool:
    """True when the command line asks for this help (`--help` / `-h`, not `--hydra-help`)."""
    return any(arg in HELP_FLAGS for arg in argv)


def _conf_dir() -> Path:
    import dsrecipes.conf  # the package's __init__ only: the YAML files lie beside it

    return Path(dsrecipes.conf.__file__).parent


def default_choices(conf_dir: Path) -> dict[str, str]:
    """group -> option chosen by config.yaml's defaults list (the lines `  - group: option`)."""
    text = (conf_dir / "config.yaml").read_text()
    return dict(re.findall(r"^\s*-\s*([a-z0-9_]+)\s*:\s*([A-Za-z0-9_]+)\s*$", text, flags=re.MULTILINE))


def group_options(conf_dir: Path) -> dict[str, list[str]]:
    """Every user-facing config group -> its options (the YAML files of its folder; Hydra's own groups apart)."""
    groups = {}
    for folder in sorted(path for path in conf_dir.iterdir() if path.is_dir() and path.name != "hydra"):
        options = sorted(path.stem for path in folder.glob("*.yaml"))
        if options:
            groups[folder.name] = options
    return groups


def recipe_help(conf_dir: Path | None = None) -> str:
    """The text `python -m dsrecipes --help` prints."""
    conf_dir = conf_dir or _conf_dir()
    defaults, groups = default_choices(conf_dir), group_options(conf_dir)
    width = max(len(name) for name in [*groups, "+experiment", *TOOLS]) + 2
    lines = [
        "usage: python -m dsrecipes [+experiment=NAME] [GROUP=OPTION ...] [KEY=VALUE ...] [-m] [--cfg job]",
        "",
        "Compose a recipe from the config groups below, override any key, and train it (mode=generate: sample from",
        "a checkpoint). Without arguments: a small GPT on the built-in corpus, 600 steps on the CPU.",
        "",
        "examples:",
        "  python -m dsrecipes +experiment=gpt_zero3",
        "  python -m dsrecipes model=llama_debug precision=bf16 optimizer.lr=3e-4 trainer.max_steps=200",
        "  python -m dsrecipes zero.stage=2 launcher.nproc_per_node=2",
        "  python -m dsrecipes -m optimizer.lr=1e-3,3e-3 trainer.max_steps=20           # a sweep (multirun)",
        "  python -m dsrecipes deepspeed_config=ds_config.json trainer.max_steps=200    # a DeepSpeed config",
        "  python -m dsrecipes mode=generate checkpoint=outputs/DATE/TIME_gpt \"prompt='def main('\"",
        "",
        "config groups (GROUP=OPTION; * marks the default):",
    ]
    for group, options in groups.items():
        marked = [f"{option}*" if defaults.get(group) == option else option for option in options]
        name = "+experiment" if group == "experiment" else group  # experiments are added, not chosen by default
        lines += textwrap.wrap(", ".join(marked), WIDTH, initial_indent=f"  {name:<{width}}",
                               subsequent_indent=" " * (width + 2), break_on_hyphens=False)
    lines += [
        "",
        "keys (KEY=VALUE):",
        "  python -m dsrecipes --cfg job --package zero    the keys of one group, with their values",
        "  python -m dsrecipes [OVERRIDES] --cfg job       the whole recipe these overrides compose",
        "  A key no schema has (trainer.max_stepz=30, also with +) is refused before any work, naming the closest key.",
        "  Quote a value Hydra would parse: \"prompt='def main('\" ; lists and sweeps: 'zero_stages=[0,3]'.",
        "",
        "tools (python -m dsrecipes.<tool> --help):",
    ]
    lines += [f"  {tool:<{width}}{what}" for tool, what in TOOLS.items()]
    lines += [
        "",
        "more:",
        f"  {'--hydra-help':<{width}}Hydra's options: multirun, hydra/sweeper=optuna|autotune, hydra/launcher=slurm",
        f"  {'docs':<{width}}docs/ in the repository (mkdocs serve), README.md",
    ]
    return "\n".join(lines) + "\n"


def dataclass_keys(cls, prefix: str = "") -> list[str]:
    """One line per field of a config dataclass: `KEY=DEFAULT  # the comment its source gives it`.

    The comments are read from the class's source (a trailing `# ...`, or the comment lines right above the
    field), so the help says what the code says and cannot drift from it.
    """
    import inspect

    comments: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(cls).splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("# "))
            continue
        match = re.match(r"^([a-z_][a-z0-9_]*)\s*:[^=]*(=.*?)?(#\s*(?P<comment>.*))?$", stripped)
        if match:
            comments[match.group(1)] = match.group("comment") or " ".join(pending)
        pending = []
    lines = []
    for item in fields(cls):
        lead = f"  {prefix}{item.name}={_as_override(_default(item))}"
        note = comments.get(item.name, "")
        lines += textwrap.wrap(note, WIDTH, initial_indent=f"{lead:<46}", subsequent_indent=" " * 46) if note else [lead]
    return lines


def _default(item):
    if item.default is not MISSING:
        return item.default
    if item.default_factory is not MISSING:
        return item.default_factory()
    return "???"


def _as_override(value) -> str:
    """A default as one writes it on the command line: null, true/false, an Enum's value, [a,b]."""
    value = getattr(value, "value", value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_as_override(element) for element in value) + "]"
    return str(value)


def print_help_and_exit(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
    sys.exit(0)
