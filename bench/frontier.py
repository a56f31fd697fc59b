"""The Pareto front of throughput against interactivity, and a read-out along it.

InferenceX draws each system as the upper-right envelope of its (interactivity, tokens/s
per GPU) points: a point is on the front when no other point of the same run is both faster
for each user and higher in throughput. Reading the front at a chosen interactivity (linear
between the two front points around it) answers "how many tokens/s per GPU at 20 tok/s per
user?". The dashboard and the exports call these, so the read-out is the same everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.curves import CurvePoint, RunCurve


@dataclass(frozen=True)
class FrontPoint:
    interactivity: float  # tok/s per user = 1000 / median TPOT ms
    output_tps_per_gpu: float
    title: str  # the load point's title
    load_point: int  # CurvePoint.load_point


def pareto_front(points: Sequence[CurvePoint]) -> list[FrontPoint]:
    """Points no other point beats on both axes, in order of rising interactivity."""
    pts = [
        FrontPoint(p.interactivity, p.output_tps_per_gpu, p.title, p.load_point)
        for p in points
        if p.interactivity is not None
    ]
    # Walk from the most interactive down: keep a point when it beats every faster one.
    pts.sort(key=lambda f: (-f.interactivity, -f.output_tps_per_gpu))
    front: list[FrontPoint] = []
    best = float("-inf")
    for f in pts:
        if f.output_tps_per_gpu > best:
            front.append(f)
            best = f.output_tps_per_gpu
    return front[::-1]


def throughput_at_interactivity(curve: RunCurve, interactivity: float) -> float | None:
    """Tokens/s per GPU on the run's front at `interactivity`; None outside the front.

    A front with one point answers only at that point's interactivity (to the nearest 0.1%).
    """
    front = pareto_front(curve.points)
    if not front:
        return None
    lo, hi = front[0], front[-1]
    if not lo.interactivity * 0.999 <= interactivity <= hi.interactivity * 1.001:
        return None
    for a, b in zip(front, front[1:], strict=False):
        if a.interactivity <= interactivity <= b.interactivity:
            if b.interactivity == a.interactivity:
                return max(a.output_tps_per_gpu, b.output_tps_per_gpu)
            share = (interactivity - a.interactivity) / (b.interactivity - a.interactivity)
            return a.output_tps_per_gpu + share * (b.output_tps_per_gpu - a.output_tps_per_gpu)
    # Within the 0.1% tolerance just outside either end (or a one-point front).
    return lo.output_tps_per_gpu if interactivity < lo.interactivity else hi.output_tps_per_gpu


def default_interactivity(curves: Sequence[RunCurve], tpot_limit_ms: float | None) -> float | None:
    """Where to read the fronts when the user chose nothing: the SLO's TPOT limit as tok/s per
    user (1000 / limit) when every run's front reaches it, else the middle of the range every
    run's front covers (an end of it is often one run's lightest load). None without overlap.
    """
    fronts = [pareto_front(c.points) for c in curves]
    fronts = [f for f in fronts if f]
    if not fronts:
        return None
    lo = max(f[0].interactivity for f in fronts)
    hi = min(f[-1].interactivity for f in fronts)
    if lo > hi:
        return None
    if tpot_limit_ms and lo <= 1000.0 / tpot_limit_ms <= hi:
        return 1000.0 / tpot_limit_ms
    return (lo + hi) / 2


def cost_view_tier(curves: Sequence[RunCurve], catalogue) -> str | None:
    """The pricing tier the $/Mtok-versus-interactivity view opens on (dashboard and deck):
    the cheapest on-demand tier every priced run's GPU has (what a buyer can rent today),
    else the first tier they all have, else the first tier any has."""
    from bench.cost import PriceCatalogueError, price_per_gpu_hour

    by_gpu: dict[str, list] = {}
    for curve in curves:
        try:
            gpu = catalogue.resolve_gpu(curve.gpu_type) if curve.gpu_type else None
            if gpu:
                by_gpu.setdefault(gpu, catalogue.tiers(gpu))
        except PriceCatalogueError:
            continue
    if not by_gpu:
        return None
    names = [[t.name for t in tiers] for tiers in by_gpu.values()]
    shared = [n for n in names[0] if all(n in other for other in names)]

    def mean_price(name: str) -> float:
        prices = []
        for tiers in by_gpu.values():
            try:
                prices.append(
                    price_per_gpu_hour(next(t for t in tiers if t.name == name), catalogue)
                )
            except PriceCatalogueError:
                return float("inf")
        return sum(prices) / len(prices)

    first = next(iter(by_gpu.values()))
    on_demand = [n for n in shared if next(t for t in first if t.name == n).kind == "on_demand"]
    if on_demand:
        return min(on_demand, key=mean_price)
    return shared[0] if shared else names[0][0] if names[0] else None
