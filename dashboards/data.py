"""Per-request data behind a run's detail charts: CDFs, errors by kind, time series.

Curves (bench.curves) carry one summary per load point; the run page also needs
distributions. These helpers read a run's requests through bench.store and compute every
number with bench.metrics (summarize at many percentiles for a CDF, its `errors` for the
error chart, time_series for the burst view), so the definitions stay in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.metrics import summarize, time_series
from bench.store import RunInfo, load_columns, load_records

# Dense where the tail lives: 1..90 by 1, 90..99 by 0.25, 99..99.99 by 0.05 (about 300 levels).
CDF_PERCENTILES: tuple[float, ...] = tuple(
    sorted(
        {float(p) for p in range(1, 90)}
        | {round(90 + 0.25 * i, 2) for i in range(36)}
        | {round(99 + 0.05 * i, 2) for i in range(20)}
        | {99.99}
    )
)
CDF_METRICS = ("ttft", "tpot", "itl", "e2el")


@dataclass
class PointDetail:
    """One load point's distributions: metric -> (values ms, fractions), error counts."""

    load_point: int
    cdfs: dict[str, tuple[list[float], list[float]]]
    errors: dict[str, int]
    completed: int
    failed: int
    cancelled: int


def point_details(run: RunInfo, db=None) -> list[PointDetail]:
    """CDFs and errors of every load point of a stored run (imported runs have none)."""
    out = []
    for lp in run.load_points:
        cols = load_columns(run.id, lp.load_point, db)
        if not len(cols.state):
            continue
        cols = cols.measured(lp.warmup_s, lp.cooldown_s)
        s = summarize(cols, percentiles=CDF_PERCENTILES)
        cdfs = {}
        for metric in CDF_METRICS:
            stats = s.metrics[metric]
            pairs = [
                (v, p / 100.0)
                for p in CDF_PERCENTILES
                if (v := stats.percentiles.get(f"p{p:g}")) is not None
            ]
            cdfs[metric] = ([v for v, _ in pairs], [f for _, f in pairs])
        out.append(
            PointDetail(
                load_point=lp.load_point,
                cdfs=cdfs,
                errors={str(k): int(v) for k, v in s.errors.items()},
                completed=s.completed,
                failed=s.failed,
                cancelled=s.cancelled,
            )
        )
    return out


def run_time_series(
    run: RunInfo, db=None, bucket_s: float = 1.0
) -> tuple[dict[str, list], list[tuple[float, float, str]]]:
    """bench.metrics.time_series of each load point, laid end to end, and the points' spans.

    Each load point keeps time on its own clock (its records count from the point's start),
    so the points are placed back to back: a point starts where the previous one's stored
    duration (ended_ns) or last bucket ends. Returns (series, [(start s, end s, title)]).
    """
    keys = ("t_s", "offered_rps", "achieved_rps", "p99_ttft_ms", "output_tps")
    series: dict[str, list] = {k: [] for k in keys}
    spans: list[tuple[float, float, str]] = []
    offset = 0.0
    points = run.load_points or []
    for lp in points:
        ts = time_series(load_records(run.id, lp.load_point, db), bucket_s)
        if not ts["t_s"]:
            continue
        series["t_s"].extend(offset + t for t in ts["t_s"])
        for k in keys[1:]:
            series[k].extend(ts[k])
        length = max(ts["t_s"][-1] + bucket_s, (lp.ended_ns or 0) / 1e9)
        title = (lp.label or f"point {lp.load_point + 1}").split(": ", 1)[-1]
        spans.append((offset, offset + length, title))
        offset += length
    if not points:
        series = time_series(load_records(run.id, None, db), bucket_s)
    return series, spans
