"""`tokenbench demo`: B200 beside H100 on a laptop, with simulated endpoints.

Llama-3.3-70B in FP8 on one B200, and on two H100s with tensor parallelism 2 (70B in FP8
does not leave room for a useful KV cache on one 80 GB H100), serving the shipped bursty
chat scenario. Two parts:

1. The verdict, in virtual time: each GPU swept over a dense grid of mean rates, two minutes
   of traffic per point (twelve bursts), so both capacities are bracketed and interpolated
   between neighbouring rates. Two minutes per point is what makes the answer stable: the
   bursty shape repeats every 10 s, and points of a few seconds measured one burst or none
   (the 6.5x of issue 17 came from 8 s points that never broke the SLO). Virtual time runs
   the same engine model without waiting, so an hour of traffic takes seconds, and
   rerunning gives the same requests (the scenario's seed) and the same answer.
2. The real load generator against both endpoints served over HTTP in real time, at the
   last rate each GPU met the SLO, checked against virtual time on the very same requests:
   the path a real benchmark takes, shown to agree with the model behind the verdict.

Both parts are stored (labelled simulated); the comparison, the buying answer for an
example demand and the next commands are printed.

An application of the library, not part of it: it sits above the sweep, the simulator, the
store and the console, and only the CLI imports it (tests/test_layering.py).
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.curves import SIM_LATE_MS
from bench.drive import choose_executor, measure
from bench.sweep import PointSpec, SweepPlan

SCENARIOS_DIR = Path(__file__).resolve().parents[1] / "scenarios"
DEMO_SCENARIO = SCENARIOS_DIR / "chat-bursty.yaml"
DEMO_MODEL = "llama-3.3-70b"
DEMO_PRECISION = "fp8"
# Mean offered rates of the virtual-time sweep (the bursty shape is kept, scaled to each
# mean): 1 req/s apart, wide enough that both GPUs break the SLO inside it.
DEMO_RATES = tuple(float(r) for r in range(2, 17))
DEMO_POINT_S = 120.0  # virtual seconds of traffic per point (twelve bursts)
DEMO_CHECK_S = 8.0  # real seconds of traffic at the real-time check point
DEMO_SLO = "p99_ttft_ms<=2000,p99_tpot_ms<=50"
# Fresh draws of prompts and arrivals the SLO search measures at the two loads bracketing the
# boundary (the library's default is 2). Every measurement informs one monotone fit of each SLO
# metric against load, and the demo's p99 TPOT crosses its limit on a shallow slope, so two
# draws left its verdict 2-5% from a dense grid's by seed (3.02x, 2.93x, 2.91x against 2.86x,
# 2.87x, 2.88x; 2026-12-07, sixth refit); four: 2.95x, 2.96x, 2.81x against the dense grid's
# 2.90x, for about 2 s more
DEMO_DRAWS = 4
DEMO_MAX_OUTPUT = 384  # keeps each real-time point's drain short
# The example demand the buying answer is sized for (change it with `tokenbench plan`).
DEMO_DEMAND_RPS = 100.0
DEMO_PEAK_FACTOR = 2.0


@dataclass(frozen=True)
class DemoTarget:
    gpu: str
    tp: int


TARGETS = (DemoTarget("B200-SXM", 1), DemoTarget("H100-SXM", 2))


DEMO_SEED = 0
# A check within this fraction of a limit in virtual time is at the capacity's edge.
EDGE = 0.05


def demo_scenario(target: DemoTarget, base_url: str | None = None):
    """The shipped bursty chat scenario set up for one demo target."""
    from bench.scenario import load_scenario

    sc = load_scenario(DEMO_SCENARIO)
    sc.target.base_url = base_url or "http://sim.virtual"
    sc.target.model = DEMO_MODEL
    sc.gpu.type, sc.gpu.count = target.gpu, target.tp
    sc.label = f"{target.gpu} x{target.tp} {DEMO_MODEL} {DEMO_PRECISION}"
    sc.workload.output.max = DEMO_MAX_OUTPUT
    sc.request_timeout_s = 60
    # Fixed prompts: the same requests on every rerun are what makes the demo's verdict
    # reproducible. The simulator's prefix cache cannot flatter them: every point runs on a
    # fresh engine (or a fresh endpoint), and within a point these random prompts share no
    # 16-token block (checked: 9,802 blocks over the 300 prompts, none repeated).
    sc.seed = DEMO_SEED
    return sc


def virtual_sweep(target: DemoTarget, rates, point_s: float, slo: str, db: str | None) -> str:
    """A rate sweep in virtual time, stored like `tokenbench sweep` stores one (SLO included,
    so `compare`, the dashboard and the exports use it by default). Returns the run id."""
    from bench.metrics import parse_slo

    sc = demo_scenario(target)
    sc.label += " (virtual time)"
    # The example demand the demo sizes: `plan`, the API and the exports default to it.
    demand = {
        "requests_per_s": DEMO_DEMAND_RPS,
        "peak_factor": DEMO_PEAK_FACTOR,
        "source": "the demo's example demand",
    }
    # The library's SLO search follows the grid (bench.sweep.Sweep.slo_search): fresh draws
    # and longer points at the bracketing rates, then bisection until the bracket is
    # narrower than that spread, so a coarse and a dense grid give the same answer.
    plan = SweepPlan(
        specs=[PointSpec("rate", rate) for rate in rates], thresholds=parse_slo(slo),
        point_duration_s=point_s, slo_draws=DEMO_DRAWS,
    )  # fmt: skip
    deployment = {"gpu": target.gpu, "model": DEMO_MODEL, "precision": DEMO_PRECISION,
                  "tp": target.tp}  # fmt: skip
    result = measure(
        sc, plan, executor=choose_executor(virtual=deployment), base_dir=DEMO_SCENARIO.parent,
        db=db, extra={"demand": demand},
    )  # fmt: skip
    return result.run_id


def run_demo(
    db: str | None = None,
    *,
    rates=DEMO_RATES,
    point_s: float = DEMO_POINT_S,
    check_s: float = DEMO_CHECK_S,
) -> list[str]:
    """Run the demo; returns the two verdict runs' ids (B200 first), then the two
    real-time check runs' ids."""
    from bench.console import comparison_tables, console
    from bench.cost import load_catalogue
    from bench.curves import compare_runs, ratio_sentence, run_curves, slo_line
    from bench.metrics import parse_slo
    from bench.plan import default_demand, plan_capacity
    from bench.store import get_run

    started = time.monotonic()
    slo = parse_slo(DEMO_SLO)
    console.rule("[bold]1. The verdict: SIMULATED sweeps in virtual time[/]")
    verdict_ids = []
    for target in TARGETS:
        t0 = time.monotonic()
        verdict_ids.append(virtual_sweep(target, rates, point_s, DEMO_SLO, db))
        (curve,) = run_curves(verdict_ids[-1:], db)
        top = max(p.offered for p in curve.points)  # the stop rule ends far past the SLO
        console.print(
            f"{target.gpu} x{target.tp}: {len(curve.points)} mean rates from {min(rates):g} to "
            f"{top:g} req/s, {point_s:g} s of bursty traffic each "
            f"({time.monotonic() - t0:.1f} s)"
        )
    curves = run_curves(verdict_ids, db)
    catalogue = load_catalogue()
    comparisons = compare_runs(curves, slo, catalogue)

    console.rule("[bold]2. The real load generator against the HTTP endpoints (real time)[/]")
    check_ids = []
    for target, comp in zip(TARGETS, comparisons, strict=True):
        cap = comp.at_slo
        anchor = cap.last_pass or cap.point or cap.first_fail
        rate = anchor.offered if anchor is not None and anchor.offered else rates[0]
        run_id, line = real_time_check(target, rate, check_s, db)
        check_ids.append(run_id)
        console.print(line)

    console.rule("[bold]B200 beside H100 (simulated)[/]")
    console.print(slo_line(slo, "the demo's"))
    for table in comparison_tables(comparisons):
        console.print(table)
    for c in comparisons:
        for flag in c.at_slo.flags:
            console.print(f"[yellow]caution[/] ({c.curve.legend}): {flag}")
    sentence = ratio_sentence(comparisons)
    if sentence:
        console.print(f"[bold]{sentence}[/]")
    plan = plan_capacity(
        comparisons, default_demand([get_run(verdict_ids[0], db)]), catalogue,
        slo_source="the demo's",
    )  # fmt: skip
    console.print(f"[bold]Buying answer:[/] {plan.sentence}")
    b, h = (r[:8] for r in verdict_ids)
    console.print(
        f"\nDemo took {time.monotonic() - started:.0f} s. Stored runs {b} (B200) and {h} "
        f"(H100) in virtual time, {check_ids[0][:8]} and {check_ids[1][:8]} in real time; "
        "all marked simulated.\n"
        f"Next: `tokenbench compare {b} {h}`, `tokenbench plan {b} {h} --requests-per-s 500`, "
        f"`tokenbench show {b}`, `tokenbench export {b} {h} --format pptx`, or "
        "`tokenbench serve` for the dashboard (it prints its address)."
    )
    return verdict_ids + check_ids


