"""Curves of stored runs: the data behind every chart, table and comparison.

One function per curve, used by the CLI's `compare`, the dashboard and the exports alike, so
a number on a slide is the number on the dashboard. Each load point's figures come from the
summary contract (bench.metrics.Summary.to_json): recomputed from the stored requests with
the point's warm-up and cool-down left out, or, for imported runs that carry no requests,
the summary stored with them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from bench.metrics import (
    DEFAULT_PERCENTILES,
    FLAT_METRICS,
    Threshold,
    class_scope,
    is_thin,
    meets_slo,
    parse_goodput,
    parse_slo,
    restore_prompt_cache,
    scoped_slo,
    slo_text,
    summarize,
    with_error_bound,
)

# Consistent colours on every chart, from the Okabe-Ito palette (safe for the common kinds of
# colour blindness): B200 bluish green, H100 blue, H200 vermillion, MI300X orange; chosen so
# the pairs compared most often stay far apart for deuteranopes and protanopes
# (tests/test_dashboard_figures.py). Colour is never the only cue: dashboards.figures also
# gives each run its own marker and dash.
GPU_COLOURS = {
    "B200-SXM": "#009E73",
    "B200-SXM-192": "#000000",
    "B300-SXM": "#56B4E9",
    "H100-SXM": "#0072B2",
    "H200-SXM": "#D55E00",
    "MI300X": "#E69F00",
    "MI355X": "#CC79A7",
}
FALLBACK_COLOURS = ("#7f7f7f", "#8c564b", "#bcbd22", "#17becf")


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
    # "ttft_ms" -> {"count": n, "level": 0.95, "p99": [low, high], ...} (Summary.to_json);
    # empty for imported runs that carry no requests.
    confidence: dict[str, dict] = field(default_factory=dict)
    partial: bool = False  # the point was interrupted: never a capacity or a knee
    offered_kind: str | None = None  # "rate" (req/s) or "concurrency" (users)
    late_ms: float | None = None  # worst lateness of a simulated endpoint during the point
    # Why the sweep measured it (bench.sweep roles): "draw" and "long" points re-measure
    # the bracketing rates (fresh prompts, longer points) for the capacity's interval only.
    role: str = "grid"
    draw: int | None = None  # which fresh draw of prompts and arrivals ("draw" points)
    # The same figures per traffic class (Summary.classes), when the run mixed classes.
    classes: dict[str, CurvePoint] = field(default_factory=dict)
    # A simulated point's figures with their expected error ({quantity: {value,
    # expected_error, low, high}}), its utilisation of the saturation rate and whether it is
    # near saturation (bench.sim.profiles.accuracy.point_error_bars); None when measured.
    error_bars: dict | None = None

    def scope(self, name: str) -> tuple[CurvePoint | None, str]:
        """(the point whose figures `name` reads, the bare name): a traffic class's own
        point for CLASS:NAME (None when that class sent nothing here), else this one."""
        cls, bare = class_scope(name)
        return (self, name) if cls is None else (self.classes.get(cls), bare)

    # Prompt tokens served from cache (Summary.prompt_cache): "intended" (what the trace
    # implies with an infinite cache), "usage" (what the responses said: the simulator's
    # cache for a simulated run, the server's for a measured one), "server" (its counters)
    prompt_cache: dict[str, dict] = field(default_factory=dict)

    def cache_share(self, source: str) -> float | None:
        """Share of prompt tokens from cache by one source ("intended", "usage", "server")."""
        part = self.prompt_cache.get(source) or {}
        return part.get("share")

    def latency(self, metric: str, stat: str = "p99") -> float | None:
        return self.metrics.get(f"{metric}_ms", {}).get(stat)

    def count(self, metric: str) -> int | None:
        """Samples behind `metric`'s percentiles (None when not known, e.g. imported)."""
        n = self.confidence.get(f"{metric}_ms", {}).get("count")
        return None if n is None else int(n)

    def ci(self, metric: str, stat: str = "p99") -> tuple[float | None, float | None] | None:
        """95% interval of a percentile; an end None is open (beyond the data); None when
        the point carries no intervals at all."""
        entry = self.confidence.get(f"{metric}_ms", {}).get(stat)
        return None if entry is None else (entry[0], entry[1])

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
        """Same names as Summary.value: p99_ttft_ms, error_rate, output_tokens_per_s, ...,
        and CLASS:NAME for one traffic class's figure."""
        point, bare = self.scope(name)
        if point is not self:
            return None if point is None else point.value(bare)
        if name in FLAT_METRICS:
            value = {
                "error_rate": self.error_rate,
                "requests_per_s": self.requests_per_s,
                "output_tokens_per_s": self.output_tps,
                "total_tokens_per_s": self.total_tps,
                "goodput_requests_per_s": self.goodput_requests_per_s,
                "completed": self.completed,
                "failed": self.failed,
            }[name]
            return None if value is None else float(value)
        stat, _, rest = name.partition("_")
        return self.latency(rest.removesuffix("_ms"), stat)

    def meets(self, slo: Sequence[Threshold]) -> bool:
        return meets_slo(slo, self.value, self.completed, self.error_rate)


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
    shape: str | None = None  # the request shape it was measured with (scenario.workload_shape)
    # a simulated run's own expected error per quantity and its basis (a calibration
    # profile's), else None: the simulator's held-out error for its category applies
    sim_error: tuple[dict[str, float], str] | None = None
    # a simulated run's expected error per quantity, its basis and saturation rate
    # (run_error_bars: what `sim run` printed); None for a measured run
    error_bars: dict | None = None

    def expected_error(self, name: str) -> float | None:
        """The relative expected error of a figure (Summary.value names) on this run; None
        when measured."""
        from bench.sim.profiles.accuracy import relative_error

        return relative_error(self.error_bars["expected_error"], name) if self.error_bars else None

    def expected_span(self, name: str, value: float | None) -> tuple[float, float] | None:
        """[low, high] of a figure (Summary.value names; a $/Mtok by bench.cost.cost_error_name)
        with its expected error, x/÷ (1 + e) (accuracy.bounds); None on a measured run or
        without a value. One rule for the CLI's tables and the exports' low/high columns."""
        from bench.sim.profiles.accuracy import bounds

        error = self.expected_error(name)
        if error is None or value is None:
            return None
        return bounds(value, error)

    @property
    def legend(self) -> str:
        tag = " (simulated)" if self.simulated else ""
        return f"{self.label}{tag}"


