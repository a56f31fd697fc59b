"""Plotly figure builders shared by the dashboard (server/) and the exports (bench/export).

One function per chart. Every number comes from bench.curves (or, for per-request charts,
from dashboards.data, which calls bench.metrics), so a chart on a slide is the chart on the
dashboard. The conventions every figure keeps, so a reader never has to relearn them:

- a run is drawn in its GPU's colour (RunCurve.colour: B200 green, H100 blue); two runs on
  the same GPU differ by marker symbol;
- simulated runs have a dotted line, "(simulated)" in their legend entry and a SIMULATED
  badge in the figure's corner;
- every axis title carries its unit;
- each trace's `meta` holds the run id, so tests and scripts can tell which run a trace
  shows.

These signatures are a contract with bench/export: add keyword arguments with defaults,
never change or remove existing ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bench.curves import CurvePoint, RunCurve, compare_runs

SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "star", "cross", "hexagon")
SIMULATED_DASH = "dot"
HEIGHT = 420

AXIS_TPS_PER_GPU = "Output throughput per GPU (tokens/s/GPU)"
AXIS_INTERACTIVITY = "Interactivity (tokens/s/user = 1000 / median TPOT ms)"
AXIS_TIME = "Time (s; load points back to back, each from its own start)"
AXIS_CDF = "Fraction of requests (cumulative)"
LATENCY_NAMES = {
    "ttft": "TTFT",
    "tpot": "TPOT",
    "itl": "ITL",
    "e2el": "E2E latency",
}


# ---------------------------------------------------------------- shared styling


def _symbols(curves: Sequence[RunCurve]) -> list[str]:
    """A marker symbol per run: runs that share a colour (same GPU) get different ones."""
    seen: dict[str, int] = {}
    out = []
    for c in curves:
        n = seen.get(c.colour, 0)
        seen[c.colour] = n + 1
        out.append(SYMBOLS[n % len(SYMBOLS)])
    return out


def _layout(fig: go.Figure, title: str, x_title: str, y_title: str, simulated: bool) -> go.Figure:
    fig.update_layout(
        title={"text": title, "x": 0.01, "xanchor": "left"},
        template="plotly_white",
        height=HEIGHT,
        margin={"l": 70, "r": 20, "t": 60, "b": 60},
        legend={"orientation": "h", "yanchor": "top", "y": -0.18, "x": 0},
        hovermode="closest",
    )
    fig.update_xaxes(title_text=x_title, rangemode="tozero", zeroline=False)
    fig.update_yaxes(title_text=y_title, rangemode="tozero", zeroline=False)
    if simulated:
        add_simulated_badge(fig)
    return fig


def add_simulated_badge(fig: go.Figure) -> go.Figure:
    """The SIMULATED badge in the top-right corner: simulated results are always labelled."""
    fig.add_annotation(
        text="SIMULATED",
        xref="paper",
        yref="paper",
        x=1.0,
        y=1.0,
        xanchor="right",
        yanchor="bottom",
        showarrow=False,
        font={"size": 12, "color": "#8a5a00"},
        bgcolor="#fff3cd",
        bordercolor="#d39e00",
        borderwidth=1,
        borderpad=3,
    )
    return fig


def _hover(curve: RunCurve, p: CurvePoint) -> str:
    """One load point in a tooltip: what was offered and what came back."""
    ttft, tpot = p.latency("ttft"), p.latency("tpot")
    return (
        f"<b>{curve.legend}</b><br>{p.title}<br>"
        f"{p.output_tps_per_gpu:,.0f} output tok/s/GPU · {p.requests_per_s:.2f} req/s<br>"
        f"P99 TTFT {_ms(ttft)} · P99 TPOT {_ms(tpot)}<br>"
        f"failed {p.failed} of {p.completed + p.failed}"
    )


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v:,.1f} ms"


def _line_trace(curve: RunCurve, symbol: str, pts, xs, ys) -> go.Scatter:
    return go.Scatter(
        x=xs,
        y=ys,
        mode="lines+markers",
        name=curve.legend,
        meta=curve.run_id,
        line={
            "color": curve.colour,
            "width": 2,
            "dash": SIMULATED_DASH if curve.simulated else None,
        },
        marker={"color": curve.colour, "symbol": symbol, "size": 9},
        text=[_hover(curve, p) for p in pts],
        hovertemplate="%{text}<extra></extra>",
    )


# ---------------------------------------------------------------- curves of many runs


def throughput_vs_latency(
    curves: Sequence[RunCurve], metric: str = "ttft", stat: str = "p99"
) -> go.Figure:
    """Output tokens/s per GPU against a latency percentile, one line per run.

    x = latency (ms), y = throughput per GPU: up and to the left is better. Points follow
    the run's load points in order of throughput (bench.curves.run_curve sorts them).
    """
    fig = go.Figure()
    for curve, symbol in zip(curves, _symbols(curves), strict=True):
        pts = [p for p in curve.points if p.latency(metric, stat) is not None]
        xs = [p.latency(metric, stat) for p in pts]
        ys = [p.output_tps_per_gpu for p in pts]
        fig.add_trace(_line_trace(curve, symbol, pts, xs, ys))
    name = LATENCY_NAMES.get(metric, metric.upper())
    label = f"{stat.upper()} {name}"
    return _layout(
        fig,
        f"Throughput per GPU vs {label}",
        f"{label} (ms)",
        AXIS_TPS_PER_GPU,
        any(c.simulated for c in curves),
    )


def throughput_vs_ttft(curves: Sequence[RunCurve]) -> go.Figure:
    """Output tokens/s per GPU against P99 TTFT (ms): how long users wait for a first token."""
    return throughput_vs_latency(curves, "ttft", "p99")


def throughput_vs_tpot(curves: Sequence[RunCurve]) -> go.Figure:
    """Output tokens/s per GPU against P99 TPOT (ms): how fast tokens stream once started."""
    return throughput_vs_latency(curves, "tpot", "p99")


def throughput_vs_interactivity(curves: Sequence[RunCurve]) -> go.Figure:
    """Output tokens/s per GPU against interactivity (tokens/s/user), InferenceMAX's chart.

    Right is a snappier experience per user, up is more tokens per GPU: the frontier shows
    what each GPU trades between the two.
    """
    fig = go.Figure()
    for curve, symbol in zip(curves, _symbols(curves), strict=True):
        pts = [p for p in curve.points if p.interactivity is not None]
        xs = [p.interactivity for p in pts]
        ys = [p.output_tps_per_gpu for p in pts]
        fig.add_trace(_line_trace(curve, symbol, pts, xs, ys))
    return _layout(
        fig,
        "Throughput per GPU vs interactivity",
        AXIS_INTERACTIVITY,
        AXIS_TPS_PER_GPU,
        any(c.simulated for c in curves),
    )


def cost_per_tier(
    curves: Sequence[RunCurve],
    catalogue,
    *,
    slo: Sequence = (),
    utilisation: float = 1.0,
    tokens: str = "output",
) -> go.Figure:
    """$ per million tokens on every pricing tier, bars grouped by tier, one colour per run.

    Each run is priced at the point bench.curves.compare_runs picks: its capacity at the
    SLO when one is given, else its peak throughput. `tokens` is "output" or "total".
    `catalogue` is a bench.cost.Catalogue; `slo` a list of bench.metrics.Threshold.
    """
    comparisons = compare_runs(curves, slo, catalogue, utilisation)
    tiers: list[str] = []
    for comp in comparisons:
        for row in comp.cost_rows:
            if row.tier not in tiers:
                tiers.append(row.tier)
    fig = go.Figure()
    for comp in comparisons:
        by_tier = {row.tier: row for row in comp.cost_rows}
        ys, texts = [], []
        for tier in tiers:
            row = by_tier.get(tier)
            value = None
            if row is not None:
                value = (
                    row.output_usd_per_mtok_at_utilisation
                    if tokens == "output"
                    else row.total_usd_per_mtok_at_utilisation
                )
            ys.append(value)
            texts.append(
                "no price"
                if row is None or value is None
                else f"${value:,.3f}/Mtok at ${row.price_usd_per_gpu_hr:,.2f}/GPU-h"
            )
        point = comp.capacity
        where = f"{comp.basis}: {point.title}" if point else f"{comp.basis}: none"
        curve = comp.curve
        fig.add_trace(
            go.Bar(
                y=tiers,
                x=ys,
                orientation="h",
                name=f"{curve.legend} ({where})",
                meta=curve.run_id,
                marker={
                    "color": curve.colour,
                    "pattern": {"shape": "/" if curve.simulated else ""},
                },
                text=[f"${v:,.3f}" if v is not None else "no price" for v in ys],
                textposition="outside",
                cliponaxis=False,
                hovertext=texts,
                hovertemplate="%{y}<br>%{hovertext}<extra>" + curve.legend + "</extra>",
            )
        )
    util = "" if utilisation >= 1 else f", at {utilisation:.0%} utilisation"
    fig = _layout(
        fig,
        f"$ per million {tokens} tokens by pricing tier{util}",
        f"USD per million {tokens} tokens ($/Mtok)",
        "Pricing tier",
        any(c.simulated for c in curves),
    )
    bars = max(1, len(tiers)) * max(1, len(comparisons))
    fig.update_layout(barmode="group", height=max(HEIGHT, 140 + 14 * bars), bargap=0.25)
    fig.update_yaxes(type="category", autorange="reversed", rangemode="normal", title_text="")
    fig.update_xaxes(title_text=f"USD per million {tokens} tokens ($/Mtok)")
    return fig


# ---------------------------------------------------------------- one run's detail


def run_time_series(
    curve: RunCurve,
    series: Mapping[str, Sequence],
    *,
    load_points: Sequence[tuple[float, float, str]] = (),
) -> go.Figure:
    """Offered and achieved requests/s and P99 TTFT per second, so a burst's effect shows.

    `series` is bench.metrics.time_series's output (t_s, offered_rps, achieved_rps,
    p99_ttft_ms); `load_points` optional (start s, end s, title) spans shaded behind.
    """
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        subplot_titles=("Requests per second", "P99 TTFT per second (by first-token time)"),
    )
    t = list(series.get("t_s", []))
    fig.add_trace(
        go.Scatter(
            x=t,
            y=list(series.get("offered_rps", [])),
            name="offered (scheduled) req/s",
            meta=curve.run_id,
            mode="lines",
            line={"color": "#7f7f7f", "width": 1.5, "shape": "hv"},
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            x=t,
            y=list(series.get("achieved_rps", [])),
            name="achieved (completed) req/s",
            meta=curve.run_id,
            mode="lines",
            line={"color": curve.colour, "width": 2, "shape": "hv"},
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            x=t,
            y=list(series.get("p99_ttft_ms", [])),
            name="P99 TTFT per second",
            meta=curve.run_id,
            mode="lines+markers",
            connectgaps=False,
            line={"color": curve.colour, "width": 1.5},
            marker={"size": 4},
        ),
        row=2,
        col=1,
    )
    shade_load_points(fig, load_points)
    fig = _layout(fig, f"Load over time: {curve.legend}", "", "", curve.simulated)
    fig.update_layout(height=HEIGHT + 140)
    fig.update_xaxes(title_text=AXIS_TIME, row=2, col=1)
    fig.update_xaxes(title_text="", row=1, col=1)
    fig.update_yaxes(title_text="Requests/s (req/s)", row=1, col=1)
    fig.update_yaxes(title_text="P99 TTFT (ms)", row=2, col=1)
    return fig


def latency_cdfs(
    curve: RunCurve,
    cdfs: Mapping[int, Mapping[str, tuple[Sequence[float], Sequence[float]]]],
    metric: str = "ttft",
) -> go.Figure:
    """Cumulative distribution of one latency metric, one line per load point.

    `cdfs` is dashboards.data.latency_cdfs's output: load point -> metric -> (values in
    ms, cumulative fractions). Lighter lines are lower loads.
    """
    fig = go.Figure()
    titles = {p.load_point: p.title for p in curve.points}
    points = sorted(cdfs)
    for i, lp in enumerate(points):
        xs, ys = cdfs[lp].get(metric, ([], []))
        shade = 0.35 + 0.65 * (i + 1) / max(1, len(points))
        fig.add_trace(
            go.Scatter(
                x=list(xs),
                y=list(ys),
                mode="lines",
                name=titles.get(lp, f"point {lp + 1}"),
                meta=curve.run_id,
                opacity=shade,
                line={
                    "color": curve.colour,
                    "width": 2,
                    "dash": SIMULATED_DASH if curve.simulated else None,
                },
                hovertemplate="%{x:,.1f} ms: %{y:.1%} of requests<extra>%{fullData.name}</extra>",
            )
        )
    name = LATENCY_NAMES.get(metric, metric.upper())
    fig = _layout(
        fig, f"{name} distribution: {curve.legend}", f"{name} (ms)", AXIS_CDF, curve.simulated
    )
    fig.update_yaxes(range=[0, 1.01], tickformat=".0%")
    return fig


def errors_by_kind(curve: RunCurve, errors: Mapping[int, Mapping[str, int]]) -> go.Figure:
    """Failed and cancelled requests per load point, stacked by error kind.

    `errors` is load point -> error kind -> count (dashboards.data.errors_by_point, the
    Summary.errors of each point). An empty chart says "no errors" in words.
    """
    titles = {p.load_point: p.title for p in curve.points}
    points = sorted(errors)
    kinds = sorted({k for counts in errors.values() for k in counts})
    fig = go.Figure()
    palette = ("#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")
    x = [titles.get(lp, f"point {lp + 1}") for lp in points]
    for i, kind in enumerate(kinds):
        fig.add_trace(
            go.Bar(
                x=x,
                y=[errors[lp].get(kind, 0) for lp in points],
                name=kind,
                meta=curve.run_id,
                marker={"color": palette[i % len(palette)]},
            )
        )
    fig = _layout(
        fig, f"Errors by kind: {curve.legend}", "Load point", "Requests (count)", curve.simulated
    )
    fig.update_layout(barmode="stack")
    fig.update_xaxes(type="category", rangemode="normal")
    if not kinds:
        fig.add_annotation(
            text="no failed or cancelled requests",
            xref="paper",
            yref="paper",
            x=0.5,
            y=0.5,
            showarrow=False,
            font={"size": 14, "color": "#555"},
        )
    return fig


def compare_figures(
    curves: Sequence[RunCurve],
    catalogue,
    *,
    slo: Sequence = (),
    utilisation: float = 1.0,
) -> dict[str, go.Figure]:
    """Every chart of the compare page by name, in page order (the HTML export reuses it)."""
    return {
        "ttft": throughput_vs_ttft(curves),
        "tpot": throughput_vs_tpot(curves),
        "interactivity": throughput_vs_interactivity(curves),
        "cost": cost_per_tier(curves, catalogue, slo=slo, utilisation=utilisation),
    }


def shade_load_points(fig: go.Figure, spans) -> None:
    """Alternate light bands with a title for each load point laid on one time axis."""
    for i, (start, end, title) in enumerate(spans):
        fig.add_vrect(
            x0=start,
            x1=end,
            fillcolor="#000000",
            opacity=0.04 if i % 2 else 0.0,
            line_width=0,
            annotation_text=title,
            annotation_position="top left",
            annotation_font_size=10,
            row=1,
            col=1,
        )
