"""Every simulated figure a user sees carries its expected error (issue 26): the dashboard's run
page, comparison tables, curves and API, the deck and the workbook show what `sim run` printed
(bench.sim.error_bars, one source), flag the points near saturation, and show nothing new on
a measured run. `sim tune --profile` runs the profile's GPU type on its calibrated device and
widens its ranges by the profile's own errors."""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from bench.cli import app
from bench.cost import load_catalogue
from bench.curves import run_curve
from bench.export.formats import write
from bench.export.report import build_report
from bench.metrics import parse_thresholds
from bench.scenario import parse_scenario
from bench.sim.profiles import get_gpu
from bench.sim.profiles.accuracy import bounds, expected_errors
from bench.sim.user_calibration import (
    CalibrationProfile,
    ParamFit,
    PointResidual,
    Settings,
    bounds_for,
    load_profile,
    write_profile,
)
from bench.sim.virtual import simulate
from bench.sim_tune import Space, search
from bench.store import RunWriter
from bench.store.engine import dispose_all
from tests.helpers import TINY_TUNE_SCENARIO, ttft_checks_off_by

COMMON = ["--num-prompts", "24", "--random-input-len", "300", "--random-output-len", "40"]


@pytest.fixture(scope="module", autouse=True)
def _ttft_checks_further_off():
    """TTFT's own error must show where it differs from the category's (see helpers)."""
    with ttft_checks_off_by(-0.6):
        yield


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A simulated H100 sweep (2 req/s, and everything at once: near saturation) stored by
    `sim run` with its --summary-json, and a measured run of the same shape."""
    tmp = tmp_path_factory.mktemp("errviews")
    db, out = str(tmp / "t.db"), tmp / "s.json"
    res = CliRunner().invoke(app, [
        "sim", "run", "--gpu", "H100", "--model", "llama-3.1-8b", "--max-num-seqs", "16",
        "--request-rates", "2,inf", *COMMON, "--db", db, "--summary-json", str(out),
    ], env={"COLUMNS": "200"})  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    writer = RunWriter(db, name="measured", label="H100 measured", backend="vllm",
                       model="llama-3.1-8b", gpu_type="H100-SXM", gpu_count=1)  # fmt: skip
    rng = np.random.default_rng(3)
    for lp, rate in enumerate((2.0, 8.0)):
        writer.start_load_point(lp, label=f"point {lp + 1}: rate {rate:g} req/s", target_rate=rate)
        reqs = [(float(t), 300, 40) for t in np.cumsum(rng.exponential(1 / rate, 24))]
        for rec in simulate(reqs, "H100-SXM", "llama-3.1-8b", "fp8", 1, load_point=lp):
            writer.submit(rec)
        writer.end_load_point(lp)
    writer.finish("completed")
    yield db, doc["run_id"], writer.run_id, doc
    dispose_all()


def _site(db):
    from server.app import create_app

    return create_app(db, api_token="t", allow_hosts=[], open_reads=True,
                      server_names=["testserver"])  # fmt: skip


def _get(db, *paths):
    from fastapi.testclient import TestClient

    site = _site(db)
    try:
        with TestClient(site) as client:
            return [client.get(p) for p in paths]
    finally:
        site.state.tb.jobs.shutdown()


def test_api_and_run_page_carry_what_sim_run_printed(runs):
    db, sim_id, measured_id, doc = runs
    errs, basis = expected_errors("H100", "llama-3.1-8b")
    api, page, api_m, page_m = _get(db, f"/api/curves?run={sim_id}", f"/runs/{sim_id}",
                                    f"/api/curves?run={measured_id}", f"/runs/{measured_id}")  # fmt: skip
    curve = api.json()[0]
    assert curve["error_bars"]["basis"] == basis == doc["simulation_error"]["basis"]
    assert curve["error_bars"]["saturation_requests_per_s"] == pytest.approx(
        doc["simulation_error"]["saturation_requests_per_s"]
    )
    by_lp = {p["load_point"]: p["error_bars"] for p in curve["points"]}
    for printed in doc["points"]:
        shown, cli = by_lp[printed["index"]], printed["expected_error"]
        assert shown["near_saturation"] == cli["near_saturation"]
        if math.isinf(cli["utilisation"]):  # rate inf: JSON has no infinity
            assert shown["utilisation"] is None
        else:
            assert shown["utilisation"] == pytest.approx(cli["utilisation"], rel=1e-6)
        for q in ("ttft_p50", "ttft_p99", "tpot_p99", "output_tps"):
            assert shown[q]["expected_error"] == cli[q]["expected_error"] == errs[q]
            assert shown[q]["value"] == pytest.approx(cli[q]["value"], rel=1e-6)
            assert (shown[q]["low"], shown[q]["high"]) == pytest.approx(
                bounds(cli[q]["value"], errs[q]), rel=1e-6
            )
    assert [by_lp[i]["near_saturation"] for i in (0, 1)] == [False, True]

    text = page.text
    note = html.unescape(text.split('id="sim-error">')[1].split("</p>")[0])
    # TTFT carries the independent TTFT checks' error, the others the category's
    low, high = min(errs.values()), max(errs.values())
    assert low < high and f"± {low:.0%}–{high:.0%} by quantity" in note
    assert f"(simulated: {basis})" in note
    rows = text.split('id="points-table"')[1].split("</table>")[0].split("<tr>")[2:]
    assert len(rows) == 2
    for row in rows:  # five figures with an error each; the overloaded point flagged
        ttft, other = (row.count(f"±{errs[q]:.0%}</small>") for q in ("ttft_p50", "tpot_p50"))
        assert ttft + other == 5 and ttft >= 2  # TTFT p50, p99 (and E2E, which holds TTFT)
    flagged = [r for r in rows if "near saturation" in r]
    assert len(flagged) == 1 and "rate inf" in flagged[0]

    assert api_m.json()[0]["error_bars"] is None
    assert all(p["error_bars"] is None for p in api_m.json()[0]["points"])
    assert "±" not in page_m.text and "sim-error" not in page_m.text
    assert "near saturation" not in page_m.text and "Utilisation (simulated)" not in page_m.text


def test_show_prints_what_sim_run_printed_and_nothing_on_a_measured_run(runs):
    db, sim_id, measured_id, doc = runs
    errs, basis = expected_errors("H100", "llama-3.1-8b")
    shown = CliRunner().invoke(app, ["show", sim_id, "--db", db], env={"COLUMNS": "250"})
    assert shown.exit_code == 0, shown.output
    text = shown.output
    flat = " ".join(text.split())  # the title wraps at the table's width
    assert f"Expected error of the simulated figures ({basis})" in flat
    assert f"TTFT p99 ms ±{errs['ttft_p99']:.0%}" in text
    assert f"TPOT p99 ms ±{errs['tpot_p99']:.0%}" in text
    for printed in doc["points"]:  # each point's row: its figures and utilisation
        row = next(
            line for line in text.splitlines() if line.startswith(f"│ {printed['index'] + 1} ")
        )
        cli = printed["expected_error"]
        assert f"{cli['ttft_p99']['value']:,.1f}" in row
        util = cli["utilisation"]
        assert ("near saturation" in row) == cli["near_saturation"]
        assert f"{util:.0%}" in row  # "inf%" at rate inf, as `sim run` printed it
    assert "near saturation (at 90% or more of the simulated maximum" in text
    measured = CliRunner().invoke(app, ["show", measured_id, "--db", db], env={"COLUMNS": "250"})
    assert measured.exit_code == 0 and "Expected error" not in measured.output


def test_a_virtual_run_keeps_its_saturation_whoever_runs_it(tmp_path: Path):
    """The demo and the service run virtual time through bench.drive.measure, not `sim run`:
    the run still keeps its saturation rate, so every view flags its points near it."""
    from bench.curves import load_saturation
    from bench.drive import choose_executor, measure
    from bench.sim.error_bars import saturation_rate
    from bench.sweep import PointSpec, SweepPlan

    db = str(tmp_path / "v.db")
    sc = parse_scenario(
        "target: {base_url: 'http://127.0.0.1:9', model: llama-3.1-8b}\n"
        "load: {shape: poisson, request_rate: 2, num_prompts: 24}\n"
        "workload: {input: {dist: fixed, mean: 300}, output: {dist: fixed, mean: 40}}\n"
    )
    virtual = {"gpu": "H100", "model": "llama-3.1-8b", "precision": "fp8", "tp": 1}
    executor = choose_executor(virtual=virtual)
    result = measure(sc, SweepPlan(specs=[PointSpec("rate", 2)]), executor=executor, db=db)
    kept = load_saturation(result.run_id, db)
    assert kept == pytest.approx(saturation_rate(executor.build(), 300, 40), rel=1e-9)
    bars = run_curve(result.run_id, db).points[0].error_bars  # 2 req/s: far below it
    assert bars["utilisation"] is not None and 0 < bars["utilisation"] < 0.1
    assert bars["near_saturation"] is False


def test_compare_page_and_curves_put_error_bars_on_simulated_runs_only(runs):
    from dashboards.figures import throughput_vs_interactivity, throughput_vs_latency

    db, sim_id, measured_id, _ = runs
    errs, _ = expected_errors("H100", "llama-3.1-8b")
    err, ttft_err = errs["output_tps"], errs["ttft_p99"]  # the category's; TTFT's (larger)
    (page,) = _get(db, f"/compare?run={sim_id}&run={measured_id}")
    table = page.text.split('id="percentile-table"')[1].split("</table>")[0]
    rows = table.split("<tr>")[2:]
    sim_rows = [r for r in rows if "(simulated)" in r]
    measured_rows = [r for r in rows if "H100 measured" in r]
    assert len(sim_rows) == len(measured_rows) == 2
    for r in sim_rows:  # interactivity too; TTFT (and E2E, which holds it) with TTFT's error
        assert r.count(f"±{err:.0%}</small>") + r.count(f"±{ttft_err:.0%}</small>") == 8
        assert r.count(f"±{ttft_err:.0%}</small>") >= 2
    assert not any('class="err"' in r or "near saturation" in r for r in measured_rows)
    # the capacity table: P99 TTFT and TPOT, $/Mtok and the matched-load throughput
    table = page.text.split('id="capacity-table"')[1].split("</table>")[0]
    rows = table.split("<tr>")[2:]
    sim_row = next(r for r in rows if "(simulated)" in r)
    measured_row = next(r for r in rows if "H100 measured" in r)
    assert sim_row.count(f"±{err:.0%}</small>") + sim_row.count(f"±{ttft_err:.0%}</small>") == 4
    assert 'class="err"' not in measured_row

    sim, measured = run_curve(sim_id, db), run_curve(measured_id, db, index=1)
    fig = throughput_vs_latency([sim, measured], "ttft", "p99")
    traces = {t.meta: t for t in fig.data}
    s, m = traces[sim_id], traces[measured_id]
    lows = [bounds(x, ttft_err)[0] for x in s.x]
    assert list(s.error_x.arrayminus) == pytest.approx(
        [x - lo for x, lo in zip(s.x, lows, strict=True)]
    )
    assert list(s.error_y.array) == pytest.approx([y * err for y in s.y])
    assert m.error_x.array is None and m.error_y.array is None
    fig = throughput_vs_interactivity([sim, measured])
    s, m = (next(t for t in fig.data if t.meta == run and t.mode == "markers")
            for run in (sim_id, measured_id))  # fmt: skip
    assert list(s.error_x.array) == pytest.approx([x * err for x in s.x])  # 1000 / TPOT p50
    assert m.error_x.array is None


def test_deck_and_workbook_carry_the_errors_and_flags(runs, tmp_path: Path):
    from openpyxl import load_workbook
    from pptx import Presentation

    db, sim_id, measured_id, doc = runs
    errs, basis = expected_errors("H100", "llama-3.1-8b")
    report = build_report([sim_id, measured_id], db, [], load_catalogue(), 1.0)
    table = report.sim_error
    assert [r[0] for r in table.rows] == [sim_id, sim_id]  # the measured run has no row
    summary = next(t for t in report.tables if t.name == "summary")
    sim_col = 1 + [c.curve.run_id for c in report.comparisons].index(sim_id)
    for label in ("P99 TTFT (ms)", "P99 TPOT (ms)", "Interactivity (tok/s per user)"):
        row = next(r for r in summary.rows if r[0] == label)
        cell, other = row[sim_col], row[3 - sim_col]
        q = "ttft_p99" if "TTFT" in label else "tpot_p50"
        assert cell.span == pytest.approx(bounds(cell.value, errs[q])), label
        assert other.span is None and "(" not in other.text()

    wb = load_workbook(write(report, "xlsx", tmp_path / "r.xlsx"))
    ws = wb["sim_error"]
    head = [c.value for c in ws[1]]
    rows = [[c.value for c in r] for r in ws.iter_rows(min_row=2, max_row=3)]
    printed = {p["index"]: p["expected_error"] for p in doc["points"]}
    for row in rows:
        lp = row[head.index("Load point")] - 1
        assert row[head.index("TTFT p99 expected error")] == pytest.approx(errs["ttft_p99"] * 100)
        assert row[head.index("TTFT p99 (ms)")] == pytest.approx(
            printed[lp]["ttft_p99"]["value"], rel=1e-3
        )
        assert (row[head.index("Near saturation")] == "near saturation") == printed[lp][
            "near_saturation"
        ]
        assert row[head.index("Where the error comes from")] == f"simulated: {basis}"
    assert measured_id not in {r[0] for r in rows}
    about = " ".join(str(c.value) for r in wb["about"].iter_rows() for c in r if c.value)
    assert "sheet sim_error" in about

    deck = Presentation(str(write(report, "pptx", tmp_path / "r.pptx")))
    slides = [
        " ".join(sh.text_frame.text for sh in s.shapes if sh.has_text_frame)
        + " ".join(
            c.text for sh in s.shapes if sh.has_table for r in sh.table.rows for c in r.cells
        )
        for s in deck.slides
    ]
    appendix = [t for t in slides if "expected error of the simulated figures" in t]
    assert len(appendix) == 1
    err, ttft_err = errs["output_tps"], errs["ttft_p99"]
    assert f"±{ttft_err:.0%}" in appendix[0] and "near saturation" in appendix[0]
    assert "held out of the fit" in appendix[0]  # where the error comes from
    ttft = next(t for t in slides if "Throughput per GPU vs P99 TTFT" in t)
    assert f"±{ttft_err:.0%} on latency" in ttft and "near saturation at rate inf" in ttft
    # the native chart: error bars on the simulated run's throughput, none on the measured one

    chart = _deck_chart(deck, "Throughput per GPU vs P99 TTFT")
    for axis, e in (("y", err), ("x", ttft_err)):  # throughput's and the latency's, x/÷ (1 + e)
        bars = _scatter_errors(chart, axis)
        sim_plus, sim_values = next(v for k, v in bars.items() if "(simulated)" in k)
        assert sim_values and sim_plus == pytest.approx([v * e for v in sim_values])
        assert bars["H100 measured"][0] == []

    # a report of the measured run alone shows nothing new
    alone = build_report([measured_id], db, [], load_catalogue(), 1.0)
    assert not alone.sim_error.rows and "sim_error" not in [t.name for t in alone.tables]
    assert "sim_error" not in load_workbook(write(alone, "xlsx", tmp_path / "m.xlsx")).sheetnames
    text = " ".join(
        sh.text_frame.text
        for s in Presentation(str(write(alone, "pptx", tmp_path / "m.pptx"))).slides
        for sh in s.shapes
        if sh.has_text_frame
    )
    assert "expected error" not in text.lower()


def _cost_range(price: float, gpus: int, tps: float, err: float, util: float) -> tuple:
    """($/Mtok, low, high) from DESIGN.md's formula with the throughput at its own ends:
    price over the highest throughput is the cheapest, over the lowest the dearest."""
    usd = lambda t: price * gpus / (t * 3600) * 1e6 / util  # noqa: E731
    return usd(tps), usd(tps * (1 + err)), usd(tps / (1 + err))


def test_cost_charts_carry_the_throughput_and_tpot_errors_on_simulated_runs_only(
    runs, tmp_path: Path
):
    from pptx import Presentation

    from bench.cost import price_per_gpu_hour
    from bench.curves import compare_runs
    from bench.frontier import cost_view_tier, pareto_front
    from dashboards.figures import cost_per_tier, cost_vs_interactivity

    db, sim_id, measured_id, _ = runs
    err = expected_errors("H100", "llama-3.1-8b")[0]["output_tps"]  # TPOT p50's too
    cat = load_catalogue()
    sim, measured = run_curve(sim_id, db), run_curve(measured_id, db, index=1)
    curves = [sim, measured]

    # $/Mtok against interactivity, at 50% utilisation: y from the throughput's error, x
    # (1000 / TPOT p50) from TPOT p50's
    tier = cost_view_tier(curves, cat)
    fig = cost_vs_interactivity(curves, cat, utilisation=0.5, tier=tier, menu=False)
    s, m = (next(t for t in fig.data if t.meta == run) for run in (sim_id, measured_id))
    price = price_per_gpu_hour(cat.tier(cat.resolve_gpu(sim.gpu_type), tier), cat)
    by_lp = {p.load_point: p for p in sim.points}
    front = [by_lp[f.load_point] for f in pareto_front(sim.points)]
    assert len(front) == len(s.y) == 2
    ends = [_cost_range(price, sim.gpu_count, p.output_tps, err, 0.5) for p in front]
    assert list(s.y) == pytest.approx([usd for usd, _, _ in ends])
    assert list(s.error_y.array) == pytest.approx([hi - usd for usd, _, hi in ends])
    assert list(s.error_y.arrayminus) == pytest.approx([usd - lo for usd, lo, _ in ends])
    inter = [1000 / p.latency("tpot", "p50") for p in front]
    assert list(s.x) == pytest.approx(inter)
    assert list(s.error_x.array) == pytest.approx([x * err for x in inter])
    assert list(s.error_x.arrayminus) == pytest.approx([x - x / (1 + err) for x in inter])
    assert m.error_x.array is None and m.error_y.array is None

    # $/Mtok per tier at capacity: the simulated run's bars x/÷ (1 + e), the measured's bare
    fig = cost_per_tier(curves, cat)
    comps = compare_runs(curves, [], cat)
    s, m = (next(t for t in fig.data if t.meta == run) for run in (sim_id, measured_id))
    rows = {r.tier: r for r in comps[0].cost_rows}
    ends = [
        _cost_range(rows[t].price_usd_per_gpu_hr, sim.gpu_count, comps[0].capacity.output_tps,
                    err, 1.0) if v is not None else None
        for t, v in zip(s.y, s.x, strict=True)
    ]  # fmt: skip
    assert sum(e is not None for e in ends) >= 2  # H100 has several priced tiers
    for value, up, down, e in zip(s.x, s.error_x.array, s.error_x.arrayminus, ends, strict=True):
        if e is None:
            assert value is None and up is None and down is None
        else:
            assert (value, up, down) == pytest.approx((e[0], e[2] - e[0], e[0] - e[1]))
    assert m.error_x.array is None and "simulated" not in " ".join(m.hovertext)

    # the deck's native $/Mtok chart: the same bars on the simulated run, none on the measured
    report = build_report([sim_id, measured_id], db, [], cat, 1.0)
    deck = Presentation(str(write(report, "pptx", tmp_path / "r.pptx")))
    chart = _deck_chart(deck, "$/Mtok output vs")
    for axis in ("y", "x"):  # $/Mtok's (throughput's error) and interactivity's (TPOT p50's)
        bars = _scatter_errors(chart, axis)
        sim_plus, sim_values = bars[sim.legend]
        assert len(sim_values) == 2 and sim_plus == pytest.approx([v * err for v in sim_values])
        assert bars[measured.legend][0] == []


def _deck_chart(deck, title: str):
    """The deck's native chart whose title starts with `title`."""
    return next(
        sh.chart
        for sl in deck.slides
        for sh in sl.shapes
        if sh.has_chart and sh._element.nvGraphicFramePr.cNvPr.get("title", "").startswith(title)
    )


