"""Dashboard figures and their data: every chart holds the curves' numbers, in GPU colours,
with units on the axes and a SIMULATED badge for simulated runs.

`store_sweep` writes a synthetic stored sweep in milliseconds; the server tests use it too.
"""

from __future__ import annotations

import numpy as np
import pytest

from bench.cost import load_catalogue
from bench.curves import run_curves
from bench.metrics import parse_thresholds
from bench.store.read import get_run
from dashboards import data, figures
from tests.helpers import store_sweep


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    db = f"sqlite:///{tmp_path_factory.mktemp('dash') / 'runs.db'}"
    b200 = store_sweep(db, gpu="B200-SXM", failures=2)
    h100 = store_sweep(db, gpu="H100-SXM", gpu_count=2, simulated=False, seed=1)
    return db, [b200, h100]


def _runs_traces(fig, ids):
    """The traces that draw the runs' load points (not SLO lines, stars or fronts)."""
    return [t for t in fig.data if t.meta in ids]


def test_latency_and_interactivity_charts_hold_the_curve_points(two_runs):
    db, ids = two_runs
    curves = run_curves(ids, db)
    for build, xs_of in (
        (figures.throughput_vs_ttft, lambda p: p.latency("ttft", "p99")),
        (figures.throughput_vs_tpot, lambda p: p.latency("tpot", "p99")),
        (figures.throughput_vs_interactivity, lambda p: p.interactivity),
    ):
        fig = build(curves)
        traces = _runs_traces(fig, ids)
        assert [t.meta for t in traces] == ids
        for trace, curve in zip(traces, curves, strict=True):
            assert list(trace.x) == pytest.approx([xs_of(p) for p in curve.points])
            assert list(trace.y) == pytest.approx([p.output_tps_per_gpu for p in curve.points])
            assert trace.marker.color == curve.colour
        assert (
            "(ms" in fig.layout.xaxis.title.text or "tokens/s/user" in fig.layout.xaxis.title.text
        )
        assert "tokens/s/GPU" in fig.layout.yaxis.title.text


def test_okabe_ito_colours_with_a_marker_and_dash_per_run(two_runs):
    db, ids = two_runs
    curves = run_curves(ids, db)
    fig = figures.throughput_vs_ttft(curves)
    assert fig.data[0].line.color == "#009E73"  # B200 bluish green (Okabe-Ito)
    assert fig.data[1].line.color == "#0072B2"  # H100 blue
    # Colour is never the only cue: marker and dash differ between the two runs.
    assert fig.data[0].marker.symbol != fig.data[1].marker.symbol
    assert fig.data[0].line.dash != fig.data[1].line.dash
    assert fig.data[0].name.endswith("(simulated)")
    assert not fig.data[1].name.endswith("(simulated)")
    assert any(a.text == "SIMULATED" for a in fig.layout.annotations)
    measured_only = figures.throughput_vs_ttft(curves[1:])
    assert not any(a.text == "SIMULATED" for a in measured_only.layout.annotations)


def test_slo_line_and_capacity_star_on_latency_charts(two_runs):
    from bench.curves import compare_runs

    db, ids = two_runs
    curves = run_curves(ids, db)
    slo = parse_thresholds("p99_ttft_ms<=150,p99_tpot_ms<=20", flag="slo")
    comps = compare_runs(curves, slo, load_catalogue())
    fig = figures.throughput_vs_ttft(curves, slo=slo, comparisons=comps)
    (line,) = [t for t in fig.data if t.meta == "slo"]
    assert list(line.x) == [150, 150] and line.line.dash == "dash" and "150" in line.name
    stars = {t.meta: t for t in fig.data if str(t.meta).startswith("capacity:")}
    for comp in comps:
        if comp.capacity is None:
            assert f"capacity:{comp.curve.run_id}" not in stars
            continue
        star = stars[f"capacity:{comp.curve.run_id}"]
        assert list(star.x) == pytest.approx([comp.capacity.latency("ttft")])
        assert list(star.y) == pytest.approx([comp.capacity.output_tps_per_gpu])
    assert stars, "at least one run has a capacity at this SLO"
    tpot = figures.throughput_vs_tpot(curves, slo=slo, comparisons=comps)
    assert [list(t.x) for t in tpot.data if t.meta == "slo"] == [[20, 20]]