def with_range(
    value: float | None,
    span: tuple[float | None, float | None] | None,
    fmt: Callable[[float], str],
    unit: str = "",
) -> str:
    """ "771.6 (686.0-867.0)": a figure with its range, in one wording for the CLI's tables, the
    plan's sentence and the exports' cells. The bare figure where the range is unknown or its
    ends read the same once rounded; an unknown low end reads "?" and an open high end "open"
    (a capacity the sweep never saw end); an em dash without a figure. `unit` follows the
    figure only ("$10,154/month ($9,026-$11,282)")."""
    if value is None:
        return "—"
    text = fmt(value) + unit
    if span is None or span == (None, None):
        return text
    lo, hi = span
    ends = (fmt(lo) if lo is not None else "?", fmt(hi) if hi is not None else "open")
    return text if ends[0] == ends[1] else f"{text} ({ends[0]}-{ends[1]})"


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
        confidence=summary.get("confidence") or {},
        partial=bool(summary.get("interrupted")),
        classes={
            name: point_from_summary(
                sub, load_point=load_point, title=title, offered=None, gpus=gpus
            )
            for name, sub in (summary.get("classes") or {}).items()
        },
        prompt_cache=_cache_parts(summary.get("prompt_cache") or {}),
    )


def _cache_parts(*summaries: dict) -> dict[str, dict]:
    """The prompt-cache figures a point has, the first summary's where both have one."""
    parts: dict[str, dict] = {}
    for source in ("intended", "usage", "server"):
        found = [s[source] for s in summaries if isinstance(s.get(source), dict)]
        if found:
            parts[source] = found[0]
    return parts


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

    from bench.store import get_run, load_columns

    run = get_run(run_ref, db)
    gpus = run.gpu_count or 1
    scenario = run.scenario()
    percentiles = scenario.get("percentiles") or DEFAULT_PERCENTILES
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
    from bench.scenario import stored_shape

    curve.shape = stored_shape(run.scenario_text)
    from bench.sim.profiles.accuracy import run_errors

    sim = (run.extra_json or {}).get("sim") or {}
    curve.sim_error = run_errors(
        sim.get("calibration"), run.simulated and sim.get("disagg"),
        sim.get("gpu") or run.gpu_type, sim.get("model") or run.model,
        run.simulated and sim.get("mtp_tokens"), sim.get("engine"),
    )  # fmt: skip
    lps = run.load_points or []
    for lp in lps:
        cols = load_columns(run.id, lp.load_point, db)
        if len(cols.state):
            cols = cols.measured(lp.warmup_s, lp.cooldown_s)
            fresh = summarize(cols, percentiles=percentiles, goodput=goodput)
            # ... with what the records cannot say again: the reuse implied, server counters
            restore_prompt_cache(fresh, lp.summary_json or {})
            summary = fresh.to_json()
        elif lp.summary_json:
            summary = lp.summary_json
        else:
            continue
        offered = lp.target_rate if lp.target_rate is not None else lp.concurrency
        point = point_from_summary(
            summary, load_point=lp.load_point, title=_title(lp), offered=offered, gpus=gpus
        )
        point.offered_kind = (
            "rate" if lp.target_rate is not None else "concurrency" if offered else None
        )
        params = lp.params_json or {}
        point.role, point.draw = str(params.get("role") or "grid"), params.get("draw")
        # The stored summary knows whether the point was cut short; a recomputed one does not.
        point.partial = point.partial or bool((lp.summary_json or {}).get("interrupted"))
        curve.points.append(point)
    if run.simulated and curve.points:
        lateness = sim_lateness_ms(run.id, db)
        for p in curve.points:
            p.late_ms = lateness.get(p.load_point)
    curve.error_bars = run_error_bars(run, db)
    if curve.error_bars is not None:
        from bench.sim.profiles.accuracy import point_error_bars

        errors, sat = (
            curve.error_bars["expected_error"],
            curve.error_bars["saturation_requests_per_s"],
        )
        for p in curve.points:
            offered = p.offered if p.offered_kind == "rate" else None
            p.error_bars = point_error_bars(p, errors, sat, offered)
    if not lps and run.summary_json:
        curve.points.append(
            point_from_summary(run.summary_json, load_point=0, title="run", offered=None, gpus=gpus)
        )
    curve.points.sort(key=lambda p: p.output_tps_per_gpu)
    return curve


def load_saturation(run_id: str, db: Any = None) -> float | None:
    """The saturation rate kept with a simulated run (bench.sim.error_bars.save_saturation);
    None when none was."""
    import json

    from bench.sim.profiles.accuracy import ARTIFACT
    from bench.store import load_artifact

    raw = load_artifact(run_id, ARTIFACT, db)
    return json.loads(raw).get("saturation_requests_per_s") if raw else None


def run_error_bars(run: Any, db: Any = None) -> dict | None:
    """A stored run's expected errors as `sim run` printed them: {"basis", "expected_error"
    {quantity: e}, "saturation_requests_per_s" (None when the run has none stored, e.g. one
    measured through `sim serve`), "near_saturation_at"}; None for a run that is not simulated.
    `run` is a bench.store.RunInfo."""
    from bench.sim.profiles.accuracy import NEAR_SATURATION, expected_errors, run_errors

    if not run.simulated:
        return None
    sim = (run.extra_json or {}).get("sim") or {}
    gpu, model = sim.get("gpu") or run.gpu_type, sim.get("model") or run.model
    # simulated with --profile: the profile's own errors; else the category's (a split's or
    # a run with MTP drafts wider)
    errors, basis = run_errors(
        sim.get("calibration"),
        sim.get("disagg"),
        gpu,
        model,
        sim.get("mtp_tokens"),
        sim.get("engine"),
    ) or expected_errors(gpu, model)
    sat = load_saturation(run.id, db)
    return {
        "basis": basis,
        "expected_error": errors,
        "saturation_requests_per_s": sat,
        "near_saturation_at": NEAR_SATURATION,
    }


# A simulated endpoint whose tokens left this much later than their simulated time moved
# the latencies it reported (bench/sim/server.py's lateness gauges, scraped with the run).
SIM_LATE_MS = 5.0


def sim_lateness_ms(run_id: str, db=None) -> dict[int, float]:
    """Per load point, the worst emission lateness (ms) the simulated endpoint reported.

    Read from the run's stored telemetry: the last-step gauge's peak during the point, and
    the all-time maximum gauge when it grew during the point. Empty when none was stored.
    """
    from bench.telemetry import load_telemetry

    try:
        df = load_telemetry(run_id, db)
    except Exception:  # noqa: BLE001 - missing telemetry only means no lateness flag
        return {}
    names = (
        "tokenbench_sim_emission_lateness_seconds",
        "tokenbench_sim_emission_lateness_max_seconds",
    )
    df = df[df["name"].isin(names)] if len(df) else df
    out: dict[int, float] = {}
    previous_max = 0.0
    for lp, part in df.groupby("load_point") if len(df) else ():
        last = part[part["name"] == names[0]]["value"]
        worst = part[part["name"] == names[1]]["value"]
        late = float(last.max()) if len(last) else 0.0
        if len(worst) and float(worst.max()) > previous_max:
            late = max(late, float(worst.max()))
            previous_max = float(worst.max())
        out[int(lp)] = late * 1e3
    return out


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


