"""Choose a setting: rank an experiment's runs (`tokenbench tune`, `sim tune`) by capacity and
$/Mtok at the SLO, with their ranges, and say which setting wins and by how much.

The facts are the ones `compare` already computed (bench.curves.compare_runs: each run's
capacity at the SLO with its range, $/Mtok per tier at that capacity); this module only orders
them and words the verdict, so `compare`, the dashboard and the deck say the same thing. A win
whose range overlaps the runner-up's is "not separable": which is ahead could flip on a rerun
(or, for simulated runs, within the simulator's expected error, which their ranges include).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.curves import Capacity, Ratio, RunComparison, capacity_ratio, cheapest


@dataclass
class RankedSetting:
    """One run of the experiment, with what it is ranked by."""

    comparison: RunComparison
    settings: dict[str, Any] | None  # the experiment's settings (None: not from an experiment)
    name: str  # the settings in words, else the run's legend
    cheapest: Any  # bench.cost.CostRow: its cheapest tier at capacity (None when unpriced)
    usd_low: float | None = None  # $/Mtok output on that tier, from the capacity's range
    usd_high: float | None = None

    @property
    def usd(self) -> float | None:
        return self.cheapest.output_usd_per_mtok_at_utilisation if self.cheapest else None

    @property
    def capacity(self) -> float | None:
        cap = self.comparison.at_slo
        return cap.value if cap is not None and cap.kind not in ("none", "below") else None


@dataclass
class SettingsRanking:
    experiment: str | None
    ranked: list[RankedSetting]  # best first
    basis: str  # what the order is by, in words
    verdict: str

    def rows(self) -> list[list[str]]:
        """#, setting, capacity (range), cheapest tier, $/Mtok (range): one row per run."""
        out = []
        for i, r in enumerate(self.ranked, 1):
            cap = r.comparison.at_slo
            usd = "—" if r.usd is None else f"${r.usd:.3f}"
            if r.usd is not None and r.usd_low is not None and r.usd_high is not None:
                usd += f" (range ${r.usd_low:.3f}-${r.usd_high:.3f})"
            out.append([
                str(i), r.name, cap.text("tok/s per GPU") if cap else "—",
                r.cheapest.tier if r.cheapest else "—", usd, r.comparison.curve.run_id[:8],
            ])  # fmt: skip
        return out

    HEADERS = ("#", "setting", "capacity at the SLO", "cheapest tier", "$/Mtok output", "run")


def settings_text(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in settings.items() if v is not None) or "(defaults)"


def experiment_of(info: Any) -> tuple[str | None, dict[str, Any] | None]:
    """(experiment name, settings) a stored run (bench.store.RunInfo) was measured under."""
    tune = (getattr(info, "extra_json", None) or {}).get("tune") or {}
    return tune.get("experiment"), tune.get("settings")


def usd_range(usd: float | None, cap: Capacity | None) -> tuple[float | None, float | None]:
    """$/Mtok at the ends of a capacity's range: the price is fixed, the throughput moves
    (None for an open end; the ends in order)."""
    if usd is None or cap is None or not cap.value:
        return None, None
    low = usd * cap.value / cap.high if cap.high else None
    high = usd * cap.value / cap.low if cap.low else None
    if low is not None and high is not None and low > high:
        low, high = high, low
    return low, high


def cheaper_beyond_ranges(
    usd_a: float, usd_b: float, cap_a: Capacity | None, cap_b: Capacity | None
) -> bool:
    """Whether A at $usd_a/Mtok is cheaper than B at $usd_b even at the ends of the range of
    A's capacity over B's (capacity_ratio): prices are fixed and $/Mtok goes as 1/capacity, so
    the cost ratio moves as the capacity ratio does. For two measured runs this is A's $/Mtok
    range below B's; for two runs simulated with the published fit the ratio carries the
    fit's error on a ratio of GPUs, not each side's compounded (their errors are shared)."""
    ratio, _ = capacity_ratio(cap_a, cap_b)
    if ratio is None or ratio.low is None or ratio.high is None or not ratio.value:
        return False
    worst = min(ratio.low, ratio.high) / ratio.value  # A's capacity at its lowest against B's
    return usd_b / usd_a * worst > 1.0


def overlaps(ratio: Ratio) -> bool:
    """Whether a capacity ratio's range holds 1, i.e. which is larger could flip; the ends
    are read in either order (an interpolated capacity's interval can come back swapped)."""
    ends = [x for x in (ratio.low, ratio.high) if x is not None]
    return ratio.flips or (len(ends) == 2 and min(ends) <= 1.0 <= max(ends))


def rank_settings(
    comparisons: Sequence[RunComparison], infos: Sequence[Any]
) -> SettingsRanking | None:
    """The runs ranked, when at least two of them are settings of an experiment (else None:
    runs that are not settings of one experiment are compared, not ranked). Ordered by $/Mtok
    on each run's cheapest tier when every run is priced, else by capacity per GPU."""
    found = [experiment_of(i) for i in infos]
    if sum(s is not None for _, s in found) < 2:
        return None
    names = {e for e, s in found if s is not None}
    ranked = []
    for comp, (_, settings) in zip(comparisons, found, strict=True):
        name = settings_text(settings) if settings is not None else comp.curve.legend
        r = RankedSetting(comp, settings, name, cheapest(comp.cost_rows))
        r.usd_low, r.usd_high = usd_range(r.usd, comp.at_slo)
        ranked.append(r)
    priced = all(r.usd is not None for r in ranked)
    if priced:
        ranked.sort(key=lambda r: r.usd)
        basis = "$/Mtok output on each setting's cheapest tier at its SLO capacity"
    else:
        ranked.sort(key=lambda r: (r.capacity is None, -(r.capacity or 0.0)))
        basis = "capacity per GPU at the SLO"
    experiment = next(iter(names)) if len(names) == 1 else None
    return SettingsRanking(experiment, ranked, basis, verdict(ranked, priced))


def verdict(ranked: Sequence[RankedSetting], by_cost: bool) -> str:
    """'Winner: X ...; 1.31x the runner-up's capacity (range 1.05-1.62x) at 1.31x lower
    $/Mtok: ahead' or '...: not separable (the ranges overlap)'."""
    if not ranked:
        return ""
    a = ranked[0]
    head = f"Winner: {a.name}"
    cap = a.comparison.at_slo
    if cap is not None:
        head += f", {cap.text('tok/s per GPU')}"
    if a.usd is not None:
        head += f", ${a.usd:.3f}/Mtok output on {a.cheapest.tier}"
    if len(ranked) < 2:
        return head + " (the only setting)"
    b = ranked[1]
    ratio, why = capacity_ratio(a.comparison.at_slo, b.comparison.at_slo)
    if ratio is None:
        return f"{head}; against the runner-up ({b.name}): {why}"
    text = f"{head}; {ratio.text()} the runner-up's capacity ({b.name})"
    apart = not overlaps(ratio)
    if by_cost and a.usd and b.usd:
        lower = f"{b.usd / a.usd:.2f}x lower" if b.usd / a.usd >= 1.005 else "the same"
        text += f", {lower} $/Mtok (${a.usd:.3f} vs ${b.usd:.3f})"
        apart = cheaper_beyond_ranges(a.usd, b.usd, cap, b.comparison.at_slo)
    if apart:
        return text + ": ahead beyond both ranges"
    return text + ": not separable (the ranges overlap, so the order could flip)"
