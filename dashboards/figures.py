"""Plotly figure builders shared by the dashboard (server/) and the exports (bench/export).

One function per chart. Every number comes from bench.curves (or, for per-request charts,
from dashboards.data, which calls bench.metrics), so a chart on a slide is the chart on the
dashboard. The conventions every figure keeps, so a reader never has to relearn them:

- a run is drawn in its GPU's colour (RunCurve.colour, the Okabe-Ito palette: B200 bluish
  green, H100 blue, H200 vermillion, MI300X orange), and colour is never the only
  cue: the i-th run of a chart also gets the i-th marker and dash (`run_styles`), so runs
  stay apart in greyscale and for a deuteranope;
- simulated runs carry "(simulated)" in their legend entry, hatched bars and a SIMULATED
  badge in the figure's corner;
- an SLO limit is a grey dashed line named after its threshold, and each run's capacity at
  the SLO a large star in the run's colour, on every latency-versus-load chart;
- a latency axis whose values (SLO limits included) span more than 20x is logarithmic;
- every axis title carries its unit;
- each trace's `meta` holds the run id (SLO lines "slo", capacity stars "capacity:<run>",
  fronts "front:<run>"), so tests and scripts can tell which run a trace shows.

These signatures are a contract with bench/export: add keyword arguments with defaults,
never change or remove existing ones.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bench.cost import cost_error_name
from bench.curves import CurvePoint, RunComparison, RunCurve, compare_runs
from bench.frontier import cost_view_tier, pareto_front, throughput_at_interactivity
from bench.metrics import LATENCY_LABELS, THIN_SAMPLES

SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "star-triangle-down", "cross",
           "hexagon")  # fmt: skip
DASHES = ("solid", "dash", "dashdot", "longdash", "dot", "longdashdot")
SLO_COLOUR = "#444444"
LOG_SPAN = 20.0  # a latency axis whose values span more than this factor is logarithmic
HEIGHT = 420

AXIS_TPS_PER_GPU = "Output tokens/s/GPU"
AXIS_INTERACTIVITY = "Interactivity (tokens/s/user = 1000 / median TPOT)"
AXIS_TIME = "Time (s; load points back to back, each from its own start)"
AXIS_CDF = "Fraction of requests (cumulative)"


# ---------------------------------------------------------------- shared styling


@dataclass(frozen=True)
class RunStyle:
    colour: str
    symbol: str
    dash: str


def run_styles(curves: Sequence[RunCurve]) -> list[RunStyle]:
    """Colour from the GPU, marker and dash from the run's place in the chart."""
    return [
        RunStyle(c.colour, SYMBOLS[i % len(SYMBOLS)], DASHES[i % len(DASHES)])
        for i, c in enumerate(curves)
    ]


def _layout(fig: go.Figure, title: str, x_title: str, y_title: str, simulated: bool) -> go.Figure:
    fig.update_layout(
        title={"text": title, "x": 0.01, "xanchor": "left"},
        template="plotly_white",
        height=HEIGHT,
        autosize=True,
        margin={"l": 70, "r": 20, "t": 60, "b": 60},
        legend={"orientation": "h", "yanchor": "top", "y": -0.18, "x": 0},
        hovermode="closest",
    )
    fig.update_xaxes(title_text=x_title, rangemode="tozero", zeroline=False, automargin=True)
    fig.update_yaxes(title_text=y_title, rangemode="tozero", zeroline=False, automargin=True)
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


THIN_SAMPLE = THIN_SAMPLES  # a P99 from fewer requests is the slowest few (bench.metrics)


def percentile_text(p: CurvePoint, metric: str, stat: str = "p99") -> str:
    """'158.1 ms (95% 140.2-171.0, n=40, thin)': a percentile with its interval and count."""
    value = p.latency(metric, stat)
    if value is None:
        return "—"
    parts = []
    ci = p.ci(metric, stat)
    if ci is not None:
        lo, hi = ci
        parts.append(f"95% {_num(lo)}-{_num(hi) if hi is not None else 'open'}")
    n = p.count(metric)
    if n is not None:
        parts.append(f"n={n:,}" + (", thin" if n < THIN_SAMPLE and stat == "p99" else ""))
    return f"{value:,.1f} ms" + (f" ({', '.join(parts)})" if parts else "")