# ---------------------------------------------------------------- capacity at an SLO

CapacityKind = Literal["interpolated", "at_least", "below", "peak", "none"]

# Sweep roles whose points re-measure the bracketing loads: they widen the capacity's range
# (what a rerun, fresh prompts or longer points would move) and never place the bracket.
SPREAD_ROLES = ("draw", "long")


@dataclass
class Capacity:
    """A run's capacity at an SLO: the one answer the CLI, API, dashboard and exports print.

    kind:
      interpolated  the SLO boundary lies between `last_pass` and `first_fail`: `point` is
                    interpolated on the metric that fails (the one crossing its limit first)
      at_least      every complete load met the SLO: `point` is the highest, a lower bound
      below         no load met it: capacity is below `first_fail`, the lowest load tested
      peak          no SLO given: `point` is the peak-throughput load, not a capacity
      none          no complete load point
    `low`/`high` bound the capacity (output tok/s per GPU; None = open or unknown): the
    hull of every part in `parts` (each a (low, high) in tok/s per GPU: the percentiles'
    95% intervals, the bracket between the two loads, fresh prompt draws and longer points
    at those loads), widened by the simulator's held-out error for simulated runs.
    Always low <= value <= high. `flags` say why the figure might be wrong.
    """

    kind: CapacityKind
    slo: list[Threshold]
    point: CurvePoint | None  # measured, or interpolated (title says between which)
    low: float | None = None
    high: float | None = None
    last_pass: CurvePoint | None = None
    first_fail: CurvePoint | None = None
    deciding: str | None = None  # "p99_tpot_ms<=50 (50.3 at rate 6 req/s)"
    flags: list[str] = field(default_factory=list)
    parts: dict[str, tuple[float, float]] = field(default_factory=dict)
    sim_error: float | None = None  # relative error folded in (simulated runs)
    sim_basis: str | None = None  # where that error comes from, in words
    # the validation category of a run simulated with the published fit (accuracy.category):
    # a ratio of two such runs carries the fit's error on a ratio, not both errors compounded
    sim_category: str | None = None
    # The traffic class whose own SLO breaks first (its CLASS:NAME threshold decides);
    # None when the deciding threshold is run-wide or nothing broke.
    binding: str | None = None

    @property
    def value(self) -> float | None:
        """Output tokens/s per GPU at capacity (None when below the lowest load)."""
        return self.point.output_tps_per_gpu if self.point is not None else None

    @property
    def bound(self) -> str | None:
        """'at least' or 'below' when the figure is a bound, else None."""
        return {"at_least": "at least", "below": "below"}.get(self.kind)

    @property
    def spread_width(self) -> float | None:
        """Width of what a rerun moves (fresh draws and longer points; the percentiles'
        sampling when those were not measured; None when unknown): what the SLO search
        narrows the bracket below, so where the grid's points fall is not what decides."""
        spans = [self.parts[k] for k in (DRAWS, LONG) if k in self.parts]
        spans = spans or [self.parts[k] for k in (SAMPLING,) if k in self.parts]
        if not spans:
            return None
        return max(h for _, h in spans) - min(lo for lo, _ in spans)

    @property
    def bracket_width(self) -> float | None:
        span = self.parts.get(BRACKET)
        return None if span is None else span[1] - span[0]

    def includes(self, with_sim: bool = True) -> list[str]:
        """What the range covers, in words, one phrase per part (the simulator's error too,
        unless a ratio states its own)."""
        words = [PART_WORDS.get(name, name) for name in self.parts]
        if self.sim_error and with_sim:
            words.append(f"the simulator's {self.sim_basis} (±{self.sim_error:.0%})")
        return words

    def covers(self) -> str:
        """What the range covers, each part with its span: 'the range covers the
        percentiles' 95% sampling intervals (1,011-1,031), ...'; '' without a range."""
        if self.low is None or self.high is None or not self.parts:
            return ""
        words = [
            f"{PART_WORDS.get(name, name)} ({_n(lo)}-{_n(hi)})"
            for name, (lo, hi) in self.parts.items()
        ]
        if self.sim_error:
            words.append(f"the simulator's {self.sim_basis} (±{self.sim_error:.0%})")
        return "the range covers " + ", ".join(words)

    def text(self, unit: str = "output tok/s per GPU") -> str:
        """One phrase: '1,234 output tok/s per GPU (range 1,100-1,300)', 'at least 900 ...';
        what the range covers is `includes()`."""
        if self.kind == "none":
            return "no complete load points"
        if self.kind == "below":
            top = self.first_fail.output_tps_per_gpu if self.first_fail else None
            whose = f"class {self.binding}'s SLO" if self.binding else "the SLO"
            return f"below {_n(top)} {unit} (the lowest load tested broke {whose})"
        head = f"{_n(self.value)} {unit}"
        if self.kind == "at_least":
            return f"at least {head} (every load tested met the SLO)"
        if self.kind == "peak":
            return f"{head} (peak throughput: no SLO)"
        binds = f"; class {self.binding} binds" if self.binding else ""
        if self.low is None or self.high is None:
            return f"{head} (interval unknown: no per-request data{binds})"
        return f"{head} (range {_n(self.low)}-{_n(self.high)}{binds})"


# The parts of a capacity's range, by name, and what each covers in words.
SAMPLING, BRACKET, DRAWS, LONG = "sampling", "bracket", "draws", "long"
PART_WORDS = {
    SAMPLING: "the percentiles' 95% sampling intervals",
    BRACKET: "the whole bracket between the last passing and first failing load",
    DRAWS: "fresh prompt and arrival draws at those two loads",
    LONG: "points twice as long at those two loads",
}


def _n(x: float | None) -> str:
    return "?" if x is None else f"{x:,.0f}"


def _complete(curve: RunCurve) -> tuple[list[CurvePoint], list[str]]:
    """Points in load order that may decide a capacity, and notes on those left out."""
    notes = [
        f"{p.title} was interrupted (partial): left out of the capacity"
        for p in curve.points
        if p.partial
    ]
    pts = [
        p for p in curve.points if not p.partial and p.completed > 0 and p.role not in SPREAD_ROLES
    ]
    one_kind = len({p.offered_kind for p in pts}) == 1
    if one_kind and all(p.offered is not None for p in pts):
        pts.sort(key=lambda p: (p.offered, p.output_tps_per_gpu))
    else:  # e.g. an auto sweep's closed-loop baseline among rates: order by what was served
        pts.sort(key=lambda p: (p.requests_per_s, p.output_tps_per_gpu))
    return pts, notes


