"""Packaging: every third-party module dsrecipes imports is a declared dependency, and the package is typed.

Imports at module level (what `import dsrecipes...` runs) must be core dependencies; imports inside a
function (optional features: Hugging Face interop, benchmarks against DeepSpeed) may come from an extra.
"""

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib") if sys.version_info >= (3, 11) else pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("dsrecipes", "kernels", "compression", "data_efficiency")
OURS = {"dsrecipes", "kernels", "compression", "data_efficiency", "tests"}


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].strip().lower().replace("_", "-") for r in requirements}


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """(top-level module names imported at module level, those imported inside functions) of one file."""
    tree = ast.parse(path.read_text())
    module_level, nested = set(), set()

    def visit(node, inside_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
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
