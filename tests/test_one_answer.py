"""One answer on every surface (issue 27): the dashboard's compare page, every download
link on it (HTML report, CSV), its JSON links and the CLI's `plan`, given the same runs,
SLO, utilisation, tier and demand, show the same figures, because each lays out one
bench.export.report.Report / bench.plan.Plan built from those inputs."""

from __future__ import annotations

import csv
import html
import io
import re
import zipfile

import pytest

from tests.helpers import b200_h100_site

SLO = "p99_ttft_ms<=150"
QUERY = f"slo={SLO}&utilisation=0.6&demand_rps=2000&peak=1.5"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    db = f"sqlite:///{tmp_path_factory.mktemp('one') / 'o.db'}"
    with b200_h100_site(db) as (client, ids):
        yield client, db, ids


def _links(page: str, path: str) -> list[str]:
    return [html.unescape(h) for h in re.findall(rf'href="({re.escape(path)}\?[^"]+)"', page)]


def _link(exports: list[str], fmt: str) -> str:
    return next(e for e in exports if f"format={fmt}" in e)


def test_every_surface_shows_the_pages_answer(site):
    from typer.testing import CliRunner

    from bench.cli import app

    client, db, ids = site
    page = client.get(f"/compare?run={ids[0]}&run={ids[1]}&{QUERY}").text
    sentence = html.unescape(re.search(r'id="plan-sentence">(.*?)</p>', page, re.S).group(1))
    assert "for 2,000 req/s mean, peak x1.5" in sentence
    # the read-out at a speed per user is labelled as another question than the verdict
    assert "Another question: throughput per GPU at" in page
    assert "Not the verdict above" in page
    # every download and JSON link carries the page's SLO, utilisation, tier and demand
    exports = _links(page, "/api/export")
    assert {re.search(r"format=(\w+)", e).group(1) for e in exports} >= {"html", "csv"}
    for link in exports + _links(page, "/api/compare"):
        for part in ("demand_rps=2000", "peak=1.5", "utilisation=0.6", "tier=", "slo="):
            assert part in link, (part, link)
    (plan_link,) = _links(page, "/api/plan")
    assert "requests_per_s=2000" in plan_link and "peak_factor=1.5" in plan_link

    # HTML report from the page's link: the same sentence
    report = client.get(next(e for e in exports if "format=html" in e)).text
    assert html.unescape(re.search(r'id="plan-sentence">(.*?)</p>', report, re.S).group(1)) == (
        sentence
    )
    # CSV from the page's link: the plan's GPUs and $/month (full precision) match the API
    data = client.get(next(e for e in exports if "format=csv" in e)).content
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        rows = list(csv.DictReader(io.StringIO(zf.read("plan.csv").decode())))
    api_plan = client.get(plan_link).json()
    assert api_plan["sentence"] == sentence
    for row, system in zip(rows, api_plan["systems"], strict=True):
        assert row["System"] == system["legend"]
        assert float(row["$/month"]) == pytest.approx(system["cheapest"]["usd_per_month"])
        assert f"{system['gpus']:,}" in row["GPUs (range)"]
    # the compare JSON from the page's link: the page's utilisation and capacities
    compare = client.get(_links(page, "/api/compare")[0]).json()
    assert compare["utilisation"] == 0.6
    for run, system in zip(compare["runs"], api_plan["systems"], strict=True):
        assert run["at_slo"]["text"] == system["capacity_text"]
    # the deck and the workbook from the page's links: the same sentence, GPUs and $/month
    if "format=pptx" in " ".join(exports):
        from openpyxl import load_workbook
        from pptx import Presentation

        deck = Presentation(io.BytesIO(client.get(_link(exports, "pptx")).content))
        text = " ".join(
            sh.text_frame.text for slide in deck.slides for sh in slide.shapes if sh.has_text_frame
        )
        assert sentence in " ".join(text.split())
        wb = load_workbook(io.BytesIO(client.get(_link(exports, "xlsx")).content))
        names = {n: wb.defined_names[n].attr_text.split("!") for n in ("DemandRps", "PeakFactor")}
        values = {n: wb[s.strip("'")][r.replace("$", "")].value for n, (s, r) in names.items()}
        assert values == {"DemandRps": 2000, "PeakFactor": 1.5}
        assert wb["inputs"]["B4"].value == 0.6  # the Utilisation input
    # the CLI's plan, given the same inputs, prints the same sentence
    out = CliRunner().invoke(
        app,
        ["plan", *ids, "--db", db, "--slo", SLO, "--requests-per-s", "2000", "--peak-factor",
         "1.5"],
        env={"COLUMNS": "400"},
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    assert sentence in " ".join(out.output.split())
