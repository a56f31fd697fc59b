"""The store facade (../shared/DESIGN.md): all SQL lives in bench/store, and code outside it
imports only `bench.store`'s public names, never SQLAlchemy or a bench.store submodule.

So the schema, the engine and the queries can change without breaking the CLI, the service
or the dashboards: a caller that needs something new from the store gets a public function
in bench/store, not a query of its own. The check reads the source (no imports), so it
runs in milliseconds and also covers modules that import lazily inside functions.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import bench.store

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("bench", "server", "dashboards", "benchmarks")
STORE = ROOT / "bench" / "store"

# Modules allowed to break the rule, each with its reason. An entry that no longer breaks
# it (or no longer exists) fails the test too, so the list only ever shrinks.
EXCEPTIONS: dict[str, str] = {
    # Provisions and drops a scratch PostgreSQL database to measure the store on; that is
    # the benchmark's setup, not something the store does for the application.
    "benchmarks/storage.py": "creates its scratch PostgreSQL database",
}


def breaches(tree: ast.AST) -> list[str]:
    """The imports in a module's syntax tree that go past the store facade."""
    public = set(bench.store.__all__)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
            if node.module == "bench.store":
                found += [
                    f"line {node.lineno}: from bench.store import {alias.name} (not public)"
                    for alias in node.names
                    if alias.name not in public
                ]
        else:
            continue
        for module in modules:
            if module == "sqlalchemy" or module.startswith(("sqlalchemy.", "bench.store.")):
                found.append(f"line {node.lineno}: imports {module}")
    return found


@functools.cache
def outside_store() -> dict[str, list[str]]:
    """Each checked module (path from the repository root) -> its breaches; read once."""
    out = {}
    for folder in CHECKED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.is_relative_to(STORE) or ".venvs" in path.parts:  # benchmark peers' venvs
                continue
            rel = path.relative_to(ROOT).as_posix()
            out[rel] = breaches(ast.parse(path.read_text(), filename=rel))
    return out


def test_only_bench_store_touches_sql_and_store_internals():
    found = outside_store()
    wrong = {
        path: problems for path, problems in found.items() if problems and path not in EXCEPTIONS
    }
    assert not wrong, (
        "outside bench/store, import SQL only through `bench.store`'s public names "
        "(add a function to bench/store and its __init__ if one is missing): "
        + "; ".join(f"{path} {', '.join(p)}" for path, p in wrong.items())
    )


def test_exceptions_are_still_needed():
    found = outside_store()
    stale = [path for path in EXCEPTIONS if not found.get(path)]
    assert not stale, f"remove from EXCEPTIONS in {Path(__file__).name}: {stale}"


def test_the_check_sees_every_kind_of_breach():
    source = """
import sqlalchemy
from sqlalchemy.exc import DatabaseError
import bench.store.read
from bench.store.models import Run
from bench.store import codec, get_run
def later():
    from bench.store.engine import get_engine
"""
    assert breaches(ast.parse(source)) == [
        "line 2: imports sqlalchemy",
        "line 3: imports sqlalchemy.exc",
        "line 4: imports bench.store.read",
        "line 5: imports bench.store.models",
        "line 6: from bench.store import codec (not public)",
        "line 8: imports bench.store.engine",
    ]
    assert breaches(ast.parse("from bench.store import RunWriter, get_run\nimport bench")) == []


def test_every_public_store_name_resolves():
    """Each name in bench.store.__all__ points at a real object in its submodule."""
    missing = [name for name in bench.store.__all__ if getattr(bench.store, name, None) is None]
    assert not missing
