"""Export: the Report, Excel and CSV agree with bench.curves; missing data is reported.

Runs are built in a temp SQLite database in virtual time (bench.sim.virtual.simulate +
RunWriter): a simulated B200 x1 and H100 x2 sweep of three load points each, and an
"imported" run without GPU type or SLO, like `tokenbench import` stores.
"""

from __future__ import annotations

import csv
import io
import re
import zipfile
from html import escape

import numpy as np
import pytest
from openpyxl import load_workbook

from bench.cost import load_catalogue
from bench.curves import compare_runs, ratio_sentence, run_curves
from bench.export.formats import write
from bench.export.report import build_report
from bench.metrics import parse_thresholds
from bench.sim.virtual import simulate
from bench.store import RunWriter
from bench.store.engine import dispose_all

SLO = "p99_ttft_ms<=2000,p99_tpot_ms<=50"
RATES = (1.0, 3.0, 6.0)


def _sweep(db, gpu: str, tp: int, *, gpu_type: str | None, slo: str | None, n: int = 24):
    """A three-point rate sweep of `gpu` x `tp`, stored like `tokenbench sweep` stores it."""
    rng = np.random.default_rng(7)
    writer = RunWriter(
        db,
        name="chat-test",
        label=f"{gpu} x{tp} llama-3.3-70b fp8" if gpu_type else None,
        scenario="name: chat-test\ndescription: test chat mix\n",
        backend="vllm",
        model="llama-3.3-70b",
        gpu_type=gpu_type,
        gpu_count=tp,
        simulated=gpu_type is not None,
        imported_from=None if gpu_type else "vllm",
        extra={"sweep": {"slo": slo.split(",")}} if slo else None,
    )
    for lp, rate in enumerate(RATES):
        writer.start_load_point(lp, label=f"point {lp + 1}: rate {rate:g} req/s", target_rate=rate)
        offsets = np.cumsum(rng.exponential(1 / rate, n))
        reqs = [(float(t), 512, 96) for t in offsets]
        for rec in simulate(reqs, gpu, "llama-3.3-70b", "fp8", tp, load_point=lp):
            writer.submit(rec)
        writer.end_load_point(lp)
    writer.finish("completed")
    return writer.run_id


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory):
    db = str(tmp_path_factory.mktemp("export") / "runs.db")
    b200 = _sweep(db, "B200-SXM", 1, gpu_type="B200-SXM", slo=SLO)
    h100 = _sweep(db, "H100-SXM", 2, gpu_type="H100-SXM", slo=SLO)
    bare = _sweep(db, "H100-SXM", 1, gpu_type=None, slo=None, n=10)
    yield db, [b200, h100], bare
    dispose_all()


@pytest.fixture(scope="module")
def report(demo_db):
    db, runs, _ = demo_db
    return build_report(runs, db, None, load_catalogue(), 0.85)


def test_report_numbers_come_from_curves(demo_db, report):
    db, runs, _ = demo_db
    curves = run_curves(runs, db)
    comps = compare_runs(curves, parse_thresholds(SLO), load_catalogue(), 0.85)
    assert report.slo_source == "stored with the runs"
    assert [str(t) for t in report.slo] == SLO.split(",")
    assert report.any_simulated and "simulated" in report.curves[0].legend
    for c in comps:
        assert c.capacity is not None, "the test sweeps must have a capacity point"
    # summary: the capacity row, per run
    row = next(r for r in report.summary.rows if r[0] == "Output tok/s per GPU")
    assert [cell.value for cell in row[1:]] == [c.capacity.output_tps_per_gpu for c in comps]
    # $/Mtok per tier at 85 % utilisation
    for j, c in enumerate(comps, start=1):
        for r in c.cost_rows:
            cell = next(x for x in report.summary_cost.rows if x[0] == r.tier)[j]
            assert cell.value == pytest.approx(r.output_usd_per_mtok_at_utilisation)
    # Both runs met the SLO at every rate: both capacities are lower bounds, so no ratio is
    # claimed (the 6.5x came from exactly this), and the sentence says why.
    assert [c.at_slo.kind for c in comps] == ["at_least", "at_least"]
    assert report.sentence == ratio_sentence(comps)
    assert "both capacities are lower bounds" in report.sentence
    assert report.missing == []