def _num(v: float | None) -> str:
    return "?" if v is None else f"{v:,.1f}"


def _hover(curve: RunCurve, p: CurvePoint) -> str:
    """One load point in a tooltip: what was offered and what came back, with how sure."""
    flags = []
    if p.partial:
        flags.append("interrupted: partial point")
    if p.late_ms:
        flags.append(f"simulator ran up to {p.late_ms:,.0f} ms late")
    if p.error_bars and p.error_bars.get("near_saturation"):
        util = p.error_bars["utilisation"]
        load = "unbounded rate" if math.isinf(util) else f"{util:.0%} of the simulated maximum"
        flags.append(f"near saturation ({load})")
    if (e := curve.expected_error("p99_ttft_ms")) is not None:
        flags.append(f"simulated: ±{e:.0%} expected error ({curve.error_bars['basis']})")
    return (
        f"<b>{curve.legend}</b><br>{p.title}<br>"
        f"{p.output_tps_per_gpu:,.0f} output tok/s/GPU · {p.requests_per_s:.2f} req/s<br>"
        f"P99 TTFT {percentile_text(p, 'ttft')}<br>P99 TPOT {percentile_text(p, 'tpot')}<br>"
        f"failed {p.failed} of {p.completed + p.failed}" + "".join(f"<br><b>{f}</b>" for f in flags)
    )


def _line_trace(curve: RunCurve, style: RunStyle, pts, xs, ys, mode="lines+markers") -> go.Scatter:
    return go.Scatter(
        x=xs,
        y=ys,
        mode=mode,
        name=curve.legend,
        meta=curve.run_id,
        legendgroup=curve.run_id,
        line={"color": style.colour, "width": 2, "dash": style.dash},
        marker={"color": style.colour, "symbol": style.symbol, "size": 9},
        text=[_hover(curve, p) for p in pts],
        hovertemplate="%{text}<extra></extra>",
    )


def _error_bar(values: Sequence[float | None], error: float | None, style: RunStyle) -> dict | None:
    """A simulated curve's expected error as plotly error bars: value x/÷ (1 + e)
    (bench.sim.profiles.accuracy.bounds), thin, in the run's colour. A missing value (a
    bar for a tier the GPU lacks) gets no bar."""
    from bench.sim.profiles.accuracy import error_bar_widths

    if error is None:
        return None
    up, down = error_bar_widths(values, error)
    return {
        "type": "data",
        "symmetric": False,
        "array": up,
        "arrayminus": down,
        "color": style.colour,
        "thickness": 1,
        "width": 4,
    }


def _with_error_bars(
    trace: go.Scatter,
    curve: RunCurve,
    x_name: str,
    style: RunStyle,
    y_name: str = "output_tokens_per_s",
):
    """A simulated run's trace with its expected error on both axes (x: the figure `x_name`,
    y: the figure `y_name`, throughput by default); a measured run's trace as it is."""
    if curve.error_bars:
        trace.error_x = _error_bar(list(trace.x), curve.expected_error(x_name), style)
        trace.error_y = _error_bar(list(trace.y), curve.expected_error(y_name), style)
    return trace


def _span_is_wide(values: Sequence[float]) -> bool:
    positive = [v for v in values if v is not None and v > 0]
    return bool(positive) and max(positive) / min(positive) > LOG_SPAN


def _log_ticks(values: Sequence[float]) -> tuple[list[float], list[str]]:
    """1-2-5 ticks covering `values` on a log axis, labelled in plain numbers (plotly's own
    log ticks label the minor ones with a bare digit, which reads as a different number)."""
    positive = [v for v in values if v is not None and v > 0]
    lo, hi = min(positive), max(positive)
    ticks: list[float] = []
    exp = math.floor(math.log10(lo))
    while 10**exp <= hi * 10:
        for m in (1, 2, 5):
            v = m * 10.0**exp
            if lo / 2.5 <= v <= hi * 2.5:
                ticks.append(v)
        exp += 1
    return ticks, [f"{v:,.3g}" if v < 1 else f"{v:,.0f}" for v in ticks]


