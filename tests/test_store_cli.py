"""The store commands through typer: tables, summaries, one-line errors (exit 2)."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from bench.cli import store as cli
from bench.store.engine import dispose_all
from tests.test_store_helpers import make_records
from tests.test_store_roundtrip import write_run

app = typer.Typer()
for _name in ("runs", "show", "rm", "export-raw", "import"):
    app.command(_name)(getattr(cli, _name.replace("-", "_") + "_command"))
app.command("upgrade")(cli.db_upgrade_command)
runner = CliRunner()


@pytest.fixture
def db(tmp_path):
    yield str(tmp_path / "cli.db")
    dispose_all()


def test_runs_show_rm(db, tmp_path):
    writer = write_run(db, make_records(200), name="cli-run", gpu_type="H100", model="llama")
    res = runner.invoke(app, ["runs", "--db", db, "--gpu", "h100"])
    assert res.exit_code == 0 and writer.run_id[:8] in res.output
    res = runner.invoke(app, ["show", writer.run_id[:6], "--db", db])
    assert res.exit_code == 0 and "TTFT" in res.output and "completed" in res.output
    # Sample counts and 95% intervals; 200 requests cannot bound a P99.9 (thin) or a P99
    # from above (open).
    text = " ".join(res.output.split())  # the caption wraps at the terminal's width
    assert "95% confidence interval" in text and "open]" in text
    assert re.search(r"thin tail .*TTFT p99\.9 \(n=1\d\d\)", text)
    res = runner.invoke(app, ["show", "cli-run", "--db", db, "--json"])
    assert res.exit_code == 0 and '"ttft_ms"' in res.output and '"confidence"' in res.output
    res = runner.invoke(
        app,
        ["export-raw", "cli-run", "--db", db, "--format", "csv", "--out", str(tmp_path / "o.csv")],
    )
    assert res.exit_code == 0 and (tmp_path / "o.csv").exists()
    res = runner.invoke(app, ["rm", "cli-run", "--db", db, "--yes"])
    assert res.exit_code == 0 and "200 requests" in res.output
    assert "no runs" in runner.invoke(app, ["runs", "--db", db]).output


@pytest.mark.parametrize(
    "args",
    [
        ["show", "missing"],
        ["rm", "missing", "--yes"],
        ["export-raw", "missing", "--out", "/tmp/x.json"],
        ["import", "/does/not/exist.json"],
        ["runs", "--db", "mysql+nodriver://x/y"],
    ],
)
def test_bad_input_is_one_line_exit_2(db, args):
    if "--db" not in args:
        args = [*args, "--db", db]
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and res.output.strip().startswith("error:")


def test_import_and_upgrade(db):
    from pathlib import Path

    data = Path(__file__).resolve().parent / "data" / "vllm_bench_serve.json"
    res = runner.invoke(app, ["import", str(data), "--db", db])
    assert res.exit_code == 0 and "imported" in res.output
    res = runner.invoke(app, ["upgrade", "--db", db])
    from bench.store.migrations import head_revision

    assert res.exit_code == 0 and head_revision() in res.output
