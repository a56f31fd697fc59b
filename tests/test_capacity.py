"""Capacity at an SLO, percentile confidence, the SLO grammar, ratios and the buying plan.

Hand-built curves with known figures, so every expected value can be worked out on paper.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from bench.cost import HOURS_PER_YEAR, load_catalogue, price_per_gpu_hour
from bench.curves import (
    CurvePoint,
    RunComparison,
    RunCurve,
    capacity_at_slo,
    capacity_ratio,
    compare_runs,
    ratio_sentence,
    resolve_slo,
)
from bench.metrics import (
    Stats,
    Summary,
    order_statistic_ranks,
    parse_goodput,
    parse_slo,
    percentile_ci,
    stats_ms,
)
from bench.plan import Demand, plan_capacity
from bench.scenario import parse_scenario
from bench.sweep import PointSpec, Sweep, SweepPlan, knee

SLO = parse_slo("p99_ttft_ms<=2000,p99_tpot_ms<=50")


def _point(
    load: float,
    tps_per_gpu: float,
    ttft: float,
    tpot: float,
    *,
    gpus: int = 1,
    n: int = 1000,
    ci: float = 0.02,
    partial: bool = False,
) -> CurvePoint:
    """A load point; P99s have a ±ci relative 95% interval from n samples."""
    conf = {
        f"{m}_ms": {"count": n, "level": 0.95, "p99": [v * (1 - ci), v * (1 + ci)]}
        for m, v in (("ttft", ttft), ("tpot", tpot))
    }
    return CurvePoint(
        load_point=int(load),
        title=f"rate {load:g} req/s",
        offered=load,
        requests_per_s=load,
        output_tps_per_gpu=tps_per_gpu,
        total_tps_per_gpu=tps_per_gpu * 3,
        output_tps=tps_per_gpu * gpus,
        total_tps=tps_per_gpu * 3 * gpus,
        completed=n,
        failed=0,
        metrics={"ttft_ms": {"p50": ttft / 2, "p99": ttft}, "tpot_ms": {"p50": 20, "p99": tpot}},
        confidence=conf,
        partial=partial,
    )


def _curve(points, gpu="H100-SXM", gpus=1, run_id="r") -> RunCurve:
    c = RunCurve(run_id, run_id, f"{gpu} x{gpus}", gpu, gpus, "m", False, None, "completed")
    c.points = list(points)
    return c


# ---------------------------------------------------------------- capacity


def test_capacity_interpolates_on_the_failing_metric():
    # TPOT crosses 50 ms 40% of the way from rate 2 (44 ms) to rate 4 (59 ms);
    # TTFT stays under its limit. 1000 + 0.4 * (1800 - 1000) = 1320 tok/s per GPU.
    curve = _curve([_point(1, 600, 300, 30), _point(2, 1000, 500, 44), _point(4, 1800, 900, 59)])
    cap = capacity_at_slo(curve, SLO)
    assert cap.kind == "interpolated"
    assert cap.value == pytest.approx(1320)
    assert cap.point.latency("tpot") == pytest.approx(50)
    assert cap.point.requests_per_s == pytest.approx(2.8)
    assert cap.last_pass.offered == 2 and cap.first_fail.offered == 4
    assert cap.deciding.startswith("p99_tpot_ms<=50 (59")
    # Sampling: TPOT at the top of its ±2% interval (44.88, 60.18) crosses at 0.3379,
    # at the bottom (43.12, 57.82) at 0.4686.
    low, high = cap.parts["sampling"]
    assert low == pytest.approx(1000 + 800 * (50 - 44.88) / (60.18 - 44.88), rel=1e-6)
    assert high == pytest.approx(1000 + 800 * (50 - 43.12) / (57.82 - 43.12), rel=1e-6)
    # The range covers the whole bracket too: the boundary is somewhere between the loads.
    assert cap.parts["bracket"] == (1000, 1800)
    assert (cap.low, cap.high) == (1000, 1800)
    assert any("bracket" in w for w in cap.includes())
    assert cap.flags == []


def test_capacity_takes_the_metric_that_crosses_first():
    # TTFT crosses at 25% (1000 -> 2000 ms against 1250 ms), TPOT at 50%.
    slo = parse_slo("p99_ttft_ms<=1250 p99_tpot_ms<=50")
    curve = _curve([_point(1, 500, 1000, 40), _point(2, 900, 2000, 60)])
    cap = capacity_at_slo(curve, slo)
    assert cap.value == pytest.approx(600)
    assert cap.deciding.startswith("p99_ttft_ms<=1250")


def test_capacity_bounds_say_so():
    all_pass = _curve([_point(1, 500, 100, 20), _point(2, 900, 200, 30)])
    cap = capacity_at_slo(all_pass, SLO)
    assert cap.kind == "at_least" and cap.value == 900 and cap.high is None
    assert cap.text().startswith("at least 900")
    all_fail = _curve([_point(1, 500, 100, 70), _point(2, 900, 200, 90)])
    cap = capacity_at_slo(all_fail, SLO)
    assert cap.kind == "below" and cap.value is None and cap.high == 500
    assert cap.text().startswith("below 500")


def test_partial_point_is_never_the_capacity_or_the_knee():
    curve = _curve([_point(1, 500, 100, 20), _point(2, 2000, 50, 10, n=1, partial=True)])
    cap = capacity_at_slo(curve, SLO)
    assert cap.kind == "at_least" and cap.value == 500
    assert any("interrupted" in f for f in cap.flags)


def test_thin_tail_and_a_miss_within_its_interval_are_flagged():
    # The H100: P99 TPOT 50.3 ms against 50 ms, from 48 requests.
    curve = _curve([_point(1, 500, 300, 40, n=48), _point(3, 1400, 900, 50.3, n=48, ci=0.1)])
    flags = " | ".join(capacity_at_slo(curve, SLO).flags)
    assert "P99 TPOT at rate 3 req/s rests on 48 samples" in flags
    curve = _curve([_point(1, 500, 300, 40), _point(3, 1400, 900, 50.3, ci=0.1)])
    flags = " | ".join(capacity_at_slo(curve, SLO).flags)
    assert "missed p99_tpot_ms<=50 by 0.3" in flags and "could be chance" in flags


def test_noisy_boundary_is_flagged():
    curve = _curve([_point(1, 500, 300, 40), _point(2, 900, 900, 55), _point(3, 1200, 900, 45)])
    assert any("met the SLO again" in f for f in capacity_at_slo(curve, SLO).flags)


# ---------------------------------------------------------------- ratio


def _comparisons(a: RunCurve, b: RunCurve):
    return compare_runs([a, b], SLO, load_catalogue())


def test_ratio_of_interpolated_capacities_with_its_range():
    a = _curve([_point(1, 2000, 300, 30), _point(2, 2200, 500, 70)], "B200-SXM", run_id="a")
    b = _curve([_point(1, 1000, 300, 30), _point(2, 1100, 500, 70)], run_id="b")
    comps = _comparisons(a, b)
    ratio, why = capacity_ratio(comps[0].at_slo, comps[1].at_slo)
    assert why is None and ratio.value == pytest.approx(2.0) and ratio.bound is None
    # each capacity's range is its whole bracket: 2000/1100 to 2200/1000
    assert ratio.low == pytest.approx(2000 / 1100) and ratio.high == pytest.approx(2.2)
    assert not ratio.flips
    # a coarse bracket is an honest wide range: 1000-3000 against 500-1500 could flip
    a = _curve([_point(1, 1000, 300, 30), _point(2, 3000, 500, 70)], "B200-SXM", run_id="a")
    b = _curve([_point(1, 500, 300, 30), _point(2, 1500, 500, 70)], run_id="b")
    ratio, _ = capacity_ratio(*(c.at_slo for c in _comparisons(a, b)))
    assert ratio.value == pytest.approx(2.0) and ratio.flips
    assert "serves 2.00x" in ratio_sentence(comps)


def test_ratio_against_a_lower_bound_is_a_bound_and_flip_is_said():
    a = _curve([_point(1, 1000, 300, 30), _point(2, 1500, 300, 40)], "B200-SXM", run_id="a")
    b = _curve([_point(1, 500, 300, 30), _point(2, 1500, 500, 70)], run_id="b")
    ratio, _ = capacity_ratio(*(c.at_slo for c in _comparisons(a, b)))
    assert ratio.bound == "at least" and ratio.high is None
    text = ratio_sentence(_comparisons(a, b))
    assert "at least 1.50x" in text and "this is a bound" in text
    # Two capacities whose intervals overlap: which is bigger could flip.
    a = _curve([_point(1, 1000, 300, 45, ci=0.2), _point(2, 1100, 300, 55, ci=0.2)], run_id="a")
    b = _curve([_point(1, 1000, 300, 44, ci=0.2), _point(2, 1100, 300, 56, ci=0.2)], run_id="b")
    ratio, _ = capacity_ratio(*(c.at_slo for c in _comparisons(a, b)))
    assert ratio.flips and "could flip" in ratio_sentence(_comparisons(a, b))


def test_no_ratio_between_two_lower_bounds():
    a = _curve([_point(1, 1000, 300, 30)], run_id="a")
    b = _curve([_point(1, 500, 300, 30)], run_id="b")
    assert "both capacities are lower bounds" in ratio_sentence(_comparisons(a, b))


# ---------------------------------------------------------------- confidence


def test_order_statistic_ranks_match_the_binomial_tables():
    assert order_statistic_ranks(100, 0.5) == (40, 61)  # the classic median table
    assert order_statistic_ranks(48, 0.99) == (46, None)  # a P99 from 48: open above
    lo, hi = order_statistic_ranks(100_000, 0.99)  # normal approximation
    assert lo == pytest.approx(98938, abs=2) and hi == pytest.approx(99063, abs=2)


@pytest.mark.parametrize(("n", "q"), [(50, 50.0), (400, 90.0), (1000, 99.0), (8000, 99.0)])
def test_percentile_ci_covers_the_true_quantile(n, q):
    """Over 400 lognormal samples of size n, the 95% interval holds the true quantile at
    least ~93% of the times (binomial noise of 400 trials allows that much)."""
    rng = np.random.default_rng(17)
    true = math.exp(0.8 * _z(q / 100))  # lognormal(0, 0.8) quantile
    hits = trials = 0
    for _ in range(400):
        lo, hi = percentile_ci(rng.lognormal(0, 0.8, n), q)
        if lo is None or hi is None:
            continue
        trials += 1
        hits += lo <= true <= hi
    assert trials == 400 and hits / trials >= 0.93


def _z(p: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(p)


def test_stats_carry_count_and_interval_into_the_summary_json():
    st = stats_ms(np.arange(1, 201) * 1e6, (50, 99))
    assert st.count == 200 and st.ci["p50"] == (86.0, 115.0)  # ranks 86 and 115 of 200
    assert st.ci["p99"][1] is None  # 200 samples cannot bound a P99 from above
    assert st.confidence()["p99"] == [st.ci["p99"][0], None]


# ---------------------------------------------------------------- SLO grammar


def test_one_slo_grammar_for_every_flag():
    long = parse_slo("p99_ttft_ms<=500,p99_tpot_ms<=50")
    assert parse_slo("ttft:500 tpot:50") == long  # vLLM's --goodput form
    assert parse_slo(["ttft:500", "p99_tpot_ms<=50"]) == long  # repeated flags
    assert parse_goodput("p99_ttft_ms<=500 tpot:50") == {"ttft": 500, "tpot": 50}
    with pytest.raises(ValueError, match="error_rate<0.1"):
        parse_goodput("error_rate<0.1")
    with pytest.raises(ValueError, match="'latency:5'"):
        parse_slo("latency:5")


def test_resolve_slo_prefers_given_then_stored():
    infos = [SimpleNamespace(extra_json={"sweep": {"slo": ["p99_ttft_ms<=2000"]}})] * 2
    assert resolve_slo(None, infos) == (parse_slo("p99_ttft_ms<=2000"), "stored with the runs")
    assert resolve_slo("ttft:100", infos) == (parse_slo("p99_ttft_ms<=100"), "given")
    other = [infos[0], SimpleNamespace(extra_json={"sweep": {"slo": ["p99_ttft_ms<=1"]}})]
    assert resolve_slo(None, other) == ([], "none")


# ---------------------------------------------------------------- the sweep brackets


def _summary(p99_ms: float, rate: float, *, interrupted: bool = False) -> Summary:
    st = Stats(1000, p99_ms, 0.0, {"p50": p99_ms / 2, "p99": p99_ms})
    return Summary(
        completed=1000, failed=0, cancelled=0, errors={}, duration_s=10, requests_per_s=rate,
        output_tokens_per_s=rate * 100, total_tokens_per_s=rate * 300, total_input_tokens=0,
        total_output_tokens=0, metrics={m: st for m in ("ttft", "tpot", "itl", "e2el")},
        ttft_from_intended=st, goodput_requests_per_s=None,
        send_lag_ms={"p50": 0, "p99": 0, "max": 0}, client_limited=False,
        interrupted=interrupted,
    )  # fmt: skip


class _Session:
    """Stands in for RunSession: P99 TTFT = 100 ms x rate (the SLO of 1000 ms breaks at 10)."""

    run_id = None

    def __init__(self, interrupt_at: float | None = None) -> None:
        self.interrupt_at = interrupt_at

    def point(self, plan, *, target_rate=None, **_):
        cut = target_rate == self.interrupt_at
        return SimpleNamespace(interrupted=cut), _summary(100 * target_rate, target_rate,
                                                          interrupted=cut)  # fmt: skip


def _sweep(session) -> Sweep:
    sc = parse_scenario(
        "target: {base_url: 'http://127.0.0.1:9'}\n"
        "load: {shape: poisson, request_rate: 1, num_prompts: 5}\n"
    )
    return Sweep(sc, session, SweepPlan(thresholds=parse_slo("p99_ttft_ms<=1000")))


def test_slo_search_extends_until_a_load_fails_then_bisects():
    sweep = _sweep(_Session())
    sweep.grid([PointSpec("rate", 1), PointSpec("rate", 2)])
    sweep.slo_search(4)
    res = sweep.conclude()
    # 2 passes -> extend to 4, 8 (pass), 16 (fails) -> bisect at 12 (fails).
    assert [p.spec.value for p in res.points] == [1, 2, 4, 8, 16, 12]
    assert res.at_slo.kind == "interpolated"
    assert res.at_slo.last_pass.offered == 8 and res.at_slo.first_fail.offered == 12
    assert res.at_slo.point.requests_per_s == pytest.approx(10)  # 1000 ms at rate 10


def test_slo_search_goes_lower_when_every_load_failed():
    sweep = _sweep(_Session())
    sweep.grid([PointSpec("rate", 40)])
    sweep.slo_search(3)
    assert [p.spec.value for p in sweep.result.points] == [40, 20, 10, 15]  # 10 meets it: bisect


def test_interrupted_point_is_neither_knee_nor_capacity():
    sweep = _sweep(_Session(interrupt_at=4))
    sweep.grid([PointSpec("rate", 2), PointSpec("rate", 4), PointSpec("rate", 8)])
    res = sweep.conclude()
    assert res.interrupted and [p.spec.value for p in res.points] == [2, 4]
    assert res.knee.spec.value == 2 and knee(res.points).spec.value == 2
    assert res.capacity.spec.value == 2 and res.at_slo.kind == "at_least"
    assert "interrupted" in res.capacity_note


# ---------------------------------------------------------------- the buying answer


def test_plan_sizes_every_system_for_the_peak_and_prices_every_tier():
    cat = load_catalogue()
    # B200 x1: capacity 1320 tok/s per GPU at 2.8 req/s; H100 x2: 500 tok/s per GPU at 1 req/s.
    b200 = _curve(
        [_point(1, 600, 300, 30), _point(2, 1000, 500, 44), _point(4, 1800, 900, 59)],
        "B200-SXM", run_id="b",
    )  # fmt: skip
    h100 = _curve(
        [_point(0.5, 250, 300, 30, gpus=2), _point(1, 500, 300, 45, gpus=2),
         _point(2, 900, 300, 65, gpus=2)],
        "H100-SXM", gpus=2, run_id="h",
    )  # fmt: skip
    comps = compare_runs([b200, h100], SLO, cat)
    h_cap = comps[1].at_slo
    assert h_cap.point.requests_per_s == pytest.approx(1.25)  # 45 -> 65 ms crosses 50 at 25%
    plan = plan_capacity(comps, Demand(requests_per_s=20, peak_factor=1.5), cat)
    b, h = plan.systems
    # Peak 30 req/s: B200 ceil(30 / 2.8) = 11 GPUs; H100 ceil(30 / 1.25) = 24 replicas of 2.
    assert (b.replicas, b.gpus, b.nodes) == (11, 11, 2)
    assert (h.replicas, h.gpus, h.nodes) == (24, 48, 6)
    tier = next(t for t in b.tiers if t.usd_per_month is not None)
    price = price_per_gpu_hour(cat.tier("B200-SXM", tier.tier), cat)
    assert tier.usd_per_month == pytest.approx(11 * price * HOURS_PER_YEAR / 12)
    # Mean 20 req/s x 1320 / 2.8 tokens per request, paid for all month.
    tokens_per_s = 20 * 1320 / 2.8
    assert tier.usd_per_mtok == pytest.approx(11 * price / (tokens_per_s * 3600) * 1e6)
    cheapest = min(
        (t.usd_per_month, s.legend, t.tier)
        for s in plan.systems
        for t in s.tiers
        if t.usd_per_month is not None
    )
    rec = plan.recommendation
    assert (rec.tier.usd_per_month, rec.legend, rec.tier.tier) == cheapest
    assert "Cheapest option holding p99_ttft_ms<=2000,p99_tpot_ms<=50" in rec.sentence
    assert any(a.startswith("Demand: 20 req/s mean, peak x1.5") for a in plan.assumptions)


def test_plan_costs_carry_the_gpu_counts_range_and_a_simulated_runs_error():
    """$/month and $/Mtok at the demand are what the GPU count's range costs (the capacity's
    range decides it); busy $/Mtok is price / throughput over the capacity's range. A
    simulated twin's range folds in the simulator's error, so its costs' ranges are wider."""
    from bench.export.report import _plan_table
    from bench.plan import span_text

    cat = load_catalogue()
    pts = [_point(1, 600, 300, 30), _point(2, 1000, 500, 44), _point(4, 1800, 900, 59)]
    measured = _curve(pts, "B200-SXM", run_id="m")
    simulated = _curve(pts, "B200-SXM", run_id="s")
    simulated.simulated, simulated.sim_error = True, ({"output_tps": 0.5}, "test error")
    comps = compare_runs([measured, simulated], SLO, cat)
    plan = plan_capacity(comps, Demand(requests_per_s=20, peak_factor=1.5), cat)
    m, s = plan.systems
    assert m.gpus == s.gpus == 11 and m.gpus_range == (8, 15)
    tokens_per_s = 20 * 1320 / 2.8
    for system, comp in zip((m, s), comps, strict=True):
        lo, hi = system.gpus_range
        cap = comp.at_slo
        for t in system.tiers:
            price = price_per_gpu_hour(cat.tier("B200-SXM", t.tier), cat)
            month = HOURS_PER_YEAR / 12 * price
            assert t.usd_per_month_range == pytest.approx((lo * month, hi * month))
            mtok = price / (tokens_per_s * 3600) * 1e6
            assert t.usd_per_mtok_range == pytest.approx((lo * mtok, hi * mtok))
            busy_lo, busy_hi = t.busy_usd_per_mtok_range
            assert busy_lo == pytest.approx(t.busy_usd_per_mtok * cap.value / cap.high)
            assert busy_hi == pytest.approx(t.busy_usd_per_mtok * cap.value / cap.low)
            assert busy_lo < t.busy_usd_per_mtok < busy_hi
    # The simulator's ±50% widens the capacity (1000-1800 -> 500-2700), so the count too.
    assert s.gpus_range[0] < m.gpus_range[0] and s.gpus_range[1] > m.gpus_range[1]
    rec = plan.recommendation.tier
    shown = span_text(rec.usd_per_month, rec.usd_per_month_range, 0, "/month")
    assert shown.count("$") == 3 and shown in plan.sentence
    # Every text export shows the ranges (Num spans); the CSV keeps the bare figure.
    table = _plan_table(plan)
    month_col = table.headers.index("$/month")
    for row, system in zip(table.rows, plan.systems, strict=True):
        cell = row[month_col]
        assert cell.value == system.cheapest.usd_per_month
        assert cell.span == pytest.approx(system.cheapest.usd_per_month_range)
    assert "range" in table.note


