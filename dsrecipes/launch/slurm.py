"""Print one of the sbatch templates that ship with dsrecipes, to adapt and submit.

    python -m dsrecipes.launch.slurm torchrun > job.sbatch   # srun: one torchrun per node, one worker per GPU
    python -m dsrecipes.launch.slurm srun > job.sbatch       # srun: one task per GPU, each task a rank
    sbatch job.sbatch +experiment=gpt_zero3 zero.stage=2      # the script's arguments are dsrecipes overrides

The templates are package data (dsrecipes/launch/*.sbatch), so a pip install has them without a
checkout of the repository. Edit the #SBATCH lines (nodes, GPUs, time, partition) for your cluster.
"""

from __future__ import annotations

import sys
from importlib.resources import files

TEMPLATES = {"torchrun": "slurm_torchrun.sbatch", "srun": "slurm_srun.sbatch"}


def template_text(name: str) -> str:
    """The text of the template `name` (a key of TEMPLATES); a ValueError naming the valid choices otherwise."""
    if name not in TEMPLATES:
        raise ValueError(f"unknown SLURM template {name!r}; choose one of: {', '.join(TEMPLATES)}")
    return files("dsrecipes.launch").joinpath(TEMPLATES[name]).read_text()


def main(argv: list[str] | None = None) -> None:
    from dsrecipes.utils.errors import USER_ERRORS, exit_on_user_error

    args = sys.argv[1:] if argv is None else list(argv)
    if args in (["-h"], ["--help"]):
        print(__doc__)
        return
    try:
        if len(args) != 1:
            raise ValueError(f"expected one template name ({' | '.join(TEMPLATES)}), got {len(args)} arguments: "
                             "python -m dsrecipes.launch.slurm torchrun > job.sbatch")
        sys.stdout.write(template_text(args[0]))
    except USER_ERRORS as error:
        exit_on_user_error(error)


if __name__ == "__main__":
    main()
