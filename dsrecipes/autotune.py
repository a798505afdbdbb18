"""The autotuner's short entry: `python -m dsrecipes -m hydra/sweeper=autotune ...` with the autotuning keys bare.

    python -m dsrecipes.autotune +experiment=gpt_tiny
    python -m dsrecipes.autotune +experiment=gpt_tiny model=gpt_debug zero_stages=[0,3] max_memory_gib=4
    python -m dsrecipes.autotune +experiment=gpt_zero3 metric=latency tuner_type=model_based tuner_num_trials=8
    python -m dsrecipes -m hydra/sweeper=autotune +experiment=gpt_tiny hydra.sweeper.max_memory_gib=4   # the same

Every autotuning key (dsrecipes.profiling.autotuning.config.AutotuneConfig: fast, metric, start_profile_step,
end_profile_step, tuner_type, tuner_early_stopping, tuner_num_trials, tuner_seed, min/max_train_micro_batch_
size_per_gpu, num_tuning_micro_batch_sizes, zero_stages, max_memory_gib, best_experiment) given as KEY=VALUE
becomes hydra.sweeper.KEY=VALUE; everything else is the recipe's, as on `python -m dsrecipes`. Results and the
best experiment go to the sweep directory (outputs/multirun/<date>/<time>_<name>/); the last lines print the
command that runs the best configuration.
"""

from __future__ import annotations

import sys
from dataclasses import fields

from dsrecipes.profiling.autotuning.config import AutotuneConfig

KEYS = frozenset(f.name for f in fields(AutotuneConfig))


def sweeper_arguments(argv: list[str]) -> list[str]:
    """argv for `python -m dsrecipes`: -m and hydra/sweeper=autotune first, bare autotuning keys moved under hydra.sweeper."""
    out = ["-m", "hydra/sweeper=autotune"]
    for arg in argv:
        if arg in ("-m", "--multirun") or arg == "hydra/sweeper=autotune":
            continue
        key = arg.split("=", 1)[0]
        out.append(f"hydra.sweeper.{arg}" if "=" in arg and key in KEYS else arg)
    return out


def usage() -> str:
    """`python -m dsrecipes.autotune --help`: this module's docstring and every autotuning key with its default."""
    from dsrecipes.cli_help import dataclass_keys

    return "\n".join([__doc__.strip(), "", "autotuning keys (KEY=VALUE; the default shown):",
                      *dataclass_keys(AutotuneConfig), "",
                      "The recipe's groups and keys: python -m dsrecipes --help", ""])


def main(argv: list[str] | None = None) -> None:
    from dsrecipes.cli_help import print_help_and_exit, wants_help

    args = list(sys.argv[1:] if argv is None else argv)
    if wants_help(args):
        print_help_and_exit(usage())
    from dsrecipes.__main__ import main as dsrecipes_main

    try:  # installed with dsrecipes (pyproject's packages), beside the dsrecipes package
        from hydra_plugins.dsrecipes_autotune.autotune_sweeper import register
    except ImportError as missing:
        raise SystemExit("dsrecipes.autotune: the hydra_plugins.dsrecipes_autotune package is missing; "
                         "reinstall dsrecipes (pip install -e .)") from missing

    register()  # an editable install hides hydra_plugins/ from Hydra's scan
    sys.argv[1:] = sweeper_arguments(args)
    dsrecipes_main()


if __name__ == "__main__":
    main()