def real_time_check(target: DemoTarget, rate: float, check_s: float, db: str | None):
    """One point through the real load generator and the HTTP endpoint, and the same
    requests in virtual time: (run id, one line comparing their P99s)."""
    from bench.console import sweep_progress
    from bench.executor import plan_from_scenario
    from bench.metrics import parse_slo, summarize
    from bench.sim.server import start_sim_server_in_thread
    from bench.sim.virtual import simulate, virtual_requests
    from bench.sweep import scenario_at

    # Shorter GIL slices: the endpoint's threads and the client share one interpreter.
    sys.setswitchinterval(0.0005)
    # The endpoint's per-step lateness warnings would bury the results; the lateness is
    # stored with the run's telemetry and flagged on the point it affected instead.
    logging.getLogger("bench.sim.server").setLevel(logging.ERROR)
    url, stop = start_sim_server_in_thread(target.gpu, DEMO_MODEL, DEMO_PRECISION, target.tp)
    try:
        sc = demo_scenario(target, url)
        sc.label += " (real-time check)"
        spec = PointSpec("rate", rate)
        result = measure(
            sc,
            SweepPlan(
                specs=[spec], thresholds=parse_slo(DEMO_SLO), slo_iterations=0,
                point_duration_s=check_s,
            ),
            base_dir=DEMO_SCENARIO.parent,
            db=db,
            simulated=True,
            on_point=sweep_progress,
        )  # fmt: skip
        note, late = emission_note(url)
    finally:
        stop()
    plan = plan_from_scenario(
        scenario_at(sc, spec, point_duration_s=check_s), base_dir=DEMO_SCENARIO.parent
    )
    virtual = summarize(
        simulate(virtual_requests(plan), target.gpu, DEMO_MODEL, DEMO_PRECISION, target.tp)
    )
    real = result.points[0].summary if result.points else None
    if real is None:
        return result.run_id, f"{target.gpu}: the real-time check measured nothing. {note}"

    def pair(metric: str) -> str:
        r, v = real.value(f"p99_{metric}_ms"), virtual.value(f"p99_{metric}_ms")
        return f"P99 {metric.upper()} {r or 0:,.1f} ms (virtual time: {v or 0:,.1f})"

    line = (
        f"{target.gpu} x{target.tp} at {spec.title}, {real.completed} requests: "
        f"{pair('ttft')}, {pair('tpot')}. {note}"
    )
    slo = parse_slo(DEMO_SLO)
    missed = [t for t in slo if not t.holds(real)]
    if missed:
        line += " " + slo_miss_reason(missed, real, virtual, late)
    return result.run_id, line


