"""The compare page's HTML (no browser): the reference run, the buying answer and the
read-out show the numbers bench.curves, bench.frontier and bench.plan compute."""

from __future__ import annotations

import html
import re

import pytest

from bench.cost import load_catalogue
from bench.curves import compare_runs, ratio_sentence, run_curves
from bench.frontier import throughput_at_interactivity
from bench.metrics import parse_slo
from bench.plan import Demand, plan_capacity, span_text
from tests.helpers import b200_h100_site

SLO = "p99_ttft_ms<=150"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    db = f"sqlite:///{tmp_path_factory.mktemp('pages') / 'p.db'}"
    with b200_h100_site(db) as (client, ids):
        yield client, db, ids


def _text(page: str, element_id: str) -> str:
    m = re.search(rf'id="{element_id}"[^>]*>(.*?)</', page, re.S)
    assert m, element_id
    return html.unescape(m.group(1)).strip()


def test_reference_is_the_baseline_and_can_be_swapped(site):
    client, db, ids = site
    curves = run_curves(ids, db)
    comps = compare_runs(curves, parse_slo(SLO, flag="slo"), load_catalogue())
    base = f"/compare?run={ids[0]}&run={ids[1]}&slo={SLO}"
    first = client.get(base).text
    assert _text(first, "sentence") == ratio_sentence([comps[1], comps[0]])
    swapped = client.get(base + f"&ref={ids[1]}").text
    assert _text(swapped, "sentence") == ratio_sentence([comps[0], comps[1]])
    assert f'value="{ids[1]}" selected' in swapped


def test_plan_panel_and_readout(site):
    client, db, ids = site
    curves = run_curves(ids, db)
    slo = parse_slo(SLO, flag="slo")
    comps = compare_runs(curves, slo, load_catalogue())
    page = client.get(
        f"/compare?run={ids[0]}&run={ids[1]}&slo={SLO}&demand_rps=3&peak=1.5&at=60"
    ).text
    plan = plan_capacity(comps, Demand(requests_per_s=3, peak_factor=1.5), load_catalogue(),
                         slo_source="given")  # fmt: skip
    assert _text(page, "plan-sentence") == plan.sentence
    table = page.split('id="plan-table"')[1].split("</table>")[0]
    for s in plan.systems:
        assert html.escape(s.capacity_text) in page
        # $/month and $/Mtok with the range the GPU count's range costs, as the CLI prints it
        t = s.cheapest
        month = span_text(t.usd_per_month, t.usd_per_month_range, 0)
        assert f'<td class="n">{month}</td>' in table
        assert f'<td class="n">{span_text(t.usd_per_mtok, t.usd_per_mtok_range, 3)}</td>' in table
    assert any(" ($" in span_text(s.cheapest.usd_per_month, s.cheapest.usd_per_month_range, 0)
               for s in plan.systems)  # fmt: skip
    rows = re.findall(
        r'<tr><td>.*?</td><td class="n">([^<]*)(?: <small class="err"[^>]*>±(\d+)%</small>)?</td>',
        page.split('id="readout-table"')[1],
    )
    expected = [throughput_at_interactivity(c, 60.0) for c in curves]
    assert [v for v, _ in rows[:2]] == [
        f"{v:,.0f}" if v is not None else "off its front" for v in expected
    ]
    for (v, err), c in zip(rows[:2], curves, strict=True):  # a simulated run's ± beside it
        e = c.expected_error("output_tokens_per_s")
        assert err == (f"{e * 100:.0f}" if e is not None and v != "off its front" else "")
    assert any(err for _, err in rows[:2])  # the site's runs are simulated
    # without a demand the panel asks for one (the stored scenario has no rate)
    assert "Give a demand" in client.get(f"/compare?run={ids[0]}&run={ids[1]}").text