def test_latency_axis_is_log_when_values_span_decades(two_runs):
    db, ids = two_runs
    curves = run_curves(ids, db)
    narrow = figures.throughput_vs_ttft(curves)
    assert narrow.layout.xaxis.type != "log"  # these TTFTs span under 20x
    far = parse_thresholds("p99_ttft_ms<=100000", flag="slo")
    wide = figures.throughput_vs_ttft(curves, slo=far)
    assert wide.layout.xaxis.type == "log" and "log scale" in wide.layout.xaxis.title.text


def test_interactivity_front_and_readout(two_runs):
    from bench.frontier import pareto_front, throughput_at_interactivity

    db, ids = two_runs
    curves = run_curves(ids, db)
    front = pareto_front(curves[0].points)
    # Synthetic sweeps trade speed per user for throughput: every point is on the front.
    assert [f.load_point for f in front] == sorted(
        (p.load_point for p in curves[0].points), key=lambda lp: -lp
    )
    xs = [f.interactivity for f in front]
    at = (xs[0] + xs[1]) / 2
    fig = figures.throughput_vs_interactivity(curves, at=at)
    fronts = {t.meta: t for t in fig.data if str(t.meta).startswith("front:")}
    assert list(fronts[f"front:{ids[0]}"].x) == pytest.approx(xs)
    value = throughput_at_interactivity(curves[0], at)
    expected = (front[0].output_tps_per_gpu + front[1].output_tps_per_gpu) / 2
    assert value == pytest.approx(expected)
    (mark,) = [t for t in fig.data if t.meta == f"readout:{ids[0]}"]
    assert list(mark.y) == pytest.approx([value])
    assert mark.name.startswith(f"{value:,.0f} tok/s/GPU at")  # the value, in the legend
    assert throughput_at_interactivity(curves[0], xs[-1] * 2) is None  # off the front


def test_pareto_front_drops_dominated_points():
    from bench.curves import CurvePoint
    from bench.frontier import pareto_front

    def point(i, tpot_ms, tps):
        return CurvePoint(i, f"p{i}", None, 1.0, tps, tps, tps, tps, 10, 0,
                          {"tpot_ms": {"p50": tpot_ms}})  # fmt: skip

    # p1 is slower per user AND lower in throughput than p2: not on the front.
    pts = [point(0, 10, 100), point(1, 20, 150), point(2, 15, 200), point(3, 40, 300)]
    assert [f.title for f in pareto_front(pts)] == ["p3", "p2", "p0"]


def test_cost_vs_interactivity_per_tier(two_runs):
    from bench.cost import dollars_per_mtok, price_per_gpu_hour
    from bench.frontier import pareto_front

    db, ids = two_runs
    curves = run_curves(ids, db)
    cat = load_catalogue()
    fig = figures.cost_vs_interactivity(curves, cat, tier="neocloud-on-demand")
    shown = [t for t in fig.data if t.visible is True]
    assert [t.meta for t in shown] == ids
    for trace, curve in zip(shown, curves, strict=True):
        price = price_per_gpu_hour(cat.tier(curve.gpu_type, "neocloud-on-demand"), cat)
        front = pareto_front(curve.points)
        by_lp = {p.load_point: p for p in curve.points}
        expected = [dollars_per_mtok(price, curve.gpu_count, by_lp[f.load_point].output_tps)
                    for f in front]  # fmt: skip
        assert list(trace.y) == pytest.approx(expected)
    menu = fig.layout.updatemenus[0]
    labels = [b.label for b in menu.buttons]
    assert "neocloud-on-demand" in labels and "spot" in labels
    spot = next(b for b in menu.buttons if b.label == "spot")
    # B200 has a spot tier, H100 does not: the title says so when that tier is picked.
    assert "no such tier for H100-SXM" in spot.args[1]["title.text"]


def test_cost_bars_use_compare_runs(two_runs):
    db, ids = two_runs
    curves = run_curves(ids, db)
    cat = load_catalogue()
    slo = parse_thresholds("p99_ttft_ms<=400", flag="slo")
    fig = figures.cost_per_tier(curves, cat, slo=slo)
    from bench.curves import compare_runs

    comps = compare_runs(curves, slo, cat)
    for trace, comp in zip(fig.data, comps, strict=True):
        by_tier = {r.tier: r.output_usd_per_mtok_at_utilisation for r in comp.cost_rows}
        for tier, value in zip(trace.y, trace.x, strict=True):
            assert value == by_tier.get(tier)
        assert trace.marker.color == comp.curve.colour
    assert "$/Mtok" in fig.layout.xaxis.title.text


