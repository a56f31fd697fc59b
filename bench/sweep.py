"""Many load points over a grid of loads; automatic sweeps; SLO-constrained capacity; knee.

Each point is a load point of one stored run: the scenario with its load changed (rate or
concurrency), warm-up and cool-down excluded from the point's statistics. A stop rule ends
the sweep early when the server is failing or far beyond the SLO, so a sweep never hammers
a dead server for an hour.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from bench.curves import SPREAD_ROLES, Capacity, capacity_at_slo, point_from_summary
from bench.executor import RunPlan, RunResult, plan_from_scenario
from bench.metrics import Summary, Threshold, meets_slo
from bench.scenario import Scenario, mean_rate
from bench.shapes import SHAPES

# The SLO search stops narrowing a bracket of rates narrower than this fraction of its top.
MIN_BRACKET = 0.005
# The bracketing loads are re-measured (fresh draws, longer points) at most this often:
# when first bracketed, at the narrowed bracket, and once more if that spread was smaller.
MAX_SPREADS = 3
SPREAD_AT = 0.10

# Stop rule defaults: half the requests failing, or a latency SLO broken tenfold.
STOP_ERROR_RATE = 0.5
STOP_SLO_FACTOR = 10.0


@dataclass(frozen=True)
class PointSpec:
    kind: str  # "rate" (open loop, req/s; inf allowed) or "concurrency" (closed loop users)
    value: float

    @property
    def title(self) -> str:
        if self.kind == "rate":
            return "rate inf" if math.isinf(self.value) else f"rate {self.value:g} req/s"
        return f"concurrency {int(self.value)}"


@dataclass
class PointResult:
    index: int
    spec: PointSpec
    summary: Summary
    role: str = "grid"  # grid, synchronous, throughput, auto, slo-search, draw, long
    meets_slo: bool | None = None
    run: RunResult | None = None  # what the executor returned (records, served models)
    draw: int | None = None  # "draw" points: which fresh draw of prompts and arrivals


@dataclass
class SweepResult:
    run_id: str | None
    points: list[PointResult] = field(default_factory=list)
    stopped_early: str | None = None
    capacity: PointResult | None = None  # the last complete load meeting the SLO
    capacity_note: str = ""
    knee: PointResult | None = None
    interrupted: bool = False
    # The capacity interpolated to the SLO boundary (bench.curves.capacity_at_slo), per GPU.
    at_slo: Capacity | None = None
    scenario: Scenario | None = None  # as run (bench.drive.measure): the simulated GPUs, say


def parse_values(text: str, flag: str) -> list[float]:
    """'1,2,4,inf' -> [1.0, 2.0, 4.0, inf]; a clear error names the flag."""
    out = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        if item.lower() in ("inf", "infinity"):
            out.append(math.inf)
            continue
        try:
            value = float(item)
        except ValueError:
            raise ValueError(f"{flag} {text!r}: {item!r} is not a number (or inf)") from None
        if value <= 0:
            raise ValueError(f"{flag} {text!r}: values must be > 0")
        out.append(value)
    if not out:
        raise ValueError(f"{flag} is empty")
    return out


def scenario_at(scenario, spec: PointSpec, *, point_duration_s: float | None = None):
    """A copy of the scenario with its load set to one sweep point.

    Rates keep the scenario's shape: a bursty on/off scenario swept at 8 req/s stays bursty,
    with every rate scaled so its mean is 8 req/s.
    """
    scenario.run_seed()  # drawn once, before copying, so every point's copy shares it
    sc = scenario.model_copy(deep=True)
    load = sc.load
    if spec.kind == "concurrency":
        load.shape, load.concurrency = "closed", int(spec.value)
        if point_duration_s:
            load.duration_s = point_duration_s
        return sc
    rate = spec.value
    base = mean_rate(sc)
    shape = SHAPES.get(load.shape)
    if shape.at_rate is not None:  # a trace: its own pattern and lengths, at this mean rate
        shape.at_rate(load, rate)
    elif shape.rate_shape or shape.scale is None or base is None or math.isinf(rate):
        if not shape.rate_shape:
            load.shape = "poisson"
        load.request_rate = rate
    else:
        shape.scale(load, rate / base)
    if point_duration_s and not math.isinf(rate):
        load.num_prompts = max(1, math.ceil(rate * point_duration_s))
        load.duration_s = None
    return sc


def draw_seed(run_seed: int, draw: int) -> int:
    """The seed of fresh draw `draw` of a run: derived, so a rerun draws the same again."""
    return int(np.random.SeedSequence([run_seed, 7919, draw]).generate_state(1)[0])


def _lengthen(sc, factor: float) -> None:
    """A point `factor` times as long, when its length is a prompt count or a duration."""
    load = sc.load
    if load.num_prompts:
        load.num_prompts = max(1, math.ceil(load.num_prompts * factor))
    elif load.duration_s:
        load.duration_s *= factor


def knee(points: Sequence[PointResult], metric: str = "p99_e2el_ms") -> PointResult | None:
    """The point after which more offered load adds little throughput but much latency.

    Walking the points in order of throughput: the knee is the last point before one whose
    output throughput grows by less than 10% while `metric` grows by more than 50%.
    """
    pts = sorted(
        (
            p
            for p in points
            if p.summary.completed and not p.summary.interrupted and p.role not in SPREAD_ROLES
        ),
        key=lambda p: (p.spec.value, p.summary.output_tokens_per_s),
    )
    pts = [p for p in pts if p.spec.kind == (pts[0].spec.kind if pts else "rate")]
    for a, b in zip(pts, pts[1:], strict=False):
        ta, tb = a.summary.output_tokens_per_s, b.summary.output_tokens_per_s
        la, lb = a.summary.value(metric), b.summary.value(metric)
        if ta <= 0 or not la or lb is None:
            continue
        if tb < ta * 1.10 and lb > la * 1.5:
            return a
    return pts[-1] if pts else None


def meets(summary: Summary, slo: Sequence[Threshold]) -> bool:
    return meets_slo(slo, summary.value, summary.completed, summary.error_rate)


def stop_reason(summary: Summary, slo: Sequence[Threshold], max_error_rate: float) -> str | None:
    """Why the sweep should not go to higher loads, or None."""
    if summary.completed + summary.failed == 0:
        return "no request finished"
    if summary.error_rate > max_error_rate:
        return f"error rate {summary.error_rate:.0%} > {max_error_rate:.0%}"
    for t in slo:
        value = summary.value(t.metric)
        if t.op in ("<", "<=") and value is not None and value > t.limit * STOP_SLO_FACTOR:
            return f"{t.metric} {value:,.0f} is over {STOP_SLO_FACTOR:g}x the SLO {t}"
    return None


class Sweep:
    """Runs a SweepPlan's points through a RunSession (bench.session) and keeps their results.

    The session's executor (local, distributed or virtual time) measures each point; the
    grid, auto sweep, SLO search, stop rules and conclusions here are the same for all.
    """

    def __init__(
        self,
        scenario,
        session,
        plan: SweepPlan,
        plan_for: Callable[..., RunPlan] = plan_from_scenario,
        on_point: Callable[[PointResult, int | None], None] | None = None,
    ) -> None:
        """`plan_for(scenario, load_point=i)` resolves one point's scenario into its plan."""
        self.scenario = scenario
        self.session = session
        self.sweep_plan = plan
        self.slo = list(plan.thresholds)
        self.plan_for = plan_for
        self.on_point = on_point
        self.result = SweepResult(run_id=session.run_id)

    def measure(
        self,
        spec: PointSpec,
        role: str = "grid",
        remaining: int | None = None,
        *,
        draw: int | None = None,
        length: float = 1.0,
    ) -> PointResult:
        """One point; `draw` k sends fresh prompts and arrivals (a seed of its own, derived
        from the run's, so a rerun repeats it); `length` scales the point's duration."""
        duration = self.sweep_plan.point_duration_s
        sc = scenario_at(self.scenario, spec, point_duration_s=duration and duration * length)
        if length != 1.0 and not duration:
            _lengthen(sc, length)
        if draw is not None:
            sc.seed = draw_seed(self.scenario.run_seed(), draw)
        plan = self.plan_for(sc, load_point=len(self.result.points))
        index = plan.load_point
        run, summary = self.session.point(
            plan,
            title=f"point {index + 1}: {spec.title}",
            mode="closed" if spec.kind == "concurrency" else sc.load.shape,
            target_rate=spec.value if spec.kind == "rate" else None,
            concurrency=int(spec.value) if spec.kind == "concurrency" else sc.load.max_concurrency,
            warmup_s=self.sweep_plan.warmup_s,
            cooldown_s=self.sweep_plan.cooldown_s,
            params={
                "role": role, "kind": spec.kind, "value": spec.value,
                **({"draw": draw} if draw is not None else {}),
                **({"length": length} if length != 1.0 else {}),
            },
        )  # fmt: skip
        point = PointResult(
            index,
            spec,
            summary,
            role,
            meets(summary, self.slo) if self.slo else None,
            run,
            draw,
        )
        self.result.points.append(point)
        if run.interrupted:
            self.result.interrupted = True
        if self.on_point is not None:
            self.on_point(point, remaining)
        return point

    def grid(self, specs: Sequence[PointSpec]) -> None:
        for i, spec in enumerate(specs):
            point = self.measure(spec, remaining=len(specs) - i - 1)
            if self.result.interrupted:
                return
            reason = stop_reason(point.summary, self.slo, self.sweep_plan.max_error_rate)
            if reason and i < len(specs) - 1:
                self.result.stopped_early = f"stopped after {spec.title}: {reason}"
                return

    def auto(self, n_points: int) -> None:
        """guidellm-style: synchronous baseline, saturated throughput, then N rates between."""
        sync = self.measure(PointSpec("concurrency", 1), role="synchronous", remaining=n_points + 1)
        if self.result.interrupted:
            return
        top = self.measure(PointSpec("rate", math.inf), role="throughput", remaining=n_points)
        if self.result.interrupted:
            return
        lo, hi = sync.summary.requests_per_s, top.summary.requests_per_s
        if lo <= 0 or hi <= lo:
            self.result.stopped_early = (
                f"auto sweep: saturated throughput {hi:.3g} req/s is not above the synchronous "
                f"{lo:.3g} req/s, so there is no range to sweep"
            )
            return
        rates = [lo + (hi - lo) * (i + 1) / (n_points + 1) for i in range(n_points)]
        self.grid([PointSpec("rate", round(r, 4)) for r in rates])

    def slo_search(self, iterations: int, draws: int = 0) -> None:
        """Bracket the SLO boundary, narrow it, then measure what moves it.

        While no load failed, the highest load is doubled; while none passed, the lowest is
        halved; then each point halves the gap between the highest passing and the lowest
        failing load, until the bracket is narrower than the capacity's measured range (so
        where the grid's points fall does not decide the answer) or `iterations` points are
        spent. Once the bracket is within SPREAD_AT of the capacity, and again where the
        bisection ends, the two bracketing loads are measured again: `draws` times with
        fresh prompts and arrivals, and once each at twice the point length; that spread is
        the range the bracket must become narrower than. Interrupted points count as neither.
        """
        if not self.slo:
            return
        kind = self.result.points[0].spec.kind if self.result.points else "rate"
        budget, spread_rel, measured, spreads = iterations, 0.0, None, 0
        while not self.result.interrupted:
            cap = self.capacity(with_sim_error=False)
            # The spread is measured once the bracket is within SPREAD_AT of the capacity
            # (a wide bracket's spread says more about the bracket than about reruns), so
            # the bisection then knows when the bracket is narrower than what a rerun moves.
            nxt = self._next_search_load(kind, spread_rel) if budget > 0 else None
            near = (
                cap.kind == "interpolated"
                and cap.value
                and (cap.bracket_width or 0.0) <= SPREAD_AT * cap.value
            )
            fresh = nxt is None or (measured is None and near)
            if draws > 0 and cap.kind == "interpolated" and fresh:
                bracket = (cap.last_pass.offered, cap.first_fail.offered)
                if bracket == measured or spreads >= MAX_SPREADS:
                    return
                measured, spreads = bracket, spreads + 1
                self._measure_spread(kind, bracket, draws)
                cap = self.capacity(with_sim_error=False)
                if cap.value and cap.spread_width is not None:  # at the latest bracket
                    spread_rel = cap.spread_width / cap.value
                continue
            if nxt is None:
                return
            budget -= 1
            self.measure(PointSpec(kind, nxt), role="slo-search")

    def _measure_spread(self, kind: str, bracket: tuple[float, float], draws: int) -> None:
        """The bracketing loads again: fresh draws, then once at twice the length (a load
        already re-measured so is not measured again: its draw would repeat exactly)."""
        done = {(p.role, p.draw, p.spec.value) for p in self.result.points}
        todo = [("draw", k, v) for k in range(1, draws + 1) for v in bracket]
        todo += [("long", None, v) for v in bracket]
        for role, k, value in todo:
            if self.result.interrupted:
                return
            if (role, k, value) not in done:
                length = 2.0 if role == "long" else 1.0
                self.measure(PointSpec(kind, value), role=role, draw=k, length=length)

    def _next_search_load(self, kind: str, spread_rel: float) -> float | None:
        """The next load the search measures, or None when the bracket is narrow enough."""
        done = [
            p
            for p in self.result.points
            if p.spec.kind == kind and not p.summary.interrupted and p.role not in SPREAD_ROLES
        ]
        passing = [p for p in done if p.meets_slo]
        failing = [p for p in done if p.meets_slo is False]
        if not done:
            return None
        if not failing:
            top = max(p.spec.value for p in done)
            return None if math.isinf(top) else top * 2
        if not passing:
            low = min(p.spec.value for p in done)
            if math.isinf(low):
                low = max(p.summary.requests_per_s for p in done) or 1.0
            nxt = math.floor(low / 2) if kind == "concurrency" else low / 2
            if nxt <= 0 or (kind == "rate" and nxt < 1e-3):
                return None
            return nxt
        lowest_fail = min(failing, key=lambda p: p.spec.value)
        below = [p for p in passing if p.spec.value < lowest_fail.spec.value]
        best = max(below, key=lambda p: p.spec.value) if below else None
        lo, hi = (best.spec.value if best else 0.0), lowest_fail.spec.value
        cap = self.capacity(with_sim_error=False)
        if cap.kind == "interpolated" and cap.last_pass is not cap.first_fail:
            # the bracket of the fitted boundary: one noisy failure does not steer the search
            lo, hi = cap.last_pass.offered, cap.first_fail.offered
        if math.isinf(hi):
            hi = max(p.summary.requests_per_s for p in self.result.points) * 1.2
        mid = (lo + hi) / 2
        if kind == "concurrency":
            mid = math.floor(mid)
            return None if mid <= lo or mid >= hi else mid
        if hi - lo < max(MIN_BRACKET * hi, 1e-3):
            return None
        if cap.kind == "interpolated" and cap.value and cap.bracket_width is not None:
            spread = max(cap.spread_width or 0.0, spread_rel * cap.value)
            if cap.bracket_width <= spread:
                return None  # narrower than the range: interpolation no longer decides
        return mid

    def capacity(self, with_sim_error: bool = True) -> Capacity:
        """The capacity of the points so far (bench.curves.capacity_at_slo, the one every
        view uses); without the simulator's error, for deciding where to measure next."""
        curve = sweep_curve(self.result.points, self._gpus())
        if with_sim_error and self.session is not None and getattr(self.session, "simulated", 0):
            # described as a stored simulated run is, so capacity_at_slo resolves its error
            # (a calibration profile's own, else the published fit's for its category)
            curve.simulated = True
            curve.gpu_type, curve.model = self.scenario.gpu.type, self.scenario.target.model
            from bench.sim.profiles.accuracy import run_errors

            ex = getattr(self.session, "executor", None)
            options = getattr(ex, "options", None)
            curve.sim_error = run_errors(
                getattr(ex, "calibration", None), getattr(options, "disagg", None),
                curve.gpu_type, curve.model, getattr(options, "mtp", None),
                getattr(ex, "engine", None),
            )  # fmt: skip
        return capacity_at_slo(curve, self.slo)

    def _gpus(self) -> int:
        return max(1, getattr(getattr(self.scenario, "gpu", None), "count", 1) or 1)

    def conclude(self) -> SweepResult:
        """Capacity (bench.curves.capacity_at_slo, the one every view uses) and the knee;
        an interrupted point is neither."""
        res = self.result
        if self.slo:
            res.at_slo = cap = self.capacity()
            measured = cap.last_pass or (cap.point if cap.kind == "at_least" else None)
            res.capacity = next(
                (p for p in res.points if measured and p.index == measured.load_point), None
            )
            res.capacity_note = "; ".join(
                [f"capacity {cap.text()}"]
                + ([f"decided by {cap.deciding}"] if cap.deciding else [])
                + cap.flags
            )
        res.knee = knee(res.points)
        return res


