"""`tokenbench demo`: B200 beside H100 on a laptop, with simulated endpoints.

Starts two simulated vLLM-like endpoints in-process on loopback — Llama-3.3-70B in FP8 on
one B200, and on two H100s with tensor parallelism 2 (70B in FP8 does not leave room for a
useful KV cache on one 80 GB H100) — sweeps the shipped bursty chat scenario against both
with the real load generator, stores both runs (labelled simulated), and prints the
comparison: P99 TTFT and TPOT, throughput per GPU, and $/Mtok on every pricing tier.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.sweep import PointSpec, SweepPlan, run_sweep

SCENARIOS_DIR = Path(__file__).resolve().parents[2] / "scenarios"
DEMO_SCENARIO = SCENARIOS_DIR / "chat-bursty.yaml"
DEMO_MODEL = "llama-3.3-70b"
DEMO_PRECISION = "fp8"
# Mean offered rates of the sweep (the bursty shape is kept, scaled to each mean).
DEMO_RATES = (1.0, 3.0, 6.0)
DEMO_POINT_S = 8.0
DEMO_SLO = "p99_ttft_ms<=2000,p99_tpot_ms<=50"
DEMO_MAX_OUTPUT = 384  # keeps each point's drain short so the demo ends within 2 minutes


@dataclass(frozen=True)
class DemoTarget:
    gpu: str
    tp: int


TARGETS = (DemoTarget("B200-SXM", 1), DemoTarget("H100-SXM", 2))


def run_demo(
    db: str | None = None, *, rates=DEMO_RATES, point_s: float = DEMO_POINT_S
) -> list[str]:
    """Run the demo; returns the two stored run ids (B200 first)."""
    from bench.cli import sweep_progress
    from bench.console import comparison_tables, console
    from bench.cost import load_catalogue
    from bench.curves import compare_runs, ratio_sentence, run_curves
    from bench.metrics import parse_thresholds
    from bench.scenario import load_scenario
    from bench.sim.server import start_sim_server_in_thread

    # Shorter GIL slices: the endpoints' threads and the client share one interpreter.
    sys.setswitchinterval(0.0005)
    # The endpoints' per-step lateness warnings would bury the results; their worst
    # lateness is printed once per endpoint instead (and stored with the run's telemetry).
    logging.getLogger("bench.sim.server").setLevel(logging.ERROR)
    thresholds = parse_thresholds(DEMO_SLO, flag="--slo")
    run_ids = []
    started = time.monotonic()
    for target in TARGETS:
        url, stop = start_sim_server_in_thread(target.gpu, DEMO_MODEL, DEMO_PRECISION, target.tp)
        try:
            sc = load_scenario(DEMO_SCENARIO)
            sc.target.base_url = url
            sc.target.model = DEMO_MODEL
            sc.gpu.type, sc.gpu.count = target.gpu, target.tp
            sc.label = f"{target.gpu} x{target.tp} {DEMO_MODEL} {DEMO_PRECISION}"
            sc.workload.output.max = DEMO_MAX_OUTPUT
            sc.request_timeout_s = 60
            console.rule(f"[bold]SIMULATED {sc.label}[/]  ({url})")
            result = run_sweep(
                sc,
                SweepPlan(
                    specs=[PointSpec("rate", r) for r in rates],
                    thresholds=thresholds,
                    slo_iterations=0,
                    point_duration_s=point_s,
                ),
                base_dir=DEMO_SCENARIO.parent,
                db=db,
                simulated=True,
                show_progress=False,
                on_point=sweep_progress,
            )
            run_ids.append(result.run_id)
            console.print(emission_note(url))
        finally:
            stop()
    curves = run_curves(run_ids, db)
    comparisons = compare_runs(curves, thresholds, load_catalogue())
    console.rule("[bold]B200 beside H100 (simulated)[/]")
    for table in comparison_tables(comparisons):
        console.print(table)
    sentence = ratio_sentence(comparisons)
    if sentence:
        console.print(f"[bold]{sentence}[/]")
    console.print(
        f"\nDemo took {time.monotonic() - started:.0f} s. SLO: {DEMO_SLO}. Stored runs "
        f"{run_ids[0][:8]} (B200) and {run_ids[1][:8]} (H100), marked simulated.\n"
        f"Next: `tokenbench compare {run_ids[0][:8]} {run_ids[1][:8]}`, "
        f"`tokenbench show {run_ids[0][:8]}`, or `tokenbench serve` and open "
        "http://127.0.0.1:8000 for the dashboard."
    )
    return run_ids


def emission_note(url: str) -> str:
    """How far the simulated endpoint's token emission strayed from its schedule."""
    import httpx

    from bench.telemetry import parse_prometheus

    try:
        samples = parse_prometheus(httpx.get(f"{url}/metrics", timeout=5).text)
    except httpx.HTTPError as exc:
        return f"simulated endpoint: could not read its /metrics ({exc})"
    worst = next(
        (s.value for s in samples if s.name == "tokenbench_sim_emission_lateness_max_seconds"),
        None,
    )
    if worst is None:
        return "simulated endpoint: no emission-lateness gauge"
    verdict = "on schedule" if worst <= 0.001 else "behind schedule at times (busy machine)"
    return f"simulated endpoint: worst token {worst * 1e3:.1f} ms off its simulated time, {verdict}"