def test_report_without_gpu_or_slo_says_what_is_missing(demo_db):
    db, runs, bare = demo_db
    report = build_report([runs[0], bare], db, None, load_catalogue(), 1.0)
    assert report.slo == []  # the runs do not share a stored SLO
    text = " ".join(report.missing)
    assert "No SLO given" in text
    assert "GPU type not recorded" in text
    assert all(r[0] != report.curves[1].legend for r in report.cost.rows)
    assert report.chart("cost_per_tier").note.startswith("left out (no $/Mtok)")
    # every format still renders
    for fmt, name in (("pptx", "d.pptx"), ("xlsx", "d.xlsx"), ("csv", "c"), ("html", "d.html")):
        out = write(report, fmt, db.rsplit("/", 1)[0] + "/missing-" + name)
        assert out.exists()


def test_report_with_only_bare_runs(demo_db, tmp_path):
    db, _, bare = demo_db
    report = build_report([bare], db, "p99_ttft_ms<=1", load_catalogue(), 1.0)
    assert any("no load point met the SLO" in m for m in report.missing)
    assert report.summary_cost.rows == [] and report.prices.rows == []
    for fmt, name in (("pptx", "b.pptx"), ("xlsx", "b.xlsx"), ("csv", "b.zip"), ("html", "b.html")):
        assert write(report, fmt, tmp_path / name).exists()


def test_xlsx_sheets_hold_the_report_numbers(report, tmp_path):
    wb = load_workbook(write(report, "xlsx", tmp_path / "r.xlsx"))
    assert {"about", "inputs", "capacity", "plan", "energy", "summary", "summary_cost", "cost",
            "percentiles", "load_points", "runs", "assumptions", "methodology",
            "missing"} <= set(wb.sheetnames)  # fmt: skip
    ws = wb["load_points"]
    headers = [c.value for c in ws[1]]
    col = headers.index("Output tok/s per GPU")
    p99 = headers.index("TTFT p99 (ms)")
    values = [(r[col].value, r[p99].value, r[col].number_format) for r in ws.iter_rows(min_row=2)]
    expected = [(p.output_tps_per_gpu, p.latency("ttft")) for c in report.curves for p in c.points]
    # Excel keeps 15 significant digits
    assert [(a, b) for a, b, _ in values] == [pytest.approx(e, rel=1e-12) for e in expected]
    assert values[0][2] == "#,##0.0"
    cost = wb["summary_cost"]
    assert cost.cell(2, 2).number_format == '"$"#,##0.000'
    assert "SIMULATED" in " ".join(str(c.value) for c in wb["about"]["A"])


def test_csv_folder_and_zip(report, tmp_path):
    folder = write(report, "csv", tmp_path / "csv")
    rows = list(csv.DictReader((folder / "percentiles.csv").open()))
    expected = [p.latency("tpot", "p99") for c in report.curves for p in c.points]
    assert [float(r["TPOT P99 (ms)"]) for r in rows] == expected
    assert rows[0]["Run"].endswith("(simulated)")
    zipped = write(report, "csv", tmp_path / "tables.zip")
    with zipfile.ZipFile(zipped) as zf:
        names = set(zf.namelist())
        assert {"summary.csv", "cost.csv", "prices.csv", "README.txt"} <= names
        prices = list(csv.DictReader(io.StringIO(zf.read("prices.csv").decode())))
    assert prices and all(r["Source"] and r["Date"] for r in prices)


def test_html_is_standalone(report, tmp_path):
    html = write(report, "html", tmp_path / "r.html").read_text()
    assert re.search(r"<script[^>]*\bsrc\s*=", html, re.I) is None  # plotly.js is inlined
    assert re.search(r"<link[^>]*\bhref\s*=\s*[\"']?(https?:)?//", html, re.I) is None
    # (plotly.js itself mentions cdn.plot.ly as the default topojson URL, used by geo maps only)
    assert "SIMULATED" in html
    assert report.sentence.replace("'", "&#x27;") in html
    for chart in report.charts:
        assert f"chart-{chart.key}" in html
    assert 'id="caveats"' in html and report.caveats
    for caveat in report.caveats:
        assert escape(caveat) in html
    assert report.tier_note and escape(report.tier_note) in html


def test_energy_table_uses_profile_tdp_without_telemetry(demo_db, report):
    from bench.sim.profiles import get_gpu

    db, runs, _ = demo_db
    comps = report.comparisons
    assert [r[0] for r in report.energy.rows] == [c.curve.legend for c in comps]
    for row, c in zip(report.energy.rows, comps, strict=True):
        tdp = get_gpu(c.curve.gpu_type).tdp_w
        assert row[2].value == tdp and row[3] == "GPU profile TDP (assumed)"
        # J/token = TDP x GPUs / output tokens/s, by hand.
        expected = tdp * c.curve.gpu_count / c.capacity.output_tps
        assert row[4].value == pytest.approx(expected)
    assert report.energy in report.tables


