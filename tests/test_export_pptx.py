"""Export: the PowerPoint deck, read back with python-pptx and checked against bench.curves.

Charts must be native PowerPoint charts whose series hold the curves' numbers; tables must
hold the Report's cells and stay on their slide; every price's source and date must be on an
assumptions slide. Rendering to PNG (LibreOffice) and PNG/SVG images (kaleido + Chromium)
run only where those programs are installed, and say so loudly when skipped.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import typer
from pptx import Presentation
from pptx.enum.chart import XL_CHART_TYPE
from pptx.util import Emu
from typer.testing import CliRunner

from bench.cli.export import export_command
from bench.cost import load_catalogue
from bench.curves import latency_curve
from bench.export.pptx import SLIDE_H, SLIDE_W, fit_pt, wrapped_lines, write_pptx
from bench.export.report import build_report
from tests.test_export_report import demo_db  # noqa: F401 - the shared fixture

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def deck(demo_db, tmp_path_factory):  # noqa: F811
    db, runs, _ = demo_db
    report = build_report(runs, db, None, load_catalogue(), 1.0)
    path = write_pptx(report, tmp_path_factory.mktemp("deck") / "deck.pptx")
    return report, Presentation(str(path)), path


def _texts(slide) -> str:
    out = []
    for shape in slide.shapes:
        if shape.has_text_frame:
            out.append(shape.text_frame.text)
        if shape.has_table:
            out += [c.text for row in shape.table.rows for c in row.cells]
    return "\n".join(out)


def _title(slide) -> str:
    return next(s.text_frame.text for s in slide.shapes if s.has_text_frame and s.text_frame.text)


def _charts(prs):
    return [s.chart for slide in prs.slides for s in slide.shapes if s.has_chart]


def test_deck_is_16_9_with_the_slides_asked_for(deck):
    report, prs, _ = deck
    assert (prs.slide_width, prs.slide_height) == (
        Emu(int(SLIDE_W * 914400)),
        Emu(int(SLIDE_H * 914400)),
    )
    titles = [_title(s) for s in list(prs.slides)[1:]]
    assert titles[0].startswith("The answer") and titles[1] == "Executive summary"
    for wanted in ("Throughput per GPU vs P99 TTFT", "Throughput per GPU vs P99 TPOT",
                   "Throughput per GPU vs interactivity", "$/Mtok output vs interactivity",
                   "Assumptions", "Assumptions: prices, sources and dates",
                   "Methodology: metric definitions", "Caveats", "Appendix",
                   "Appendix: latency percentiles per load point"):  # fmt: skip
        assert any(t.startswith(wanted) for t in titles), (wanted, titles)
    assert any(t.startswith("$/Mtok of output tokens per pricing tier") for t in titles)
    # simulated is said on every slide (footer) and in the legends
    assert all("SIMULATED" in _texts(s) for s in prs.slides)


def test_titles_sit_in_title_placeholders_and_charts_have_alt_text(deck):
    report, prs, _ = deck
    for slide in prs.slides:
        assert slide.shapes.title is not None and slide.shapes.title.text_frame.text
        assert slide.shapes.title.text_frame.text == _title(slide)
    frames = [s for slide in prs.slides for s in slide.shapes if s.has_chart]
    assert len(frames) == len(report.charts)
    for frame, chart in zip(frames, report.charts, strict=True):
        descr = frame._element.nvGraphicFramePr.cNvPr.get("descr")
        assert descr == chart.alt_text and len(descr) > 60


def _plotted(series) -> list:
    """A scatter series' y values without the blanks that pad it to the chart's longest
    series (pptx._same_point_count)."""
    values = list(series.values)
    while values and values[-1] is None:
        values.pop()
    return values


def test_scatter_series_share_one_point_count_so_libreoffice_draws_them_all(deck):
    """LibreOffice drops a scatter series shorter than one after it; every series is padded to
    the chart's largest count with blanks, and its real points are all there."""
    from pptx.oxml.ns import qn

    _, prs, _ = deck
    for chart in _charts(prs):
        if not chart.chart_type.name.startswith("XY_SCATTER"):
            continue
        counts = {int(n.get("val")) for n in chart._chartSpace.iter(qn("c:ptCount"))
                  if n.getparent().tag == qn("c:numCache")}  # fmt: skip
        assert len(counts) == 1, chart.chart_title.text_frame.text
        longest = max(len(s._element.xpath("./c:yVal//c:pt")) for s in chart.plots[0].series)
        assert counts == {longest}