def test_compare_tables_carry_a_simulated_runs_expected_range():
    """`tokenbench compare`: a simulated run's P99s and $/Mtok show their range, x/÷ (1 + e)
    with the run's own expected error per quantity; a measured run's stay bare."""
    from rich.console import Console

    from bench.console import comparison_tables

    cat = load_catalogue()
    pts = [_point(1, 600, 300, 30), _point(2, 1000, 500, 44), _point(4, 1800, 900, 59)]
    measured = _curve(pts, "B200-SXM", run_id="measured")
    simulated = _curve(pts, "B200-SXM", run_id="simulated")
    simulated.simulated = True
    errors = {"ttft_p99": 0.2, "tpot_p99": 0.1, "output_tps": 0.25}
    simulated.error_bars = {"basis": "test", "expected_error": errors}
    comps = compare_runs([measured, simulated], SLO, cat)
    console = Console(record=True, width=400)
    for table in comparison_tables(comps):
        console.print(table)
    text = console.export_text()
    ttft = comps[1].capacity.latency("ttft")
    row = next(line for line in text.splitlines() if "p99 TTFT ms at capacity" in line)
    assert f"{ttft:,.1f} ({ttft / 1.2:,.1f}-{ttft * 1.2:,.1f})" in row
    assert row.count("(") == 1  # the measured run's cell has no range
    tier = comps[1].cost_rows[0]
    usd = tier.output_usd_per_mtok_at_utilisation
    row = next(line for line in text.splitlines() if line.startswith(f"│ {tier.tier} "))
    assert f"{usd:,.3f} ({usd / 1.25:,.3f}-{usd * 1.25:,.3f})" in row and row.count("(") == 1