def _crossing(t: Threshold, va: float | None, vb: float | None) -> float:
    """Where between two loads (0 = a, 1 = b) `t`'s metric crosses its limit, linearly:
    0 when it already fails at a (or has no value there), 1 when it still passes at b."""
    if va is None or not t.passes(va):
        return 0.0
    if vb is not None and t.passes(vb):
        return 1.0
    if vb is None or vb == va:
        return 0.0
    return min(1.0, max(0.0, (t.limit - va) / (vb - va)))


def _interpolate(a: CurvePoint, b: CurvePoint, f: float) -> CurvePoint:
    """The point a fraction f of the way from a to b, every figure linear in between."""

    def mix(x, y):
        return None if x is None or y is None else x + (y - x) * f

    metrics = {
        m: {k: mix(v, b.metrics.get(m, {}).get(k)) for k, v in stats.items()}
        for m, stats in a.metrics.items()
    }
    title = a.title if f <= 0 else f"interpolated {f:.0%} of the way from {a.title} to {b.title}"
    return CurvePoint(
        load_point=a.load_point,
        title=title,
        offered=mix(a.offered, b.offered),
        requests_per_s=mix(a.requests_per_s, b.requests_per_s),
        output_tps_per_gpu=mix(a.output_tps_per_gpu, b.output_tps_per_gpu),
        total_tps_per_gpu=mix(a.total_tps_per_gpu, b.total_tps_per_gpu),
        output_tps=mix(a.output_tps, b.output_tps),
        total_tps=mix(a.total_tps, b.total_tps),
        completed=a.completed,
        failed=a.failed,
        metrics=metrics,
        goodput_requests_per_s=mix(a.goodput_requests_per_s, b.goodput_requests_per_s),
        late_ms=max(a.late_ms or 0.0, b.late_ms or 0.0) or None,
        classes={
            k: _interpolate(v, b.classes[k], f) for k, v in a.classes.items() if k in b.classes
        },
    )


def _percentile_of(t: Threshold) -> tuple[str, str] | None:
    """('tpot', 'p99') for p99_tpot_ms (and for a class's agent:p99_tpot_ms); None for flat
    figures (error_rate, ...)."""
    stat, _, rest = class_scope(t.metric)[1].partition("_")
    if not rest.endswith("_ms") or not stat.startswith("p"):
        return None
    return rest.removesuffix("_ms"), stat


def _ci_end(p: CurvePoint, t: Threshold, end: int) -> float | None:
    """One end of the 95% interval of t's metric at p; the value itself without intervals;
    None when the interval is open at that end."""
    which = _percentile_of(t)
    own = p.scope(t.metric)[0]
    if which is None or own is None:
        return p.value(t.metric)
    ci = own.ci(*which)
    return p.value(t.metric) if ci is None else ci[end]


def _confidence_flags(p: CurvePoint, slo: Sequence[Threshold], passed: bool) -> list[str]:
    """A thin tail, or a verdict the percentile's own interval could reverse."""
    out = []
    for t in slo:
        which = _percentile_of(t)
        if which is None:
            continue
        metric, stat = which
        own, _ = p.scope(t.metric)
        if own is None:
            continue
        cls = class_scope(t.metric)[0]
        whose = f" of class {cls}" if cls else ""
        n = own.count(metric)
        if n is not None and is_thin(n, float(stat[1:])):
            out.append(f"{stat.upper()} {metric.upper()}{whose} at {p.title} rests on {n} samples")
            continue
        ci, value = own.ci(metric, stat), p.value(t.metric)
        if ci is None or value is None or t.op not in ("<", "<="):
            continue
        lo, hi = ci
        if not passed and not t.passes(value) and (lo is None or lo <= t.limit):
            out.append(
                f"{p.title} missed {t} by {value - t.limit:.3g} ({value:.4g}), inside its 95% "
                f"interval [{_e(lo)}, {_e(hi)}]: that miss could be chance"
            )
        if passed and hi is None:
            out.append(
                f"{p.title} met {t} ({value:.4g}) but {n} samples cannot bound its "
                f"{stat.upper()} from above: that pass could be chance"
            )
        elif passed and hi > t.limit:
            out.append(
                f"{p.title} met {t} ({value:.4g}) but its 95% interval reaches {hi:.4g}: "
                "that pass could be chance"
            )
    return out


def _e(x: float | None) -> str:
    return "open" if x is None else f"{x:.4g}"


def _late_flag(p: CurvePoint | None) -> list[str]:
    if p is None or p.late_ms is None or p.late_ms <= SIM_LATE_MS:
        return []
    return [
        f"the simulated endpoint ran up to {p.late_ms:.0f} ms behind its schedule at "
        f"{p.title} (busy machine): latencies there may read up to that much high"
    ]