def _log_axis(update, values: Sequence[float], title: str) -> None:
    ticks, labels = _log_ticks(values)
    update(type="log", rangemode="normal", title_text=title, tickvals=ticks, ticktext=labels)


def _slo_limits(slo: Sequence, metric: str, stat: str) -> list:
    """The upper limits of `slo` on `stat` of `metric` (e.g. p99_ttft_ms<=500)."""
    return [t for t in slo if t.metric == f"{stat}_{metric}_ms" and t.op in ("<", "<=")]


def _slo_line(threshold, y_top: float, *, vertical: bool = True) -> go.Scatter:
    """An SLO limit as a dashed grey line from the axis to just above the highest point."""
    xs, ys = [threshold.limit, threshold.limit], [0.0, y_top]
    return go.Scatter(
        x=xs if vertical else ys,
        y=ys if vertical else xs,
        mode="lines",
        name=f"SLO {threshold}",
        meta="slo",
        line={"color": SLO_COLOUR, "width": 1.5, "dash": "dash"},
        hovertemplate=f"SLO {threshold}<extra></extra>",
    )


def _capacity_star(comp: RunComparison, style: RunStyle, x: float, first: bool) -> go.Scatter:
    """The run's capacity at the SLO (bench.curves.capacity_at_slo: interpolated between the
    last passing and first failing load), with its 95% interval as a vertical bar."""
    point, cap = comp.capacity, comp.at_slo
    value = point.output_tps_per_gpu
    what = cap.text() if cap is not None else f"{value:,.0f} output tok/s per GPU"
    error = None
    if cap is not None and (cap.low is not None or cap.high is not None):
        error = {
            "type": "data",
            "symmetric": False,
            "array": [max(0.0, (cap.high if cap.high is not None else value) - value)],
            "arrayminus": [max(0.0, value - (cap.low if cap.low is not None else value))],
            "color": style.colour,
            "thickness": 2,
            "width": 8,
        }
    return go.Scatter(
        x=[x],
        y=[value],
        mode="markers",
        name="capacity at the SLO (star, 95% interval)",
        showlegend=first,
        legendgroup="capacity",
        meta=f"capacity:{comp.curve.run_id}",
        error_y=error,
        marker={
            "symbol": "star",
            "size": 18,
            "color": style.colour,
            "line": {"color": "#000000", "width": 1.5},
        },
        hovertemplate=(
            f"<b>{comp.curve.legend}</b><br>capacity at the SLO: {what}<br>"
            f"{point.title}<extra></extra>"
        ),
    )


# ---------------------------------------------------------------- curves of many runs


def throughput_vs_latency(
    curves: Sequence[RunCurve],
    metric: str = "ttft",
    stat: str = "p99",
    *,
    slo: Sequence = (),
    comparisons: Sequence[RunComparison] | None = None,
) -> go.Figure:
    """Output tokens/s per GPU against a latency percentile, one line per run.

    x = latency (ms), y = throughput per GPU: up and to the left is better. Points follow
    the run's load points in order of throughput (bench.curves.run_curve sorts them). With
    `slo`, its limits on this percentile are drawn as lines; with `comparisons`
    (bench.curves.compare_runs, same order as `curves`), each capacity at the SLO is a star.
    """
    fig = go.Figure()
    styles = run_styles(curves)
    xs_all: list[float] = []
    y_top = 0.0
    for curve, style in zip(curves, styles, strict=True):
        pts = [p for p in curve.points if p.latency(metric, stat) is not None]
        xs = [p.latency(metric, stat) for p in pts]
        ys = [p.output_tps_per_gpu for p in pts]
        xs_all += xs
        y_top = max([y_top, *ys])
        trace = _with_error_bars(
            _line_trace(curve, style, pts, xs, ys), curve, f"{stat}_{metric}_ms", style
        )
        if trace.error_y.array is not None:
            y_top = max([y_top, *(y + up for y, up in zip(ys, trace.error_y.array, strict=True))])
        fig.add_trace(trace)
    limits = _slo_limits(slo, metric, stat)
    for t in limits:
        fig.add_trace(_slo_line(t, (y_top or 1.0) * 1.08))
    first = True
    for comp, style in zip(comparisons or (), styles, strict=False):
        x = comp.capacity.latency(metric, stat) if comp.capacity is not None else None
        if comp.basis == "SLO capacity" and x is not None:
            fig.add_trace(_capacity_star(comp, style, x, first))
            first = False
    name = LATENCY_LABELS.get(metric, metric.upper())
    label = f"{stat.upper()} {name}"
    fig = _layout(
        fig,
        f"Throughput per GPU vs {label}",
        f"{label} (ms)",
        AXIS_TPS_PER_GPU,
        any(c.simulated for c in curves),
    )
    if _span_is_wide(xs_all + [t.limit for t in limits]):
        _log_axis(fig.update_xaxes, xs_all + [t.limit for t in limits], f"{label} (ms, log scale)")
    return fig


