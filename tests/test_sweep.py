"""Sweeps, SLO capacity, knee, curves and compare against the fake server and the simulator."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

from bench.cost import load_catalogue
from bench.curves import (
    capacity_at_slo,
    compare_runs,
    cost_curve,
    interactivity_curve,
    latency_curve,
    ratio_sentence,
    run_curve,
)
from bench.drive import measure
from bench.metrics import Summary, parse_thresholds, stats_ms
from bench.scenario import mean_rate, parse_scenario
from bench.sweep import (
    PointResult,
    PointSpec,
    SweepPlan,
    knee,
    scenario_at,
    stop_reason,
)


def _summary(out_tps: float, p99_e2el: float, *, failed: int = 0, completed: int = 100) -> Summary:
    st = stats_ms(np.array([p99_e2el * 1e6]), (50, 99))
    return Summary(
        completed=completed, failed=failed, cancelled=0, errors={}, duration_s=10,
        requests_per_s=completed / 10, output_tokens_per_s=out_tps, total_tokens_per_s=out_tps,
        total_input_tokens=0, total_output_tokens=0,
        metrics={m: st for m in ("ttft", "tpot", "itl", "e2el")}, ttft_from_intended=st,
        goodput_requests_per_s=None, send_lag_ms={"p50": 0, "p99": 0, "max": 0},
        client_limited=False,
    )  # fmt: skip


def test_knee_is_where_throughput_flattens_and_latency_climbs():
    pts = [
        PointResult(0, PointSpec("rate", 1), _summary(100, 200)),
        PointResult(1, PointSpec("rate", 2), _summary(200, 210)),
        PointResult(2, PointSpec("rate", 4), _summary(390, 260)),
        PointResult(3, PointSpec("rate", 8), _summary(410, 900)),
        PointResult(4, PointSpec("rate", 16), _summary(415, 4000)),
    ]
    assert knee(pts).index == 2


def test_stop_rule():
    slo = parse_thresholds("p99_ttft_ms<=100", flag="--slo")
    assert stop_reason(_summary(1, 50), slo, 0.5) is None
    assert "10x the SLO" in stop_reason(_summary(1, 1500), slo, 0.5)
    assert "error rate" in stop_reason(_summary(1, 50, failed=80, completed=20), slo, 0.5)


def test_scenario_at_keeps_the_bursty_shape():
    sc = parse_scenario(
        "load:\n  shape: on_off\n  burst: {rate: 16, duration_s: 3}\n"
        "  quiet: {rate: 1, duration_s: 7}\n  num_prompts: 10\n"
    )
    assert mean_rate(sc) == pytest.approx(5.5)
    at = scenario_at(sc, PointSpec("rate", 11.0), point_duration_s=10)
    assert at.load.shape == "on_off"
    assert (at.load.burst.rate, at.load.quiet.rate) == (32, 2)
    assert at.load.num_prompts == 110
    closed = scenario_at(sc, PointSpec("concurrency", 8), point_duration_s=5)
    assert closed.load.shape == "closed" and closed.load.concurrency == 8
    assert sc.load.burst.rate == 16  # the original is untouched


def tokenbench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], capture_output=True, text=True, timeout=300,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


@pytest.mark.slow
def test_sweep_stores_load_points_and_finds_capacity(server_factory, tmp_path):
    # TTFT 30 ms, 5 ms per token: p99 TTFT stays ~30 ms at low load; inf sends all at once.
    server = server_factory("--ttft-ms", "30", "--itl-ms", "5")
    db = f"sqlite:///{tmp_path / 'sw.db'}"
    proc = tokenbench(
        "sweep", "--base-url", server.url, "--request-rates", "5,10,20", "--num-prompts", "20",
        "--random-input-len", "16", "--random-output-len", "8", "--slo", "p99_ttft_ms<=200",
        "--slo-iterations", "0", "--gpu", "h100", "--num-gpus", "2", "--db", db,
        "--label", "fake H100 pair",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "SLO capacity" in proc.stdout and "$/Mtok on H100-SXM x2" in proc.stdout
    assert "at least" in proc.stdout  # every rate met the SLO: a lower bound, said so
    from bench.store.read import list_runs

    (run,) = list_runs(db)
    curve = run_curve(run.id, db)
    assert run.gpu_type == "H100-SXM" and run.gpu_count == 2
    assert [p.offered for p in sorted(curve.points, key=lambda p: p.offered)] == [5, 10, 20]
    for p in curve.points:
        assert p.completed == 20
        assert p.latency("ttft", "p50") == pytest.approx(30, abs=10)
        assert p.latency("ttft", "p99") < 200
        assert p.interactivity == pytest.approx(200, rel=0.1)  # 1000 / 5 ms
        assert p.output_tps_per_gpu == pytest.approx(p.output_tps / 2)
    xs, ys = latency_curve(curve, "ttft", "p99")
    assert len(xs) == 3 and xs == sorted(xs)
    ix, iy = interactivity_curve(curve)
    assert len(ix) == 3
    cat = load_catalogue()
    cx, cy = cost_curve(curve, cat, "neocloud-on-demand")
    price = next(
        t for t in cat.tiers("H100-SXM") if t.name == "neocloud-on-demand"
    ).price_usd_per_gpu_hr
    best = max(curve.points, key=lambda p: p.output_tps)
    expected = price * 2 / (best.output_tps * 3600) * 1e6
    assert min(cy) == pytest.approx(expected, rel=1e-9)
    slo = parse_thresholds("p99_ttft_ms<=200", flag="--slo")
    cap = capacity_at_slo(curve, slo)
    assert cap.kind == "at_least" and cap.point is best and cap.value == best.output_tps_per_gpu


@pytest.mark.slow
def test_sweep_stop_rule_ends_early_against_failing_server(server_factory, tmp_path):
    server = server_factory("--ttft-ms", "5", "--itl-ms", "1", "--fault", "1:http_500")
    proc = tokenbench(
        "sweep", "--base-url", server.url, "--request-rates", "5,10,20,40", "--num-prompts", "5",
        "--db", f"sqlite:///{tmp_path / 'x.db'}",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr  # nothing succeeded: not a result (issue 23)
    assert "stopped after rate 5 req/s: error rate 100%" in proc.stdout
    assert "No request succeeded" in proc.stderr


def test_slo_bisection_narrows_capacity(tmp_path):
    """In virtual time (fast, exact): bisection lands between the passing and failing rates."""
    from bench.sim.virtual import VirtualExecutor

    sc = parse_scenario(
        "load: {shape: poisson, request_rate: 1, num_prompts: 200}\n"
        "workload: {input: {mean: 512}, output: {mean: 128}}\n"
    )
    db = f"sqlite:///{tmp_path / 'v.db'}"
    rates = [0.5, 1, 2, 4, 8, 16, 32]
    virtual = VirtualExecutor("H100", "llama-3.3-70b", tp=2)
    result = measure(
        virtual.adopt(sc), SweepPlan([PointSpec("rate", r) for r in rates], point_duration_s=60),
        executor=virtual, db=db,
    )  # fmt: skip
    run_id = result.run_id
    p99 = [p.summary.value("p99_ttft_ms") for p in result.points]
    assert p99[-1] > 5 * p99[0]  # overload shows up as queueing in TTFT
    curve = run_curve(run_id, db)
    assert curve.simulated and len(curve.points) == len(rates)
    slo = parse_thresholds("p99_ttft_ms<=1000", flag="--slo")
    cap = capacity_at_slo(curve, slo)
    # Bracketed by adjacent rates, and interpolated to where P99 TTFT crosses the limit.
    assert cap.kind == "interpolated"
    assert rates.index(cap.first_fail.offered) == rates.index(cap.last_pass.offered) + 1
    assert cap.point.latency("ttft", "p99") == pytest.approx(1000)
    assert cap.last_pass.output_tps_per_gpu <= cap.value <= cap.first_fail.output_tps_per_gpu
    assert cap.low <= cap.value <= cap.high
    comps = compare_runs([curve, curve], slo, load_catalogue())
    sentence = ratio_sentence(comps)
    assert "serves 1.00x" in sentence and "could flip" in sentence  # a run against itself
    assert all(
        math.isfinite(r.output_usd_per_mtok) for r in comps[0].cost_rows if r.output_usd_per_mtok
    )