def test_run_detail_figures(two_runs):
    db, ids = two_runs
    run = get_run(ids[0], db)
    curve = run_curves(ids[:1], db)[0]
    series, spans = data.run_time_series(run, db)
    assert len(spans) == 3 and spans[0][0] == 0 and spans[1][0] == pytest.approx(spans[0][1])
    assert sum(series["offered_rps"]) == pytest.approx(120)  # every request, once
    fig = figures.run_time_series(curve, series, load_points=spans)
    assert fig.layout.yaxis.title.text == "Requests/s (req/s)"
    assert fig.layout.yaxis2.title.text == "P99 TTFT (ms)"

    details = data.point_details(run, db)
    assert [d.load_point for d in details] == [0, 1, 2]
    assert details[0].errors == {"http_5xx": 2} and details[1].errors == {}
    xs, ys = details[2].cdfs["ttft"]
    assert xs == sorted(xs) and ys[-1] == pytest.approx(0.9999) and 0 < ys[0] < 0.05
    p99 = next(p for p in curve.points if p.load_point == 2).latency("ttft", "p99")
    assert xs[ys.index(0.99)] == pytest.approx(p99)  # the CDF and the curve agree
    cdf = figures.latency_cdfs(curve, {d.load_point: d.cdfs for d in details}, "ttft")
    assert len(cdf.data) == 3 and cdf.layout.xaxis.title.text == "TTFT (ms)"  # < 20x: linear
    wide = {0: {"ttft": ([10.0, 100.0, 5000.0], [0.1, 0.5, 1.0])}}
    assert figures.latency_cdfs(curve, wide, "ttft").layout.xaxis.type == "log"
    errs = figures.errors_by_kind(curve, {d.load_point: d.errors for d in details})
    assert [t.name for t in errs.data] == ["http_5xx"] and list(errs.data[0].y) == [2, 0, 0]


def test_vendored_plotly_bundle_matches_the_python_package():
    """The dashboard's plotly.js must be the version the figures are built for."""
    import re

    import plotly.offline

    from server.pages import PLOTLY_JS

    head = PLOTLY_JS.read_text()[:400]
    version = re.search(r"plotly\.js \(basic - minified\) v([\d.]+)", head).group(1)
    assert version == plotly.offline.get_plotlyjs_version()


# Machado, Oliveira & Fernandes (2009), severity 1.0: linear-sRGB matrices of full
# deuteranopia and protanopia.
DEUTERANOPIA = ((0.367322, 0.860646, -0.227968), (0.280085, 0.672501, 0.047413),
                (-0.011820, 0.042940, 0.968881))  # fmt: skip
PROTANOPIA = ((0.152286, 1.052583, -0.204868), (0.114503, 0.786281, 0.099216),
              (-0.003882, -0.048116, 1.051998))  # fmt: skip


def _seen_lab(hex_colour: str, deficiency) -> np.ndarray:
    """CIELAB of a colour as a person with `deficiency` sees it."""
    c = np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)]) / 255
    linear = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    linear = np.clip(np.array(deficiency) @ linear, 0, 1)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722],
                    [0.0193, 0.1192, 0.9505]]) @ linear  # fmt: skip
    t = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(t > (6 / 29) ** 3, np.cbrt(t), t / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


@pytest.mark.parametrize("deficiency", [DEUTERANOPIA, PROTANOPIA], ids=["deutan", "protan"])
def test_gpu_colours_stay_apart_for_colour_blind_readers(deficiency):
    """The GPUs compared most often differ by more than 30 CIELAB units as a deuteranope or
    a protanope sees them (the old palette had B200/MI300X at 7 and H100/H200 at 8), and no
    two GPUs fall under 15 (seven GPUs from the eight Okabe-Ito colours allow no more; the
    marker and dash per run carry the rest)."""
    from itertools import combinations

    from bench.curves import GPU_COLOURS

    def distance(a: str, b: str) -> float:
        seen = [_seen_lab(GPU_COLOURS[g], deficiency) for g in (a, b)]
        return float(np.linalg.norm(seen[0] - seen[1]))

    for a, b in (("B200-SXM", "MI300X"), ("H100-SXM", "H200-SXM"), ("B200-SXM", "H100-SXM")):
        assert distance(a, b) > 30, (a, b, round(distance(a, b), 1))
    for a, b in combinations(GPU_COLOURS, 2):
        assert distance(a, b) > 15, (a, b, round(distance(a, b), 1))
