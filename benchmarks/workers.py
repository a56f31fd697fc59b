"""How much more load `--workers 2` sustains than one worker (issue 8). A benchmark, not a test.

One Python process runs out of CPU long before a big deployment does; this measures what a
second worker process buys on this machine. The server runs on the same 2 cores, so it must
cost as little as possible (a remote GPU box would cost this host nothing):
benchmarks/workers_server.js (Node; else tests/fake_openai_server.py) streams every request
at a fixed schedule, the first write at TTFT and then one write every ITL holding
--tokens-per-write SSE events of one token each (default 1, as vLLM streams), from one
timer for all streams with prebuilt frames: ~3.4 us of its CPU per token at one event per
write (~1.5 us at four) against the client's ~6 (~4). Closed loops at rising
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
- the worst worker's event-loop lag p99 (tokenbench's own client_limited check), the
  busiest worker's CPU time / run time (all its threads and syscalls: past ~1.0
  its event loop's core is full), and how idle the
  machine was (0% = the 2 cores were the limit, whoever used them);
and says, per side, the highest step whose TTFT error stays within --max-ttft-error-ms and
whose ITL p99 stays within --max-itl-p99-ms: that step's tok/s is the load it sustains;
and the peak tok/s over all steps, honest or not.

    python benchmarks/workers.py                 # ~2.5 minutes: 1 and 2 workers
    python benchmarks/workers.py --repeats 5 --json out.json
    python benchmarks/workers.py --workers 1,2,4,8,16   # the curve, on a host with 16+ cores

Per worker count it also reports tok/s per client core (tokens over the workers' own CPU
seconds: what one fully used core yields) and the ratio to one worker, measured side by side
(the counts alternate within each repeat). Counts above this host's cores are run only when
asked for and marked: they measure the cores' sharing, not scaling.

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

from bench.backends.dialects import get_dialect  # noqa: E402
from bench.distributed import run_distributed  # noqa: E402
from bench.executor import RunPlan  # noqa: E402
from bench.metrics import summarize  # noqa: E402
from bench.workload import LengthDist, Workload  # noqa: E402

NODE_SERVER = ROOT / "benchmarks" / "workers_server.js"
PY_SERVER = ROOT / "tests" / "fake_openai_server.py"


def start_server(
    ttft_ms: float, itl_ms: float, per_write: int
) -> tuple[subprocess.Popen, str, str]:
    """The cheapest server available, on a free loopback port: (process, url, name)."""
    node = shutil.which("node")
    if node:
        cmd = [node, str(NODE_SERVER), "--tokens-per-write", str(per_write)]
        name = f"node workers_server.js, {per_write} token events per write"
    else:
        cmd, name = [sys.executable, str(PY_SERVER)], "python fake_openai_server.py (no node)"
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


def cpu_idle_jiffies() -> tuple[int, int]:
    """(idle, total) jiffies of the whole machine, from /proc/stat: was any core left idle?"""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return fields[3] + fields[4], sum(fields)


def proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(plan: RunPlan, workers: int, server_pid: int) -> dict:
    t = time.perf_counter()
    server0 = proc_cpu_s(server_pid)
    idle0, total0 = cpu_idle_jiffies()
    result = run_distributed(plan, workers=workers, handle_sigint=False)
    idle1, total1 = cpu_idle_jiffies()
    server_cpu_s = proc_cpu_s(server_pid) - server0
    wall = time.perf_counter() - t
    worker_cpu_s = sum(w.cpu_s or 0.0 for w in result.workers)  # during the run, not imports
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
        "worker_cpu_us_per_token": worker_cpu_s / max(s.total_output_tokens, 1) * 1e6,
        "worker_cpu_busy_max": max(w.cpu_busy or 0.0 for w in result.workers),
        "server_cpu_us_per_token": server_cpu_s / max(s.total_output_tokens, 1) * 1e6,
        "machine_idle": (idle1 - idle0) / max(total1 - total0, 1),
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
    p.add_argument("--concurrency", default="128,256,384,512,768", help="steps, comma-separated")
    p.add_argument("--duration", type=float, default=2.5, help="seconds of load per run")
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--ttft-ms", type=float, default=20.0)
    p.add_argument("--itl-ms", type=float, default=2.5, help="between the server's writes")
    p.add_argument("--tokens-per-write", type=int, default=1, help="SSE events per write")
    p.add_argument("--max-ttft-error-ms", type=float, default=5.0)
    p.add_argument("--max-itl-p99-ms", type=float, default=15.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--workers",
        default="1,2",
        help="worker counts to compare, comma-separated (the first is the baseline)",
    )
    p.add_argument("--json", type=Path, help="write every run and the medians here")
    args = p.parse_args(argv)
    steps = [int(c) for c in args.concurrency.split(",")]
    counts = [int(w) for w in args.workers.split(",")]
    cores = os.cpu_count() or 1
    if max(counts) > cores:
        print(f"note: {max(counts)} workers on {cores} cores: beyond {cores} they share cores")

    load_before = os.getloadavg()
    proc, url, server_name = start_server(args.ttft_ms, args.itl_ms, args.tokens_per_write)
    rows: list[dict] = []
    try:
        measure(make_plan(url, 8, 32, 8, None), 1, proc.pid)  # warm the server and the page cache
        for rep in range(args.repeats):
            for c in steps:
                # Enough requests for the duration (each takes TTFT + n*ITL), not a million.
                writes = -(-args.output_len // args.tokens_per_write)
                per_request_s = (args.ttft_ms + writes * args.itl_ms) / 1e3
                n = int(c * (args.duration / per_request_s + 2) * 1.5)
                plan = make_plan(url, c, n, args.output_len, args.duration)
                order = counts if (rep + c) % 2 == 0 else counts[::-1]  # no order bias
                for workers in order:
                    row = measure(plan, workers, proc.pid) | {"concurrency": c, "repeat": rep}
                    rows.append(row)
                    print(
                        f"run {rep + 1}  C={c:<4} workers {workers}: "
                        f"{row['sustained_tok_s']:>8,.0f} tok/s  TTFT p50 {row['ttft_p50_ms']:5.1f}"
                        f" ms  ITL p99 {row['itl_p99_ms']:5.1f} ms  loop lag p99 "
                        f"{row['loop_lag_p99_ms']:5.1f} ms  client CPU "
                        f"{row['worker_cpu_us_per_token']:4.1f} us/tok  server CPU "
                        f"{row['server_cpu_us_per_token']:4.1f} us/tok  machine idle "
                        f"{row['machine_idle']:4.0%}",
                        flush=True,
                    )
    finally:
        stop_server(proc)
    load_after = os.getloadavg()

    print(
        f"\n{cores} CPUs, {platform.python_implementation()} {platform.python_version()}"
        f", load average {load_before[0]:.1f} before / {load_after[0]:.1f} after; server: "
        f"{server_name} (TTFT {args.ttft_ms:g} ms, ITL {args.itl_ms:g} ms); closed loops of "
        f"{args.output_len}-token requests, {args.duration:g} s each; medians of "
        f"{args.repeats} repeats. 'ok' = TTFT error <= {args.max_ttft_error_ms:g} ms and "
        f"ITL p99 <= {args.max_itl_p99_ms:g} ms."
    )
    width = 62
    print(f"{'C':>5} | " + " | ".join(f"{f'{w} worker(s)':^{width}}" for w in counts))
    medians: dict[int, dict[int, dict]] = {}
    best: dict[int, tuple[int, float] | None] = dict.fromkeys(counts)
    for c in steps:
        cells = []
        for workers in counts:
            mine = [r for r in rows if r["workers"] == workers and r["concurrency"] == c]
            m = {k: median_of(mine, k) for k in mine[0] if k not in ("workers", "concurrency")}
            medians.setdefault(c, {})[workers] = m
            ok = honest(m, args)
            if ok and (best[workers] is None or m["sustained_tok_s"] > best[workers][1]):
                best[workers] = (c, m["sustained_tok_s"])
            cells.append(
                f"{m['sustained_tok_s']:>7,.0f} tok/s TTFT+{m['ttft_p50_ms'] - args.ttft_ms:4.1f}"
                f" ITL99 {m['itl_p99_ms']:5.1f} lag {m['loop_lag_p99_ms']:5.1f} cpu "
                f"{m['worker_cpu_busy_max']:4.2f} idle {m['machine_idle']:3.0%} "
                f"{'ok' if ok else '--'}"
            )
        print(f"{c:>5} | " + " | ".join(f"{cell:{width}}" for cell in cells))
    summary = scaling(rows, steps, counts, best, medians, cores)
    print(summary["text"])
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": vars(args) | {"json": str(args.json)},
                    "runs": rows,
                    "medians": medians,
                    "sustained": best,
                    "scaling": {k: v for k, v in summary.items() if k != "text"},
                    "loadavg": [load_before, load_after],
                },
                indent=2,
            )  # fmt: skip
        )


def scaling(
    rows: list[dict],
    steps: list[int],
    counts: list[int],
    best: dict[int, tuple[int, float] | None],
    medians: dict[int, dict[int, dict]],
    cores: int,
) -> dict:
    """Per worker count: the load sustained honestly, the peak, tok/s per client core, each
    beside the first count's (ratios of medians measured in the same repeats)."""
    base = counts[0]
    per_core = {
        w: float(np.median([1e6 / r["worker_cpu_us_per_token"] for r in rows if r["workers"] == w]))
        for w in counts
    }
    peak = {w: max(medians[c][w]["sustained_tok_s"] for c in steps) for w in counts}
    lines = [
        "| workers | sustained honestly (C) | × | peak tok/s | × | tok/s per client core | × |",
        "|---|---|---|---|---|---|---|",
    ]
    for w in counts:
        b, b0 = best[w], best[base]
        sustained = "none honest" if b is None else f"{b[1]:,.0f} (C={b[0]})"
        ratio = f"{b[1] / b0[1]:.2f}" if b and b0 else "–"
        lines.append(
            f"| {w}{' (> cores)' if w > cores else ''} | {sustained} | {ratio} "
            f"| {peak[w]:,.0f} | {peak[w] / max(peak[base], 1e-9):.2f} "
            f"| {per_core[w]:,.0f} | {per_core[w] / per_core[base]:.2f} |"
        )
    return {
        "text": "\n".join(lines),
        "peak": peak,
        "tok_s_per_client_core": per_core,
        "sustained_ratio": {
            w: best[w][1] / best[base][1] for w in counts if best[w] and best[base]
        },
    }


if __name__ == "__main__":
    main()