def test_charts_are_native_and_hold_the_curves(deck):
    from bench.frontier import pareto_front

    report, prs, _ = deck
    charts = _charts(prs)
    xy = [c for c in charts if c.chart_type.name.startswith("XY_SCATTER")]
    assert len(xy) == 4
    assert [c.chart_type for c in charts].count(XL_CHART_TYPE.COLUMN_CLUSTERED) == 1
    inter, cost_inter, ttft, tpot = xy
    for chart, metric in ((ttft, "ttft"), (tpot, "tpot")):
        series = list(chart.plots[0].series)
        for curve, s in zip(report.curves, series, strict=False):
            tps, latency = latency_curve(curve, metric, "p99")
            assert s.name == curve.legend and "(simulated)" in s.name
            assert _plotted(s) == pytest.approx(tps)  # y: throughput per GPU
            xs = [float(v.text) for v in s._element.xpath("./c:xVal//c:v")]
            assert xs == pytest.approx(latency)  # x: P99 latency, ms
        names = [s.name for s in series]
        limit = next(t for t in report.slo if t.metric == f"p99_{metric}_ms")
        assert f"SLO {limit}" in names  # the SLO line
        for comp in report.comparisons:  # and each capacity at the SLO, as a marker
            s = series[names.index(f"Capacity at the SLO: {comp.curve.legend}")]
            assert _plotted(s) == pytest.approx([comp.capacity.output_tps_per_gpu])
    for curve, s in zip(report.curves, inter.plots[0].series, strict=True):
        assert _plotted(s) == pytest.approx(
            [f.output_tps_per_gpu for f in pareto_front(curve.points)]
        )
    # Runs differ by marker and dash, not colour alone.
    first, second = list(ttft.plots[0].series)[:2]
    assert first.marker.style != second.marker.style
    assert first.format.line.dash_style != second.format.line.dash_style
    bars = charts[-1]
    cats = list(bars.plots[0].categories)
    assert cats == report.chart("cost_per_tier").categories
    for comp, s in zip(report.comparisons, bars.plots[0].series, strict=True):
        by_tier = {r.tier: r.output_usd_per_mtok_at_utilisation for r in comp.cost_rows}
        assert list(s.values) == pytest.approx([by_tier.get(t) for t in cats])


def test_log_axis_when_latencies_span_decades(demo_db, tmp_path):  # noqa: F811
    from bench.metrics import parse_slo

    db, runs, _ = demo_db
    # An SLO 1000x beyond the points makes the TTFT axis span decades.
    report = build_report(runs, db, parse_slo("p99_ttft_ms<=2000000", flag="slo"),
                          load_catalogue(), 1.0)  # fmt: skip
    assert report.chart("tput_vs_p99_ttft").log_x
    prs = Presentation(str(write_pptx(report, tmp_path / "log.pptx")))
    xml = [s.chart._chartSpace.xml for slide in prs.slides for s in slide.shapes if s.has_chart]
    assert sum("c:logBase" in x for x in xml) >= 1


def test_tables_hold_the_report_cells(deck):
    report, prs, _ = deck
    tables = [s.table for slide in prs.slides for s in slide.shapes if s.has_table]
    cells = [[c.text for c in row.cells] for t in tables for row in t.rows]
    for table in (report.summary, report.summary_cost, report.percentiles, report.prices):
        for row in table.text_rows():
            assert row in cells, (table.name, row)
    # the capacity figure, rounded as the slide shows it
    comp = report.comparisons[0]
    summary = next(s for s in prs.slides if _title(s) == "Executive summary")
    assert f"{comp.capacity.output_tps_per_gpu:,.0f}" in _texts(summary)


def test_answer_slide_sizes_the_fleet(demo_db, tmp_path):  # noqa: F811
    from bench.plan import Demand

    db, runs, _ = demo_db
    report = build_report(runs, db, None, load_catalogue(), 1.0,
                          demand=Demand(requests_per_s=3, peak_factor=1.5))  # fmt: skip
    prs = Presentation(str(write_pptx(report, tmp_path / "plan.pptx")))
    answer = list(prs.slides)[1]
    rec = report.plan.recommendation
    assert _title(answer) == f"The answer: {rec.gpus} x {rec.gpu_type} on {rec.tier.tier}"
    text = _texts(answer)
    assert rec.sentence in text and f"${rec.tier.usd_per_month:,.0f}" in text
    for system in report.plan.systems:
        assert system.legend in text and system.capacity_text in text
    caveats = "\n".join(_texts(s) for s in prs.slides if _title(s).startswith("Caveats"))
    assert "Simulated results" in caveats
    for line in report.caveats:
        assert line in caveats


