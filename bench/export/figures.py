"""Plotly figures of a Report's charts, for the HTML report and the PNG/SVG images.

They are the dashboard's own figures (dashboards.figures, issue 6), built from the same
RunCurves, so a chart in the report looks and reads like the one on the compare page. If
that module cannot be imported (a trimmed install), minimal figures are drawn from the
Report's Chart data instead, so the export still works.
"""

from __future__ import annotations

import plotly.graph_objects as go

from bench.export.report import Chart, Report

# dashboards.figures.compare_figures names -> Report chart keys
DASHBOARD_KEYS = {
    "interactivity": "tput_vs_interactivity",
    "cost_interactivity": "cost_vs_interactivity",
    "ttft": "tput_vs_p99_ttft",
    "tpot": "tput_vs_p99_tpot",
    "cost": "cost_per_tier",
}


def chart_figure(chart: Chart) -> go.Figure:
    """A plain plotly figure of one Report chart (the fallback)."""
    fig = go.Figure()
    for s in chart.series:
        if chart.kind == "bar":
            fig.add_trace(go.Bar(x=chart.categories, y=s.y, name=s.name, marker_color=s.colour))
        else:
            dash = "dash" if s.reference else ("dot" if s.simulated else "solid")
            fig.add_trace(
                go.Scatter(
                    x=s.x,
                    y=s.y,
                    name=s.name,
                    text=s.labels or None,
                    mode="lines" if s.reference else "lines+markers",
                    line={"color": s.colour, "dash": dash},
                )
            )
    fig.update_layout(
        title=chart.title,
        xaxis_title=chart.x_title,
        yaxis_title=chart.y_title,
        template="plotly_white",
        barmode="group",
        height=420,
    )
    return fig


def for_export(fig: go.Figure, height: int = 720) -> go.Figure:
    """A copy laid out for a report: legend above the plot, so rotated tier names and axis
    titles below it never collide with it, and the SIMULATED badge in the top corner."""
    top, bottom = 120, 80
    fig = go.Figure(fig)
    fig.update_layout(
        height=height,
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0, "xanchor": "left"},
        margin={"t": top, "b": bottom},
        title={"y": 1 - 12 / height, "yanchor": "top"},
    )
    # The badge sits in paper coordinates: put it level with the title, above the legend.
    badge_y = 1 + (top - 12) / (height - top - bottom)
    fig.update_annotations(selector={"text": "SIMULATED"}, y=badge_y, yanchor="top")
    return fig


def report_figures(report: Report, height: int = 720) -> dict[str, go.Figure]:
    """Chart key -> figure, in the Report's chart order."""
    try:
        from dashboards.figures import compare_figures
    except ImportError:
        return {c.key: chart_figure(c) for c in report.charts}
    from bench.frontier import default_interactivity

    tpot = [t.limit for t in report.slo if t.metric == "p99_tpot_ms" and t.op in ("<", "<=")]
    figs = compare_figures(
        report.curves,
        report.catalogue,
        slo=report.slo,
        utilisation=report.utilisation,
        interactivity=default_interactivity(report.curves, min(tpot, default=None)),
        comparisons=report.comparisons,
    )
    out = {}
    for chart in report.charts:
        name = next((k for k, v in DASHBOARD_KEYS.items() if v == chart.key), None)
        out[chart.key] = for_export(figs[name], height) if name in figs else chart_figure(chart)
    return out