def sweep_curve(points: Sequence[PointResult], gpus: int = 1):
    """A sweep's points as a bench.curves.RunCurve, so the sweep's capacity is the one
    `compare`, the dashboard and the exports compute from the stored run."""
    from bench.curves import RunCurve

    curve = RunCurve("", "sweep", "sweep", None, gpus, None, False, None, "running")
    for p in points:
        point = point_from_summary(
            p.summary.to_json(), load_point=p.index, title=p.spec.title, offered=p.spec.value,
            gpus=gpus,
        )  # fmt: skip
        point.offered_kind = p.spec.kind
        point.role, point.draw = p.role, p.draw
        curve.points.append(point)
    return curve


@dataclass
class SweepPlan:
    """What to measure: a grid of points or an auto sweep, the SLO and each point's windows."""

    specs: list[PointSpec] = field(default_factory=list)
    auto: int | None = None  # guidellm-style: N rates between synchronous and saturated
    thresholds: list[Threshold] = field(default_factory=list)
    slo_iterations: int = 8
    # Fresh draws of prompts and arrivals at the two loads bracketing the SLO boundary (and
    # one pair of points twice as long): what a rerun would move, measured (0: not measured).
    slo_draws: int = 2
    point_duration_s: float | None = None
    warmup_s: float = 0.0
    cooldown_s: float = 0.0
    max_error_rate: float = STOP_ERROR_RATE

    def planned_points(self) -> int:
        base = len(self.specs) if self.auto is None else self.auto + 2
        spread = 2 * (self.slo_draws + 1) if self.slo_draws else 0
        return base + (self.slo_iterations + spread if self.thresholds else 0)


def sweep_extra(result: SweepResult) -> dict:
    """What the stored run keeps about the sweep's conclusions (capacity, knee)."""
    return {
        "sweep": {
            "capacity_load_point": result.capacity.index if result.capacity else None,
            "capacity_note": result.capacity_note,
            "capacity": _capacity_json(result.at_slo),
            "knee_load_point": result.knee.index if result.knee else None,
            "stopped_early": result.stopped_early,
        }
    }


def _capacity_json(cap: Capacity | None) -> dict | None:
    if cap is None:
        return None
    return {
        "kind": cap.kind,
        "output_tokens_per_s_per_gpu": cap.value,
        "low": cap.low,
        "high": cap.high,
        "deciding": cap.deciding,
        "binding_class": cap.binding,  # the traffic class whose own SLO broke first
        "flags": cap.flags,
        "parts": {name: list(span) for name, span in cap.parts.items()},
        "simulator_error": cap.sim_error,
        "covers": cap.covers(),
    }
