"""The layering in DESIGN.md, checked on the source: who may import whom.

bench never imports server or dashboards (bench/export may import dashboards' figure
builders); nothing outside bench/cli imports the CLI (but bench/__main__.py, which runs it); the CLI
may import everything. Read
with `ast` (no module is imported), so a lazy import inside a function counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# bench/export lays out the dashboard's own charts, so it may import the figure builders.
EXPORT_MAY_IMPORT = ("dashboards.figures",)


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The absolute names an import statement imports (`from a import b` gives a and a.b)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: resolve against this module's package
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, *([base] if base else [])])
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _broken_rule(module: str, name: str) -> str | None:
    """Why `module` may not import `name` (None when it may)."""
    if _within(module, "bench.cli") or module == "bench.__main__":
        return None  # the CLI (and `python -m bench`, which is it) imports everything
    if _within(name, "bench.cli"):
        return "only bench/cli may import the CLI"
    if not _within(module, "bench"):
        return None
    if _within(name, "server"):
        return "bench never imports server"
    if _within(name, "dashboards"):
        if _within(module, "bench.export") and any(_within(name, m) for m in EXPORT_MAY_IMPORT):
            return None
        return "bench never imports dashboards (bench/export: only its figure builders)"
    return None


def violations(root: Path) -> list[str]:
    """'file:line: imports NAME: rule' for every import under root/bench and root/server
    that breaks the layering."""
    found = []
    for top in ("bench", "server"):
        for path in sorted((root / top).rglob("*.py")):
            module = _module_name(path, root)
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                for name in _imported(node, module, path.name == "__init__.py"):
                    rule = _broken_rule(module, name)
                    if rule:
                        where = path.relative_to(root)
                        found.append(f"{where}:{node.lineno}: imports {name}: {rule}")
                        break
    return found


def test_bench_and_server_keep_the_layering():
    assert violations(ROOT) == []


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_check_names_each_offending_file_and_line(tmp_path):
    root = _tree(
        tmp_path,
        {
            "bench/__init__.py": "",
            "bench/__main__.py": "from bench.cli import app\n",
            "bench/cli/__init__.py": "import server.app\nfrom dashboards import data\n",
            "bench/sim/demo.py": "def f():\n    from bench.cli import sweep_progress\n",
            "bench/sim/other.py": "from bench import cli\n",
            "bench/store/x.py": "from ..cli.common import fail\n",
            "bench/export/figs.py": "from dashboards.figures import a\nimport dashboards.data\n",
            "bench/runner.py": "import server\n",
            "server/api.py": "from bench.export.formats import write\nimport bench.cli.store\n",
        },
    )
    assert violations(root) == [
        "bench/export/figs.py:2: imports dashboards.data: bench never imports dashboards "
        "(bench/export: only its figure builders)",
        "bench/runner.py:1: imports server: bench never imports server",
        "bench/sim/demo.py:2: imports bench.cli: only bench/cli may import the CLI",
        "bench/sim/other.py:1: imports bench.cli: only bench/cli may import the CLI",
        "bench/store/x.py:1: imports bench.cli.common: only bench/cli may import the CLI",
        "server/api.py:2: imports bench.cli.store: only bench/cli may import the CLI",
    ]