def capacity_at_slo(
    curve: RunCurve,
    slo: Sequence[Threshold],
    sim_error: tuple[dict[str, float], str] | None = None,
    sim_category: str | None = None,
) -> Capacity:
    """The highest load meeting every SLO threshold, interpolated to the boundary.

    Loads are walked in order of offered load; the first failing load and the passing one
    below it bracket the boundary, and the capacity is where the failing metric crosses its
    limit on the straight line between them (the metric crossing first decides). Points the
    sweep measured again at the two bracketing loads (fresh draws: role "draw"; longer:
    "long") give more estimates of the same crossing: the capacity is the mean of the
    bracket's estimates, and the range spans all of them. It can never contradict itself:
    low <= value <= high, and value is never below a load that passed with no failing load
    beneath it. Interrupted (partial) points never count. `sim_error` (relative error per
    quantity, where it comes from) widens a simulated run's range by the figures that could
    decide it (sim_widening); None reads it from the simulator (bench.sim.profiles.accuracy)
    for simulated curves. `sim_category`: the validation category of a run simulated with
    the published fit, when `sim_error` is its.
    """
    slo = list(slo)
    pts, notes = _complete(curve)
    if not pts:
        return Capacity("none", slo, None, flags=notes)
    if not slo:
        peak = max(pts, key=lambda p: p.output_tps_per_gpu)
        return Capacity(
            "peak", slo, peak, peak.output_tps_per_gpu, peak.output_tps_per_gpu,
            flags=notes + _late_flag(peak),
        )  # fmt: skip
    first = next((i for i, p in enumerate(pts) if not p.meets(slo)), None)
    if first is None:
        top = max(pts, key=lambda p: p.output_tps_per_gpu)
        flags = notes + _confidence_flags(top, slo, True) + _late_flag(top)
        return Capacity("at_least", slo, top, top.output_tps_per_gpu, None, top, None, None, flags)
    b = pts[first]
    # the first broken threshold, the implicit error bound included (metrics.meets_slo)
    broken = [t for t in with_error_bound(slo) if not t.passes(b.value(t.metric))]
    deciding_t = broken[0] if broken else slo[0]
    if first == 0:
        flags = notes + _confidence_flags(b, slo, False) + _late_flag(b)
        return Capacity(
            "below", slo, None, None, b.output_tps_per_gpu, None, b, _deciding(deciding_t, b),
            flags, binding=class_scope(deciding_t.metric)[0],
        )  # fmt: skip
    # Every complete measurement (grid, search, fresh draws, longer points) informs one
    # monotone fit of each SLO metric against load (pool adjacent violators): a single noisy
    # point on a flat stretch cannot decide alone. The capacity is where the fit crosses.
    groups = _groups(curve, pts)
    pos, deciding_fit = _boundary(groups, slo, "value")
    at = [_tps_at(groups, pos)] + [
        _tps_at(groups, _boundary(groups, slo, side)[0]) for side in ("pessimistic", "optimistic")
    ]
    k = min(int(pos), len(groups) - 1)
    a, b = _rep(groups[k]), _rep(groups[min(k + 1, len(groups) - 1)])
    if deciding_fit is not None and b is not a:
        deciding_t = deciding_fit
    x0, x1 = a.output_tps_per_gpu, b.output_tps_per_gpu
    parts: dict[str, tuple[float, float]] = {BRACKET: (min(x0, x1), max(x0, x1))}
    flags = notes + _confidence_flags(a, slo, a.meets(slo))
    flags += _confidence_flags(b, slo, b.meets(slo)) if b is not a else []
    if b is a:
        flags.append(
            f"the failures among the loads tested were outweighed by passes around them: "
            f"the fitted boundary is at or above {a.title}"
        )
    known = all(
        (own := p.scope(t.metric)[0]) is not None and own.ci(*which) is not None
        for t in slo
        if (which := _percentile_of(t)) is not None
        for p in (a, b)
    )
    if known:  # within the bracket: the loads beyond it were judged on their own values
        lo, hi = parts[BRACKET]
        sampled = [min(max(x, lo), hi) for x in at]
        parts[SAMPLING] = (min(sampled), max(sampled))
    else:  # e.g. an imported run: summaries without per-request data
        flags.append("no percentile intervals stored, so the capacity's uncertainty is unknown")
    for role, subsets in _spread_subsets(curve, pts).items():
        found = []
        for subset in subsets:
            sub = _groups(None, subset)
            if len(sub) >= 2:
                found.append(_tps_at(sub, _boundary(sub, slo, "value")[0]))
        if found:
            parts[DRAWS if role == "draw" else LONG] = (min(found + [at[0]]), max(found + [at[0]]))
    # Never below a load that passed, every time it was measured, with nothing failing
    # beneath it (its throughput was served within the SLO), whatever the fit says.
    floor_point = _floor(groups, slo)
    floor = floor_point.output_tps_per_gpu if floor_point is not None else -math.inf
    value = max(at[0], floor)
    point = _point_at(a, b, value) if value > floor else None
    if point is None or point.output_tps_per_gpu < floor:
        point = floor_point or point or a
    value = point.output_tps_per_gpu
    flags += _late_flag(a) + _late_flag(b)
    again = [p for p in pts[first + 1 :] if p.meets(slo)]
    if again:
        flags.append(
            f"{again[-1].title} met the SLO again above the first failure at {pts[first].title}: "
            "the boundary is noisy there"
        )
    if sim_error is None and curve.simulated:
        from bench.sim.profiles.accuracy import category, expected_errors

        sim_error = curve.sim_error  # a calibration profile's, stored with the run
        if sim_error is None:  # the published fit's, for the run's category
            sim_error = expected_errors(curve.gpu_type, curve.model)
            sim_category = category(curve.gpu_type, curve.model)
    low = high = None
    widen: tuple[float, str] | None = None
    if sim_error is not None:
        e, which = sim_widening(sim_error[0], slo, point)
        widen = (e, f"{sim_error[1]}; {which}")
    if known:
        low = min([value] + [lo for lo, _ in parts.values()])
        high = max([value] + [hi for _, hi in parts.values()])
        if widen is not None:  # x/÷ (1 + error), as every simulated figure's bounds
            low, high = low / (1 + widen[0]), high * (1 + widen[0])
    return Capacity(
        "interpolated",
        slo,
        point,
        low=low,
        high=high,
        last_pass=a,
        first_fail=b,
        deciding=_deciding(deciding_t, b),
        flags=flags,
        parts=parts,
        sim_error=widen[0] if widen else None,
        sim_basis=widen[1] if widen else None,
        sim_category=sim_category if widen else None,
        binding=class_scope(deciding_t.metric)[0],
    )


def sim_widening(
    errors: dict[str, float], slo: Sequence[Threshold], point: CurvePoint | None
) -> tuple[float, str]:
    """The error a simulated capacity widens by (x/÷ 1 + e), and which figures set it in
    words: the output throughput's (a capacity is one) and that of each SLO figure that could
    decide within its error at the capacity, i.e. whose value there, off by its error, would
    break its limit. The deciding figure always could; one far inside its limit could not,
    however far off it is: a TTFT p99 at a third of its limit does not widen a capacity TPOT
    decides by TTFT's larger error (the published fit's held-out points, throughput at an
    interactivity, are a capacity at a TPOT limit: their error is that capacity's)."""
    from bench.sim.profiles.accuracy import relative_error

    could: dict[str, float] = {}
    left = []
    for t in slo:
        e = relative_error(errors, class_scope(t.metric)[1])
        value = point.value(t.metric) if point is not None else None
        if e is None:
            continue
        reach = (
            None if value is None else value * (1 + e) if t.op in ("<", "<=") else value / (1 + e)
        )
        if reach is not None and t.passes(reach):
            left.append(f"{t.metric} at {value:.4g} against {t.limit:g} ({e:.0%})")
        else:
            could[t.metric] = max(could.get(t.metric, 0.0), e)
    # named last: a tie names the SLO's figure
    could["output tok/s"] = relative_error(errors, "output_tokens_per_s") or 0.0
    name = max(could, key=lambda k: could[k])
    words = f"widened by {name}'s {could[name]:.0%}, the largest of the figures that could decide"
    if left:
        words += f"; left out, within the limit even that far off: {', '.join(left)}"
    return could[name], words