def _scatter_errors(chart, axis: str = "y") -> dict[str, tuple[list[float], list[float]]]:
    """Per series of a scatter chart: the plus half-widths of its error bars along `axis`
    ([] for none) and its values on that axis."""
    from pptx.oxml.ns import qn

    bars = {}
    for ser in chart.plots[0].series:
        found = [
            b
            for b in ser._element.findall(qn("c:errBars"))
            if b.find(qn("c:errDir")).get("val") == axis
        ]
        plus = [float(v.text) for b in found for v in b.find(qn("c:plus")).iter(qn("c:v"))]
        values = ser._element.find(qn(f"c:{axis}Val"))
        bars[ser.name] = (plus, [float(v.text) for v in values.iter(qn("c:v"))])
    return bars


def _bar_errors(chart, name: str) -> tuple[dict, dict, list]:
    """One bar series' error bars in the deck's XML: ({point: plus}, {point: minus}, bars)."""
    from pptx.oxml.ns import qn

    ser = next(s for s in chart.plots[0].series if s.name == name)._element
    found = ser.findall(qn("c:errBars"))

    def points(tag: str) -> dict[int, float]:
        return {int(pt.get("idx")): float(pt.find(qn("c:v")).text)
                for b in found for pt in b.find(qn(tag)).iter(qn("c:pt"))}  # fmt: skip

    return points("c:plus"), points("c:minus"), found