def slo_miss_reason(missed, real, virtual, late_s: float | None) -> str:
    """Why the real-time check missed the SLO at a rate the sweep found passing: the
    simulated endpoint running late on a busy machine, or the rate sitting at the capacity's
    edge, where the same requests in virtual time miss too, or pass by a hair."""
    what = ", ".join(f"{t} ({real.value(t.metric):,.1f})" for t in missed)
    why = []
    if late_s is not None and late_s * 1e3 > SIM_LATE_MS:
        why.append(
            f"the endpoint ran up to {late_s * 1e3:,.0f} ms behind its schedule on this busy "
            "machine, which adds to the latencies measured"
        )
    if any(not t.holds(virtual) for t in missed) or any(
        abs((virtual.value(t.metric) or 0) / t.limit - 1) < EDGE for t in missed
    ):
        why.append(
            "this rate is at the edge of the capacity (virtual time on the same requests: "
            + ", ".join(f"{virtual.value(t.metric):,.1f}" for t in missed)
            + f"), and a short check of {real.completed} requests moves the P99 either way"
        )
    reason = "; ".join(why) or "no cause found: rerun the check with `tokenbench sim run`"
    return f"It misses the SLO: {what}. Why: {reason}."


def emission_note(url: str) -> tuple[str, float | None]:
    """How far the simulated endpoint's token emission strayed from its schedule: a
    sentence, and the worst lateness in seconds (None when it could not be read)."""
    import httpx

    from bench.backends.openai import METRICS_PATHS
    from bench.telemetry import parse_prometheus

    try:
        samples = parse_prometheus(httpx.get(url + METRICS_PATHS[0], timeout=5).text)
    except httpx.HTTPError as exc:
        return f"simulated endpoint: could not read its /metrics ({exc})", None
    worst = next(
        (s.value for s in samples if s.name == "tokenbench_sim_emission_lateness_max_seconds"),
        None,
    )
    if worst is None:
        return "simulated endpoint: no emission-lateness gauge", None
    verdict = "on schedule" if worst <= 0.001 else "behind schedule at times (busy machine)"
    return (
        f"Simulated endpoint: worst token {worst * 1e3:.1f} ms off its simulated time, {verdict}.",
        worst,
    )