def _x(p: CurvePoint, by_offered: bool) -> float:
    return p.offered if by_offered else p.requests_per_s


def _groups(
    curve: RunCurve | None, pts: Sequence[CurvePoint]
) -> list[tuple[float, list[CurvePoint]]]:
    """`pts` grouped by load in load order (offered load when all have one, else what was
    served), with the curve's re-measurements (fresh draws, longer points) of the same
    kind when a curve is given."""
    same = list(pts)
    if curve is not None:
        kinds, ids = {p.offered_kind for p in pts}, {id(p) for p in pts}
        same += [
            p
            for p in curve.points
            if p.role in SPREAD_ROLES and id(p) not in ids and not p.partial
            and p.completed > 0 and p.offered_kind in kinds
        ]  # fmt: skip
    by_offered = len({p.offered_kind for p in same}) == 1 and all(
        p.offered is not None for p in same
    )
    groups: dict[float, list[CurvePoint]] = {}
    for p in same:
        groups.setdefault(_x(p, by_offered), []).append(p)
    return sorted(groups.items(), key=lambda kv: kv[0])


def _floor(
    groups: list[tuple[float, list[CurvePoint]]], slo: Sequence[Threshold]
) -> CurvePoint | None:
    """The highest-throughput load below the first load with any failing measurement
    (grid, search, fresh draw or longer point): a capacity is never below it."""
    best = None
    for group in groups:
        if not all(p.meets(slo) for p in group[1]):
            break
        rep = _rep(group)
        if best is None or rep.output_tps_per_gpu > best.output_tps_per_gpu:
            best = rep
    return best


def _rep(group: tuple[float, list[CurvePoint]]) -> CurvePoint:
    """The point that stands for a load: its grid or search point, else its first."""
    pts = group[1]
    return next((p for p in pts if p.role not in SPREAD_ROLES), pts[0])


