"""Which errors are the user's to fix, and how the entry points report them: one line, no traceback.

A recipe value the checks refuse (ValueError), a file that is missing or cannot be written
(OSError: disk full, read-only or vanished directory, dsrecipes.training.checkpointing.checkpoint's
CheckpointSaveError), a loss that went non-finite (FloatingPointError): `python -m dsrecipes`
and its workers print `dsrecipes: error: ...` and exit with status 2. DSRECIPES_DEBUG=1 or
HYDRA_FULL_ERROR=1 re-raise them with their traceback. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import os
import sys

USER_ERRORS = (ValueError, OSError, FloatingPointError)
USER_ERROR_EXIT_CODE = 2


def debugging() -> bool:
    return bool(os.environ.get("DSRECIPES_DEBUG") or os.environ.get("HYDRA_FULL_ERROR"))


def user_error_message(error: BaseException) -> str:
    """The error's message; for an OS error its reason and the path it concerns; for a config resolver's
    error (e.g. conf/model/hf.yaml's hf_model) the resolver's own line, without OmegaConf's wrapper."""
    if isinstance(error, OSError) and error.strerror:
        return f"{error.strerror}: {error.filename}" if error.filename else error.strerror
    from omegaconf.errors import InterpolationResolutionError

    if isinstance(error, InterpolationResolutionError):
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        return first.split(" raised while resolving interpolation: ", 1)[-1]
    return str(error)


def exit_on_user_error(error: BaseException, prefix: str = "", program: str = "dsrecipes") -> None:
    """Print `<program>: error: <message>` on stderr and exit 2 (re-raise when debugging); program names the
    entry (e.g. dsrecipes.launch.hostfile, whose argparse errors use the same prefix)."""
    if debugging():
        raise error
    print(f"{program}: error: {prefix}{user_error_message(error)}", file=sys.stderr, flush=True)
    sys.exit(USER_ERROR_EXIT_CODE)
