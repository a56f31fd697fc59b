"""Intended vs simulated prompt-cache hit rates on the dashboard's run page and in the report
(deck, workbook, HTML): an agentic trace replayed in virtual time on B200 and H100 (issue 29)."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bench.agentic import SessionStats, describe, generate, write_trace
from bench.cli import app
from bench.cost import load_catalogue
from bench.export.formats import write
from bench.export.report import build_report
from bench.store.read import list_runs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def agentic_runs(tmp_path_factory):
    """A synthetic agentic trace on 70B: B200 (KV for every block) and one H100, whose
    13,012 tokens of KV cannot keep the sessions' contexts between turns."""
    tmp = tmp_path_factory.mktemp("cache")
    db = f"sqlite:///{tmp / 'c.db'}"
    rows = generate(SessionStats(session_rate=2.0, turns_mean=4, delay_cap_s=20,
                                 max_input=8000), sessions=30, seed=3)  # fmt: skip
    write_trace(rows, tmp / "trace.jsonl")
    (tmp / "sc.yaml").write_text(
        "name: agentic\nworkload:\n  dataset: mooncake\n  dataset_path: trace.jsonl\n"
    )
    for gpu in ("b200", "h100"):
        res = CliRunner().invoke(app, [
            "sim", "run", "--scenario", str(tmp / "sc.yaml"), "--gpu", gpu,
            "--model", "llama-3.3-70b", "--db", db,
        ], env={"COLUMNS": "200"})  # fmt: skip
        assert res.exit_code == 0, res.output
    ids = [r.id for r in sorted(list_runs(db=db), key=lambda r: r.created_at)]
    intended = describe(rows, 512)["intended_share"]
    return db, ids, intended


def test_report_puts_intended_beside_simulated(agentic_runs, tmp_path):
    db, ids, share = agentic_runs
    report = build_report(ids, db, [], load_catalogue(), 1.0)
    table = report.prompt_cache
    assert [r[2] for r in table.rows] == ["B200-SXM", "H100-SXM"]
    headers = table.headers
    intended = [r[headers.index("Intended (trace, infinite cache)")].value for r in table.rows]
    served = [r[headers.index("Served from cache (responses)")].value for r in table.rows]
    assert intended[0] == intended[1] == pytest.approx(share * 100)
    assert served[0] == pytest.approx(intended[0], abs=0.5)  # room for every block
    assert served[1] < served[0] - 10  # a KV cache too small to keep the sessions
    assert all(r[3].startswith("simulated") for r in table.rows)
    deck = write(report, "pptx", tmp_path / "r.pptx")
    from pptx import Presentation

    text = " ".join(
        shape.text_frame.text
        for slide in Presentation(str(deck)).slides
        for shape in slide.shapes
        if shape.has_text_frame
    )
    assert "prompt cache hit rates" in text
    page = write(report, "html", tmp_path / "r.html").read_text()
    assert "Prompt cache: intended, simulated and measured hit rates" in page


def test_run_page_shows_the_cache_table(agentic_runs):
    from fastapi.testclient import TestClient

    from server.app import create_app

    db, ids, share = agentic_runs
    site = create_app(db, api_token="t", allow_hosts=[], open_reads=True,
                      server_names=["testserver"])  # fmt: skip
    try:
        with TestClient(site) as client:
            page = client.get(f"/runs/{ids[1]}").text
    finally:
        site.state.tb.jobs.shutdown()
    table = page.split('id="cache-table"')[1].split("</table>")[0]
    cells = [html.unescape(c) for c in re.findall(r'<td class="n">([^<]*)</td>', table)]
    assert cells[0] == f"{share:.1%}" and cells[1].endswith("%") and cells[2] == "—"
    assert float(cells[1].rstrip("%")) < share * 100 - 10
    assert "Simulated" in table