def _pav(ys: list[float], ws: list[float]) -> list[float]:
    """The non-decreasing least-squares fit of ys (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [weighted sum, weight, members]
    for y, w in zip(ys, ws, strict=True):
        blocks.append([y * w, w, 1])
        while len(blocks) > 1 and _mean(blocks[-2]) > _mean(blocks[-1]):
            last = blocks.pop()
            blocks[-1] = [blocks[-1][0] + last[0], blocks[-1][1] + last[1], blocks[-1][2] + last[2]]
    return [_mean(b) for b in blocks for _ in range(int(b[2]))]


def _mean(block: list[float]) -> float:
    return math.inf if math.isinf(block[0]) else block[0] / block[1]


def _boundary(
    groups: list[tuple[float, list[CurvePoint]]], slo: Sequence[Threshold], side: str
) -> tuple[float, Threshold | None]:
    """Where the monotone fit of the SLO's metrics first crosses a limit, as a position in
    `groups` (j + f: a fraction f of the way from load j to load j + 1), and the threshold
    that crosses first; (last index, None) when the fit never crosses. `side`: "value",
    or every percentile at the "pessimistic" or "optimistic" end of its 95% interval."""
    best: tuple[float, Threshold | None] = (float(len(groups) - 1), None)
    for t in with_error_bound(slo):
        sign = 1.0 if t.op in ("<", "<=") else -1.0
        end = None if side == "value" else int((side == "pessimistic") == (sign > 0))
        ys, ws = [], []
        for _, pts in groups:
            vals = [_ci_end(p, t, end) if end is not None else p.value(t.metric) for p in pts]
            known = [v for v in vals if v is not None]
            # no value (nothing completed for that metric) counts as failing
            ys.append(sign * sum(known) / len(known) if known else math.inf)
            ws.append(float(len(pts)))
        fit, limit = _pav(ys, ws), sign * t.limit
        fails = [j for j, g in enumerate(fit) if not (g < limit if t.op in "<>" else g <= limit)]
        if not fails:
            continue
        j = fails[0]
        pos = 0.0
        if j > 0:
            g0, g1 = fit[j - 1], fit[j]
            f = 0.0 if math.isinf(g1) or g1 == g0 else (limit - g0) / (g1 - g0)
            pos = j - 1 + min(1.0, max(0.0, f))
        if pos < best[0] or best[1] is None:
            best = (pos, t)
    return best


def _tps_at(groups: list[tuple[float, list[CurvePoint]]], pos: float) -> float:
    """Output tok/s per GPU at a position in `groups`, between their standing points."""
    j = min(int(pos), len(groups) - 1)
    a, b = _rep(groups[j]), _rep(groups[min(j + 1, len(groups) - 1)])
    return a.output_tps_per_gpu + (b.output_tps_per_gpu - a.output_tps_per_gpu) * (pos - j)


def _spread_subsets(
    curve: RunCurve, pts: Sequence[CurvePoint]
) -> dict[str, list[list[CurvePoint]]]:
    """Per spread role, the points measured together (one fresh draw; the longer points)."""
    kinds = {p.offered_kind for p in pts}
    out: dict[str, list[list[CurvePoint]]] = {}
    for role in SPREAD_ROLES:
        sets: dict[object, list[CurvePoint]] = {}
        for p in curve.points:
            if p.role == role and not p.partial and p.completed > 0 and p.offered_kind in kinds:
                sets.setdefault(p.draw, []).append(p)
        if sets:
            out[role] = list(sets.values())
    return out


def _point_at(a: CurvePoint, b: CurvePoint, value: float) -> CurvePoint | None:
    """The point between a and b whose output tok/s per GPU is `value`; None when no point
    on the segment has it."""
    x0, x1 = a.output_tps_per_gpu, b.output_tps_per_gpu
    if not min(x0, x1) <= value <= max(x0, x1):
        return None
    return a if x1 == x0 else _interpolate(a, b, (value - x0) / (x1 - x0))


def _deciding(t: Threshold, p: CurvePoint) -> str:
    value = p.value(t.metric)
    return f"{t} ({'no data' if value is None else f'{value:.4g}'} at {p.title})"


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


def matched_load(curves: Sequence[RunCurve], level: float | None = None) -> list[CurvePoint | None]:
    """Each run at one and the same output throughput per GPU: `level`, by default the
    highest every run reaches; each run's point there is interpolated between its two
    loads around it, so the latencies compared are at equal load (None for a run that
    never reaches it)."""
    tops = [max((p.output_tps_per_gpu for p in c.points), default=0.0) for c in curves]
    if level is None:
        level = min(tops) if tops else 0.0
    out: list[CurvePoint | None] = []
    for c in curves:
        pts = sorted(
            (p for p in c.points if not p.partial and p.completed > 0 and p.role == "grid"),
            key=lambda p: p.output_tps_per_gpu,
        ) or sorted(c.points, key=lambda p: p.output_tps_per_gpu)
        below = [p for p in pts if p.output_tps_per_gpu <= level]
        above = [p for p in pts if p.output_tps_per_gpu >= level]
        if not below or not above:
            out.append(None)
            continue
        a, b = below[-1], above[0]
        out.append(a if b.output_tps_per_gpu == a.output_tps_per_gpu else _point_at(a, b, level))
    return out


@dataclass
class RunComparison:
    curve: RunCurve
    capacity: CurvePoint | None  # at_slo.point: where the run is priced and compared
    at_matched_load: CurvePoint | None
    cost_rows: list  # bench.cost.CostRow at capacity (or best point when no SLO is given)
    basis: str  # "SLO capacity" or "peak throughput"
    at_slo: Capacity | None = None


def compare_runs(
    curves: Sequence[RunCurve], slo: Sequence[Threshold], catalogue, utilisation: float = 1.0
) -> list[RunComparison]:
    """The side-by-side facts `compare`, the dashboard and the deck all show."""
    caps = [capacity_at_slo(curve, slo) for curve in curves]
    # Equal load: the lower of the SLO capacities (where both still serve), else the
    # highest throughput every run reaches.
    values = [c.value for c in caps if c.value]
    matched = matched_load(curves, min(values) if slo and len(values) == len(caps) else None)
    out = []
    for curve, at_match, cap in zip(curves, matched, caps, strict=True):
        basis = "SLO capacity" if slo else "peak throughput"
        out.append(
            RunComparison(
                curve,
                cap.point,
                at_match,
                cost_rows_at(curve, cap.point, catalogue, utilisation),
                basis,
                cap,
            )
        )
    return out


def cheapest(rows) -> object | None:
    priced = [r for r in rows if r.output_usd_per_mtok is not None]
    return min(priced, key=lambda r: r.output_usd_per_mtok_at_utilisation) if priced else None


@dataclass
class Ratio:
    """A's capacity over B's, with what it is worth.

    bound: None (a measured ratio), "at least" or "at most" (one side is a bound); `low` and
    `high` come from the two capacities' intervals (None = open); `flips` is True when that
    range holds 1, i.e. which system is bigger is within the measurements' confidence.
    """

    value: float
    low: float | None
    high: float | None
    bound: str | None
    flips: bool
    # both runs simulated with the published fit: the fit's error on a ratio of two GPUs
    # (accuracy.ratio_error) and its basis, in place of each side's error
    sim_error: float | None = None
    sim_basis: str | None = None

    def text(self) -> str:
        head = f"{self.bound} {self.value:.2f}x" if self.bound else f"{self.value:.2f}x"
        if self.low is None and self.high is None:
            return head
        return f"{head} (range {_r(self.low)}-{_r(self.high)})"


def _r(x: float | None) -> str:
    return "open" if x is None else f"{x:.2f}x"


def capacity_ratio(a: Capacity | None, b: Capacity | None) -> tuple[Ratio | None, str | None]:
    """(ratio, None) or (None, why there is none), for A's capacity over B's."""
    if a is None or b is None:
        return None, "a run has no capacity"
    if a.kind in ("none", "below") or b.kind in ("none", "below"):
        who = (
            "both"
            if a.kind == b.kind
            else ("the first" if a.kind in ("none", "below") else "the second")
        )
        return None, f"{who} met the SLO at no load tested, so there is no ratio"
    if a.kind == "at_least" and b.kind == "at_least":
        return None, "both capacities are lower bounds (every load met the SLO): no ratio"
    if not a.value or not b.value:
        return None, "a capacity is zero"
    value = a.value / b.value
    bound = "at least" if a.kind == "at_least" else "at most" if b.kind == "at_least" else None

    def div(x, y):
        return None if x is None or not y else x / y

    low, high = div(a.low, b.high), div(a.high, b.low)
    sim = _shared_sim_error(a, b)
    if None in (a.low, a.high, b.low, b.high):
        sim = None  # a bound or an unknown interval: each side's own range, as measured
    if sim is not None:
        # each side's range without its own simulator error, then the ratio's error on top
        ea, eb, r = a.sim_error or 0.0, b.sim_error or 0.0, sim[0]
        low = div(a.low * (1 + ea), b.high / (1 + eb)) / (1 + r)
        high = div(a.high / (1 + ea), b.low * (1 + eb)) * (1 + r)
    if bound == "at least":
        high = None
    elif bound == "at most":
        low = None
    # An end left open by a bound counts as reaching past 1; an unknown interval (no
    # per-request data) claims nothing either way.
    known = (low is not None or bound == "at most") and (high is not None or bound == "at least")
    flips = known and (low is None or low <= 1.0) and (high is None or high >= 1.0)
    if sim is None:
        return Ratio(value, low, high, bound, flips), None
    return Ratio(value, low, high, bound, flips, *sim), None


def _shared_sim_error(a: Capacity, b: Capacity) -> tuple[float, str] | None:
    """The published fit's error on a ratio of two GPUs, when both capacities were simulated
    with it (their errors are the same fit's); None otherwise (a measured side, or a
    calibration profile, whose own error each side keeps)."""
    if not (a.sim_category and b.sim_category):
        return None
    from bench.sim.profiles.accuracy import ratio_error

    return ratio_error(a.sim_category, b.sim_category)


def ratio_sentence(comparisons: Sequence[RunComparison]) -> str | None:
    """One sentence a reader can repeat: A delivers X× B's capacity at Y× lower $/Mtok, with
    the SLO it holds at, whether a side is a bound, and whether the verdict could flip."""
    if len(comparisons) < 2:
        return None
    a, b = comparisons[0], comparisons[1]
    ratio, why = capacity_ratio(a.at_slo, b.at_slo)
    if ratio is None:
        return f"No capacity ratio of {a.curve.legend} to {b.curve.legend}: {why}." if why else None
    slo = f"the SLO {slo_text(a.at_slo.slo)}" if a.at_slo.slo else "peak throughput (no SLO)"
    text = (
        f"{a.curve.legend} serves {ratio.text()} the output tokens/s per GPU of "
        f"{b.curve.legend} at {slo}"
    )
    if ratio.bound:
        side = a if ratio.bound == "at least" else b
        text += f" ({side.curve.legend} met the SLO at every load tested, so this is a bound)"
    ca, cb = cheapest(a.cost_rows), cheapest(b.cost_rows)
    if ca is not None and cb is not None:
        ua, ub = ca.output_usd_per_mtok_at_utilisation, cb.output_usd_per_mtok_at_utilisation
        if ua and ub:
            how = f"{ub / ua:.2f}x less" if ua <= ub else f"{ua / ub:.2f}x more"
            text += (
                f"; on each one's cheapest tier ({ca.tier} ${ua:.3f} vs {cb.tier} ${ub:.3f} "
                "per million output tokens) "
                f"it costs {how}"
            )
            text += _tier_flips(a, b, ua <= ub)
    text += "."
    covers = range_words(a.at_slo, b.at_slo, with_sim=ratio.sim_error is None)
    if ratio.sim_error is not None:
        covers += f", the {ratio.sim_basis} (±{ratio.sim_error:.0%})"
    if covers and (ratio.low is not None or ratio.high is not None):
        text += f" The range covers {covers}."
    if ratio.flips:
        text += (
            " Which is larger is within that range: the verdict could flip (a denser grid, "
            "more draws or more requests per point narrow it)."
        )
    return text


def _tier_flips(a: RunComparison, b: RunComparison, a_cheaper: bool) -> str:
    """', but more on hyperscaler-on-demand': the tiers both GPUs have on which the
    comparison of A's $/Mtok with B's turns the other way, since the tier can decide it."""
    theirs = {r.tier: r.output_usd_per_mtok_at_utilisation for r in b.cost_rows}
    flipped = [
        r.tier
        for r in a.cost_rows
        if r.output_usd_per_mtok_at_utilisation and theirs.get(r.tier)
        and (r.output_usd_per_mtok_at_utilisation > theirs[r.tier]) == a_cheaper
    ]  # fmt: skip
    if not flipped:
        return ""
    return f", but {'more' if a_cheaper else 'less'} on {', '.join(flipped)}"


def range_words(*caps: Capacity | None, with_sim: bool = True) -> str:
    """What the capacities' ranges cover, in words, once for all of them."""
    seen: list[str] = []
    for cap in caps:
        if cap is None:
            continue
        for part in cap.includes(with_sim) if cap.parts else []:
            if part not in seen:
                seen.append(part)
    return ", ".join(seen)


