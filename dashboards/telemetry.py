"""Server telemetry under client latency: why P99 TTFT jumped, on one time axis.

The top panel is the client's P99 TTFT per second (bench.metrics.time_series of the
records); under it the server's own view of the same seconds: requests waiting and
running, KV-cache use and, when GPU telemetry was recorded, board power per GPU. The
samples come from bench.telemetry, whose t_s is on the records' clock, so no alignment
is guessed. Conventions as in dashboards/figures.py: units in every axis title, the
SIMULATED badge on simulated runs, the run id in each trace's `meta`.

- `telemetry_figure(telemetry, client)`: the builder, for frames already on one axis (one
  load point, or `laid_end_to_end`'s output);
- `run_telemetry_figure(run_id, db, load_point=None)`: loads and lays out a stored run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bench.metrics import time_series
from bench.records import RequestRecord
from bench.telemetry import kv_cache_usage, load_telemetry, power_w, queue_depth
from dashboards.figures import HEIGHT, add_simulated_badge, shade_load_points

AXIS_TIME_POINT = "Time since the load point's start (s)"
AXIS_TIME_RUN = "Time (s; load points back to back, each from its own start)"
CLIENT_COLOUR = "#1f77b4"
WAITING_COLOUR = "#d62728"
RUNNING_COLOUR = "#2ca02c"
KV_COLOUR = "#9467bd"
POWER_COLOURS = ("#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def telemetry_figure(
    telemetry: pd.DataFrame,
    client: Mapping[str, Sequence] | Sequence[RequestRecord] | None = None,
    *,
    title: str = "Server telemetry under client P99 TTFT",
    simulated: bool = False,
    run_id: str | None = None,
    spans: Sequence[tuple[float, float, str]] = (),
    x_title: str = AXIS_TIME_POINT,
) -> go.Figure:
    """P99 TTFT per second over server queue depth, KV-cache use (and GPU power if any).

    `telemetry` is bench.telemetry.load_telemetry's frame (its t_s is the x axis as is);
    `client` is bench.metrics.time_series's dict or the records to compute it from.
    `spans` (start s, end s, title) shade load points, as in figures.run_time_series.
    A client value is drawn at the middle of its one-second bucket (its t_s is the
    bucket's start), so it sits over the server samples of the same second.
    """
    series = client if isinstance(client, Mapping) else time_series(list(client or []))
    t = list(series.get("t_s", []))
    half = ((t[1] - t[0]) if len(t) > 1 else 1.0) / 2
    queue, kv, power = queue_depth(telemetry), kv_cache_usage(telemetry), power_w(telemetry)
    has_power = not power.empty
    rows = 4 if has_power else 3
    names = [
        "Client: P99 TTFT of requests whose first token came that second",
        "Server: requests waiting and running",
        "Server: KV-cache use",
    ] + (["GPU board power"] if has_power else [])
    fig = make_subplots(
        rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.06, subplot_titles=names
    )
    fig.add_trace(
        go.Scatter(
            x=[x + half for x in t],
            y=list(series.get("p99_ttft_ms", [])),
            name="P99 TTFT per second",
            meta=run_id,
            mode="lines+markers",
            connectgaps=False,
            line={"color": CLIENT_COLOUR, "width": 1.5},
            marker={"size": 4},
        ),
        row=1,
        col=1,
    )
    for column, label, colour in (
        ("requests_waiting", "waiting (queued on the server)", WAITING_COLOUR),
        ("requests_running", "running (in the batch)", RUNNING_COLOUR),
    ):
        part = queue.dropna(subset=[column])
        if not part.empty:
            fig.add_trace(_step(part["t_s"], part[column], label, colour, run_id), row=2, col=1)
    part = kv.dropna(subset=["kv_cache_usage"])
    if not part.empty:
        fig.add_trace(
            _step(part["t_s"], part["kv_cache_usage"] * 100, "KV-cache use", KV_COLOUR, run_id),
            row=3,
            col=1,
        )
    if has_power:
        for i, (gpu, g) in enumerate(power.groupby("gpu", sort=True)):
            colour = POWER_COLOURS[i % len(POWER_COLOURS)]
            fig.add_trace(
                _step(g["t_s"], g["power_w"], f"GPU {gpu} power", colour, run_id), row=4, col=1
            )
    if kv.dropna(subset=["kv_cache_usage"]).empty and not queue.empty:
        fig.add_annotation(
            text="this server exposes no KV-cache usage (llama.cpp's llama-server has none)",
            xref="x3 domain",
            yref="y3 domain",
            x=0.5,
            y=0.5,
            showarrow=False,
            font={"color": "#7f7f7f"},
        )
    if queue.empty and kv.empty:
        fig.add_annotation(
            text="no server telemetry recorded for this run",
            xref="x2 domain",
            yref="y2 domain",
            x=0.5,
            y=0.5,
            showarrow=False,
            font={"color": "#7f7f7f"},
        )
    shade_load_points(fig, spans)
    fig.update_layout(
        title={"text": title, "x": 0.01, "xanchor": "left"},
        template="plotly_white",
        height=HEIGHT + 160 * (rows - 1),
        margin={"l": 70, "r": 20, "t": 60, "b": 60},
        legend={"orientation": "h", "yanchor": "top", "y": -0.08, "x": 0},
        hovermode="x unified",
    )
    fig.update_xaxes(zeroline=False)
    fig.update_xaxes(title_text=x_title, row=rows, col=1)
    fig.update_yaxes(rangemode="tozero", zeroline=False)
    fig.update_yaxes(title_text="P99 TTFT (ms)", row=1, col=1)
    fig.update_yaxes(title_text="Requests (count)", row=2, col=1)
    fig.update_yaxes(title_text="KV cache used (%)", row=3, col=1)
    if has_power:
        fig.update_yaxes(title_text="Power per GPU (W)", row=4, col=1)
    if simulated:
        add_simulated_badge(fig)
    return fig


def _step(x, y, name: str, colour: str, run_id: str | None) -> go.Scatter:
    """Samples drawn as steps: a gauge holds its value until the next scrape."""
    return go.Scatter(
        x=list(x),
        y=list(y),
        name=name,
        meta=run_id,
        mode="lines",
        line={"color": colour, "width": 1.8, "shape": "hv"},
    )


def laid_end_to_end(
    run_id: str, db=None, bucket_s: float = 1.0
) -> tuple[dict[str, list], pd.DataFrame, list[tuple[float, float, str]]]:
    """A run's client series and telemetry with its load points placed back to back.

    Each point keeps its own clock; a point starts where the previous one's stored duration
    (ended_ns) or last client bucket ends, the rule of dashboards.data.run_time_series, so
    this figure and that one share an axis. Telemetry taken before a point's start (the
    scrape just before its first request) is left out of the laid-out frame.
    """
    from bench.store import get_run, load_records

    run = get_run(run_id, db)
    telemetry = load_telemetry(run.id, db)
    keys = ("t_s", "offered_rps", "achieved_rps", "p99_ttft_ms", "output_tps")
    series: dict[str, list] = {k: [] for k in keys}
    parts, spans = [], []
    offset = 0.0
    for lp in run.load_points:
        ts = time_series(load_records(run.id, lp.load_point, db), bucket_s)
        last_bucket = ts["t_s"][-1] + bucket_s if ts["t_s"] else 0.0
        length = max(last_bucket, (lp.ended_ns or 0) / 1e9)
        if length <= 0:
            continue
        series["t_s"].extend(offset + t for t in ts["t_s"])
        for k in keys[1:]:
            series[k].extend(ts[k])
        part = telemetry[(telemetry["load_point"] == lp.load_point) & (telemetry["t_s"] >= 0)]
        parts.append(part.assign(t_s=part["t_s"] + offset))
        label = (lp.label or f"point {lp.load_point + 1}").split(": ", 1)[-1]
        spans.append((offset, offset + length, label))
        offset += length
    laid = pd.concat(parts, ignore_index=True) if parts else telemetry.iloc[0:0]
    return series, laid, spans


def run_telemetry_figure(
    run_id: str, db=None, load_point: int | None = None, bucket_s: float = 1.0
) -> go.Figure:
    """The run page's figure: one load point on its own clock, or the whole run laid out."""
    from bench.store import get_run, load_records

    run = get_run(run_id, db)
    name = run.label or run.name or run.short_id
    if load_point is not None or len(run.load_points) <= 1:
        lp = load_point if load_point is not None else 0
        return telemetry_figure(
            load_telemetry(run.id, db, load_point=lp),
            time_series(load_records(run.id, lp, db), bucket_s),
            title=f"Server telemetry under client P99 TTFT: {name}",
            simulated=run.simulated,
            run_id=run.id,
        )
    series, laid, spans = laid_end_to_end(run.id, db, bucket_s)
    return telemetry_figure(
        laid,
        series,
        title=f"Server telemetry under client P99 TTFT: {name}",
        simulated=run.simulated,
        run_id=run.id,
        spans=spans,
        x_title=AXIS_TIME_RUN,
    )
