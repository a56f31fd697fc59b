"""The layering in DESIGN.md, checked on the source: who may import whom, and no circles.

The module import graph is read from the code with `ast` (no module is imported), so a lazy
import inside a function and one under `if TYPE_CHECKING:` count too. An import names the
most specific module of this project it reaches (`from bench.store import engine` is
bench.store.engine; `from bench.store import get_run` is bench.store); the packages above
it, which Python also runs, are not counted as imported, so a package's facade importing its
own submodules is not a circle.

Three checks:
- no import circles among bench, server and dashboards;
- each module sits in one layer of LAYERS and imports only its own layer and those below;
- the explicit rules: bench never imports server or dashboards (bench/export may import
  dashboards' figure builders); only the CLI imports the CLI or an application (the demo).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOPS = ("bench", "server", "dashboards")
# DESIGN.md's layers, lowest first. A module is in the layer of the longest prefix that
# names it; it may import modules of its own layer and of the layers below.
LAYERS: dict[str, list[str]] = {
    # what a run is: records, definitions, scenarios, the wire; the hardware catalogue
    "base": ["bench.records", "bench.metrics", "bench.scenario", "bench.arrivals",
             "bench.workload", "bench.tokenizer", "bench.backends", "bench.extras",
             "bench.vllm_compat", "bench.vllm_result", "bench.data", "bench.hardware",
             "bench.sim.profiles", "bench.registry", "bench.datasets", "bench.lengths",
             "bench.shapes", "bench.traces", "bench.formulas", "bench.blocks", "bench.overrides",
             "bench.agentic"],
    # where runs are kept and what they cost
    "storage": ["bench.store", "bench.telemetry", "bench.cost"],
    # stored runs read back: curves, plans, reports, figures
    "analysis": ["bench.curves", "bench.frontier", "bench.plan", "bench.export", "dashboards",
                 "bench.choose"],
    # whatever turns a RunPlan into records: local, distributed, virtual time (bench.sim)
    "executors": ["bench.executor", "bench.runner", "bench.distributed", "bench.sim",
                  "bench.launchers"],
    # one stored run over any executor, the one driver above it (bench.drive: a run or a
    # sweep), and the terminal's display of runs, points and summaries
    "session": ["bench.session", "bench.sweep", "bench.drive", "bench.console", "bench.tune",
                "bench.sim_tune"],
    # applications of the library: the demo and the service
    "applications": ["bench.demo", "server"],
    # the `tokenbench` command imports everything and nothing imports it
    "cli": ["bench.cli", "bench.__main__"],
}  # fmt: skip
APPLICATIONS = ("bench.demo",)  # only the CLI runs them
# bench/export lays out the dashboard's own charts, so it may import the figure builders.
EXPORT_MAY_IMPORT = ("dashboards.figures",)


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def layer_of(module: str) -> int | None:
    """The index in LAYERS of the layer `module` sits in (None when no entry names it)."""
    if module == "bench":
        return 0  # bench/__init__.py: below everything (it imports nothing)
    best, where = -1, None
    for i, prefixes in enumerate(LAYERS.values()):
        for prefix in prefixes:
            if _within(module, prefix) and len(prefix) > best:
                best, where = len(prefix), i
    return where


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The absolute names an import statement imports (`from a import b` gives a.b)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: resolve against this module's package
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, *([base] if base else [])])
    return [f"{base}.{alias.name}" for alias in node.names]


def import_graph(root: Path) -> dict[str, dict[str, int]]:
    """module -> {module of this project it imports: line of the first such import}."""
    files = {}
    for top in TOPS:
        for path in sorted((root / top).rglob("*.py")):
            files[_module_name(path, root)] = path
    graph: dict[str, dict[str, int]] = {}
    for module, path in files.items():
        edges = graph.setdefault(module, {})
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            for name in _imported(node, module, path.name == "__init__.py"):
                while name and name not in files:  # the most specific module it names
                    name = name.rpartition(".")[0]
                if name and name != module:
                    edges.setdefault(name, node.lineno)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Every import circle: the strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _broken_rule(module: str, name: str) -> str | None:
    """Why `module` may not import `name` (None when it may)."""
    here, there = layer_of(module), layer_of(name)
    if here is None:
        return f"{module} has no layer: add it to LAYERS in tests/test_layering.py"
    if _within(module, "bench.cli") or module == "bench.__main__":
        return None  # the CLI (and `python -m bench`, which is it) imports everything
    if _within(name, "bench.cli"):
        return "only bench/cli may import the CLI"
    if any(_within(name, app) for app in APPLICATIONS):
        return "only bench/cli may import an application"
    if _within(module, "bench"):
        if _within(name, "server"):
            return "bench never imports server"
        if _within(name, "dashboards") and not (
            _within(module, "bench.export") and any(_within(name, m) for m in EXPORT_MAY_IMPORT)
        ):
            return "bench never imports dashboards (bench/export: only its figure builders)"
    if there is not None and there > here:
        names = list(LAYERS)
        return f"layer {names[here]} imports layer {names[there]} above it"
    return None


def violations(root: Path) -> list[str]:
    """'file:line: imports NAME: rule' for every import that breaks the layering."""
    found = []
    for module, edges in sorted(import_graph(root).items()):
        path = module.replace(".", "/")
        path += "/__init__.py" if (root / path).is_dir() else ".py"
        if layer_of(module) is None:
            found.append(f"{path}: {_broken_rule(module, module)}")
            continue
        for name, line in sorted(edges.items(), key=lambda e: e[1]):
            rule = _broken_rule(module, name)
            if rule:
                found.append(f"{path}:{line}: imports {name}: {rule}")
    return found


def test_no_import_circles():
    assert cycles(import_graph(ROOT)) == []


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
            "bench/cli/run.py": "from bench.demo import run_demo\n",
            "bench/demo.py": "from bench.drive import measure\n",
            "bench/sweep.py": "",
            "bench/plan.py": "x = 1\n\ndef f():\n    from bench.sweep import mean_rate\n",
            "bench/sim/other.py": "from bench import cli\n",
            "bench/sim/virtual.py": "from bench.demo import DEMO_SLO\n",
            "bench/store/x.py": "from ..cli.common import fail\n",
            "bench/export/figs.py": "from dashboards.figures import a\nimport dashboards.data\n",
            "bench/runner.py": "import server\n",
            "bench/newthing.py": "",
            "server/__init__.py": "",
            "server/app.py": "",
            "server/api.py": "from bench.export.formats import write\nimport bench.cli.store\n",
            "dashboards/__init__.py": "",
            "dashboards/data.py": "",
            "dashboards/figures.py": "",
        },
    )
    assert violations(root) == [
        "bench/export/figs.py:2: imports dashboards.data: bench never imports dashboards "
        "(bench/export: only its figure builders)",
        "bench/newthing.py: bench.newthing has no layer: add it to LAYERS in "
        "tests/test_layering.py",
        "bench/plan.py:4: imports bench.sweep: layer analysis imports layer session above it",
        "bench/runner.py:1: imports server: bench never imports server",
        "bench/sim/other.py:1: imports bench.cli: only bench/cli may import the CLI",
        "bench/sim/virtual.py:1: imports bench.demo: only bench/cli may import an application",
        "bench/store/x.py:1: imports bench.cli: only bench/cli may import the CLI",
        "server/api.py:2: imports bench.cli: only bench/cli may import the CLI",
    ]


def test_a_circle_through_a_lazy_or_type_checking_import_is_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            "bench/__init__.py": "",
            "bench/executor.py": "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from bench.runner import RunPlan\n",
            "bench/runner.py": "from bench.executor import StoredAs\n",
            "bench/store/__init__.py": "from bench.store.engine import get_engine\n",
            "bench/store/engine.py": "def f():\n    from bench.store.migrations import x\n",
            "bench/store/migrations/__init__.py": "from bench.store import engine\n",
            "bench/store/read.py": "from bench.store import get_engine\n",
        },
    )
    assert cycles(import_graph(root)) == [
        ["bench.executor", "bench.runner"],
        ["bench.store.engine", "bench.store.migrations"],
    ]
