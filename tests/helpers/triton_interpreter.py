"""Triton's CPU interpreter for the kernel tests only, never for the rest of the suite.

Triton chooses its interpreter when a kernel is *decorated* (`TRITON_INTERPRET=1` read by `triton.jit`), that is
when a dsrecipes.kernels module is first imported; from then on the kernel runs as it was decorated, whatever the
environment says. Setting the variable for the kernel tests' sake at collection time (as the suite once did) made
every later test in that test process run interpreted Triton wherever a kernel was reachable: int8 QAT, int8
inference and serve-bench 10-40x slower, and testing a path users on a CPU never take.

So the kernel tests get a private copy of dsrecipes: `InterpretedModules.active()` sets the variable, swaps every
`dsrecipes` entry of sys.modules for the copy's (importing afresh, so decorated under the interpreter, on first
use) and, on exit, puts the process's own modules, its environment and Hydra's ConfigStore back. Everything a
kernel test touches (its module's imports at collection, its fixtures, its lazy imports) runs inside; nothing
outside ever sees an interpreted kernel or the variable (tests/unit/kernels/conftest.py wires it into pytest;
tests/conftest.py checks every other test). With a CUDA device the kernels compile as usual and nothing is swapped.
"""

from __future__ import annotations

import copy
import os
import sys
from contextlib import contextmanager

VARIABLE = "TRITON_INTERPRET"


def _ours(name: str) -> bool:
    return name == "dsrecipes" or name.startswith("dsrecipes.")


class InterpretedModules:
    """A private set of dsrecipes modules imported under TRITON_INTERPRET=1, entered with `active()`."""

    def __init__(self) -> None:
        self.modules: dict[str, object] = {}  # this copy's modules, kept between activations
        self.config_repo: dict | None = None  # this copy's ConfigStore contents (its schemas are its own classes)
        self.depth = 0

    @contextmanager
    def active(self):
        if self.depth:  # nested (a fixture inside a test's setup): already in
            self.depth += 1
            try:
                yield
            finally:
                self.depth -= 1
            return
        from hydra.core.config_store import ConfigStore

        store = ConfigStore.instance()
        saved_modules = {name: module for name, module in sys.modules.items() if _ours(name)}
        saved_repo, saved_value = store.repo, os.environ.get(VARIABLE)
        for name in saved_modules:
            del sys.modules[name]
        sys.modules.update(self.modules)
        store.repo = self.config_repo if self.config_repo is not None else copy.deepcopy(saved_repo)
        os.environ[VARIABLE] = "1"
        self.depth = 1
        try:
            yield
        finally:
            self.depth = 0
            self.modules = {name: module for name, module in sys.modules.items() if _ours(name)}
            for name in self.modules:
                del sys.modules[name]
            sys.modules.update(saved_modules)
            self.config_repo, store.repo = store.repo, saved_repo
            if saved_value is None:
                os.environ.pop(VARIABLE, None)
            else:
                os.environ[VARIABLE] = saved_value


def needs_interpreter() -> bool:
    """True without a CUDA device: the kernels can run on CPU tensors only under the interpreter."""
    import torch

    return not torch.cuda.is_available()


def interpreted_kernels_in_this_process() -> list[str]:
    """The names of the loaded dsrecipes modules holding a kernel decorated under the interpreter (none outside
    the kernel tests' copy)."""
    found = []
    for name, module in list(sys.modules.items()):
        if _ours(name) and module is not None:
            if any(type(value).__name__ == "InterpretedFunction" for value in list(vars(module).values())):
                found.append(name)
    return found
