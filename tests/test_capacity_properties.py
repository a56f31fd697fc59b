"""Capacity at an SLO can never contradict itself, whatever the latency curve.

Property tests (hypothesis) over random curves: throughput that falls past saturation,
latencies that are not monotone in load, noisy passes above a failure, re-measured
brackets. Plus the inverted ranges `sim run --slo` printed (issue 27), reproduced first.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.curves import CurvePoint, RunCurve, capacity_at_slo, capacity_ratio
from bench.metrics import parse_slo
from tests.helpers import ttft_checks_off_by

SLO = parse_slo("p99_ttft_ms<=2000,p99_tpot_ms<=50")


def _point(load, tps, ttft, tpot, *, ci=0.02, role="grid", draw=None) -> CurvePoint:
    conf = {
        f"{m}_ms": {"count": 1000, "level": 0.95, "p99": [v * (1 - ci), v * (1 + ci)]}
        for m, v in (("ttft", ttft), ("tpot", tpot))
    }
    return CurvePoint(
        load_point=0, title=f"rate {load:g} req/s", offered=load, requests_per_s=load,
        output_tps_per_gpu=tps, total_tps_per_gpu=tps * 3, output_tps=tps,
        total_tps=tps * 3, completed=1000, failed=0,
        metrics={"ttft_ms": {"p50": ttft / 2, "p99": ttft}, "tpot_ms": {"p50": 20, "p99": tpot}},
        confidence=conf, offered_kind="rate", role=role, draw=draw,
    )  # fmt: skip


def _curve(points, run_id="r", simulated=False) -> RunCurve:
    c = RunCurve(run_id, run_id, run_id, "B200-SXM", 1, "llama-3.3-70b", simulated, None, "done")
    c.points = list(points)
    return c


def _consistent(cap, curve) -> None:
    """lower <= estimate <= upper, and never below a load that passed (every time it was
    measured: grid, fresh draws, longer points) with no failing load beneath it."""
    if cap.kind != "interpolated":
        return
    if cap.low is not None:
        assert cap.low <= cap.value <= cap.high
    by_load: dict[float, list] = {}
    for p in curve.points:
        by_load.setdefault(p.offered, []).append(p)
    floor = 0.0
    for load in sorted(by_load):
        if not all(p.meets(SLO) for p in by_load[load]):
            break
        grid = [p for p in by_load[load] if p.role == "grid"] or by_load[load]
        floor = max(floor, grid[0].output_tps_per_gpu)
    assert cap.value >= floor


# -- the cases `sim run --slo` printed with default settings (issue 27) -----------------------


def test_throughput_falling_past_the_boundary_gives_no_inverted_range():
    # The failing load served fewer tok/s than the passing one below it: the interpolation
    # ran backwards and printed "2,577 (95% interval 2,600-2,564)".
    curve = _curve([_point(4, 1300, 300, 20), _point(8, 2600, 900, 44), _point(10, 2564, 3000, 70)])
    cap = capacity_at_slo(curve, SLO)
    assert cap.low <= cap.value <= cap.high
    assert cap.value == 2600  # rate 8 served 2,600 within the SLO: no less than that
    assert cap.point.title == "rate 8 req/s"


def test_capacity_is_never_below_a_load_that_passed():
    # rate 8 passed at 2,600; rate 9 passed at 2,590 (noise); rate 10 failed at 2,700.
    # Interpolating from rate 9 alone gave a capacity below what rate 8 served.
    curve = _curve(
        [_point(8, 2600, 900, 40), _point(9, 2590, 900, 49.9), _point(10, 2700, 3000, 90)]
    )
    cap = capacity_at_slo(curve, SLO)
    assert cap.value >= 2600 and cap.low <= cap.value <= cap.high


def test_ratio_of_inverted_brackets_is_ordered():
    a = _curve([_point(8, 2600, 900, 44), _point(10, 2564, 3000, 70)], "a")
    b = _curve([_point(8, 1050, 900, 44), _point(10, 1040, 3000, 70)], "b")
    ratio, _ = capacity_ratio(capacity_at_slo(a, SLO), capacity_at_slo(b, SLO))
    assert ratio.low <= ratio.value <= ratio.high


def test_draws_and_longer_points_widen_the_range_and_move_the_estimate():
    grid = [_point(8, 2000, 900, 40), _point(10, 2400, 900, 60)]  # crossing at 50%: 2,200
    draws = [
        _point(8, 2000, 900, 45, role="draw", draw=1),  # crossing at 100%... of 45->50->55
        _point(10, 2400, 900, 55, role="draw", draw=1),  # = 50%: 2,200
        _point(8, 1980, 900, 30, role="draw", draw=2),
        _point(10, 2380, 900, 70, role="draw", draw=2),  # 50% again: 2,180
    ]
    long = [_point(8, 2000, 900, 48, role="long"), _point(10, 2400, 900, 58, role="long")]
    cap = capacity_at_slo(_curve(grid + draws + long), SLO)
    # one monotone fit over all of them: P99 TPOT 40.75 ms at rate 8 (mean of 40, 45, 30,
    # 48) and 60.75 at rate 10 cross 50 ms 46.25% of the way: 2,185 tok/s
    assert cap.value == pytest.approx(2185)
    # each draw alone: 45 -> 55 and 30 -> 70 both cross half way (2,200 and 2,180)
    assert cap.parts["draws"] == pytest.approx((2180, 2200))
    assert cap.parts["long"] == pytest.approx((2080, 2185))  # 48 -> 58: 20% of the way
    assert cap.low == 2000 and cap.high == 2400  # the bracket still dominates
    assert any("fresh prompt" in w for w in cap.includes())
    assert any("twice as long" in w for w in cap.includes())


@pytest.fixture
def ttft_further_off():
    with ttft_checks_off_by(-0.5):  # a range of x/÷ 2 holds them
        yield


def test_a_simulated_range_folds_in_the_error_of_the_figures_that_could_decide_it(
    ttft_further_off,
):
    """x/÷ (1 + error) of the SLO figures that, off by their error at the capacity, would break
    their limit: the deciding TPOT's (and throughput's) always; TTFT's larger error only where
    TTFT is close enough to its limit to decide within it (the TTFT checks read 50% off here:
    measured twice the simulated, a range of x/÷ 2)."""
    from bench.sim.profiles.accuracy import expected_errors

    errors, basis = expected_errors("B200-SXM", "llama-3.3-70b")
    tpot, ttft = errors["tpot_p99"], errors["ttft_p99"]
    assert ttft > tpot  # the independent TTFT checks are further off than the fitted points
    pts = [_point(8, 2000, 900, 40), _point(10, 2400, 900, 60)]
    cap = capacity_at_slo(_curve(pts, simulated=True), SLO)
    # TTFT p99 900 ms, 900 x (1 + ttft) still under its 2,000 ms: it cannot decide; TPOT's
    # error widens the range. An error of 100% or more never takes it below zero.
    assert cap.low == pytest.approx(2000 / (1 + tpot)) and cap.high == pytest.approx(
        2400 * (1 + tpot)
    )
    assert cap.sim_error == tpot and "dense models" in basis and basis in cap.sim_basis
    assert "widened by p99_tpot_ms's" in cap.sim_basis and "left out" in cap.sim_basis
    assert "p99_ttft_ms at 900 against 2000" in cap.sim_basis
    assert any("held out of the fit" in w for w in cap.includes())
    # TTFT p99 at 1,500 ms: x 2 would break 2,000 ms, so its error widens the range
    near = [_point(8, 2000, 1500, 40), _point(10, 2400, 1500, 60)]
    cap = capacity_at_slo(_curve(near, simulated=True), SLO)
    assert cap.sim_error == ttft and "widened by p99_ttft_ms's" in cap.sim_basis
    assert cap.low == pytest.approx(2000 / (1 + ttft))
    measured = capacity_at_slo(_curve(pts, simulated=False), SLO)
    assert measured.sim_error is None and (measured.low, measured.high) == (2000, 2400)


def test_a_ratio_of_two_simulated_runs_carries_the_fits_error_on_a_ratio_not_both_errors():
    """Both sides simulated with the published fit share its errors: the ratio is off by the
    held-out pairs of GPUs' error (accuracy.ratio_error), not by each side's compounded."""
    from bench.sim.profiles.accuracy import expected_errors, ratio_error

    a = capacity_at_slo(
        _curve([_point(8, 4000, 900, 40), _point(10, 4800, 900, 60)], "a", True), SLO
    )
    b = capacity_at_slo(
        _curve([_point(8, 2000, 900, 40), _point(10, 2400, 900, 60)], "b", True), SLO
    )
    err = expected_errors("B200-SXM", "llama-3.3-70b")[0]["tpot_p99"]
    r, basis = ratio_error("dense", "dense")
    assert a.sim_category == b.sim_category == "dense" and r < err
    ratio, _ = capacity_ratio(a, b)
    # the measured parts: 4,000-4,800 over 2,000-2,400; then x/÷ (1 + r)
    assert ratio.low == pytest.approx(4000 / 2400 / (1 + r))
    assert ratio.high == pytest.approx(4800 / 2000 * (1 + r))
    assert (ratio.sim_error, ratio.sim_basis) == (r, basis) and "pairs" in basis
    # compounded, each side's error would have given a far wider range
    assert ratio.low > (a.low / b.high) * 1.2 and ratio.high < (a.high / b.low) / 1.2
    # a measured side keeps the old arithmetic (each side's own range)
    m = capacity_at_slo(_curve([_point(8, 2000, 900, 40), _point(10, 2400, 900, 60)], "m"), SLO)
    mixed, _ = capacity_ratio(a, m)
    assert mixed.sim_error is None and mixed.low == pytest.approx(a.low / m.high)
    # a side that is a bound (every load met the SLO) keeps each side's own range, and says so
    top = capacity_at_slo(
        _curve([_point(8, 4000, 900, 40), _point(10, 4800, 900, 45)], "t", True), SLO
    )
    bounded, _ = capacity_ratio(top, b)
    assert top.kind == "at_least" and bounded.bound == "at least"
    assert bounded.sim_error is None and bounded.low == pytest.approx(top.low / b.high)


# -- properties over random curves ------------------------------------------------------------

_latency = st.floats(1.0, 400.0, allow_nan=False)


@st.composite
def _curves(draw):
    n = draw(st.integers(1, 8))
    rates = sorted(draw(st.lists(st.floats(0.5, 64.0), min_size=n, max_size=n, unique=True)))
    pts = [
        _point(
            r,
            draw(st.floats(10.0, 5000.0)),
            draw(st.floats(50.0, 6000.0)),
            draw(_latency),
            ci=draw(st.floats(0.0, 0.5)),
        )
        for r in rates
    ]
    # re-measurements at random subsets of the tested rates, with their own figures
    for role in ("draw", "long"):
        for k in range(draw(st.integers(0, 3))):
            for r in draw(st.lists(st.sampled_from(rates), max_size=n, unique=True)):
                pts.append(
                    _point(r, draw(st.floats(10.0, 5000.0)), 900, draw(_latency), role=role, draw=k)
                )
    return _curve(draw(st.permutations(pts)), simulated=draw(st.booleans()))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_curves())
def test_capacity_never_contradicts_itself(curve):
    cap = capacity_at_slo(curve, SLO)
    _consistent(cap, curve)
    if cap.kind == "interpolated":
        # the bracket of the fitted boundary, in load order (one load when the fit never
        # crosses within the loads tested)
        assert cap.last_pass.offered <= cap.first_fail.offered
        for lo, hi in cap.parts.values():
            assert lo <= hi


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_curves(), _curves())
def test_ratio_range_holds_the_ratio(a, b):
    ratio, _ = capacity_ratio(capacity_at_slo(a, SLO), capacity_at_slo(b, SLO))
    if ratio is None:
        return
    if ratio.low is not None:
        assert ratio.low <= ratio.value * (1 + 1e-12)
    if ratio.high is not None:
        assert ratio.value <= ratio.high * (1 + 1e-12)


# -- matched load and the demo's real-time check ----------------------------------------------


def test_matched_load_compares_the_runs_at_equal_load():
    from bench.cost import load_catalogue
    from bench.curves import compare_runs

    a = _curve([_point(2, 1000, 200, 20), _point(4, 2000, 400, 30), _point(6, 3000, 900, 60)], "a")
    b = _curve([_point(2, 700, 300, 30), _point(4, 1400, 900, 45), _point(6, 1500, 5000, 90)], "b")
    comps = compare_runs([a, b], SLO, load_catalogue())
    level = min(c.at_slo.value for c in comps)  # the lower capacity: both still serve there
    at = [c.at_matched_load for c in comps]
    assert [p.output_tps_per_gpu for p in at] == pytest.approx([level, level])
    # a's TPOT read off its own curve at that load: 20 ms at 1,000, 30 ms at 2,000
    assert at[0].latency("tpot") == pytest.approx(20 + 10 * (level - 1000) / 1000)


def test_the_demo_says_why_its_real_time_check_missed_the_slo():
    from types import SimpleNamespace

    from bench.demo import slo_miss_reason

    def summary(tpot):
        return SimpleNamespace(value={"p99_tpot_ms": tpot}.get, completed=70)

    (t,) = parse_slo("p99_tpot_ms<=50")
    text = slo_miss_reason([t], summary(51.6), summary(51.2), 0.062)
    assert text.startswith("It misses the SLO: p99_tpot_ms<=50 (51.6).")
    assert "62 ms behind its schedule" in text and "edge of the capacity" in text
    on_time = slo_miss_reason([t], summary(58.0), summary(40.0), 0.001)
    assert "no cause found" in on_time