def test_a_flip_is_too_close_to_call_only_where_the_ranges_overlap():
    from bench.plan import _overlap

    assert _overlap((100, 200), (150, 300)) and _overlap((150, 300), (100, 200))
    assert not _overlap((100, 140), (150, 300)) and not _overlap((150, 300), (100, 140))
    assert _overlap((100, None), (150, 300))  # open above: reaches it
    assert not _overlap((None, None), (150, 300))  # unknown: nothing to say


def test_plan_by_tokens_per_day_and_bounds():
    cat = load_catalogue()
    at_least = _curve([_point(1, 1000, 300, 30)], "B200-SXM", run_id="a")
    below = _curve([_point(1, 1000, 300, 90)], run_id="b")
    comps = compare_runs([at_least, below], SLO, cat)
    plan = plan_capacity(comps, Demand(output_tokens_per_day=86_400 * 2500), cat)
    a, b = plan.systems
    assert a.gpus == 3 and a.gpus_range == (None, 3) and "lower bound" in a.note
    # "at most" already says it: no $ range beside a lower-bound capacity
    assert all(t.usd_per_month_range == (None, None) for t in a.tiers)
    assert b.gpus is None and "cannot be sized" in b.note
    assert plan.recommendation.legend == a.legend
    with pytest.raises(ValueError, match="peak factor"):
        Demand(requests_per_s=1, peak_factor=0.5)


