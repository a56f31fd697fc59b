"""The buying answer: how many GPUs each compared system needs for a demand, and what it costs.

Given a demand (mean requests/s, or output tokens/day) with a peak factor, and each run's
capacity at the SLO (bench.curves.capacity_at_slo: the same figure `compare` prints), a
plan sizes every system for the peak:

    replicas = ceil(mean demand x peak factor / capacity per replica)
    GPUs     = replicas x GPUs per replica (the run's tensor-parallel group)
    nodes    = ceil(GPUs / GPUs per node)
    $/month  = GPUs x price per GPU-hour x 730 h            (every tier of the GPU)
    $/Mtok   = $/month / output tokens served per month at the mean demand x 1e6

The fleet is paid for around the clock and sized for the peak, so $/Mtok here includes the
idle capacity the peak factor and the rounding up leave; it is higher than the busy-GPU
$/Mtok at capacity (InferenceX's convention), which is listed beside it.

A capacity that is a lower bound ("at least": every load met the SLO) gives a GPU count
that is enough but maybe more than needed; a run with no load meeting the SLO cannot be
sized and says so. Prices come from the catalogue (bench/data/prices.yaml), never typed here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.cost import (
    HOURS_PER_YEAR,
    Catalogue,
    PriceCatalogueError,
    dollars_per_mtok,
    price_basis,
    price_per_gpu_hour,
    price_text,
)
from bench.curves import RunComparison, with_range
from bench.metrics import Threshold, slo_text

HOURS_PER_MONTH = HOURS_PER_YEAR / 12  # 730
SECONDS_PER_DAY = 86400.0
DEFAULT_GPUS_PER_NODE = 8  # an HGX/DGX board; MI300X platforms also carry 8


@dataclass(frozen=True)
class Demand:
    """What must be served: a mean rate and the factor by which the busiest hour exceeds it.

    Exactly one of `requests_per_s` and `output_tokens_per_day` is set. `source` says where
    the figure came from ("given", "the scenario's mean rate").
    """

    requests_per_s: float | None = None
    output_tokens_per_day: float | None = None
    peak_factor: float = 1.0
    source: str = "given"
    shape: str | None = None  # the request shape (workload_shape) when the demand has one
    # A demand given as a mix of traffic classes: mean req/s per class (requests_per_s is
    # then their sum). Each run is sized so that no class gets more per replica than it had
    # at the measured capacity (mix_peak).
    mix: dict[str, float] | None = None

    def __post_init__(self) -> None:
        given = [v for v in (self.requests_per_s, self.output_tokens_per_day) if v is not None]
        if len(given) != 1:
            raise ValueError("give exactly one demand: requests/s or output tokens/day")
        if not (math.isfinite(given[0]) and given[0] > 0):
            raise ValueError(f"demand must be a positive number, got {given[0]!r}")
        if not (math.isfinite(self.peak_factor) and self.peak_factor >= 1):
            raise ValueError(f"peak factor must be >= 1 (peak / mean), got {self.peak_factor!r}")

    @property
    def unit(self) -> str:
        return "req/s" if self.requests_per_s is not None else "output tokens/day"

    def text(self) -> str:
        if self.mix:
            parts = ", ".join(f"{k} {v:.3g}" for k, v in self.mix.items())
            return f"{self.requests_per_s:.3g} req/s mean ({parts}), peak x{self.peak_factor:g} ({self.source})"
        if self.requests_per_s is not None:
            rps = self.requests_per_s
            head = f"{rps:,.0f} req/s mean" if rps >= 100 else f"{rps:.3g} req/s mean"
        else:
            head = f"{self.output_tokens_per_day:,.0f} output tokens/day mean"
        return f"{head}, peak x{self.peak_factor:g} ({self.source})"


@dataclass
class TierCost:
    """One pricing tier of a sized fleet."""

    tier: str
    kind: str  # on_demand, reserved, spot, owned, ...
    provider: str
    source: str
    date: str
    price_usd_per_gpu_hr: float | None
    usd_per_month: float | None
    usd_per_mtok: float | None  # at the mean demand, idle capacity included
    busy_usd_per_mtok: float | None  # at capacity, every GPU busy (InferenceX's figure)
    basis: str = "quoted"  # bench.cost.price_basis: quoted, derived (how), computed
    # (low, high) of each figure (span_text words it); None = that end is open or unknown.
    # The range is what the GPU count's range costs, so it covers what the capacity's range
    # does: sampling, bracket, reruns, and a simulated run's expected error.
    usd_per_month_range: tuple[float | None, float | None] = (None, None)
    usd_per_mtok_range: tuple[float | None, float | None] = (None, None)
    busy_usd_per_mtok_range: tuple[float | None, float | None] = (None, None)


@dataclass
class SystemPlan:
    """One compared system sized for the demand; `gpus` None when it cannot be sized."""

    run_id: str
    legend: str  # the run's legend, "(simulated)" included
    gpu_type: str | None
    gpus_per_replica: int
    capacity_kind: str  # bench.curves.Capacity.kind
    capacity_text: str  # Capacity.text(): the figure with its interval or bound
    replica_capacity: float | None  # per replica, in the demand's unit per second
    replicas: int | None
    gpus: int | None
    gpus_range: tuple[int | None, int | None]  # from the capacity's range (Capacity.covers)
    nodes: int | None
    tiers: list[TierCost] = field(default_factory=list)
    cheapest: TierCost | None = None
    note: str | None = None  # why it is not sized, or why the count is a bound


@dataclass
class Recommendation:
    """The cheapest option meeting the SLO."""

    legend: str
    gpu_type: str
    gpus: int
    nodes: int
    tier: TierCost
    sentence: str


@dataclass
class Plan:
    """The buying answer, for the CLI's `plan`, the API's /api/plan and the Report.

    Shape (all plain data; the deck's first content slide and the dashboard panel lay it out):
      demand: Demand           mean rate, peak factor, where it came from
      slo, slo_source          the SLO the capacities are at and where it came from
      gpus_per_node            for the node count
      systems: [SystemPlan]    per run: capacity, replicas, GPUs (+ range), nodes,
                               tiers: [TierCost] ($/GPU-hr, $/month, $/Mtok), cheapest tier
      recommendation           the cheapest system x tier that meets the SLO, or None
      assumptions: [str]       every assumption, one line each, to print under the answer
    """

    demand: Demand
    slo: list[Threshold]
    slo_source: str
    gpus_per_node: int
    systems: list[SystemPlan]
    recommendation: Recommendation | None
    assumptions: list[str]

    @property
    def sentence(self) -> str:
        if self.recommendation is not None:
            return self.recommendation.sentence
        return "No system can be sized: " + "; ".join(
            f"{s.legend}: {s.note}" for s in self.systems if s.note
        )


def parse_mix(text: str) -> dict[str, float]:
    """--mix 'chat=30,agent=10' -> {'chat': 30.0, 'agent': 10.0} (mean req/s per class)."""
    out: dict[str, float] = {}
    for item in text.replace(" ", ",").split(","):
        if not item:
            continue
        name, sep, value = item.partition("=")
        try:
            rate = float(value) if sep else math.nan
        except ValueError:
            rate = math.nan
        if not name or not (math.isfinite(rate) and rate > 0):
            raise ValueError(
                f"--mix item {item!r}: expected CLASS=REQ_PER_S with a positive rate, "
                "e.g. --mix chat=30,agent=10"
            )
        out[name] = rate
    if not out:
        raise ValueError("--mix: give at least one CLASS=REQ_PER_S")
    return out


def mix_peak(mix: dict[str, float], point, peak_factor: float) -> tuple[float, str | None]:
    """The total req/s a mixed demand must be sized at on a run measured with its own mix:
    each class's demand over its share of the run's requests at capacity, the largest (so
    no class gets more per replica than it had when every class met its SLO), and that
    class's name. A class the run never sent raises ValueError."""
    total = point.requests_per_s or 0.0
    need, by = 0.0, None
    for name, rate in mix.items():
        own = point.classes.get(name)
        share = own.requests_per_s / total if own is not None and total else 0.0
        if share <= 0:
            sent = ", ".join(sorted(point.classes)) or "none"
            raise ValueError(f"the demand's class {name!r} is not in the run (its classes: {sent})")
        if rate / share > need:
            need, by = rate / share, name
    return need * peak_factor, by


def _size(peak: float, capacity: float | None, gpus_per_replica: int) -> int | None:
    if capacity is None or capacity <= 0:
        return None
    return math.ceil(peak / capacity - 1e-9) * gpus_per_replica


def scenario_demand(scenario_text: str | None) -> Demand | None:
    """The demand a stored scenario describes: its own mean request rate (peak factor 1:
    a sweep of that shape already measured its bursts). None for closed loops."""
    import yaml

    from bench.scenario import ScenarioError, mean_rate, parse_scenario, workload_shape

    if not scenario_text:
        return None
    try:
        data = yaml.safe_load(scenario_text)
        sc = parse_scenario(yaml.safe_dump(data), source="stored scenario")
    except (yaml.YAMLError, ScenarioError, ValueError):
        return None
    rate = mean_rate(sc)
    if rate is None or not math.isfinite(rate) or rate <= 0:
        return None
    return Demand(
        requests_per_s=rate, source=f"the mean rate of scenario {sc.name!r}",
        shape=workload_shape(sc),
    )  # fmt: skip


def default_demand(infos) -> Demand | None:
    """The demand a plan uses when none is given: one stored with the first run (extra
    "demand": {"requests_per_s" or "output_tokens_per_day", "peak_factor"}, as the demo
    stores its example), else that run's scenario mean rate. The CLI's `plan`, the API and
    the Report all call this, so they size the same demand."""
    if not infos:
        return None
    stored = (infos[0].extra_json or {}).get("demand")
    if isinstance(stored, dict):
        try:
            return Demand(
                stored.get("requests_per_s"),
                stored.get("output_tokens_per_day"),
                float(stored.get("peak_factor", 1.0)),
                str(stored.get("source") or "stored with the run"),
            )
        except (TypeError, ValueError):
            pass
    return scenario_demand(infos[0].scenario_text)


def resolve_demand(
    infos, requests_per_s: float | None = None, peak_factor: float | None = None
) -> Demand | None:
    """The demand a view sizes: the mean rate given (its peak factor, else 1), else
    default_demand with a given peak factor replacing its own. The dashboard page and every
    download from it call this with the page's values, so they size the same fleet."""
    from dataclasses import replace

    if requests_per_s is not None:
        return Demand(requests_per_s=requests_per_s, peak_factor=peak_factor or 1.0)
    demand = default_demand(infos)
    if demand is not None and peak_factor is not None:
        demand = replace(demand, peak_factor=peak_factor)
    return demand


def plan_capacity(
    comparisons: Sequence[RunComparison],
    demand: Demand,
    catalogue: Catalogue,
    *,
    slo_source: str = "given",
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
) -> Plan:
    """Size every compared system for `demand` and price it on every tier of its GPU."""
    if gpus_per_node < 1:
        raise ValueError(f"GPUs per node must be >= 1, got {gpus_per_node}")
    slo = list(comparisons[0].at_slo.slo) if comparisons and comparisons[0].at_slo else []
    systems = [_system(c, demand, catalogue, gpus_per_node) for c in comparisons]
    options = [(s, s.cheapest) for s in systems if s.gpus is not None and s.cheapest is not None]
    options = [(s, t) for s, t in options if t.usd_per_month is not None]
    rec = None
    if options:
        best, tier = min(options, key=lambda o: o[1].usd_per_month)
        rec = Recommendation(
            best.legend, best.gpu_type or "?", best.gpus, best.nodes, tier,
            _sentence(best, tier, demand, slo) + _flips(best, systems, comparisons),
        )  # fmt: skip
    return Plan(
        demand=demand,
        slo=slo,
        slo_source=slo_source,
        gpus_per_node=gpus_per_node,
        systems=systems,
        recommendation=rec,
        assumptions=_assumptions(demand, slo, slo_source, gpus_per_node, comparisons),
    )


def _system(comp: RunComparison, demand: Demand, catalogue: Catalogue, per_node: int):
    curve, cap = comp.curve, comp.at_slo
    g = curve.gpu_count
    point = comp.capacity
    tokens_per_request = (
        point.output_tps / point.requests_per_s if point and point.requests_per_s else None
    )
    sized_by = mix_error = None
    if demand.mix and point is not None and point.classes:
        try:
            peak, sized_by = mix_peak(demand.mix, point, demand.peak_factor)
        except ValueError as exc:
            mix_error = str(exc)
    if demand.requests_per_s is not None:
        if sized_by is None:
            peak = demand.requests_per_s * demand.peak_factor
        mean_tokens_per_s = (
            demand.requests_per_s * tokens_per_request if tokens_per_request else None
        )

        def per_replica(x: float | None) -> float | None:  # output tok/s/GPU -> req/s/replica
            if x is None or not point or not point.output_tps_per_gpu:
                return None
            return point.requests_per_s * x / point.output_tps_per_gpu
    else:
        mean_tokens_per_s = demand.output_tokens_per_day / SECONDS_PER_DAY
        peak = mean_tokens_per_s * demand.peak_factor

        def per_replica(x: float | None) -> float | None:
            return None if x is None else x * g

    kind = cap.kind if cap is not None else "none"
    plan = SystemPlan(
        run_id=curve.run_id,
        legend=curve.legend,
        gpu_type=curve.gpu_type,
        gpus_per_replica=g,
        capacity_kind=kind,
        capacity_text=cap.text() if cap is not None else "no capacity",
        replica_capacity=None,
        replicas=None,
        gpus=None,
        gpus_range=(None, None),
        nodes=None,
    )
    if kind in ("none", "below") or point is None:
        plan.note = (
            "no load tested met the SLO, so it cannot be sized (measure lower loads)"
            if kind == "below"
            else "no complete load points"
        )
        return plan
    if mix_error is not None:
        plan.note = f"{mix_error}: it cannot be sized for this mix"
        return plan
    plan.replica_capacity = per_replica(cap.value)
    plan.gpus = _size(peak, plan.replica_capacity, g)
    if plan.gpus is None:
        plan.note = "its capacity is zero"
        return plan
    plan.replicas = plan.gpus // g
    plan.nodes = math.ceil(plan.gpus / per_node)
    if demand.mix and sized_by is None:
        plan.note = (
            "the run measured no traffic classes, so the mix is sized at its total rate "
            "as if it had the run's request shape"
        )
    if sized_by is not None:
        plan.note = (
            f"sized by class {sized_by}: its share of the demand exceeds its share of the "
            "measured mix the most, so no class gets more per replica than at capacity"
        )
    # More capacity -> fewer GPUs: the interval's high end gives the low count.
    plan.gpus_range = (_size(peak, per_replica(cap.high), g), _size(peak, per_replica(cap.low), g))
    if kind == "at_least":
        plan.note = (
            "every load tested met the SLO, so its capacity is a lower bound: this many GPUs "
            "is enough, maybe more than needed"
        )
        plan.gpus_range = (None, plan.gpus)
    elif kind == "peak":
        plan.note = "no SLO: sized at peak throughput, latency not held to anything"
    # a lower bound's count is already "at most": its costs carry no range
    costed = (None, None) if kind == "at_least" else plan.gpus_range
    plan.tiers = _tiers(comp, plan.gpus, costed, mean_tokens_per_s, catalogue)
    priced = [t for t in plan.tiers if t.usd_per_month is not None]
    plan.cheapest = min(priced, key=lambda t: t.usd_per_month) if priced else None
    return plan


def _tiers(
    comp: RunComparison,
    gpus: int,
    gpus_range: tuple[int | None, int | None],
    mean_tokens_per_s,
    catalogue: Catalogue,
):
    if not comp.curve.gpu_type:
        return []
    try:
        tiers = catalogue.tiers(comp.curve.gpu_type)
    except PriceCatalogueError:
        return []
    busy = {r.tier: r.output_usd_per_mtok for r in comp.cost_rows}
    cap = comp.at_slo
    out = []
    for tier in tiers:
        try:
            price: float | None = price_per_gpu_hour(tier, catalogue)
        except PriceCatalogueError:
            price = None

        def month(n: int | None, price=price) -> float | None:
            return None if price is None or n is None else n * price * HOURS_PER_MONTH

        def per_mtok(n: int | None, price=price) -> float | None:
            if price is None or n is None or not mean_tokens_per_s:
                return None
            return dollars_per_mtok(price, n, mean_tokens_per_s)

        busy_now = busy.get(tier.name)
        out.append(
            TierCost(
                tier=tier.name,
                kind=tier.kind,
                provider=tier.provider,
                source=tier.source,
                date=tier.date,
                price_usd_per_gpu_hr=price,
                usd_per_month=month(gpus),
                usd_per_mtok=per_mtok(gpus),
                busy_usd_per_mtok=busy_now,
                basis=price_basis(tier),
                # Fewer GPUs (the low count) cost less: the low end of each range.
                usd_per_month_range=(month(gpus_range[0]), month(gpus_range[1])),
                usd_per_mtok_range=(per_mtok(gpus_range[0]), per_mtok(gpus_range[1])),
                busy_usd_per_mtok_range=_busy_range(busy_now, cap),
            )
        )
    return out


def _busy_range(busy: float | None, cap) -> tuple[float | None, float | None]:
    """The busy $/Mtok's range: price / throughput, so the capacity's high end gives the low
    cost. (None, None) where the capacity has no two-sided range."""
    if busy is None or cap is None or cap.value is None or cap.kind == "at_least":
        return (None, None)
    low = busy * cap.value / cap.high if cap.high else None
    high = busy * cap.value / cap.low if cap.low else None
    return (low, high)


def span_text(
    value: float | None,
    span: tuple[float | None, float | None],
    decimals: int,
    unit: str = "",
) -> str:
    """ "$10,154/month ($9,026-$11,282)", "$10,154/month ($9,026-open)" where the high end is
    open (bench.curves.with_range: the exports' Num cells and the CLI's tables read the same)."""
    return with_range(value, span, lambda v: f"${v:,.{decimals}f}", unit)


def gpus_text(s: SystemPlan) -> str:
    """A system's GPU count with its range, one wording for the CLI's table and the exports'
    cell: "38 (32-44)"; "at most 38" where the capacity is only a lower bound (the sweep never
    saturated it); "38 (open above)" where the capacity's interval has no upper end, so more
    GPUs may be needed; "cannot be sized" without a capacity."""
    if s.gpus is None:
        return "cannot be sized"
    if s.capacity_kind == "at_least":
        return f"at most {s.gpus:,}"
    lo, hi = s.gpus_range
    if hi is None:
        return f"{s.gpus:,} (open above)" if s.capacity_kind == "interpolated" else f"{s.gpus:,}"
    return with_range(s.gpus, (lo, hi), lambda v: f"{v:,.0f}")


def _sentence(s: SystemPlan, tier: TierCost, demand: Demand, slo) -> str:
    held = f"holding {slo_text(slo)}" if slo else "at peak throughput (no SLO)"
    rng = ""
    lo, hi = s.gpus_range
    if s.capacity_kind == "interpolated" and lo is not None and hi is not None and lo != hi:
        rng = f" (range {lo}-{hi} GPUs)"
    elif s.capacity_kind == "interpolated" and hi is None:
        rng = " (the capacity's interval is open: more GPUs may be needed)"
    bound = " at most" if s.capacity_kind == "at_least" else ""
    per_mtok = (
        f", {span_text(tier.usd_per_mtok, tier.usd_per_mtok_range, 3, '/Mtok output')}"
        if tier.usd_per_mtok
        else ""
    )
    derived = f", {tier.basis}" if tier.basis != "quoted" else ""
    return (
        f"Cheapest option {held} for {demand.text()}:{bound} {s.gpus} x {s.gpu_type} "
        f"({s.nodes} node{'s' if s.nodes != 1 else ''}){rng}, {s.legend}, on {tier.tier} "
        f"({price_text(tier.price_usd_per_gpu_hr)}/GPU-hour{derived}): "
        f"{span_text(tier.usd_per_month, tier.usd_per_month_range, 0, '/month')}{per_mtok}."
    )


def _overlap(a: tuple[float | None, float | None], b: tuple[float | None, float | None]) -> bool:
    """Whether two $/month ranges overlap (an open end reaches as far as it may)."""
    lo_a, hi_a = a
    lo_b, hi_b = b
    if None in (lo_a, lo_b) and None in (hi_a, hi_b):
        return False  # neither range is known on both sides: nothing to say
    a_below_b = hi_a is not None and lo_b is not None and hi_a < lo_b
    b_below_a = hi_b is not None and lo_a is not None and hi_b < lo_a
    return not (a_below_b or b_below_a)


def _too_close(
    mine: TierCost, theirs: TierCost, best: SystemPlan, other: SystemPlan, caps: dict
) -> str:
    """Why a cheaper month for `other` is too close to call, "" when it is not: their $/month
    ranges overlap; for two runs simulated with the published fit, whose errors are the same
    fit's, the range of their capacity ratio decides instead (each side's range holds the
    whole fit error, so side by side they compound it: choose.cheaper_beyond_ranges)."""
    from bench.choose import cheaper_beyond_ranges

    a, b = caps.get(other.run_id), caps.get(best.run_id)
    if a is not None and b is not None and a.sim_category and b.sim_category:
        if cheaper_beyond_ranges(theirs.usd_per_month, mine.usd_per_month, a, b):
            return ""
        return " — within the range of their capacity ratio, so too close to call"
    if _overlap(mine.usd_per_month_range, theirs.usd_per_month_range):
        return " — their ranges overlap, so too close to call"
    return ""


def _flips(
    best: SystemPlan, systems: Sequence[SystemPlan], comparisons: Sequence[RunComparison]
) -> str:
    """The tiers on which another system would cost less per month than `best`: the
    answer depends on how the GPUs are paid for, and the headline says where it flips."""
    caps = {c.curve.run_id: c.at_slo for c in comparisons}
    others = [s for s in systems if s is not best and s.gpus is not None]
    flips = []
    for mine in best.tiers:
        if mine.usd_per_month is None:
            continue
        for other in others:
            theirs = next((t for t in other.tiers if t.tier == mine.tier), None)
            if theirs is None or theirs.usd_per_month is None:
                continue
            if theirs.usd_per_month < mine.usd_per_month:
                prices = "; ".join(
                    f"{s.gpu_type} {price_text(t.price_usd_per_gpu_hr)}/GPU-hour"
                    + (f" ({t.basis})" if t.basis != "quoted" else "")
                    for s, t in ((best, mine), (other, theirs))
                )
                close = _too_close(mine, theirs, best, other, caps)
                flips.append(
                    f"on {mine.tier} {other.legend} costs less "
                    f"(${theirs.usd_per_month:,.0f} vs ${mine.usd_per_month:,.0f}/month; "
                    f"{prices}){close}"
                )
    return (" The answer flips: " + "; ".join(flips) + ".") if flips else ""


def _basis(demand: Demand, comparisons: Sequence[RunComparison]) -> list[str]:
    """What the capacities were measured with, and a warning where the demand's shape (or
    another run's) differs: a capacity holds for the request shape it was measured with."""
    shapes = {c.curve.legend: c.curve.shape for c in comparisons}
    known = {s for s in shapes.values() if s}
    if not known:
        return [
            "Workload: not stored with the runs, so the shape these capacities hold for is unknown."
        ]
    if len(known) == 1:
        (shape,) = known
        out = [f"Workload the capacities were measured with: {shape}."]
    else:
        out = [f"Workload of {who}: {shape or 'not stored'}." for who, shape in shapes.items()]
        out.append(
            "WARNING: the runs were measured with different workloads, so their capacities "
            "are not like for like."
        )
    if demand.shape and demand.shape not in known:
        out.append(
            f"WARNING: the demand's shape ({demand.shape}) differs from the one measured: "
            "measure that shape before buying for it."
        )
    elif not demand.shape:
        out.append("The demand is assumed to have the measured shape.")
    return out


def _assumptions(demand, slo, slo_source, per_node, comparisons) -> list[str]:
    out = [
        f"Demand: {demand.text()}; the fleet is sized for the peak, mean x peak factor.",
        f"SLO: {slo_text(slo)} ({slo_source})" if slo else "SLO: none (sized at peak throughput)",
        "Capacity per replica: each run's capacity at the SLO, interpolated between the last "
        "load meeting it and the first breaking it; replicas are the run's GPUs (its tensor-"
        "parallel group), rounded up to whole replicas.",
        f"Nodes: {per_node} GPUs per node.",
        f"$/month: GPUs x $/GPU-hour x {HOURS_PER_MONTH:.0f} hours, paid whether busy or idle.",
        "$/Mtok: $/month over the output tokens served at the mean demand (idle capacity "
        "included); 'busy' $/Mtok is at capacity with every GPU busy.",
        "Ranges: a $/month or $/Mtok range is what the GPU count's range costs, and that "
        "follows the capacity's range (sampling, the bracket between loads, reruns and, for a "
        "simulated run, the simulator's expected error); busy $/Mtok's is price over the "
        "capacity's range.",
        "Prices: the catalogue's tiers with their sources and dates (`tokenbench prices`).",
    ]
    if demand.output_tokens_per_day is None:
        out.append(
            "Tokens per request: as measured at each run's capacity (for $/Mtok at the demand)."
        )
    out += _basis(demand, comparisons)
    if any(c.curve.simulated for c in comparisons):
        out.append("Simulated runs: capacities come from the roofline simulator, not hardware.")
    return out
