"""Curves of stored runs: the data behind every chart, table and comparison.

One function per curve, used by the CLI's `compare`, the dashboard and the exports alike, so
a number on a slide is the number on the dashboard. Each load point's figures come from the
summary contract (bench.metrics.Summary.to_json): recomputed from the stored requests with
the point's warm-up and cool-down left out, or, for imported runs that carry no requests,
the summary stored with them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.metrics import Threshold, parse_goodput, summarize

# Consistent colours on every chart, from the Okabe-Ito palette (safe for the common kinds of
# colour blindness): B200 bluish green, H100 blue, H200 reddish purple, MI300X vermillion.
# Colour is never the only cue: dashboards.figures also gives each run its own marker and dash.
GPU_COLOURS = {
    "B200-SXM": "#009E73",
    "B200-SXM-192": "#F0E442",
    "B300-SXM": "#56B4E9",
    "H100-SXM": "#0072B2",
    "H200-SXM": "#CC79A7",
    "MI300X": "#D55E00",
    "MI355X": "#E69F00",
}
FALLBACK_COLOURS = ("#000000", "#7f7f7f", "#8c564b", "#bcbd22")


def gpu_colour(gpu: str | None, index: int = 0) -> str:
    from bench.sim.profiles import get_gpu

    try:
        name = get_gpu(gpu).name if gpu else None
    except (KeyError, ValueError):
        name = None
    return GPU_COLOURS.get(name) or FALLBACK_COLOURS[index % len(FALLBACK_COLOURS)]


@dataclass
class CurvePoint:
    """One load point of a run, in the units buyers compare: per GPU, ms, tok/s/user."""

    load_point: int
    title: str
    offered: float | None
    requests_per_s: float
    output_tps_per_gpu: float
    total_tps_per_gpu: float
    output_tps: float
    total_tps: float
    completed: int
    failed: int
    metrics: dict[str, dict[str, float | None]]  # "ttft_ms" -> {"p50": .., "p99": ..}
    goodput_requests_per_s: float | None = None

    def latency(self, metric: str, stat: str = "p99") -> float | None:
        return self.metrics.get(f"{metric}_ms", {}).get(stat)

    @property
    def interactivity(self) -> float | None:
        """Tokens/s per user = 1000 / median TPOT ms (the InferenceMAX x-axis)."""
        tpot = self.latency("tpot", "p50")
        return 1000.0 / tpot if tpot else None

    @property
    def error_rate(self) -> float:
        done = self.completed + self.failed
        return self.failed / done if done else 0.0

    def value(self, name: str) -> float | None:
        """Same names as Summary.value: p99_ttft_ms, error_rate, output_tokens_per_s, ..."""
        flat = {
            "error_rate": self.error_rate,
            "requests_per_s": self.requests_per_s,
            "output_tokens_per_s": self.output_tps,
            "total_tokens_per_s": self.total_tps,
            "goodput_requests_per_s": self.goodput_requests_per_s,
        }
        if name in flat:
            return flat[name]
        stat, _, rest = name.partition("_")
        return self.latency(rest.removesuffix("_ms"), stat)

    def meets(self, slo: Sequence[Threshold]) -> bool:
        return self.completed > 0 and all(t.passes(self.value(t.metric)) for t in slo)


@dataclass
class RunCurve:
    run_id: str
    name: str
    label: str
    gpu_type: str | None
    gpu_count: int
    model: str | None
    simulated: bool
    imported_from: str | None
    status: str
    points: list[CurvePoint] = field(default_factory=list)
    colour: str = "#1f77b4"

    @property
    def legend(self) -> str:
        tag = " (simulated)" if self.simulated else ""
        return f"{self.label}{tag}"


def point_from_summary(
    summary: dict, *, load_point: int, title: str, offered: float | None, gpus: int
) -> CurvePoint:
    tp = summary.get("throughput", {})
    out, tot = tp.get("output_tokens_per_s") or 0.0, tp.get("total_tokens_per_s") or 0.0
    return CurvePoint(
        load_point=load_point,
        title=title,
        offered=offered,
        requests_per_s=tp.get("requests_per_s") or 0.0,
        output_tps_per_gpu=out / max(1, gpus),
        total_tps_per_gpu=tot / max(1, gpus),
        output_tps=out,
        total_tps=tot,
        completed=int(summary.get("completed") or 0),
        failed=int(summary.get("failed") or 0),
        metrics=summary.get("metrics", {}),
        goodput_requests_per_s=summary.get("goodput_requests_per_s"),
    )


def _title(lp) -> str:
    if lp.label:
        return lp.label.split(": ", 1)[-1]
    if lp.target_rate is not None:
        return "rate inf" if math.isinf(lp.target_rate) else f"rate {lp.target_rate:g} req/s"
    if lp.concurrency is not None:
        return f"concurrency {lp.concurrency}"
    return f"point {lp.load_point + 1}"


def run_curve(run_ref: str, db=None, *, index: int = 0) -> RunCurve:
    """Every load point of a stored run as a curve, recomputed from its requests."""
    import yaml

    from bench.store.read import get_run, load_columns

    run = get_run(run_ref, db)
    gpus = run.gpu_count or 1
    scenario = yaml.safe_load(run.scenario_text) if run.scenario_text else {}
    scenario = scenario if isinstance(scenario, dict) else {}
    percentiles = scenario.get("percentiles") or (50, 90, 95, 99, 99.9)
    goodput = parse_goodput(scenario.get("goodput"))
    curve = RunCurve(
        run_id=run.id,
        name=run.name or run.short_id,
        label=run.label or f"{run.gpu_type or 'GPU?'} x{gpus} {run.model or ''}".strip(),
        gpu_type=run.gpu_type,
        gpu_count=gpus,
        model=run.model,
        simulated=run.simulated,
        imported_from=run.imported_from,
        status=run.status,
        colour=gpu_colour(run.gpu_type, index),
    )
    lps = run.load_points or []
    for lp in lps:
        cols = load_columns(run.id, lp.load_point, db)
        if len(cols.state):
            if lp.warmup_s or lp.cooldown_s:
                last = float(cols.intended_ns.max())
                cols = cols.window((lp.warmup_s or 0) * 1e9, last - (lp.cooldown_s or 0) * 1e9 + 1)
            summary = summarize(cols, percentiles=percentiles, goodput=goodput).to_json()
        elif lp.summary_json:
            summary = lp.summary_json
        else:
            continue
        offered = lp.target_rate if lp.target_rate is not None else lp.concurrency
        curve.points.append(
            point_from_summary(
                summary, load_point=lp.load_point, title=_title(lp), offered=offered, gpus=gpus
            )
        )
    if not lps and run.summary_json:
        curve.points.append(
            point_from_summary(run.summary_json, load_point=0, title="run", offered=None, gpus=gpus)
        )
    curve.points.sort(key=lambda p: p.output_tps_per_gpu)
    return curve


def run_curves(run_refs: Sequence[str], db=None) -> list[RunCurve]:
    return [run_curve(ref, db, index=i) for i, ref in enumerate(run_refs)]


# ---------------------------------------------------------------- the curves


def latency_curve(curve: RunCurve, metric: str = "ttft", stat: str = "p99") -> tuple[list, list]:
    """x = output tokens/s per GPU, y = latency (ms) of `metric` at `stat`, per load point."""
    pts = [p for p in curve.points if p.latency(metric, stat) is not None]
    return [p.output_tps_per_gpu for p in pts], [p.latency(metric, stat) for p in pts]


def interactivity_curve(curve: RunCurve) -> tuple[list, list]:
    """x = interactivity (tok/s per user), y = output tokens/s per GPU (InferenceMAX's chart)."""
    pts = [p for p in curve.points if p.interactivity is not None]
    return [p.interactivity for p in pts], [p.output_tps_per_gpu for p in pts]


def cost_curve(
    curve: RunCurve, catalogue, tier: str, *, tokens: str = "output", utilisation: float = 1.0
) -> tuple[list, list]:
    """x = interactivity (tok/s per user), y = $/Mtok on one pricing tier."""
    from bench.cost import cost_at_utilisation, dollars_per_mtok, price_per_gpu_hour

    if not curve.gpu_type:
        return [], []
    price = price_per_gpu_hour(
        catalogue.tier(catalogue.resolve_gpu(curve.gpu_type), tier), catalogue
    )
    xs, ys = [], []
    for p in curve.points:
        tps = p.output_tps if tokens == "output" else p.total_tps
        usd = cost_at_utilisation(dollars_per_mtok(price, curve.gpu_count, tps), utilisation)
        if p.interactivity is not None and usd is not None:
            xs.append(p.interactivity)
            ys.append(usd)
    return xs, ys


def capacity_at_slo(curve: RunCurve, slo: Sequence[Threshold]) -> CurvePoint | None:
    """The highest-throughput load point that meets every SLO threshold."""
    passing = [p for p in curve.points if p.meets(slo)]
    return max(passing, key=lambda p: p.output_tps_per_gpu) if passing else None


def cost_rows_at(curve: RunCurve, point: CurvePoint | None, catalogue, utilisation: float = 1.0):
    """$/Mtok on every tier of the run's GPU at one of its points ([] without GPU or point)."""
    from bench.cost import PriceCatalogueError, cost_table

    if point is None or not curve.gpu_type:
        return []
    try:
        return cost_table(
            curve.gpu_type,
            curve.gpu_count,
            point.output_tps,
            point.total_tps,
            catalogue,
            utilisation,
        )
    except PriceCatalogueError:
        return []


def matched_load(curves: Sequence[RunCurve]) -> list[CurvePoint | None]:
    """For each run, its point at the highest throughput per GPU that every run reaches."""
    tops = [max((p.output_tps_per_gpu for p in c.points), default=0.0) for c in curves]
    level = min(tops) if tops else 0.0
    out = []
    for c in curves:
        reach = [p for p in c.points if p.output_tps_per_gpu <= level * 1.0001]
        out.append(max(reach, key=lambda p: p.output_tps_per_gpu) if reach else None)
    return out


@dataclass
class RunComparison:
    curve: RunCurve
    capacity: CurvePoint | None
    at_matched_load: CurvePoint | None
    cost_rows: list  # bench.cost.CostRow at capacity (or best point when no SLO is given)
    basis: str  # "SLO capacity" or "peak throughput"


def compare_runs(
    curves: Sequence[RunCurve], slo: Sequence[Threshold], catalogue, utilisation: float = 1.0
) -> list[RunComparison]:
    """The side-by-side facts `compare`, the dashboard and the deck all show."""
    matched = matched_load(curves)
    out = []
    for curve, at_match in zip(curves, matched, strict=True):
        if slo:
            cap, basis = capacity_at_slo(curve, slo), "SLO capacity"
        else:
            cap = max(curve.points, key=lambda p: p.output_tps_per_gpu, default=None)
            basis = "peak throughput"
        out.append(
            RunComparison(
                curve, cap, at_match, cost_rows_at(curve, cap, catalogue, utilisation), basis
            )
        )
    return out


def cheapest(rows) -> object | None:
    priced = [r for r in rows if r.output_usd_per_mtok is not None]
    return min(priced, key=lambda r: r.output_usd_per_mtok_at_utilisation) if priced else None


def ratio_sentence(comparisons: Sequence[RunComparison]) -> str | None:
    """One sentence a reader can repeat: A delivers X× B's capacity at Y× lower $/Mtok."""
    if len(comparisons) < 2:
        return None
    a, b = comparisons[0], comparisons[1]
    if a.capacity is None or b.capacity is None or not b.capacity.output_tps_per_gpu:
        return None
    cap_ratio = a.capacity.output_tps_per_gpu / b.capacity.output_tps_per_gpu
    text = (
        f"{a.curve.legend} serves {cap_ratio:.2f}x the output tokens/s per GPU of "
        f"{b.curve.legend} at {a.basis}"
    )
    ca, cb = cheapest(a.cost_rows), cheapest(b.cost_rows)
    if ca is not None and cb is not None:
        ua, ub = ca.output_usd_per_mtok_at_utilisation, cb.output_usd_per_mtok_at_utilisation
        if ua and ub:
            how = f"{ub / ua:.2f}x less" if ua <= ub else f"{ua / ub:.2f}x more"
            text += (
                f"; on the cheapest tiers (${ua:.3f} vs ${ub:.3f} per million output tokens) "
                f"it costs {how}"
            )
    return text + "."