def test_plan_comparison_objects_are_the_compare_ones():
    curve = _curve([_point(1, 1000, 300, 30)], "B200-SXM")
    (comp,) = compare_runs([curve], SLO, load_catalogue())
    assert isinstance(comp, RunComparison) and comp.capacity is comp.at_slo.point


def test_scenario_files_take_the_same_slo_grammar():
    from bench.scenario import ScenarioError

    assert parse_slo(parse_scenario('slo: "ttft:500 tpot:50"\n').slo) == parse_slo(
        "p99_ttft_ms<=500,p99_tpot_ms<=50"
    )
    with pytest.raises(ScenarioError, match="line 1: slo.*'p99_bogus<5'"):
        parse_scenario('slo: "p99_bogus<5"\n')


def test_default_demand_is_the_stored_one_else_the_scenario_mean_rate():
    from bench.plan import default_demand

    bursty = (
        "load: {shape: on_off, burst: {rate: 16, duration_s: 3}, quiet: {rate: 1, duration_s: 7}}\n"
    )
    stored = SimpleNamespace(
        extra_json={"demand": {"requests_per_s": 100, "peak_factor": 2, "source": "demo"}},
        scenario_text=bursty,
    )
    assert default_demand([stored]) == Demand(100, None, 2.0, "demo")
    plain = SimpleNamespace(extra_json=None, scenario_text=bursty)
    demand = default_demand([plain])
    assert demand.requests_per_s == pytest.approx(5.5)  # (16 x 3 + 1 x 7) / 10
    assert demand.peak_factor == 1.0 and "scenario" in demand.source
    closed = SimpleNamespace(
        extra_json=None, scenario_text="load: {shape: closed, concurrency: 4}\n"
    )
    assert default_demand([closed]) is None