def throughput_vs_ttft(curves: Sequence[RunCurve], **kw) -> go.Figure:
    """Output tokens/s per GPU against P99 TTFT (ms): how long users wait for a first token."""
    return throughput_vs_latency(curves, "ttft", "p99", **kw)


def throughput_vs_tpot(curves: Sequence[RunCurve], **kw) -> go.Figure:
    """Output tokens/s per GPU against P99 TPOT (ms): how fast tokens stream once started."""
    return throughput_vs_latency(curves, "tpot", "p99", **kw)


def _front_trace(curve: RunCurve, style: RunStyle, xs, ys, texts) -> go.Scatter:
    return go.Scatter(
        x=xs,
        y=ys,
        mode="lines",
        name=f"{curve.legend}: Pareto front",
        showlegend=False,
        legendgroup=curve.run_id,
        meta=f"front:{curve.run_id}",
        line={"color": style.colour, "width": 2.5, "dash": style.dash},
        text=texts,
        hovertemplate="%{text}<extra>Pareto front</extra>",
    )


def throughput_vs_interactivity(
    curves: Sequence[RunCurve], *, at: float | None = None
) -> go.Figure:
    """Output tokens/s per GPU against interactivity (tokens/s/user), InferenceX's chart.

    Right is a snappier experience per user, up is more tokens per GPU. Every load point is
    a marker; the line joins each run's Pareto front (bench.frontier). With `at`, the fronts
    are read at that interactivity: a dotted line there and each run's throughput on it.
    """
    fig = go.Figure()
    styles = run_styles(curves)
    for curve, style in zip(curves, styles, strict=True):
        pts = [p for p in curve.points if p.interactivity is not None]
        xs = [p.interactivity for p in pts]
        ys = [p.output_tps_per_gpu for p in pts]
        # interactivity is 1000 / median TPOT: x/÷ (1 + e) of TPOT is x/÷ (1 + e) of it
        trace = _line_trace(curve, style, pts, xs, ys, mode="markers")
        fig.add_trace(_with_error_bars(trace, curve, "p50_tpot_ms", style))
        front = pareto_front(curve.points)
        fig.add_trace(
            _front_trace(
                curve,
                style,
                [f.interactivity for f in front],
                [f.output_tps_per_gpu for f in front],
                [f"{curve.legend}<br>{f.title}" for f in front],
            )
        )
    if at is not None:
        _add_readout(fig, curves, styles, at)
    return _layout(
        fig,
        "Throughput per GPU vs interactivity",
        AXIS_INTERACTIVITY,
        AXIS_TPS_PER_GPU,
        any(c.simulated for c in curves),
    )


def interactivity_readout(
    curves: Sequence[RunCurve], at: float
) -> list[tuple[RunCurve, float | None]]:
    """Each run's throughput per GPU on its front at `at` tok/s per user (None: off its front)."""
    return [(c, throughput_at_interactivity(c, at)) for c in curves]


