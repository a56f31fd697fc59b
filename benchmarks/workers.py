"""How much more load `--workers 2` sustains than one worker (issue 8). A benchmark, not a test.

One Python process runs out of CPU long before a big deployment does; this measures what a
second worker process buys on this machine. A cheap streaming server (Node,
benchmarks/stream_server.js when present, else tests/fake_openai_server.py) streams every
request at a fixed schedule (TTFT, then one token per ITL). Closed loops at rising
concurrency C offer rising load; each step runs with 1 and with 2 workers, alternately, and
the whole grid is repeated; everything goes through bench.distributed.run_distributed (one
spawned process per worker, so both sides pay the same start-up).

Why not simply "tokens/s at saturation": a saturated client still drains its sockets in
bulk, so it reports nearly the server's token rate while its timestamps are wrong (late
loop, ITL stretched, TTFT inflated). Load is *sustained* only while the timings stay
honest, so for each step and side this reports (medians over the repeats):
- tok/s: token arrivals per second (the client's own chunk timestamps) in the middle 60%
  of the run, ramp-up and tail left out;
- TTFT error: client TTFT p50 minus the server's TTFT, and ITL p99 (server: exactly ITL);
- the worst worker's event-loop lag p99 (tokenbench's own client_limited check);
and says, per side, the highest step whose TTFT error stays within --max-ttft-error-ms and
whose ITL p99 stays within --max-itl-p99-ms: that step's tok/s is the load it sustains.

    python benchmarks/workers.py                 # ~4 minutes
    python benchmarks/workers.py --repeats 5 --json out.json

The machine's load average is printed before and after: other work on a 2-core machine
moves these numbers. Only 127.0.0.1 is contacted; the server is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.backends.openai import get_dialect  # noqa: E402
from bench.distributed import run_distributed  # noqa: E402
from bench.metrics import summarize  # noqa: E402
from bench.runner import RunPlan  # noqa: E402
from bench.workload import LengthDist, Workload  # noqa: E402

NODE_SERVER = ROOT / "benchmarks" / "stream_server.js"
PY_SERVER = ROOT / "tests" / "fake_openai_server.py"


def start_server(ttft_ms: float, itl_ms: float) -> tuple[subprocess.Popen, str, str]:
    """The cheapest server available, on a free loopback port: (process, url, name)."""
    node = shutil.which("node")
    if node and NODE_SERVER.exists():
        cmd, name = [node, str(NODE_SERVER)], "node stream_server.js"
    else:
        cmd, name = [sys.executable, str(PY_SERVER)], "python fake_openai_server.py"
    proc = subprocess.Popen(
        [*cmd, "--port", "0", "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise SystemExit(f"benchmark server did not start: {line!r}")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}", name


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def make_plan(
    url: str, concurrency: int, requests: int, out_len: int, duration_s: float | None
) -> RunPlan:
    workload = Workload(seed=1, input=LengthDist(mean=16), output=LengthDist(mean=out_len))
    return RunPlan(
        base_url=url,
        endpoint="/v1/completions",
        dialect=get_dialect("vllm"),
        model="bench-model",
        workload=workload,
        specs=workload.specs(requests),
        concurrency=concurrency,
        duration_s=duration_s,
        request_timeout_s=60.0,
    )


def sustained_tokens_per_s(records, keep: float = 0.6) -> float:
    """Token arrivals per second in the middle `keep` of the run (chunk timestamps)."""
    times = np.concatenate([r.chunk_times_ns for r in records if len(r.chunk_times_ns)])
    if times.size < 2:
        return 0.0
    lo, hi = np.percentile(times, [50 * (1 - keep), 100 - 50 * (1 - keep)])
    inside = int(((times >= lo) & (times <= hi)).sum())
    return inside / ((hi - lo) / 1e9) if hi > lo else 0.0


def measure(plan: RunPlan, workers: int) -> dict:
    t = time.perf_counter()
    result = run_distributed(plan, workers=workers, handle_sigint=False)
    wall = time.perf_counter() - t
    s = summarize(result.records, loop_lag_p99_ms=result.loop_lag_p99_ms)
    if result.partial or s.failed or not s.completed:
        raise SystemExit(f"{workers} worker(s): {s.failed} failed, warnings {result.warnings}")
    return {
        "workers": workers,
        "sustained_tok_s": sustained_tokens_per_s(result.records),
        "ttft_p50_ms": s.metrics["ttft"].percentiles["p50"],
        "itl_p50_ms": s.metrics["itl"].percentiles["p50"],
        "itl_p99_ms": s.metrics["itl"].percentiles["p99"],
        "loop_lag_p99_ms": result.loop_lag_p99_ms,
        "completed": s.completed,
        "wall_s": wall,
    }


def median_of(rows: list[dict], key: str) -> float:
    return float(np.median([r[key] for r in rows]))


def honest(m: dict, args: argparse.Namespace) -> bool:
    return (
        m["ttft_p50_ms"] - args.ttft_ms <= args.max_ttft_error_ms
        and m["itl_p99_ms"] <= args.max_itl_p99_ms
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", default="64,128,192,256,384,512", help="steps, comma-separated")
    p.add_argument("--duration", type=float, default=2.5, help="seconds of load per run")
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--ttft-ms", type=float, default=20.0)
    p.add_argument("--itl-ms", type=float, default=10.0)
    p.add_argument("--max-ttft-error-ms", type=float, default=5.0)
    p.add_argument("--max-itl-p99-ms", type=float, default=15.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, help="write every run and the medians here")
    args = p.parse_args(argv)
    steps = [int(c) for c in args.concurrency.split(",")]

    load_before = os.getloadavg()
    proc, url, server_name = start_server(args.ttft_ms, args.itl_ms)
    rows: list[dict] = []
    try:
        measure(make_plan(url, 8, 32, 8, None), 1)  # warm the server and the page cache
        for rep in range(args.repeats):
            for c in steps:
                # Enough requests for the duration (each takes TTFT + n*ITL), not a million.
                per_request_s = (args.ttft_ms + args.output_len * args.itl_ms) / 1e3
                n = int(c * (args.duration / per_request_s + 2) * 1.5)
                plan = make_plan(url, c, n, args.output_len, args.duration)
                for workers in (1, 2) if (rep + c) % 2 == 0 else (2, 1):  # no order bias
                    row = measure(plan, workers) | {"concurrency": c, "repeat": rep}
                    rows.append(row)
                    print(
                        f"run {rep + 1}  C={c:<4} workers {workers}: "
                        f"{row['sustained_tok_s']:>8,.0f} tok/s  TTFT p50 {row['ttft_p50_ms']:5.1f}"
                        f" ms  ITL p99 {row['itl_p99_ms']:5.1f} ms  loop lag p99 "
                        f"{row['loop_lag_p99_ms']:5.1f} ms",
                        flush=True,
                    )
    finally:
        stop_server(proc)
    load_after = os.getloadavg()

    print(
        f"\n{os.cpu_count()} CPUs, {platform.python_implementation()} {platform.python_version()}"
        f", load average {load_before[0]:.1f} before / {load_after[0]:.1f} after; server: "
        f"{server_name} (TTFT {args.ttft_ms:g} ms, ITL {args.itl_ms:g} ms); closed loops of "
        f"{args.output_len}-token requests, {args.duration:g} s each; medians of "
        f"{args.repeats} repeats. 'ok' = TTFT error <= {args.max_ttft_error_ms:g} ms and "
        f"ITL p99 <= {args.max_itl_p99_ms:g} ms."
    )
    print(f"{'C':>5} | {'1 worker':^44} | {'2 workers':^44}")
    medians: dict[int, dict[int, dict]] = {}
    best: dict[int, tuple[int, float] | None] = {1: None, 2: None}
    for c in steps:
        cells = []
        for workers in (1, 2):
            mine = [r for r in rows if r["workers"] == workers and r["concurrency"] == c]
            m = {k: median_of(mine, k) for k in mine[0] if k not in ("workers", "concurrency")}
            medians.setdefault(c, {})[workers] = m
            ok = honest(m, args)
            if ok and (best[workers] is None or m["sustained_tok_s"] > best[workers][1]):
                best[workers] = (c, m["sustained_tok_s"])
            cells.append(
                f"{m['sustained_tok_s']:>7,.0f} tok/s TTFT+{m['ttft_p50_ms'] - args.ttft_ms:4.1f}"
                f" ITL99 {m['itl_p99_ms']:4.1f} lag {m['loop_lag_p99_ms']:4.1f} {'ok' if ok else '--'}"
            )
        print(f"{c:>5} | {cells[0]:44} | {cells[1]:44}")
    for workers in (1, 2):
        b = best[workers]
        text = "no step was honest" if b is None else f"{b[1]:,.0f} tok/s (C={b[0]})"
        print(f"  {workers} worker{'s' if workers > 1 else ' '} sustain {text}")
    ratio = None
    if best[1] and best[2]:
        ratio = best[2][1] / best[1][1]
        print(f"  2 workers sustain {ratio:.2f}x the load of 1")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": vars(args) | {"json": str(args.json)},
                    "runs": rows,
                    "medians": medians,
                    "sustained": best,
                    "ratio": ratio,
                    "loadavg": [load_before, load_after],
                },
                indent=2,
            )  # fmt: skip
        )


if __name__ == "__main__":
    main()
