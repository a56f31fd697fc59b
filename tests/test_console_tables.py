"""Every row of every console table has as many cells as its header.

rich pads a short row with empty cells, so a row missing one value shows the rest one
column left, under the wrong headers (the run summary's "TTFT from schedule" row showed
its p99.9 under p99). Every console table is bench.console.Table, whose add_row refuses a
row that does not fit: any test that prints a table (the CLI tests, the tour) then fails on
such a row. Here: every module uses that Table, and the summary's rows sit under their headers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bench.console import Table, summary_tables
from bench.metrics import summarize
from bench.records import OK, RequestRecord

ROOT = Path(__file__).resolve().parent.parent


def test_every_console_table_is_the_checked_one():
    """No module builds a rich Table of its own (rich.table.Column is fine)."""
    found = []
    for package in ("bench", "server", "dashboards"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "bench" / "console.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.ImportFrom)
                    and node.module == "rich.table"
                    and any(a.name == "Table" for a in node.names)
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == [], "use bench.console.Table"


def test_a_row_that_does_not_fit_its_header_is_refused():
    t = Table("a", "b", "c", title="t")
    t.add_row("1", "2", "3")
    with pytest.raises(ValueError, match="a row of 2 cells under 3 columns"):
        t.add_row("1", "2")


def _records(n: int = 200) -> list[RequestRecord]:
    ms = 1_000_000
    out = []
    for i in range(n):
        rec = RequestRecord(index=i, intended_ns=i * 50 * ms, sent_ns=i * 50 * ms + ms)
        rec.first_token_ns = rec.sent_ns + (20 + i % 17) * ms
        rec.end_ns = rec.first_token_ns + 40 * ms
        rec.output_tokens, rec.prompt_tokens, rec.state = 5, 16, OK
        out.append(rec)
    return out


def test_the_summary_rows_sit_under_their_headers():
    summary = summarize(_records())
    head, lat = summary_tables(summary, metrics=("ttft", "tpot"))
    headers = [str(c.header) for c in lat.columns]
    cells = {str(lat.columns[0]._cells[i]): i for i in range(lat.row_count)}
    row = cells["TTFT from schedule"]
    value = {h: str(c._cells[row]) for h, c in zip(headers, lat.columns, strict=True)}
    queued = summary.ttft_from_intended
    assert value["n"] == f"{queued.count:,}"
    assert value["p99"] == f"{queued.percentiles['p99']:.2f}"
    assert value["mean"] == f"{queued.mean:.2f}"