def _add_readout(fig: go.Figure, curves, styles, at: float) -> None:
    """A dotted line at `at` and an open circle where each run's front crosses it; the value
    is in the circle's legend entry (below the plot, so it never covers a curve)."""
    values = interactivity_readout(curves, at)
    top = max((p.output_tps_per_gpu for c in curves for p in c.points), default=1.0)
    fig.add_trace(
        go.Scatter(
            x=[at, at],
            y=[0.0, top * 1.08],
            mode="lines",
            name=f"read-out at {at:,.1f} tok/s/user",
            showlegend=False,
            meta="readout",
            line={"color": SLO_COLOUR, "width": 1.5, "dash": "dot"},
            hoverinfo="skip",
        )
    )
    for (curve, value), style in zip(values, styles, strict=True):
        text = (
            f"{value:,.0f} tok/s/GPU at {at:,.1f} tok/s/user"
            if value is not None
            else f"off its front at {at:,.1f} tok/s/user"
        )
        fig.add_trace(
            go.Scatter(
                x=[at] if value is not None else [],
                y=[value] if value is not None else [],
                mode="markers",
                name=text,
                legendgroup=curve.run_id,
                meta=f"readout:{curve.run_id}",
                marker={
                    "symbol": "circle-open",
                    "size": 14,
                    "color": style.colour,
                    "line": {"width": 2.5},
                },  # fmt: skip
                hovertemplate=f"<b>{curve.legend}</b><br>{text}<extra>read-out</extra>",
            )
        )


def _front_costs(curve: RunCurve, catalogue, tier: str, utilisation: float, tokens: str):
    """(interactivity, $/Mtok, title) along the run's front on one tier; [] without a price."""
    from bench.cost import (
        PriceCatalogueError,
        cost_at_utilisation,
        dollars_per_mtok,
        price_per_gpu_hour,
    )

    if not curve.gpu_type:
        return []
    try:
        price = price_per_gpu_hour(
            catalogue.tier(catalogue.resolve_gpu(curve.gpu_type), tier), catalogue
        )
    except (PriceCatalogueError, KeyError):
        return []
    by_point = {p.load_point: p for p in curve.points}
    out = []
    for f in pareto_front(curve.points):
        p = by_point[f.load_point]
        tps = p.output_tps if tokens == "output" else p.total_tps
        usd = cost_at_utilisation(dollars_per_mtok(price, curve.gpu_count, tps), utilisation)
        if usd is not None:
            out.append((f.interactivity, usd, f.title))
    return out


def run_tiers(curves: Sequence[RunCurve], catalogue) -> dict[str, list[str]]:
    """Tier names -> the legends of the runs whose GPU has that tier, in catalogue order."""
    from bench.cost import PriceCatalogueError

    tiers: dict[str, list[str]] = {}
    for curve in curves:
        if not curve.gpu_type:
            continue
        try:
            names = [t.name for t in catalogue.tiers(catalogue.resolve_gpu(curve.gpu_type))]
        except (PriceCatalogueError, KeyError):
            continue
        for name in names:
            tiers.setdefault(name, []).append(curve.legend)
    return tiers