# ---------------------------------------------------------------- the workbook's formulas


def _recalculated(path, out_dir):
    """The workbook as LibreOffice computes it (headless convert), read back as values."""
    import shutil
    import subprocess
    import tempfile

    if not shutil.which("soffice"):
        pytest.skip("LOUD SKIP: LibreOffice not installed (apt-get install -y libreoffice-calc) "
                    "- the workbook's formulas were not recalculated")  # fmt: skip
    with tempfile.TemporaryDirectory() as profile:
        res = subprocess.run(
            ["soffice", f"-env:UserInstallation=file://{profile}", "--headless",
             "--convert-to", "xlsx", "--outdir", str(out_dir), str(path)],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return load_workbook(out_dir / path.name, data_only=True)


def _rows(ws, first: int = 2) -> list[tuple]:
    return [
        r for r in ws.iter_rows(min_row=first, values_only=True) if any(v is not None for v in r)
    ]


def test_xlsx_derives_cost_with_formulas(report, tmp_path):
    """$/Mtok and $/month are formulas over the inputs and the measured capacity sheet."""
    wb = load_workbook(write(report, "xlsx", tmp_path / "f.xlsx"))
    cost = wb["cost"]
    assert str(cost["H2"].value).startswith("=") and "Utilisation" in str(cost["J2"].value)
    assert str(cost["D2"].value).startswith("=inputs!$C$")
    formulas = sum(
        1 for ws in wb for row in ws.iter_rows() for c in row if str(c.value).startswith("=")
    )
    assert formulas > 50
    assert wb["inputs"]["B4"].value == report.utilisation  # the Utilisation input
    assert {"Utilisation", "HoursPerMonth", "DemandRps", "FacilityPUE"} <= set(wb.defined_names)


@pytest.mark.slow
def test_xlsx_recalculates_in_libreoffice_when_a_price_changes(demo_db, tmp_path):
    from bench.plan import HOURS_PER_MONTH, Demand

    db, runs, _ = demo_db
    report = build_report(
        runs, db, None, load_catalogue(), 0.85, demand=Demand(requests_per_s=3, peak_factor=1.5)
    )
    assert report.plan is not None and all(s.gpus for s in report.plan.systems)
    path = write(report, "xlsx", tmp_path / "calc.xlsx")
    before = _recalculated(path, tmp_path / "before")
    # As exported, the formulas give the Report's own numbers.
    by_row = {(r[0], r[2]): r for r in _rows(before["cost"]) if r[2]}
    for comp in report.comparisons:
        for row in comp.cost_rows:
            got = by_row[(comp.curve.legend, row.tier)]
            assert got[9] == pytest.approx(row.output_usd_per_mtok_at_utilisation, rel=1e-9)
    plan_rows = {(r[0], r[2]): r for r in _rows(before["plan"]) if r[2] and r[3] is not None}
    for system in report.plan.systems:
        for tier in system.tiers:
            got = plan_rows[(system.legend, tier.tier)]
            assert got[4] == system.gpus
            assert got[5] == pytest.approx(tier.usd_per_month, rel=1e-9)
            assert got[6] == pytest.approx(tier.usd_per_mtok, rel=1e-9)
            assert got[8:12] == (None,) * 4  # a lower-bound capacity: no range

    # A finance person doubles the B200's neocloud price and sets utilisation to 50%.
    wb = load_workbook(path)
    inputs = wb["inputs"]
    cell = next(
        r[2] for r in inputs.iter_rows()
        if r[0].value == "B200-SXM" and r[1].value == "neocloud-on-demand"
    )  # fmt: skip
    price = cell.value
    cell.value = price * 2
    inputs["B4"] = 0.5
    wb.save(path)
    after = _recalculated(path, tmp_path / "after")
    old = {(r[0], r[2]): r for r in _rows(before["cost"]) if r[2]}
    new = {(r[0], r[2]): r for r in _rows(after["cost"]) if r[2]}
    b200 = next(c.curve.legend for c in report.comparisons if c.curve.gpu_type == "B200-SXM")
    # the neocloud price and the tiers derived from it (their cells are formulas over it)
    follows = {
        t.name
        for t in report.catalogue.tiers("B200-SXM")
        if t.name == "neocloud-on-demand"
        or (t.derived is not None and t.derived.from_tier == "neocloud-on-demand")
    }
    assert len(follows) > 1
    for key, row in new.items():
        doubled = key[0] == b200 and key[1] in follows
        assert row[3] == pytest.approx(old[key][3] * (2 if doubled else 1))
        assert row[7] == pytest.approx(old[key][7] * (2 if doubled else 1))  # busy $/Mtok
        # at 50% utilisation instead of the report's: every $/Mtok moves
        factor = (2 if doubled else 1) * report.utilisation / 0.5
        assert row[9] == pytest.approx(old[key][9] * factor)
    month_old = {(r[0], r[2]): r[5] for r in _rows(before["plan"]) if r[2] and r[3] is not None}
    month_new = {(r[0], r[2]): r[5] for r in _rows(after["plan"]) if r[2] and r[3] is not None}
    assert month_new[(b200, "neocloud-on-demand")] == pytest.approx(
        month_old[(b200, "neocloud-on-demand")] * 2
    )
    system = next(s for s in report.plan.systems if s.legend == b200)
    assert month_new[(b200, "neocloud-on-demand")] == pytest.approx(
        system.gpus * price * 2 * HOURS_PER_MONTH
    )
    summary = {r[0]: r for r in _rows(after["summary_cost"])}
    col = 1 + [c.curve.legend for c in report.comparisons].index(b200)
    assert summary["neocloud-on-demand"][col] == pytest.approx(new[(b200, "neocloud-on-demand")][9])

    # Electricity, PUE and the demand doubled: the owned-TCO price (a formula over them)
    # rises by three times its power term, the GPU count is the one bench.plan sizes for
    # twice the demand, and the plan's $/month on that tier is their product.
    from bench.cost import price_per_gpu_hour, tco_breakdown
    from bench.plan import plan_capacity

    wb = load_workbook(path)
    for name in ("UsdPerKwh", "FacilityPUE", "DemandRps"):
        sheet, ref = wb.defined_names[name].attr_text.split("!")
        cell = wb[sheet.strip("'")][ref.replace("$", "")]
        cell.value = cell.value * 2
    wb.save(path)
    powered = _recalculated(path, tmp_path / "powered")
    power = tco_breakdown(report.catalogue.tier("B200-SXM", "owned-tco")).power_usd_per_gpu_hr
    month_pow = {(r[0], r[2]): r[5] for r in _rows(powered["plan"]) if r[2] and r[3] is not None}
    owned = price_per_gpu_hour(report.catalogue.tier("B200-SXM", "owned-tco"), report.catalogue)
    twice = plan_capacity(
        report.comparisons, Demand(requests_per_s=6, peak_factor=1.5), report.catalogue
    )
    gpus = next(s.gpus for s in twice.systems if s.legend == b200)
    assert gpus > system.gpus
    assert month_pow[(b200, "owned-tco")] == pytest.approx(
        gpus * (owned + 3 * power) * HOURS_PER_MONTH
    )


@pytest.mark.slow
def test_xlsx_plan_ranges_recalculate_to_the_plans(tmp_path):
    """The workbook's range columns (GPUs, $/month, $/Mtok at each end of the capacity's range)
    recalculate in LibreOffice to bench.plan's own ranges, on sweeps whose capacities are
    interpolated (the demo's, in virtual time) and carry the simulator's error."""
    from bench.demo import DEMO_SLO, TARGETS, virtual_sweep
    from bench.plan import Demand

    db = str(tmp_path / "v.db")
    ids = [virtual_sweep(t, (4.0, 8.0, 12.0, 16.0, 24.0), 30.0, DEMO_SLO, db) for t in TARGETS]
    report = build_report(
        ids, db, None, load_catalogue(), 1.0, demand=Demand(requests_per_s=100, peak_factor=2)
    )
    systems = report.plan.systems
    assert all(s.capacity_kind == "interpolated" and None not in s.gpus_range for s in systems)
    book = _recalculated(write(report, "xlsx", tmp_path / "p.xlsx"), tmp_path / "calc")
    # the sizing rows (GPUs per replica is a number there; the tier rows have a tier's name)
    sized = {r[0]: r for r in _rows(book["plan"], 4) if isinstance(r[2], (int, float))}
    tiers = {(r[0], r[2]): r for r in _rows(book["plan"]) if r[2] and r[3] is not None}
    for system in systems:
        assert (sized[system.legend][9], sized[system.legend][10]) == system.gpus_range
        for tier in system.tiers:
            got = tiers[(system.legend, tier.tier)]
            assert (got[8], got[9]) == pytest.approx(tier.usd_per_month_range, rel=1e-9)
            assert (got[10], got[11]) == pytest.approx(tier.usd_per_mtok_range, rel=1e-9)
    dispose_all()


def test_report_carries_capacity_confidence_caveats_and_the_plan(demo_db):
    from bench.plan import Demand, plan_capacity

    db, runs, _ = demo_db
    demand = Demand(requests_per_s=30, peak_factor=2)
    report = build_report(runs, db, None, load_catalogue(), 1.0, demand=demand)
    comps = compare_runs(run_curves(runs, db), parse_thresholds(SLO), load_catalogue())
    want = plan_capacity(comps, demand, load_catalogue(), slo_source="stored with the runs")
    assert [s.gpus for s in report.plan.systems] == [s.gpus for s in want.systems]
    assert report.plan.sentence == want.sentence and report.plan.slo_source == want.slo_source
    # Both runs met the SLO everywhere: said as a bound in the caveats and the summary.
    assert sum("lower bound" in c for c in report.caveats) == 2
    row = next(r for r in report.summary.rows if r[0] == "Capacity")
    assert [cell_text for cell_text in row[1:]] == [c.at_slo.text() for c in comps]
    # The raw sheet has each percentile's sample count and 95% interval.
    table = report.load_points
    n_col = table.headers.index("TTFT samples")
    lo_col = table.headers.index("TTFT p99 95% low (ms)")
    hi_col = table.headers.index("TTFT p99 95% high (ms)")
    first = report.curves[0].points[0]
    row = table.rows[0]
    assert row[n_col].value == first.count("ttft") == 24
    assert (row[lo_col].value, row[hi_col].value) == first.ci("ttft", "p99")
    assert row[hi_col].value is None  # 24 requests cannot bound a P99 from above


def _evaluate(formula: str, wb) -> float:
    """A price formula's value: named inputs and inputs!$C$n cells substituted, then the
    arithmetic (+ - * / and parentheses only) evaluated."""
    import re

    expr = formula.lstrip("=")
    for name in sorted(wb.defined_names, key=len, reverse=True):
        if not re.search(rf"\b{name}\b", expr):
            continue
        sheet, ref = wb.defined_names[name].attr_text.split("!")
        value = wb[sheet.strip("'")][ref.replace("$", "")].value
        expr = re.sub(rf"\b{name}\b", repr(float(value)), expr)

    def cell(m):
        value = wb["inputs"][f"C{m.group(1)}"].value
        return f"({_evaluate(value, wb)})" if str(value).startswith("=") else repr(float(value))

    expr = re.sub(r"inputs!\$C\$(\d+)", cell, expr)
    assert re.fullmatch(r"[\d.e+\-*/() ]+", expr), expr
    return eval(expr)  # noqa: S307 - digits and arithmetic only (checked above)


def test_xlsx_prices_that_are_not_quoted_are_formulas_over_the_inputs(report, tmp_path):
    """Electricity and PUE drive the owned-TCO price the answer uses; a derived price
    follows its base tier: the workbook is the model, not a copy of its results."""
    from bench.cost import price_per_gpu_hour

    wb = load_workbook(write(report, "xlsx", tmp_path / "m.xlsx"))
    inputs = wb["inputs"]
    rows = {(r[0].value, r[1].value): r[2] for r in inputs.iter_rows() if r[2].value is not None}
    cat = report.catalogue
    owned = derived = 0
    for (gpu, name), cell in rows.items():
        try:
            tier = cat.tier(gpu, name)
        except Exception:  # noqa: BLE001 - the inputs sheet's other rows
            continue
        if tier.tco is not None:
            owned += 1
            assert "FacilityPUE" in cell.value and "UsdPerKwh" in cell.value
        if tier.derived is not None:
            derived += 1
            assert cell.value.startswith(f"={tier.derived.factor!r}*inputs!$C$")
        if tier.tco is not None or tier.derived is not None:
            # as exported, the formula gives the catalogue's price
            assert _evaluate(cell.value, wb) == pytest.approx(price_per_gpu_hour(tier, cat))
    assert owned and derived
    # doubling the electricity price and PUE moves the owned price by its power term
    b200 = rows[("B200-SXM", "owned-tco")]
    before = _evaluate(b200.value, wb)
    kwh = wb.defined_names["UsdPerKwh"].attr_text.split("!")[1].replace("$", "")
    pue = wb.defined_names["FacilityPUE"].attr_text.split("!")[1].replace("$", "")
    k0, p0 = inputs[kwh].value, inputs[pue].value
    inputs[kwh], inputs[pue] = k0 * 2, p0 * 2
    from bench.cost import tco_breakdown

    power = tco_breakdown(cat.tier("B200-SXM", "owned-tco")).power_usd_per_gpu_hr
    assert _evaluate(b200.value, wb) == pytest.approx(before + 3 * power)
