"""The base install does not crash: a feature whose optional extra is missing says, in one
line, which `pip install 'tokenbench[...]'` brings it (and the API answers 400 with it).

The missing module is simulated with sys.modules[name] = None, which makes its import fail
exactly as it does where the package is not installed.
"""

from __future__ import annotations

import re
import subprocess
import sys

import httpx
import pytest

from bench.extras import EXTRAS, MissingExtraError, require
from tests.test_cli import tokenbench
from tests.test_server_api import make_app


def tokenbench_without(modules: list[str], *args: str) -> subprocess.CompletedProcess:
    """`tokenbench ARGS` in a process where `modules` cannot be imported."""
    code = (
        "import sys\n"
        f"for m in {modules!r}: sys.modules[m] = None\n"
        "from bench.cli import app\n"
        "app(prog_name='tokenbench')\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def stored_run(tmp_path_factory, fake_server):
    db = f"sqlite:///{tmp_path_factory.mktemp('extras') / 'tb.db'}"
    proc = tokenbench(
        "run", "--base-url", fake_server.url, "--num-prompts", "4", "--request-rate", "inf",
        "--random-output-len", "3", "--db", db, "--label", "extras",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    from bench.store.read import list_runs

    return db, list_runs(db)[0].id


def test_require_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pptx", None)
    with pytest.raises(MissingExtraError) as err:
        require("pptx", "PowerPoint export")
    assert str(err.value) == "PowerPoint export needs python-pptx: pip install 'tokenbench[export]'"
    assert set(EXTRAS.values()) >= {("export", "openpyxl"), ("pg", "psycopg")}


@pytest.mark.slow
@pytest.mark.parametrize(
    "blocked, args, said",
    [
        (["pptx"], ["export", "--format", "pptx"], "PowerPoint export needs python-pptx"),
        (["openpyxl"], ["export", "--format", "xlsx"], "Excel export needs openpyxl"),
        (["kaleido"], ["export", "--format", "png"], "PNG export needs kaleido"),
        (["pyarrow"], ["export-raw", "--format", "parquet"], "Parquet export needs pyarrow"),
    ],
)
def test_exports_without_their_extra_say_which_to_install(stored_run, tmp_path, blocked, args,
                                                          said):  # fmt: skip
    db, run = stored_run
    if args[0] == "export":
        args = [*args, "--runs", run, "--out", str(tmp_path / "out"), "--db", db]
    else:
        args = [*args, run, "--out", str(tmp_path / "out.parquet"), "--db", db]
    proc = tokenbench_without(blocked, *args)
    assert proc.returncode == 2, proc.stderr
    assert said in proc.stderr and "pip install 'tokenbench[export]'" in proc.stderr
    assert "Traceback" not in proc.stderr and "ModuleNotFoundError" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_postgres_without_psycopg_says_which_extra(tmp_path):
    proc = tokenbench_without(["psycopg"], "runs", "--db", "postgresql://me@127.0.0.1:1/tb")
    assert proc.returncode == 2
    assert "a PostgreSQL database needs psycopg: pip install 'tokenbench[pg]'" in proc.stderr
    assert "Traceback" not in proc.stderr and "No module named" not in proc.stderr


@pytest.mark.slow
async def test_the_dashboard_download_without_the_extra_is_a_400(stored_run, monkeypatch):
    db, run = stored_run
    app = make_app(db)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://test"
        ) as client:
            installed = await client.get(f"/compare?run={run}")
            # the link carries the page's settings between the run and the format
            pptx_link = re.compile(rf'/api/export\?run={run}(&[^"&]+)*&format=pptx"')
            assert pptx_link.search(installed.text)
            assert "missing-extras" not in installed.text
            for module, fmt, dist in (("pptx", "pptx", "python-pptx"), ("openpyxl", "xlsx",
                                                                        "openpyxl")):  # fmt: skip
                monkeypatch.setitem(sys.modules, module, None)
                r = await client.get(f"/api/export?run={run}&format={fmt}")
                assert r.status_code == 400, r.text
                assert dist in r.json()["detail"]
                assert "pip install 'tokenbench[export]'" in r.json()["detail"]
            # the compare page offers the hint instead of a link that answers 400
            page = await client.get(f"/compare?run={run}")
            assert page.status_code == 200
            assert not pptx_link.search(page.text)
            assert "format=html" in page.text
            assert "Excel export needs openpyxl: pip install" in page.text
    finally:
        app.state.tb.jobs.shutdown()


def test_fitting_the_simulator_without_scipy_names_the_extra(monkeypatch):
    from bench.sim.calibration import fit

    monkeypatch.setitem(sys.modules, "scipy", None)
    with pytest.raises(MissingExtraError) as err:
        fit([])
    assert (
        str(err.value) == "Fitting the simulator needs scipy: pip install 'tokenbench[calibrate]'"
    )
