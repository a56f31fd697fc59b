"""Every module imports, and benchmarks/ stays apart from the tests.

The fast subset (`pytest -m "not slow"`) is what runs before each commit; a module that only
slow tests reach (the demo, the distributed driver, a CLI command group) must still fail
there when it no longer imports. benchmarks/ are scripts, not tests: they must not import
test modules (what both need lives in the library, e.g. server.live.LiveServer).
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bench", "server", "dashboards")
# Scripts that act when imported: `python -m bench` runs the CLI, and alembic's env.py runs
# a migration (only ever inside alembic). Their imports are reached through what they call.
ACTS_ON_IMPORT = ("bench.__main__", "bench.store.migrations.env")


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        root = importlib.import_module(package)
        names.append(package)
        for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
            names.append(info.name)
    return sorted(n for n in names if n not in ACTS_ON_IMPORT)


@pytest.mark.parametrize("module", _modules())
def test_every_module_imports(module):
    importlib.import_module(module)


def test_benchmarks_compile_and_import_no_test_module():
    scripts = sorted((ROOT / "benchmarks").glob("*.py"))
    assert scripts
    found = []
    for path in scripts:
        tree = ast.parse(path.read_text(), filename=str(path))  # a syntax error fails here
        compile(tree, str(path), "exec")
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n == "tests" or n.startswith("tests.") for n in names):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == [], "benchmarks import test modules"
