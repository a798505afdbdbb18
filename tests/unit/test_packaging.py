"""Packaging: every third-party module dsrecipes imports is a declared dependency, and the package is typed.

Imports at module level (what `import dsrecipes...` runs) must be core dependencies; imports inside a
function (optional features: Hugging Face interop, benchmarks against DeepSpeed) may come from an extra;
an import guarded by `except ImportError` (a fallback when the module is absent) need not be declared.
"""

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import REPO

tomllib = pytest.importorskip("tomllib") if sys.version_info >= (3, 11) else pytest.importorskip("tomli")

ROOT = REPO
SOURCES = ("dsrecipes",)
OURS = {"dsrecipes", "tests"}


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].strip().lower().replace("_", "-") for r in requirements}


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """(top-level module names imported at module level, those imported inside functions) of one file."""
    tree = ast.parse(path.read_text())
    module_level, nested = set(), set()

    def guarded(node) -> bool:
        return isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError") for h in node.handlers)

    def visit(node, inside_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if guarded(child):
                for statement in [*child.orelse, *child.finalbody, *(s for h in child.handlers for s in h.body)]:
                    visit(ast.Module(body=[statement], type_ignores=[]), inside_function)
                continue  # the try body's imports are optional
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in child.names] if isinstance(child, ast.Import) else \
                    ([child.module] if child.module and child.level == 0 else [])
                for name in names:
                    (nested if inside_function else module_level).add(name.split(".")[0])
            inside = inside_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            visit(child, inside)

    visit(tree, False)
    return module_level, nested


def _distributions(modules: set[str]) -> dict[str, str]:
    """{module: distribution} for the third-party modules (standard library and dsrecipes left out)."""
    owners = importlib.metadata.packages_distributions()
    found = {}
    for module in modules - OURS:
        if module in sys.stdlib_module_names or module == "__future__":
            continue
        dists = owners.get(module)
        assert dists, f"{module} is imported by dsrecipes but no installed distribution provides it"
        found[module] = dists[0].lower().replace("_", "-")
    return found


def test_every_imported_module_is_a_declared_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = _requirement_names(project["dependencies"])
    extras = set().union(*(_requirement_names(v) for v in project["optional-dependencies"].values()))
    module_level, nested = set(), set()
    for source in SOURCES:
        for path in (ROOT / source).rglob("*.py"):
            top, inner = _imports(path)
            module_level |= top
            nested |= inner
    for module, dist in _distributions(module_level).items():
        assert dist in core, f"`import {module}` runs on import of dsrecipes; declare {dist} in project.dependencies"
    for module, dist in _distributions(nested - module_level).items():
        assert dist in core | extras, f"dsrecipes imports {module}; declare {dist} as a dependency or in an extra"


def test_the_package_is_typed():
    assert (ROOT / "dsrecipes" / "py.typed").is_file()
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data["dsrecipes"]


def test_no_top_level_folder_of_the_checkout_shadows_another_module():
    """Every process started in the checkout (pytest, `python -m dsrecipes`) has the checkout first on sys.path: a
    top-level package there named like an installed or standard module hides it. A top-level kernels/ hid PyPI's
    `kernels`, which transformers >= 5.25 imports on `import transformers`; compression/ would hide Python 3.14's."""
    packages = sorted(p.parent.name for p in ROOT.glob("*/__init__.py"))
    # conf/ holds Hydra's YAML only (a package so that it installs as dsrecipes.conf); nothing imports it as `conf`
    assert packages == ["conf", "dsrecipes", "tests"], (
        f"top-level Python packages {packages}: put the code under dsrecipes/ (only conf, dsrecipes and tests live there)")


def test_every_sub_package_is_listed_for_installation():
    """pyproject lists packages by hand (conf/ installs as dsrecipes.conf): a package
    missing there works in an editable checkout and is absent from a real install."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    directories = {name: Path(path) for name, path in setuptools["package-dir"].items()}
    expected = set()
    for name, directory in directories.items():
        for init in (ROOT / directory).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / directory).parts
            expected.add(".".join((name, *relative)))
    missing = sorted(expected - set(setuptools["packages"]))
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {', '.join(missing)}"
