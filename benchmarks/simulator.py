"""Simulator benchmark: accuracy against published measurements, virtual-time speed, and
real-time emission accuracy (issues 4 and 19).

0. Validation (--validate): every expressible point of bench/sim/profiles/published.yaml
   reproduced through the closed-loop engine in virtual time (what `sim run` / `sim serve`
   execute), InferenceX's method for curve points; the table of point, published, simulated,
   error, beside the formula clock the fit uses and (--loso) leave-one-source-out: each source's
   points scored by a fit that never saw that source. Then the GPU-to-GPU ratios, and the
   per-request error against published runs of real engines on GPUs (bench.sim.per_request),
   and the decode step against vLLM measured at a known batch (bench.sim.decode_steps; most of
   its rows are in the fit, and the table gives their error with their source held out).
1. Virtual time: 1,000 requests (target >= 100x faster than real time), then one hour of
   50 req/s (1k in / 256 out, 180,000 requests) for a few deployments (target: under 30 s each).
2. Real time: `tokenbench sim serve` in its own process, driven by tokenbench at 256
   concurrent streams (closed loop, starts spread); the server's own gauges say how far its
   token emission strayed from the simulated schedule (target: within 1 ms).

Prints tables; medians of --repeats runs.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def virtual_hour(gpu: str, tp: int, model: str = "llama-3.3-70b") -> tuple[float, int]:
    import numpy as np

    from bench.sim.virtual import simulate

    rng = np.random.default_rng(0)
    n = 50 * 3600
    offsets = np.cumsum(rng.exponential(1 / 50, n))
    t = time.perf_counter()
    records = simulate([(o, 1024, 256) for o in offsets], gpu, model, "fp8", tp)
    return time.perf_counter() - t, sum(r.ok for r in records)


def validation(loso: bool) -> None:
    from collections import defaultdict

    from bench.sim.calibration import (
        Sim,
        decode_step_points,
        disaggregated,
        leave_one_source_out,
        load_published,
        mean_abs_error,
        mtp_speedups,
        source_disagreements,
        steps_held_out,
        table,
        validate,
        validation_table,
    )

    pub = load_published()
    t = time.perf_counter()
    sim = Sim(clock="engine")  # memoised: each configuration runs once
    engine = validate(sim=sim)
    ratios = [(r, sim.ratio(r)) for r in pub.ratios]
    t_engine = time.perf_counter() - t
    formula = validate()
    after = validate(points=pub.after_fit)
    t = time.perf_counter()
    held = leave_one_source_out(pub.scored) if loso else None
    t_loso = time.perf_counter() - t
    steps_held = steps_held_out(pub.scored) if loso else None
    steps = validate(points=decode_step_points())
    print(f"validation: {len(engine)} fitted and {len(after)} later points of {len(pub.points)} "
          f"published (engine clock, virtual time, {t_engine:.0f} s with the ratios)")  # fmt: skip
    split = disaggregated()
    print(table(engine + after, held))
    print(f"  the {len(split)} points whose sources also ran disaggregated splits, those in "
          "their fronts (formula clock; scored, never fitted):")  # fmt: skip
    print(table(split, header=False))
    mtp = mtp_speedups()
    print(f"  {len(mtp)} published speed-ups of MTP over the same deployment without it (formula "
          "clock; scored, never fitted):")  # fmt: skip
    print(table(mtp, header=False))
    print()
    print(validation_table(formula, held, after, engine, split, mtp, steps, steps_held))
    print()
    if held:
        print(
            f"  leave-one-source-out ({t_loso:.0f} s; formula clock, each source's points "
            "scored by a fit without it; P = no other source has a point of the same engine "
            "(or, for AMD, of AMD), so only the initial values and ranges reach it):"
        )
        by_source = defaultdict(list)
        for r in held:
            by_source[r.point.source].append(r)
        for src, rs in sorted(by_source.items()):
            errs = " ".join(f"{r.error:+.0%}{'' if r.group_fitted else 'P'}" for r in rs)
            print(f"    {src:5} {len(rs):2} points, MAE {mean_abs_error(rs):5.1%}: {errs}")
    print("  sources publishing the same curve, each point against the other's curve:")
    for line in source_disagreements(pub):
        print(f"    {line}")
    skipped = [p for p in pub.points if not p.expressible]
    print(
        f"  not expressible ({len(skipped)}): " + "; ".join(f"{p.id}: {p.reason}" for p in skipped)
    )
    print("GPU ratios (offline max throughput per GPU, Llama-3.3-70B 1000/1000, engine clock):")
    for r, val in ratios:
        print(
            f"  {r.id:22} published {r.measured:5.2f} simulated {val:5.2f} ({val / r.measured - 1:+.0%})  {r.note}"
        )
    from bench.sim.per_request import per_request_errors, report

    print(
        "per request, published runs of a real engine on GPUs (engine clock; scored, never "
        "fitted; SGLang's and TensorRT-LLM's DeepSeek-R1 first-token latency read from their "
        "H200 runs: python -m bench.sim.per_request --first-token):"
    )
    print(report(per_request_errors()))
    from bench.sim import decode_steps

    print(
        "decode steps at a measured batch, vLLM on H100 and B200 (the rows of at most 512 "
        "sequences, less the runs decode_steps.yaml leaves out, are in the fit):"
    )
    print(decode_steps.report(decode_steps.step_errors()))


def virtual_thousand() -> tuple[float, float]:
    """Wall seconds and simulated seconds for 1,000 requests at 8 req/s on 1x B200 70B FP8."""
    import numpy as np

    from bench.sim.virtual import simulate

    rng = np.random.default_rng(1)
    offsets = np.cumsum(rng.exponential(1 / 8, 1000))
    t = time.perf_counter()
    records = simulate([(o, 1024, 256) for o in offsets], "B200", "llama-3.3-70b", "fp8", 1)
    wall = time.perf_counter() - t
    return wall, max(r.end_ns for r in records) / 1e9


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def real_time_lateness(streams: int, duration_s: float, gpu: str, model: str) -> dict:
    """Start a sim server process, drive it, and read its lateness gauges."""
    import httpx

    from bench.backends.dialects import get_dialect
    from bench.executor import RunPlan
    from bench.metrics import summarize
    from bench.runner import run_blocking
    from bench.telemetry import parse_prometheus
    from bench.workload import LengthDist, Workload

    port = free_port()
    cmd = [sys.executable, "-m", "bench", "sim", "serve", "--gpu", gpu, "--model", model,
           "--port", str(port)]  # fmt: skip
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                httpx.get(f"{url}/health", timeout=0.5)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        workload = Workload(seed=1, input=LengthDist(mean=256), output=LengthDist(mean=256))
        plan = RunPlan(
            base_url=url, endpoint="/v1/completions", dialect=get_dialect("vllm"), model=model,
            workload=workload, specs=workload.specs(streams * 50), concurrency=streams,
            duration_s=duration_s, ramp_up_s=2.0, request_timeout_s=120,
        )  # fmt: skip
        result = run_blocking(plan, handle_sigint=False)
        s = summarize(result.records)
        gauges = {x.name: x.value for x in parse_prometheus(httpx.get(f"{url}/metrics").text)}
    finally:
        server.terminate()
        server.wait(timeout=10)
    steps = gauges.get("tokenbench_sim_steps_total", 0) or 1
    return {
        "tok_s": s.output_tokens_per_s,
        "max_ms": gauges["tokenbench_sim_emission_lateness_max_seconds"] * 1e3,
        "late_share": gauges["tokenbench_sim_late_steps_total"] / steps,
        "wakeup_max_ms": gauges["tokenbench_sim_wakeup_lateness_max_seconds"] * 1e3,
        "write_max_ms": gauges["tokenbench_sim_write_max_seconds"] * 1e3,
        "tpot_p50_ms": s.metrics["tpot"].percentiles["p50"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--validate", action="store_true", help="only the published-point validation")
    p.add_argument("--loso", action="store_true", help="add leave-one-source-out (minutes)")
    args = p.parse_args()
    if args.validate:
        validation(args.loso)
        return

    wall, simulated = virtual_thousand()
    print(f"virtual time: 1,000 requests (8 req/s, 1024/256, 1x B200 70B FP8): {simulated:.0f} s "
          f"simulated in {wall:.2f} s = {simulated / wall:,.0f}x real time")  # fmt: skip

    print("virtual time: one hour at 50 req/s, 1024 in / 256 out, Llama-3.3-70B FP8")
    for gpu, tp in (("H100", 8), ("B200", 8), ("H100", 2)):
        runs = [virtual_hour(gpu, tp) for _ in range(args.repeats)]
        secs = statistics.median(r[0] for r in runs)
        print(f"  {gpu} x{tp}: {secs:6.1f} s (median of {args.repeats}), {runs[0][1]:,} completed")

    print(
        f"\nreal time: {args.streams} concurrent streams for {args.duration:g} s, sim server in its own process"
    )
    for gpu, model in (("B200", "llama-3.3-70b"), ("H100", "llama-3.1-8b")):
        runs = [
            real_time_lateness(args.streams, args.duration, gpu, model) for _ in range(args.repeats)
        ]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"  {gpu} {model}: {med['tok_s']:,.0f} tok/s, TPOT p50 {med['tpot_p50_ms']:.1f} ms; "
            f"steps with a token > 1 ms late {med['late_share']:.1%}, worst token "
            f"{med['max_ms']:.1f} ms (wake-up {med['wakeup_max_ms']:.1f} ms, write "
            f"{med['write_max_ms']:.1f} ms)"
        )


if __name__ == "__main__":
    main()
