"""Triton's CPU interpreter for the kernel tests only, never for the rest of the suite.

Triton chooses its interpreter when a kernel is *decorated* (`TRITON_INTERPRET=1` read by `triton.jit`), that is
when a dsrecipes.kernels module is first imported; from then on the kernel runs as it was decorated, whatever the
environment says. Setting the variable for the kernel tests' sake at collection time (as the suite once did) made
every later test in that test process run interpreted Triton wherever a kernel was reachable: int8 QAT, int8
inference and serve-bench 10-40x slower, and testing a path users on a CPU never take.

So the kernel tests get a private copy of dsrecipes: `InterpretedModules.active()` sets the variable, swaps every
`dsrecipes` entry of sys.modules for the copy's (importing afresh, so decorated under the interpreter, on first
use) and, on exit, puts the process's own modules, its environment and Hydra's ConfigStore entries back. Triton's own
Python modules are swapped too: its language library (`tl.sum`, `tl.cdiv` ...) is made of `@triton.jit`
functions decorated when triton is imported, and an interpreted kernel can only call interpreted ones. Its
compiled extension (`triton._C`) is shared: nanobind aborts the process if it is loaded twice. Everything a
kernel test touches (its module's imports at collection, its fixtures, its lazy imports) runs inside; nothing
outside ever sees an interpreted kernel or the variable (tests/unit/kernels/conftest.py wires it into pytest;
tests/conftest.py checks every other test). With a CUDA device the kernels compile as usual and nothing is swapped.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

VARIABLE = "TRITON_INTERPRET"


def _ours(name: str) -> bool:
    """The modules the copy holds its own versions of: dsrecipes, and triton but for its compiled extension."""
    for package in ("dsrecipes", "triton"):
        if name == package or name.startswith(package + "."):
            return not name.startswith("triton._C")
    return False


class InterpretedModules:
    """A private set of dsrecipes modules imported under TRITON_INTERPRET=1, entered with `active()`."""

    def __init__(self) -> None:
        self.modules: dict[str, object] = {}  # this copy's modules, kept between activations
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
        saved_entries, saved_value = _entries(store.repo), os.environ.get(VARIABLE)
        for name in saved_modules:
            del sys.modules[name]
        sys.modules.update(self.modules)
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
            _restore_entries(store.repo, saved_entries)
            if saved_value is None:
                os.environ.pop(VARIABLE, None)
            else:
                os.environ[VARIABLE] = saved_value


    def release(self) -> None:
        """Hand the copy's modules to sys.modules under other names, so the interpreter's exit tears them down with
        its own modules (else nanobind, at exit, reports the triton objects they hold as leaks)."""
        for name, module in self.modules.items():
            sys.modules[f"_interpreted_copy.{name}"] = module
        self.modules = {}


def _entries(repo: dict, prefix: tuple = ()) -> dict[tuple, object]:
    """Every stored config of Hydra's ConfigStore by its path (the nodes themselves, not copies)."""
    found = {}
    for name, value in repo.items():
        if isinstance(value, dict):
            found.update(_entries(value, (*prefix, name)))
        else:
            found[(*prefix, name)] = value
    return found


def _restore_entries(repo: dict, saved: dict[tuple, object]) -> None:
    """Put back every config the copy overwrote (its register_configs stores schemas of its own classes); what it
    added (Hydra's plugins registering their configs on first use) stays, as it would have outside."""
    now = _entries(repo)
    for path, node in saved.items():
        if now.get(path) is not node:
            folder = repo
            for name in path[:-1]:
                folder = folder.setdefault(name, {})
            folder[path[-1]] = node


def needs_interpreter() -> bool:
    """True without a CUDA device: the kernels can run on CPU tensors only under the interpreter."""
    import torch

    return not torch.cuda.is_available()


def interpreted_kernels_in_this_process() -> list[str]:
    """The names of the loaded dsrecipes modules holding a kernel decorated under the interpreter (none outside
    the kernel tests' copy)."""
    found = []
    for name, module in list(sys.modules.items()):
        if (name == "dsrecipes" or name.startswith("dsrecipes.")) and module is not None:
            if any(type(value).__name__ == "InterpretedFunction" for value in list(vars(module).values())):
                found.append(name)
    return found