def test_assumptions_list_every_price_with_source_and_date(deck):
    report, prs, _ = deck
    text = "\n".join(_texts(s) for s in prs.slides if _title(s).startswith("Assumptions"))
    catalogue = load_catalogue()
    for gpu in ("B200-SXM", "H100-SXM"):
        for tier in catalogue.tiers(gpu):
            assert tier.source in text and tier.date in text
    for needle in ("Fleet utilisation", "p99_ttft_ms<=2000", "simulated", "backend vllm",
                   "Electricity price", "Facility PUE"):  # fmt: skip
        assert needle in text
    # Sources read as sources: no internal tags or file names.
    for internal in ("[S", "gpus.yaml", "seed 0", "published.md", "README.md"):
        assert internal not in text, internal
    # B200 has a spot tier and H100 does not: the prices slide says tiers differ.
    assert report.tier_note and "spot (no price for H100-SXM)" in report.tier_note
    assert report.tier_note in text


def test_nothing_leaves_its_slide(deck):
    _, prs, _ = deck
    bottom = prs.slide_height
    for slide in prs.slides:
        for shape in slide.shapes:
            assert shape.left >= 0 and shape.left + shape.width <= prs.slide_width + 10
            assert shape.top + shape.height <= bottom + 10, (_title(slide), shape.name)
            if shape.has_text_frame and shape.text_frame.text:
                run = shape.text_frame.paragraphs[0].runs[0]
                pt = run.font.size.pt
                w, h = shape.width / 914400 - 0.1, shape.height / 914400 - 0.06
                text = shape.text_frame.text
                # fitted: the text is at the largest size that fits, or at the floor size
                assert pt == fit_pt(text, w, h, pt, min(pt, 9))
                if pt > 9:
                    assert wrapped_lines(text, w, pt) * pt * 1.22 / 72 <= h + 1e-6


@pytest.mark.slow
def test_long_tables_split_across_slides(demo_db, tmp_path):  # noqa: F811
    db, runs, _ = demo_db
    report = build_report(runs, db, None, load_catalogue(), 1.0)
    report.percentiles.rows = report.percentiles.rows * 12  # 72 rows
    prs = Presentation(str(write_pptx(report, tmp_path / "long.pptx")))
    titles = [_title(s) for s in prs.slides]
    pages = [t for t in titles if t.startswith("Appendix: latency percentiles per load point (")]
    assert len(pages) >= 3 and pages[0].endswith(f"(1/{len(pages)})")


def test_cli_writes_and_rejects_bad_input(demo_db, tmp_path):  # noqa: F811
    db, runs, _ = demo_db
    app = typer.Typer()
    app.command("export")(export_command)
    app.command("noop")(lambda: None)
    runner = CliRunner()
    out = tmp_path / "cli.pptx"
    res = runner.invoke(app, ["export", "--runs", ",".join(runs), "--out", str(out), "--db", db])
    assert res.exit_code == 0, res.output
    assert out.exists()
    for bad in (["--runs", "nope"], ["--runs", runs[0], "--slo", "p99_nope_ms<1"],
                ["--runs", runs[0], "--price", "B200-SXM:x=abc"], ["--runs", " , "]):  # fmt: skip
        res = runner.invoke(app, ["export", *bad, "--db", db, "--out", str(tmp_path / "x.pptx")])
        assert res.exit_code == 2, (bad, res.output)
        assert "Traceback" not in res.output


@pytest.mark.slow
@pytest.mark.skipif(
    not (shutil.which("soffice") and shutil.which("pdftoppm")),
    reason="LOUD SKIP: LibreOffice/poppler not installed (apt-get install -y libreoffice-impress "
    "poppler-utils fonts-crosextra-carlito) - the deck was not rendered",
)
def test_deck_renders_one_png_per_slide(deck, tmp_path):
    _, prs, path = deck
    res = subprocess.run(
        [str(ROOT / "bench/export/render_deck.sh"), str(path), str(tmp_path / "png"), "30"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.split()) == len(prs.slides)


@pytest.mark.slow
def test_images_png_and_svg(deck, tmp_path):
    from bench.export.images import find_browser, write_images

    if find_browser() is None:
        pytest.skip("LOUD SKIP: no Chromium for kaleido (apt-get install -y chromium) - no images")
    report, _, _ = deck
    pngs = write_images(report, tmp_path / "png", "png")
    svgs = write_images(report, tmp_path / "svg", "svg")
    assert [p.stem for p in pngs] == [c.key for c in report.charts]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert all("<svg" in p.read_text()[:500] for p in svgs)