def test_capacity_without_intervals_says_its_uncertainty_is_unknown():
    a, b = _point(1, 500, 300, 40), _point(2, 900, 300, 60)
    a.confidence = b.confidence = {}  # an imported run: summaries only
    cap = capacity_at_slo(_curve([a, b]), SLO)
    assert cap.value == pytest.approx(700) and cap.low is None and cap.high is None
    assert "interval unknown" in cap.text() and any("unknown" in f for f in cap.flags)


# ---------------------------------------------------------------- the commands


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """B200 x1 and H100 x2 swept in virtual time like the demo, SLO stored with the runs (up to
    24 req/s: B200 passes at 16 since the simulator models memory as the device reports it)."""
    from bench.demo import DEMO_SLO, TARGETS, virtual_sweep
    from bench.store.engine import dispose_all

    db = f"sqlite:///{tmp_path_factory.mktemp('cmd') / 'runs.db'}"
    ids = [virtual_sweep(t, (4.0, 8.0, 12.0, 16.0, 24.0), 30.0, DEMO_SLO, db) for t in TARGETS]
    yield db, ids
    dispose_all()


def _invoke(*args: str) -> str:
    from typer.testing import CliRunner

    from bench.cli import app

    res = CliRunner().invoke(app, list(args), env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    return " ".join(res.output.split())


def test_compare_uses_the_stored_slo_and_says_so(swept):
    from bench.curves import run_curves

    db, ids = swept
    out = _invoke("compare", *ids, "--db", db)
    assert "SLO used: p99_ttft_ms<=2000,p99_tpot_ms<=50 (stored with the runs)" in out
    comps = compare_runs(run_curves(ids, db), SLO, load_catalogue())
    assert ratio_sentence(comps) in out  # the same sentence as the library (and the exports)
    assert f"{comps[0].at_slo.value:,.0f} tok/s/GPU (range" in out
    given = _invoke("compare", *ids, "--db", db, "--slo", "ttft:1000")
    assert "SLO used: p99_ttft_ms<=1000 (given)" in given


def test_plan_command_prints_the_library_plan(swept):
    from bench.curves import run_curves

    db, ids = swept
    out = _invoke("plan", *ids, "--db", db, "--requests-per-s", "40", "--peak-factor", "1.5")
    comps = compare_runs(run_curves(ids, db), SLO, load_catalogue())
    plan = plan_capacity(comps, Demand(40, None, 1.5), load_catalogue())
    assert plan.sentence in out and "Demand: 40 req/s mean, peak x1.5 (given)" in out
    for s in plan.systems:
        assert f"{s.replicas:,} x {s.gpus_per_replica}" in out
    data = _invoke("plan", *ids, "--db", db, "--tokens-per-day", "1e9", "--json")
    assert '"output_tokens_per_day": 1000000000.0' in data


def test_interrupted_sweep_says_so_in_the_console(capsys):
    from bench.cli.sweep import print_sweep_result
    from bench.cost import load_catalogue as cat

    sweep = _sweep(_Session(interrupt_at=4))
    sweep.grid([PointSpec("rate", 2), PointSpec("rate", 4)])
    sc = parse_scenario("gpu: {type: H100-SXM, count: 1}\n")
    print_sweep_result(sweep.conclude(), sc, cat(), 1.0)
    out = " ".join(capsys.readouterr().out.split())
    assert "Sweep interrupted: the last point is partial" in out
    assert "Knee of the curve: point 1 (rate 2 req/s)" in out
    assert "at least 200 output tok/s per GPU" in out and "partial" in out


def test_mixed_sweep_kinds_are_ordered_by_what_was_served():
    # An auto sweep: a closed-loop baseline (1 user, 0.5 req/s) among rates 0.8 and 1.2.
    sync, r1, r2 = _point(1, 100, 300, 20), _point(0.8, 160, 300, 30), _point(1.2, 240, 300, 60)
    sync.requests_per_s, sync.offered_kind = 0.5, "concurrency"
    r1.offered_kind = r2.offered_kind = "rate"
    cap = capacity_at_slo(_curve([sync, r2, r1]), SLO)
    assert cap.last_pass is r1 and cap.first_fail is r2  # not the 1-user point
    assert cap.value == pytest.approx(160 + 80 * (50 - 30) / (60 - 30))


def test_show_prints_a_sweeps_capacity_at_its_stored_slo(swept):
    from bench.curves import run_curve

    db, ids = swept
    out = _invoke("show", ids[1], "--db", db)
    cap = capacity_at_slo(run_curve(ids[1], db), SLO)
    assert "SLO used: p99_ttft_ms<=2000,p99_tpot_ms<=50 (stored with the runs)" in out
    assert f"Capacity: {cap.text()}" in out and "INTERRUPTED" not in out


def test_plan_shows_prices_whose_products_add_up_names_flips_and_states_its_basis():
    import re

    from bench.cost import price_decimals, price_text

    assert (price_decimals(2.25), price_decimals(1.5456), price_decimals(12.0)) == (2, 4, 2)
    assert price_text(1.5456) == "$1.5456"
    a = _curve([_point(10, 2600, 900, 45), _point(12, 2800, 1500, 55)], "B200-SXM", run_id="a")
    # the same 260 output tokens per request as a's (2 GPUs x 950 tok/s at 7.3 req/s)
    b = _curve(
        [_point(7.3, 950, 900, 45, gpus=2), _point(8.1, 1050, 1500, 55, gpus=2)],
        "H100-SXM", 2, run_id="b",
    )  # fmt: skip
    a.shape = b.shape = (
        "input 512 tokens (lognormal), output 256 tokens (lognormal), poisson arrivals"
    )
    comps = compare_runs([a, b], SLO, load_catalogue())
    plan = plan_capacity(comps, Demand(requests_per_s=100, peak_factor=2), load_catalogue())
    text = plan.sentence
    # the shown price x GPUs x 730 h is the shown $/month, to the dollar
    gpus = int(re.search(r"(\d+) x B200-SXM", text).group(1))
    price = float(re.search(r"\(\$([\d.]+)/GPU-hour", text).group(1))
    month = float(re.search(r"\$([\d,]+)/month", text).group(1).replace(",", ""))
    assert abs(gpus * price * 730 - month) <= 1
    assert "owned-tco" in text and "computed: owned TCO" in text  # how the price was arrived at
    # B200's hyperscaler price is derived, not quoted, and there H100 costs less per month
    assert "The answer flips: on hyperscaler-on-demand" in text
    assert "derived: 2 x neocloud-on-demand, not quoted" in text
    # a flip inside both $/month ranges is called too close; one outside them is not
    best = next(s for s in plan.systems if s.legend == plan.recommendation.legend)
    other = next(s for s in plan.systems if s is not best)
    mine, theirs = (
        next(t for t in sys.tiers if t.tier == "hyperscaler-on-demand") for sys in (best, other)
    )
    overlap = theirs.usd_per_month_range[1] >= mine.usd_per_month_range[0]
    assert ("too close to call" in text) == overlap
    assert any(a.shape in line for line in plan.assumptions)
    # the verdict's sentence names the tiers it priced and where the comparison turns
    verdict = ratio_sentence(comps)
    assert "on each one's cheapest tier (owned-tco $" in verdict
    assert "but more on hyperscaler-on-demand" in verdict
    other = Demand(requests_per_s=100, shape="input 8,000 tokens (fixed), output 1,000 tokens")
    warned = plan_capacity(comps, other, load_catalogue()).assumptions
    assert any(line.startswith("WARNING: the demand's shape") for line in warned)


def test_a_figure_and_its_range_read_alike_in_the_cli_the_plan_and_the_exports():
    """One wording (bench.curves.with_range): the plan's $ figures, the exports' Num cells and
    the CLI's expected ranges; a range whose ends round alike is not shown, an unknown end
    reads "?" or "open"."""
    from bench.console import _fmt_expected
    from bench.curves import with_range
    from bench.export.report import Num
    from bench.plan import span_text

    def fmt(v):
        return f"{v:,.1f}"

    assert with_range(771.6, (686.04, 867.2), fmt) == "771.6 (686.0-867.2)"
    assert with_range(771.6, (771.61, 771.64), fmt) == "771.6"
    assert with_range(771.6, (700.0, None), fmt) == "771.6 (700.0-open)"
    assert with_range(771.6, (None, 800.0), fmt) == "771.6 (?-800.0)"
    assert with_range(771.6, None, fmt) == with_range(771.6, (None, None), fmt) == "771.6"
    assert with_range(None, (1.0, 2.0), fmt) == "—"
    assert span_text(10154.2, (9026.0, 11282.4), 0, "/month") == "$10,154/month ($9,026-$11,282)"
    assert Num(10154.2, 0, "$", span=(9026.0, 11282.4)).text() == "$10,154 ($9,026-$11,282)"
    assert Num(5.0, 1, span=(5.01, 5.04)).text() == "5.0"  # ends that round alike
    assert Num(float("nan"), 1, span=(1.0, 2.0)).text() == "—"

    class Simulated:
        def expected_span(self, name, value):
            return (value / 1.1, value * 1.1)

    assert _fmt_expected(Simulated(), "output_tps", 100.0, 1) == "100.0 (90.9-110.0)"


def test_a_gpu_count_and_its_range_read_alike_in_the_cli_and_the_exports():
    """bench.plan.gpus_text: one wording for the plan table of the CLI and of every export."""
    from dataclasses import replace

    from bench.plan import SystemPlan, gpus_text

    s = SystemPlan("r", "B200", "B200-SXM", 1, "interpolated", "", 1.0, 38, 38, (32, 44), 5)
    assert gpus_text(s) == "38 (32-44)"
    assert gpus_text(replace(s, gpus_range=(38, 38))) == "38"
    assert gpus_text(replace(s, gpus_range=(32, None))) == "38 (open above)"
    assert gpus_text(replace(s, capacity_kind="at_least", gpus_range=(None, 38))) == "at most 38"
    assert gpus_text(replace(s, gpus=None)) == "cannot be sized"
    assert gpus_text(replace(s, gpus=1200, gpus_range=(1000, 1500))) == "1,200 (1,000-1,500)"


def test_plan_calls_a_flip_between_two_simulated_gpus_by_their_capacity_ratio():
    """Two GPUs simulated with the published fit share its error: a month 32% cheaper is
    beyond their capacity ratio's range (the fit's error on a ratio of GPUs) though each
    side's $/month range, holding the whole fit error, overlaps the other's; a month 6%
    cheaper is within it."""
    from bench.choose import cheaper_beyond_ranges
    from bench.plan import _overlap

    cat = load_catalogue()
    a = _curve([_point(10, 2600, 900, 45), _point(12, 2800, 1500, 55)], "B200-SXM", run_id="a")
    b = _curve(
        [_point(9.6, 1250, 900, 45, gpus=2), _point(10.6, 1380, 1500, 55, gpus=2)],
        "H100-SXM", 2, run_id="b",
    )  # fmt: skip
    for c in (a, b):
        c.simulated, c.model = True, "llama-3.3-70b"
    comps = compare_runs([a, b], SLO, cat)
    assert comps[0].at_slo.sim_category == comps[1].at_slo.sim_category == "dense"
    plan = plan_capacity(comps, Demand(requests_per_s=100, peak_factor=2), cat)
    best, other = plan.systems  # B200 is the cheapest option
    assert plan.recommendation.legend == best.legend
    flips = {}
    for mine in best.tiers:
        theirs = next((t for t in other.tiers if t.tier == mine.tier), None)
        if theirs and mine.usd_per_month and theirs.usd_per_month < mine.usd_per_month:
            beyond = cheaper_beyond_ranges(
                theirs.usd_per_month, mine.usd_per_month, comps[1].at_slo, comps[0].at_slo
            )
            overlap = _overlap(mine.usd_per_month_range, theirs.usd_per_month_range)
            flips[mine.tier] = (beyond, overlap)
    # hyperscaler: $113,880 vs $166,440 a month; 3-year rental: $37,960 vs $40,223
    assert flips == {"hyperscaler-on-demand": (True, True), "inferencex-rental-3yr": (False, True)}
    text = plan.sentence
    hyper, rental = text.split("on hyperscaler-on-demand ")[1].split(" on inferencex-rental-3yr ")
    assert "too close to call" not in hyper  # compounded, the two ranges would have said so
    assert "within the range of their capacity ratio, so too close to call" in rental
