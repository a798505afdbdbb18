"""Write the dsrecipes experiment equivalent to a DeepSpeed config: YAML on stdout, the report on stderr.

    python -m dsrecipes.convert_ds_config ds_config.json > conf/experiment/mine.yaml
    python -m dsrecipes +experiment=mine                    # the same recipe as deepspeed_config=ds_config.json

The experiment is what `deepspeed_config=ds_config.json` composes under the command line: the
options the DeepSpeed config picks (`override /optimizer: lamb`) and its values, `# @package
_global_`, nothing else. A key dsrecipes cannot honour prints the report and exits with status 2,
writing no YAML.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from dsrecipes.config.ds_import import read_deepspeed_file, translate
    from dsrecipes.config.ds_import.cli import config_name
    from dsrecipes.config.ds_import.report import print_report
    from dsrecipes.utils.errors import USER_ERRORS, exit_on_user_error

    parser = argparse.ArgumentParser(prog="python -m dsrecipes.convert_ds_config", description=__doc__.splitlines()[0])
    parser.add_argument("config", help="a DeepSpeed config file (JSON, or HJSON with hjson installed)")
    parser.add_argument("--name", help="the experiment's name for the comment line (default: the file's stem)")
    parser.add_argument("--quiet", action="store_true", help="no report on stderr")
    args = parser.parse_args(argv)
    try:
        translation = translate(read_deepspeed_file(args.config))
        if not args.quiet or translation.refusals:
            print_report(translation, args.config)
        translation.raise_if_refused(f"DeepSpeed config {args.config}")
    except USER_ERRORS as error:
        exit_on_user_error(error)
    name = args.name or config_name(args.config)
    command = f"python -m dsrecipes +experiment={name}"
    sys.stdout.write(translation.experiment_yaml(Path(args.config).name, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