def cost_vs_interactivity(
    curves: Sequence[RunCurve],
    catalogue,
    *,
    utilisation: float = 1.0,
    tokens: str = "output",
    tier: str | None = None,
    menu: bool = True,
) -> go.Figure:
    """$/Mtok against interactivity along each run's Pareto front, one pricing tier at a time.

    With `menu` every tier's traces are in the figure and a menu switches between them (the
    standalone HTML report); without, only the chosen tier's (the dashboard picks the tier
    with a form field: a quarter of the traces to draw).

    InferenceX's cost view: lower is cheaper, right is faster per user. A menu picks the
    tier; tiers some GPUs lack say so in the title. Starts on `tier`, else
    bench.frontier.cost_view_tier (the cheapest on-demand tier every GPU has). A simulated
    run's points carry its expected errors as on the throughput charts: x (1000 / TPOT p50)
    TPOT p50's, y ($/Mtok) its throughput's (`bench.cost.cost_error_name`).
    """
    tiers = run_tiers(curves, catalogue)
    priced = [c for c in curves if any(c.legend in who for who in tiers.values())]
    if tier not in tiers:
        tier = cost_view_tier(curves, catalogue)
    fig = go.Figure()
    styles = run_styles(curves)
    owners: list[str] = []  # the tier of each trace
    values: list[float] = []
    for name in tiers if menu else [tier] if tier else []:
        for curve, style in zip(curves, styles, strict=True):
            pts = _front_costs(curve, catalogue, name, utilisation, tokens)
            if not pts:
                continue
            values += [u for _, u, _ in pts]
            owners.append(name)
            trace = go.Scatter(
                x=[x for x, _, _ in pts],
                y=[u for _, u, _ in pts],
                mode="lines+markers",
                name=curve.legend,
                meta=curve.run_id,
                visible=name == tier,
                line={"color": style.colour, "width": 2, "dash": style.dash},
                marker={"color": style.colour, "symbol": style.symbol, "size": 9},
                text=[f"<b>{curve.legend}</b><br>{t}<br>{name}" for _, _, t in pts],
                hovertemplate="%{text}<br>$%{y:,.3f}/Mtok at %{x:,.1f} tok/s/user<extra></extra>",
            )
            # x: 1000 / TPOT p50 carries TPOT's error; y: $/Mtok its throughput's
            fig.add_trace(
                _with_error_bars(trace, curve, "p50_tpot_ms", style, cost_error_name(tokens))
            )
    util = "" if utilisation >= 1 else f", {utilisation:.0%} utilisation"

    def title(name: str | None) -> str:
        if name is None:
            return f"$ per million {tokens} tokens vs interactivity (no prices)"
        lacking = [c.legend for c in priced if c.legend not in tiers[name]]
        note = f" (no such tier for {', '.join(lacking)})" if lacking else ""
        return f"$/Mtok {tokens} vs interactivity: {name}{util}{note}"

    fig = _layout(
        fig,
        title(tier),
        AXIS_INTERACTIVITY,
        f"USD per million {tokens} tokens ($/Mtok)",
        any(c.simulated for c in curves),
    )
    if _span_is_wide(values):
        _log_axis(fig.update_yaxes, values, f"USD per million {tokens} tokens ($/Mtok, log scale)")
    if menu and len(tiers) > 1:
        buttons = [
            {
                "label": name,
                "method": "update",
                "args": [{"visible": [o == name for o in owners]}, {"title.text": title(name)}],
            }
            for name in tiers
        ]
        fig.update_layout(
            updatemenus=[
                {
                    "buttons": buttons,
                    "active": list(tiers).index(tier),
                    "direction": "down",
                    "x": 0.0,
                    "xanchor": "left",
                    "y": 1.0,
                    "yanchor": "bottom",
                    "pad": {"t": 0, "b": 4},
                    "font": {"size": 11},
                    "showactive": True,
                }
            ],
            margin={"t": 90},
            title={"y": 0.98, "yanchor": "top"},
        )
    return fig


