"""Every third-party module the shipped code imports is declared in pyproject.toml.

CI installs into a new virtual environment on every run (.ci/run), so a module installed by
hand cannot hide a missing declaration there; this test says which declaration is missing
before CI does, on any machine. It reads every import in bench/, server/ and dashboards/
(ast, nothing imported), maps each module to the distribution that installs it (from the
installed packages' own metadata, so no name map is typed here: yaml -> PyYAML,
pptx -> python-pptx) and requires that distribution in the base dependencies or in an extra.
A module only an extra brings must be known to bench/extras.py under that extra, so the
feature that needs it says, in one line, which extra to install.

An import in an `except ImportError:` handler is a fallback for what the `try` imported
(typer's vendored click, else click itself on an older typer) and is not required.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from bench.extras import EXTRAS

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("bench", "server", "dashboards")


def _norm(dist: str) -> str:
    """PEP 503 normal form: PyYAML, pyyaml and py_yaml are one distribution."""
    return re.sub(r"[-_.]+", "-", dist).lower()


def _requirement_name(req: str) -> str:
    return _norm(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req).group(1))


def declared() -> tuple[set[str], dict[str, set[str]]]:
    """(base distributions, {extra: distributions}) from pyproject.toml, normalised."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {_requirement_name(r) for r in project["dependencies"]}
    extras = {
        name: {_requirement_name(r) for r in reqs}
        for name, reqs in project["optional-dependencies"].items()
    }
    return base, extras


def _guarded(tree: ast.AST) -> set[int]:
    """Line numbers of the fallback imports in an `except ImportError:` handler."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try):
            continue
        caught = {
            n.id
            for h in node.handlers
            for n in ast.walk(h.type or ast.Name("BaseException"))
            if isinstance(n, ast.Name)
        }
        if caught & {"ImportError", "ModuleNotFoundError"}:
            for handler in node.handlers:
                lines |= {
                    n.lineno
                    for n in ast.walk(handler)
                    if isinstance(n, ast.Import | ast.ImportFrom)
                }
    return lines


def third_party_imports() -> dict[str, list[str]]:
    """{top-level module: ['path:line', ...]} for every import not from stdlib or this repo."""
    found: dict[str, list[str]] = {}
    for package in SHIPPED:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            guarded = _guarded(tree)
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                if node.lineno in guarded:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in sys.stdlib_module_names or top in SHIPPED:
                        continue
                    found.setdefault(top, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_the_scan_sees_known_imports():
    """The scan itself works: it finds imports we know are there, and no stdlib module."""
    found = third_party_imports()
    assert {"numpy", "yaml", "sqlalchemy", "pptx", "scipy"} <= set(found)
    assert not {"os", "json", "asyncio"} & set(found)
    assert "bench/sim/calibration.py" in " ".join(found["scipy"])


def test_every_import_is_declared():
    base, extras = declared()
    provided = packages_distributions()
    problems = []
    for module, where in sorted(third_party_imports().items()):
        dists = {_norm(d) for d in provided.get(module, [])}
        if not dists and module in EXTRAS:
            problems.append(
                f"{module} ({where[0]}) is not installed here: pip install -e '.[test]' "
                f"(it is in the [{EXTRAS[module][0]}] extra)"
            )
            continue
        if not dists:
            problems.append(
                f"{module} ({where[0]}) is imported but no installed distribution provides "
                "it: declare it in pyproject.toml and pip install it"
            )
            continue
        in_extras = sorted(e for e, names in extras.items() if dists & names and e != "test")
        if dists & base:
            continue
        if not in_extras:
            problems.append(
                f"{module} ({where[0]}) comes from {'/'.join(sorted(dists))}, which "
                "pyproject.toml declares neither in dependencies nor in a feature's extra"
            )
        elif module not in EXTRAS or EXTRAS[module][0] not in in_extras:
            problems.append(
                f"{module} ({where[0]}) is only in the extra(s) {in_extras}: add it to "
                "bench/extras.py EXTRAS under that extra, so its feature names the extra"
            )
    assert problems == []


def test_extras_map_matches_pyproject():
    """bench/extras.py's hint names an extra that really declares the distribution."""
    _, extras = declared()
    wrong = [
        f"{module}: {dist} is not in [{extra}]"
        for module, (extra, dist) in EXTRAS.items()
        if _norm(dist) not in extras.get(extra, set())
    ]
    assert wrong == []


def test_the_test_extra_installs_every_feature_extra():
    """`pip install -e '.[test]'` (README, CI) brings every extra, so no feature test skips."""
    _, extras = declared()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    self_ref = [r for r in project["optional-dependencies"]["test"] if r.startswith("tokenbench[")]
    assert len(self_ref) == 1
    named = set(re.search(r"\[(.*)\]", self_ref[0]).group(1).split(","))
    assert named == set(extras) - {"test"}