# ---------------------------------------------------------------- which SLO


def slo_to_store(thresholds: Sequence[Threshold]) -> list[str]:
    """How a sweep stores its SLO (run extra `sweep.slo`): the one grammar's text, which
    stored_slo parses back."""
    return [str(t) for t in thresholds]


def stored_slo(infos) -> list[Threshold]:
    """The SLO the runs were swept against (stored with each run), when they all agree."""
    found = []
    for info in infos:
        sweep = (info.extra_json or {}).get("sweep") or {}
        found.append(tuple(sweep.get("slo") or ()))
    if not found or not found[0] or any(f != found[0] for f in found):
        return []
    try:
        return parse_slo(list(found[0]), flag="stored SLO")
    except ValueError:
        return []


def class_slo(info) -> list[Threshold]:
    """The SLO a stored run's traffic classes are judged at: the one its sweep stored, else
    each class's own from its stored scenario (CLASS:NAME thresholds); [] when neither."""
    found = stored_slo([info])
    if found:
        return found
    out: list[Threshold] = []
    for c in info.scenario().get("classes") or ():
        if not isinstance(c, dict) or not c.get("slo") or not c.get("name"):
            continue
        try:
            out += scoped_slo(parse_slo(c["slo"], flag=f"classes.{c['name']}.slo"), c["name"])
        except ValueError:
            return []
    return out


def class_verdict(point: CurvePoint, name: str, slo: Sequence[Threshold]) -> bool | None:
    """Whether traffic class `name` meets its own SLO at this point (the CLASS:NAME
    thresholds of `slo`, read on the class's own figures); None when it has none here."""
    own = [t for t in slo if class_scope(t.metric)[0] == name]
    sub = point.classes.get(name)
    if not own or sub is None:
        return None
    return sub.meets([Threshold(class_scope(t.metric)[1], t.op, t.limit) for t in own])


@dataclass
class ClassRow:
    """One traffic class at one load point: what the per-class views (run page, report,
    API) show. `figures` is the class's own CurvePoint (its prompt_cache too)."""

    point: CurvePoint
    name: str
    figures: CurvePoint
    meets: bool | None  # its own SLO (None: no SLO of its own)


def class_rows(curve: RunCurve, slo: Sequence[Threshold]) -> list[ClassRow]:
    """Each load point's traffic classes, by offered load (then the order measured); []
    for a run without classes."""
    points = sorted(curve.points, key=lambda p: (p.offered or 0.0, p.load_point))
    return [
        ClassRow(p, name, sub, class_verdict(p, name, slo))
        for p in points
        for name, sub in sorted(p.classes.items())
    ]


@dataclass
class ClassView:
    """A stored run's traffic classes as every per-class view shows them (run page, API):
    their SLOs, their rows per load point, and a sweep's capacity naming the class that binds."""

    slo: list[Threshold]
    rows: list[ClassRow]
    capacity: Capacity | None

    @property
    def binding(self) -> str | None:
        return self.capacity.binding if self.capacity is not None else None


def class_view(curve: RunCurve, info) -> ClassView:
    """`info` is the run's stored RunInfo (its SLO, its scenario's classes)."""
    if not any(p.classes for p in curve.points):
        return ClassView([], [], None)
    slo = class_slo(info)
    capacity = None
    if slo and len(curve.points) > 1:  # a sweep: the load where the first class breaks
        capacity = capacity_at_slo(curve, slo, curve.sim_error)
    return ClassView(slo, class_rows(curve, slo), capacity)


def resolve_slo(given, infos) -> tuple[list[Threshold], str]:
    """The SLO every view uses by default, and where it came from.

    `given` (text in the one grammar, or Thresholds) wins; None means "not given": the SLO
    stored with the runs when they all agree. CLI, API, dashboard and exports call this, so
    the same runs get the same capacity everywhere. Source: "given", "stored with the runs"
    or "none". Raises ValueError for a malformed SLO.
    """
    if isinstance(given, str):
        thresholds = parse_slo(given, flag="--slo")
        return thresholds, "given" if thresholds else "none"
    if given is not None:
        thresholds = list(given)
        return thresholds, "given" if thresholds else "none"
    thresholds = stored_slo(infos)
    return thresholds, "stored with the runs" if thresholds else "none"


def slo_line(thresholds: Sequence[Threshold], source: str) -> str:
    """'SLO used: p99_ttft_ms<=2000,p99_tpot_ms<=50 (stored with the runs)'."""
    if not thresholds:
        return "SLO used: none (capacity is each run's peak throughput; give --slo)"
    return f"SLO used: {slo_text(thresholds)} ({source})"