def cost_per_tier(
    curves: Sequence[RunCurve],
    catalogue,
    *,
    slo: Sequence = (),
    utilisation: float = 1.0,
    tokens: str = "output",
    comparisons: Sequence[RunComparison] | None = None,
) -> go.Figure:
    """$ per million tokens on every pricing tier, bars grouped by tier, one colour per run.

    Each run is priced at the point bench.curves.compare_runs picks: its capacity at the
    SLO when one is given, else its peak throughput. `tokens` is "output" or "total". A
    simulated run's bars carry its throughput's expected error (bench.cost.cost_error_name
    says why that is the $/Mtok's), a measured run's none.
    `catalogue` is a bench.cost.Catalogue; `slo` a list of bench.metrics.Threshold.
    """
    if comparisons is None:
        comparisons = compare_runs(curves, slo, catalogue, utilisation)
    tiers: list[str] = []
    for comp in comparisons:
        for row in comp.cost_rows:
            if row.tier not in tiers:
                tiers.append(row.tier)
    fig = go.Figure()
    styles = run_styles([comp.curve for comp in comparisons])
    for comp, style in zip(comparisons, styles, strict=True):
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
                "no such tier for this GPU"
                if row is None or value is None
                else f"${value:,.3f}/Mtok at ${row.price_usd_per_gpu_hr:,.2f}/GPU-h"
            )
        point = comp.capacity
        where = f"{comp.basis}: {point.title}" if point else f"{comp.basis}: none"
        curve = comp.curve
        error = curve.expected_error(cost_error_name(tokens))
        if error is not None:  # a simulated run: its throughput's error (cost_error_name)
            where += f"<br>simulated: $/Mtok x/÷ {1 + error:.2f} (throughput ±{error:.0%})"
        texts = [f"{t}<br>{where}" for t in texts]
        fig.add_trace(
            go.Bar(
                y=tiers,
                x=ys,
                orientation="h",
                name=f"{curve.legend} (at capacity)" if point else f"{curve.legend} (no capacity)",
                meta=curve.run_id,
                error_x=_error_bar(ys, error, style),
                marker={
                    "color": curve.colour,
                    "line": {"color": "#000000", "width": 0.5},
                    "pattern": {"shape": "/" if curve.simulated else ""},
                },
                text=[f"${v:,.3f}" if v is not None else "no tier" for v in ys],
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
                },
                hovertemplate="%{x:,.1f} ms: %{y:.1%} of requests<extra>%{fullData.name}</extra>",
            )
        )
    name = LATENCY_LABELS.get(metric, metric.upper())
    fig = _layout(
        fig, f"{name} distribution: {curve.legend}", f"{name} (ms)", AXIS_CDF, curve.simulated
    )
    fig.update_yaxes(range=[0, 1.01], tickformat=".0%")
    values = [v for lp in points for v in cdfs[lp].get(metric, ([], []))[0]]
    if _span_is_wide(values):
        _log_axis(fig.update_xaxes, values, f"{name} (ms, log scale)")
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
    interactivity: float | None = None,
    tier: str | None = None,
    comparisons: Sequence[RunComparison] | None = None,
    tier_menu: bool = True,
) -> dict[str, go.Figure]:
    """Every chart of the compare page by name, in page order (the HTML export reuses it).

    `interactivity` is where the throughput-vs-interactivity fronts are read (None: no
    read-out); `tier` the pricing tier the cost-vs-interactivity chart opens on, with a
    menu of the others when `tier_menu`.
    """
    if comparisons is None:
        comparisons = compare_runs(curves, slo, catalogue, utilisation)
    figs = {
        "interactivity": throughput_vs_interactivity(curves, at=interactivity),
        "cost_interactivity": cost_vs_interactivity(
            curves, catalogue, utilisation=utilisation, tier=tier, menu=tier_menu
        ),
        "ttft": throughput_vs_ttft(curves, slo=slo, comparisons=comparisons),
        "tpot": throughput_vs_tpot(curves, slo=slo, comparisons=comparisons),
        "cost": cost_per_tier(
            curves, catalogue, slo=slo, utilisation=utilisation, comparisons=comparisons
        ),
    }
    for fig in figs.values():
        legend_room(fig)
    return figs


LEGEND_ROW_PX = 22  # one legend entry's row, at the page's font size


def legend_room(fig: go.Figure) -> go.Figure:
    """The legend below everything (axis titles included), with a row of room per entry:
    six runs' names, each with its GPU, model and '(simulated)', wrap one per row on a
    390 px screen, and a legend placed in the plot's own coordinates then covered the
    x-axis title. The figure grows by the legend's height, so the plot keeps its size."""
    entries = sum(1 for t in fig.data if t.showlegend is not False and t.name)
    room = LEGEND_ROW_PX * entries
    margin = fig.layout.margin
    fig.update_layout(
        legend={"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom", "x": 0},
        margin={"b": (margin.b or 60) + room},
        height=(fig.layout.height or HEIGHT) + room,
    )
    return fig


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
