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


@pytest.mark.slow
def test_a_run_without_telemetry_samples_never_imports_pandas(fake_server, tmp_path):
    """pandas (~0.6 s of CPU, ~75 MiB) is for telemetry frames and exports: a run whose
    server exposes no /metrics (scraping is on by default) stores and prints without it."""
    import os
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from bench.cli import app\n"
        "try:\n    app(prog_name='tokenbench')\nexcept SystemExit as exc:\n    code = exc.code\n"
        "print('PANDAS', 'pandas' in sys.modules, code, file=sys.stderr)\n"
    )
    args = ["run", "--base-url", fake_server.url, "--num-prompts", "3", "--request-rate", "100",
            "--random-output-len", "3", "--db", f"sqlite:///{tmp_path / 'tb.db'}"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert "/metrics answered HTTP 404" in proc.stderr  # scraped, nothing to keep
    assert "PANDAS False 0" in proc.stderr, proc.stderr