def test_cost_bars_and_tables_carry_the_range_on_simulated_runs_only(runs, tmp_path: Path):
    """The deck's $/Mtok bars carry x/÷ (1 + e) as native error bars, and the cost table
    (CSV, HTML) and the workbook's cost sheet give its low and high: simulated runs only."""
    import csv

    from openpyxl import load_workbook
    from pptx import Presentation
    from pptx.oxml.ns import qn

    from bench.curves import compare_runs

    db, sim_id, measured_id, _ = runs
    cat = load_catalogue()
    sim, measured = run_curve(sim_id, db), run_curve(measured_id, db, index=1)
    err = expected_errors("H100", "llama-3.1-8b")[0]["output_tps"]  # the category's
    err_total = max(sim.error_bars["expected_error"].values())  # total tok/s: the largest
    util = 0.5
    comp = compare_runs([sim, measured], [], cat, util)[0]
    tps, total_tps = comp.capacity.output_tps, comp.capacity.total_tps
    ends = {r.tier: _cost_range(r.price_usd_per_gpu_hr, sim.gpu_count, tps, err, util)
            for r in comp.cost_rows}  # fmt: skip
    total_ends = {r.tier: _cost_range(r.price_usd_per_gpu_hr, sim.gpu_count, total_tps,
                                      err_total, util) for r in comp.cost_rows}  # fmt: skip
    assert len(ends) >= 2

    report = build_report([sim_id, measured_id], db, [], cat, util)
    deck = Presentation(str(write(report, "pptx", tmp_path / "r.pptx")))
    chart = _deck_chart(deck, "$/Mtok of output")
    tiers = list(chart.plots[0].categories)
    plus, minus, found = _bar_errors(chart, sim.legend)
    assert len(found) == 1 and found[0].find(qn("c:errDir")) is None  # a bar's: no direction
    want = {i: ends[t] for i, t in enumerate(tiers) if t in ends}
    assert set(plus) == set(minus) == set(want)
    for i, (usd, lo, hi) in want.items():
        assert (plus[i], minus[i]) == pytest.approx((hi - usd, usd - lo))
    assert _bar_errors(chart, measured.legend)[2] == []
    # hatched as on the dashboard: the measured run of the same GPU shares its colour
    fills = {ser.name: ser._element.find(qn("c:spPr"))[0].tag for ser in chart.plots[0].series}
    assert fills == {sim.legend: qn("a:pattFill"), measured.legend: qn("a:solidFill")}

    # the cost table: CSV numbers and HTML text, the measured run's cells empty
    at = f"at {util:.0%} utilisation"
    names = [
        f"{t} $/Mtok {at}, simulated {e}" for t in ("Output", "Total") for e in ("low", "high")
    ]
    with open(write(report, "csv", tmp_path / "csv") / "cost.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["Run"] for r in rows} == {sim.legend, measured.legend}
    for r in rows:
        got = [r[n] for n in names]
        if r["Run"] == measured.legend:
            assert got == ["", "", "", ""]
            continue
        (_, lo, hi), (_, tlo, thi) = ends[r["Tier"]], total_ends[r["Tier"]]
        assert [float(v) for v in got] == pytest.approx([lo, hi, tlo, thi])
        assert float(r[f"Output $/Mtok {at}"]) == pytest.approx(ends[r["Tier"]][0])
    page = write(report, "html", tmp_path / "r.html").read_text()
    cost_html = page[page.index("$/Mtok per pricing tier at capacity") :]
    assert all(html.escape(n) in cost_html for n in names)
    tier = next(iter(ends))
    assert f"${ends[tier][1]:,.3f}" in cost_html and f"${ends[tier][2]:,.3f}" in cost_html

    # the summary's $/Mtok (tiers x runs) as text, on the slide and the page: "x (low-high)"
    j_sim, j_measured = (report.summary_cost.headers.index(r.legend) for r in (sim, measured))
    slide_cells = {c.text for sl in deck.slides for sh in sl.shapes if sh.has_table
                   for row in sh.table.rows for c in row.cells}  # fmt: skip
    for row in report.summary_cost.rows:
        usd, lo, hi = ends[row[0]]
        text = f"${usd:,.3f} (${lo:,.3f}-${hi:,.3f})"
        assert row[j_sim].text() == text and text in slide_cells and text in page
        assert row[j_sim].value == pytest.approx(usd)  # CSV and Excel keep the bare number
        assert "(" not in row[j_measured].text()

    # the workbook: the range as formulas over the at-utilisation $/Mtok, recalculated
    book = write(report, "xlsx", tmp_path / "r.xlsx")
    ws = load_workbook(book)["cost"]
    head = [c.value for c in ws[1]]
    low = head.index("Output $/Mtok at utilisation, simulated low") + 1
    assert str(ws.cell(2, low).value).startswith("=IF(ISNUMBER(J2),J2/(1+")
    from tests.test_export_report import _recalculated, _rows

    (tmp_path / "calc").mkdir()
    values = _rows(_recalculated(book, tmp_path / "calc")["cost"])
    by_run = {(r[0], r[2]): r for r in values if r[2] in ends}
    assert {run for run, _ in by_run} == {sim.legend, measured.legend}
    for (run, t), r in by_run.items():
        got = r[head.index("Output $/Mtok expected error (simulated)") :][:6]
        if run == measured.legend:
            assert all(v in (None, "") for v in got)
        else:
            (_, lo, hi), (_, tlo, thi) = ends[t], total_ends[t]
            assert got == pytest.approx((err, lo, hi, err_total, tlo, thi))

    # a report of the measured run alone has no such columns
    alone = build_report([measured_id], db, [], cat, util)
    assert not any("simulated" in h for h in alone.cost.headers)
    assert not any("simulated" in str(c.value) for c in
                   load_workbook(write(alone, "xlsx", tmp_path / "m.xlsx"))["cost"][1])  # fmt: skip


# -- sim tune --profile ------------------------------------------------------------------------

TUNE_SLO = "p99_ttft_ms<=500,p99_tpot_ms<=12"
SPACE = dict(precisions=["fp8"], mtp=[0], max_num_seqs=[16], parallels=["tp1"], refine=False)
# The profile's own errors (its one fitted point's residuals): TTFT 12%, TPOT 7%, tok/s 9%.
MEASURED = {"ttft_p50": 100.0, "tpot_p50": 10.0, "output_tps": 1000.0}
SIMULATED = {"ttft_p50": 112.0, "tpot_p50": 10.7, "output_tps": 1090.0}


def _profile(tmp_path: Path, mbu: float | None = None) -> Path:
    """An H100 calibration profile at the published fit's values (H100, vLLM), with `mbu`
    instead of the fit's when given."""
    from bench.sim.virtual import build_engine

    eff = build_engine("H100", "llama-3.1-8b").dep.eff
    # the fit has no front end (t_req_s 0) and steady steps (step_cv 0): a profile's are at
    # least their lower bounds
    values = {"mbu": mbu or eff.mbu, "mfu": eff.mfu, "kv_bw_ratio": eff.kv_bw_ratio, "t_layer_s": eff.t_layer_s, "t_tok_s": eff.t_tok_s,
              "t_req_s": 1e-5, "step_cv": 1e-3}  # fmt: skip
    params = [ParamFit(b.name, values[b.name], b.low, b.high, b.source, 1.05)
              for b in bounds_for("nvidia")]  # fmt: skip
    prof = CalibrationProfile(get_gpu("H100"), Settings(model="llama-3.1-8b"), params,
                              [PointResidual("r", 0, "rate 4/s", MEASURED, SIMULATED)], [])  # fmt: skip
    return write_profile(prof, tmp_path / f"mbu-{mbu}.yaml")


def _tune(profile=None, gpus=("H100",)):
    sc = parse_scenario(TINY_TUNE_SCENARIO, source="tiny")
    return search(sc, "llama-3.1-8b", Space(gpus=list(gpus), **SPACE),
                  parse_thresholds(TUNE_SLO), load_catalogue(), store=False, slo_iterations=5,
                  slo_draws=0, top=1, profile=profile)  # fmt: skip


def test_sim_tune_runs_the_profiles_gpu_on_its_device_with_its_errors(tmp_path: Path):
    same, slow = (load_profile(_profile(tmp_path, m)) for m in (None, 0.65))
    published = _tune().searched()[0]
    on_same = _tune(same).searched()[0]
    on_slow = _tune(slow, gpus=("H100", "B200")).searched("H100")[0]
    assert on_slow.config.profile == str(slow.path) and published.config.profile is None
    # the profile's device is what runs: the fit's own values give the fit's capacity, a
    # slower memory path (mbu 0.65 against the fit's 0.88) less
    assert on_same.value == pytest.approx(published.value, rel=1e-3)  # written to 4 digits
    assert 0 < on_slow.value < 0.95 * published.value
    # the profile's own error widens its range, not the category's: the profile states no
    # p99, so an SLO on a p99 takes its largest error (TTFT p50's 12%)
    assert on_slow.capacity.sim_error == pytest.approx(0.12)
    assert published.capacity.sim_error == _deciding_error(published.capacity, "H100")
    cap = on_slow.capacity
    assert cap.high >= cap.value * 1.12 * (1 - 1e-9) and cap.low <= cap.value / 1.12 * (1 + 1e-9)
    assert "--profile" in on_slow.config.command("llama-3.1-8b", "vllm")
    b200 = _tune(slow, gpus=("H100", "B200")).searched("B200")[0]
    assert b200.config.profile is None and b200.capacity.sim_error == _deciding_error(
        b200.capacity, "B200"
    )


def _deciding_error(cap, gpu: str) -> float:
    """The category's error of the figure the capacity's range says it was widened by."""
    errors = expected_errors(gpu, "llama-3.1-8b")[0]
    named = {"p99_ttft_ms": "ttft_p99", "p99_tpot_ms": "tpot_p99", "output tok/s": "output_tps"}
    which = next(q for name, q in named.items() if f"widened by {name}'s" in cap.sim_basis)
    return errors[which]


def test_sim_tune_profile_cli_prints_its_errors_and_refuses_a_missing_device(tmp_path: Path):
    path = _profile(tmp_path, 0.65)
    (tmp_path / "sc.yaml").write_text(TINY_TUNE_SCENARIO)
    base = ["sim", "tune", "--slo", TUNE_SLO, "--scenario", str(tmp_path / "sc.yaml"),
            "--precisions", "fp8", "--mtp", "0", "--max-num-seqs", "16", "--parallel", "tp1",
            "--no-refine", "--db", str(tmp_path / "t.db")]  # fmt: skip
    res = CliRunner().invoke(app, [*base, "--profile", str(path)], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    assert "H100-SXM (calibrated) tp1 fp8" in res.output  # the profile's device alone
    line = next(ln for ln in res.output.splitlines() if ln.startswith("Expected error"))
    assert "±7% to ±12% by quantity" in line and f"calibration profile {path}" in line
    res = CliRunner().invoke(app, [*base, "--profile", str(path), "--gpus", "B200"])
    assert res.exit_code == 2
    msg = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(msg) == 1 and re.search(
        r"calibrates H100-SXM, which is not among --gpus B200", msg[0]
    )


def test_sim_serve_with_a_profile_announces_its_errors(tmp_path: Path):
    """A run measured against `sim serve --profile` is stored with the profile's errors (the
    endpoint announces them in /v1/models, bench.sim.detect), not the category's."""
    from bench.sim.error_bars import calibration_record
    from bench.sim.server import SimServer
    from bench.sim.virtual import build_engine

    prof = load_profile(_profile(tmp_path, 0.65))
    record = calibration_record(prof)
    assert record["expected_error"] == pytest.approx({"ttft_p50": 0.12, "tpot_p50": 0.07,
                                                      "output_tps": 0.09})  # fmt: skip
    engine = build_engine(prof.calibrated_device(), "llama-3.1-8b")
    assert SimServer(engine, "llama-3.1-8b", calibration=record).hardware()["calibration"] == record
    assert "calibration" not in SimServer(engine, "llama-3.1-8b").hardware()
