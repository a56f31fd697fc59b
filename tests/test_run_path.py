"""One run path: RunSession and Sweep over any Executor (bench.executor).

Virtual time (fast, exact) shows the sweep's SLO search, warm-up windows and closed loops
working through the same code as a local sweep; the distributed driver shows the self-check
judging each worker and the merged run with one rule; the slow tests run real workers
against local servers (telemetry, an SLO sweep).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import numpy as np
import pytest

from bench.distributed import DistributedExecutor, _Driver, _shares
from bench.drive import choose_executor, measure
from bench.executor import RunResult, plan_from_scenario
from bench.metrics import client_limited_reasons, parse_thresholds
from bench.records import CANCELLED, OK, RequestRecord
from bench.runner import LocalExecutor
from bench.scenario import parse_scenario
from bench.session import window_summary
from bench.sim.virtual import VirtualExecutor
from bench.store.read import get_run, load_records
from bench.sweep import PointSpec, SweepPlan
from tests.helpers import busy_share, plan

SCENARIO = (
    "load: {shape: poisson, request_rate: 1, num_prompts: 200}\n"
    "workload: {input: {mean: 512}, output: {mean: 128}}\n"
)


def virtual_sweep(tmp_path, specs, **plan_kw):
    virtual = VirtualExecutor("H100", "llama-3.3-70b", tp=2)
    db = f"sqlite:///{tmp_path / 'v.db'}"
    sc = virtual.adopt(parse_scenario(SCENARIO))
    result = measure(sc, SweepPlan(specs, **plan_kw), executor=virtual, db=db)
    return result, db


# ------------------------------------------------------------------ virtual time


def test_virtual_sweep_searches_the_slo_and_is_stored_simulated(tmp_path):
    slo = parse_thresholds("p99_ttft_ms<=1000", flag="--slo")
    specs = [PointSpec("rate", r) for r in (1, 32)]
    result, db = virtual_sweep(
        tmp_path, specs, thresholds=slo, slo_iterations=4, slo_draws=1, point_duration_s=60
    )
    roles = [p.role for p in result.points]
    # bisected from the grid's bracket (1-32), then the spread where the bisection ends:
    # one fresh draw at both bracketing rates, and both twice as long
    assert roles[:3] == ["grid", "grid", "slo-search"] and roles.count("slo-search") <= 4
    assert result.at_slo is not None and result.at_slo.kind == "interpolated"
    first_fail, last_pass = result.at_slo.first_fail.offered, result.at_slo.last_pass.offered
    assert 1 <= last_pass < first_fail <= 32
    cap = result.at_slo
    # narrowed until the bracket (in tok/s per GPU) is within the measured spread, or the
    # four bisection steps were spent
    narrow = cap.bracket_width <= cap.spread_width
    assert narrow or first_fail - last_pass <= 31 / 2**4
    spread = {(p.role, p.spec.value) for p in result.points if p.role in ("draw", "long")}
    assert {(r, v) for r in ("draw", "long") for v in (last_pass, first_fail)} <= spread
    assert set(cap.parts) == {"bracket", "sampling", "draws", "long"}
    assert cap.low <= cap.value <= cap.high and cap.sim_error > 0  # simulated: folded in
    run = get_run(result.run_id, db)
    assert run.simulated and run.endpoint == "sim://virtual" and run.backend == "sim"
    assert (run.gpu_type, run.gpu_count) == ("H100-SXM", 2)
    assert run.extra_json["sim"]["clock"] == "virtual"
    assert run.extra_json["sweep"]["slo"] == ["p99_ttft_ms<=1000"]
    stored = run.summary_json["sweep"]["capacity"]
    assert stored["kind"] == "interpolated" and stored["covers"] == cap.covers()
    assert len(run.load_points) == len(result.points)


def test_virtual_closed_loop_keeps_its_users_busy(tmp_path):
    specs = [PointSpec("concurrency", c) for c in (1, 16)]
    result, db = virtual_sweep(tmp_path, specs)
    one, many = (p.summary for p in result.points)
    assert one.completed == many.completed == 200
    assert many.output_tokens_per_s > 4 * one.output_tokens_per_s
    for lp, users in ((0, 1), (1, 16)):
        records = [r for r in load_records(result.run_id, db=db) if r.load_point == lp]
        starts = np.array([r.sent_ns for r in records])
        ends = np.array([r.end_ns for r in records])
        # at every send, exactly the users' number of requests are in flight (or fewer
        # only while the first wave starts)
        in_flight = [int(((starts <= t) & (ends > t)).sum()) for t in starts]
        assert max(in_flight) == users
        assert np.median(in_flight) == users


def test_virtual_warmup_is_left_out_of_each_point(tmp_path):
    specs = [PointSpec("rate", 4)]
    whole, _ = virtual_sweep(tmp_path, specs, point_duration_s=30)
    windowed, _ = virtual_sweep(tmp_path, specs, point_duration_s=30, warmup_s=10, cooldown_s=5)
    n = whole.points[0].summary.completed
    assert 0 < windowed.points[0].summary.completed < n * 0.75


def test_a_stop_event_set_before_a_virtual_point_measures_nothing(tmp_path):
    import threading

    stop = threading.Event()
    stop.set()
    virtual = VirtualExecutor("H100", "llama-3.3-70b", tp=2)
    sc = virtual.adopt(parse_scenario(SCENARIO))

    measured = measure(sc, executor=virtual, store=False, stop_event=stop)
    (point,) = measured.points
    assert point.run.interrupted and point.summary.completed == 0 and measured.interrupted


class StopAfter(threading.Event):
    """A stop event that reads set from its n-th look on: a stop mid-point, without timing."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.looks = n

    def is_set(self) -> bool:
        self.looks -= 1
        return self.looks < 0


def test_a_stop_mid_point_in_virtual_time_keeps_what_was_measured():
    virtual = VirtualExecutor("H100", "llama-3.3-70b", tp=2)
    # a fixed seed: with one drawn per run the 400th step sometimes fell in a gap between
    # Poisson arrivals, with nothing in flight to cancel (a clean CI, 2026-12-06)
    sc = virtual.adopt(parse_scenario(SCENARIO + "seed: 0\n"))
    plan = plan_from_scenario(sc)
    whole = virtual.run(plan, lambda r: None)
    kept: list[RequestRecord] = []
    stopped = virtual.run(plan, kept.append, StopAfter(400))  # ~400 engine steps in
    assert stopped.interrupted and not whole.interrupted
    assert stopped.records == kept and 0 < len(kept) < len(whole.records)
    states = {r.state for r in kept}
    assert states == {OK, CANCELLED}  # in flight when stopped: cancelled, as over HTTP
    done = {r.index: r for r in whole.records}
    for r in kept:  # what finished before the stop is what the whole run measured
        if r.ok:
            assert (
                r.end_ns == done[r.index].end_ns and r.output_tokens == done[r.index].output_tokens
            )


def test_the_session_never_changes_its_callers_scenario(tmp_path):
    """Stored on the simulated GPUs (H100 x2), told A100 x8: the caller's scenario keeps
    saying A100 x8; the result's scenario says what was run."""
    virtual = VirtualExecutor("H100", "llama-3.3-70b", tp=2)
    sc = parse_scenario(SCENARIO + "gpu: {type: A100-SXM, count: 8}\n")
    sc.target.base_url = "http://sim.virtual"
    given = sc.model_dump()
    db = f"sqlite:///{tmp_path / 'c.db'}"
    run = measure(sc, executor=virtual, db=db)
    sweep = measure(sc, SweepPlan([PointSpec("rate", 2.0)], point_duration_s=5), executor=virtual,
                    db=db)  # fmt: skip
    assert sc.model_dump() == given
    for result in (run, sweep):
        assert (result.scenario.gpu.type, result.scenario.gpu.count) == ("H100-SXM", 2)
        assert (get_run(result.run_id, db).gpu_type, get_run(result.run_id, db).gpu_count) == (
            "H100-SXM", 2,
        )  # fmt: skip


class Recorder:
    """A Display that keeps what the session gives it."""

    def __init__(self) -> None:
        self.points: list[tuple[str, int]] = []
        self.ticks: list[int] = []
        self.lines: list[str] = []

    @contextmanager
    def point(self, title: str, total: int):
        self.points.append((title, total))
        yield lambda p: self.ticks.append(p.completed + p.failed)

    def warn(self, message: str) -> None:
        self.lines.append(f"warning: {message}")

    def say(self, line: str) -> None:
        self.lines.append(line)


def test_the_session_shows_through_the_display_it_is_given(capsys):
    virtual = VirtualExecutor("H100", "llama-3.3-70b", tp=2)
    sc = virtual.adopt(parse_scenario(SCENARIO))
    shown = Recorder()
    result = measure(sc, SweepPlan([PointSpec("rate", 2.0), PointSpec("rate", 4.0)],
                                   point_duration_s=5), executor=virtual, store=False,
                     display=shown)  # fmt: skip
    assert shown.points == [("point 1: rate 2 req/s", 10), ("point 2: rate 4 req/s", 20)]
    assert shown.ticks == [p.summary.completed + p.summary.failed for p in result.points]
    assert capsys.readouterr() == ("", "")  # the session itself prints nothing


def test_one_function_chooses_the_executor():
    assert isinstance(choose_executor(), LocalExecutor)
    assert not choose_executor(handle_sigint=False).handle_sigint
    spread = choose_executor(workers=3, ray="auto")
    assert isinstance(spread, DistributedExecutor)
    assert (spread.workers, spread.ray_address) == (3, "auto")
    virtual = choose_executor(virtual={"gpu": "H100", "model": "llama-3.3-70b", "tp": 2})
    assert virtual == VirtualExecutor("H100", "llama-3.3-70b", tp=2)
    with pytest.raises(ValueError, match="leave out --workers and --ray"):
        choose_executor(workers=2, virtual={"gpu": "H100", "model": "llama-3.3-70b"})


# ------------------------------------------------------------------ self-check, one rule


def records(first: int, n: int, *, merged_gap: bool = False) -> list[RequestRecord]:
    """n requests 100 ms apart, on time, each 50 ms to its first token, 4 tokens."""
    ms = 1_000_000
    out = []
    for i in range(first, first + n):
        rec = RequestRecord(index=i, intended_ns=i * 100 * ms, sent_ns=i * 100 * ms)
        rec.first_token_ns = rec.sent_ns + 50 * ms
        rec.end_ns = rec.first_token_ns + 30 * ms
        rec.output_tokens, rec.prompt_tokens, rec.state = 4, 16, OK
        out.append(rec)
    return out


def status(n: int, **reads) -> dict:
    base = {
        "sent": n, "completed": n, "failed": 0, "in_flight": 0, "finished": True,
        "error": None, "interrupted": False, "duration_s": 2.0, "cpu_s": 0.1,
        "loop_lag_p99_ms": 0.2, "loop_lag_max_ms": 1.0, "loop_cpu_share": 0.1, "loop_cpu_wait_share": 0.0,
        "late_read_share": 0.0, "merged_token_share": 0.0,
    }  # fmt: skip
    return {**base, **reads}


OVERLOAD = {"loop_cpu_share": 0.99, "late_read_share": 0.4, "merged_token_share": 0.3}


def test_one_rule_judges_each_worker_and_the_merged_run_as_one_process():
    url = "http://127.0.0.1:9"  # nothing is sent: the driver is fed the workers' batches
    sc = parse_scenario(f"target: {{base_url: '{url}'}}\n")
    shares = _shares(plan(url, 20), 2)
    driver = _Driver(shares, None, None)
    busy, calm = records(0, 10), records(10, 10)
    driver.take(0, busy, status(10, **OVERLOAD))
    driver.take(1, calm, status(10))
    merged = driver.result("processes")
    assert merged.backend == "processes" and not merged.partial
    w0, w1 = merged.workers
    assert w0.client_limited_reasons == client_limited_reasons(busy, **OVERLOAD)
    assert len(w0.client_limited_reasons) == 2 and w1.client_limited_reasons == []
    assert w0.to_json()["client_limited"] and not w1.to_json()["client_limited"]
    assert any(w.startswith("worker 0") and "read together" in w for w in merged.warnings)
    # The merged run, summarised like any run, names what one overloaded process would.
    single = RunResult(
        busy + calm, 2.0, 0.2, 1.0, False, 0, **OVERLOAD
    )  # one process, same records, same overload
    assert single.detail_json() == {}  # one process: nothing added to its stored summary
    a = window_summary(merged, sc).client_limited_reasons
    b = window_summary(single, sc).client_limited_reasons
    assert a == b and len(a) == 2
    assert reason_kinds(a) == {"read together", "event loop was busy"}


# ------------------------------------------------------------------ real workers (slow)


@pytest.mark.slow
def test_two_workers_store_telemetry_and_their_detail(tmp_path):
    from bench.sim.server import start_sim_server_in_thread
    from bench.telemetry import TelemetryConfig, load_telemetry

    url, stop = start_sim_server_in_thread("H100-SXM", "llama-3.1-8b", "fp8", 1)
    try:
        sc = parse_scenario(
            f"target: {{base_url: '{url}', model: llama-3.1-8b}}\n"
            "load: {shape: constant, request_rate: 20, num_prompts: 40}\n"
            "workload: {input: {mean: 64}, output: {mean: 16}}\n"
        )

        db = f"sqlite:///{tmp_path / 'd.db'}"
        measured = measure(
            sc, executor=DistributedExecutor(workers=2), db=db,
            telemetry=TelemetryConfig(interval_s=0.2),
        )  # fmt: skip
        (point,) = measured.points
        summary, run_id = point.summary, measured.run_id
    finally:
        stop()
    assert summary.completed == 40
    df = load_telemetry(run_id, db)
    assert set(df["source"]) == {"server"} and len(df) > 0
    running = df[df["metric"] == "requests_running"]["value"]
    assert running.max() > 0  # scraped while the workers' requests were in flight
    run = get_run(run_id, db)
    assert run.simulated  # the simulator was detected, as for a local run
    assert run.extra_json["distributed"]["workers"] == 2
    assert run.summary_json["partial"] is False
    workers = run.summary_json["distributed"]["workers"]
    assert len(workers) == 2
    for w in workers:  # every worker shipped its own read statistics
        assert w["loop_cpu_share"] is not None and "client_limited_reasons" in w
    lp = run.load_points[0].summary_json
    assert lp["distributed"]["workers"] == workers


@pytest.mark.slow
def test_two_worker_sweep_finds_a_capacity_with_warmup(server_factory, tmp_path):
    # TTFT 50 ms and 10 ms per token: the p99 E2EL of 16 tokens is ~200 ms when idle; the
    # SLO is set between an idle point and one far beyond what the SLO allows.
    server = server_factory("--ttft-ms", "50", "--itl-ms", "10")
    sc = parse_scenario(
        f"target: {{base_url: '{server.url}', model: fake-model}}\n"
        "load: {shape: constant, request_rate: 1, num_prompts: 40}\n"
        "workload: {input: {mean: 16}, output: {mean: 16}}\n"
    )
    slo = parse_thresholds("p99_e2el_ms<=10000,p99_ttft_ms<=10000", flag="--slo")
    db = f"sqlite:///{tmp_path / 's.db'}"
    result = measure(
        sc,
        SweepPlan([PointSpec("rate", 10), PointSpec("rate", 20)], thresholds=slo,
                  slo_iterations=1, point_duration_s=2, warmup_s=0.5),
        executor=DistributedExecutor(workers=2), db=db,
    )  # fmt: skip
    assert [p.role for p in result.points] == ["grid", "grid", "slo-search"]
    assert result.at_slo is not None and result.at_slo.kind == "at_least"
    assert all(p.meets_slo for p in result.points)
    for p in result.points:  # warm-up left out of every point
        assert 0 < p.summary.completed < p.spec.value * 2
    run = get_run(result.run_id, db)
    assert all("distributed" in lp.summary_json for lp in run.load_points)
    assert run.summary_json["sweep"]["capacity"]["kind"] == "at_least"


# ------------------------------------------------------------------ the commands (slow)


def tokenbench(*args: str):
    import os
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "bench", *args], capture_output=True, text=True, timeout=300,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


@pytest.mark.slow
def test_sim_run_finds_a_capacity_at_the_slo_stored_simulated(tmp_path):
    import json

    db, out = f"sqlite:///{tmp_path / 'v.db'}", tmp_path / "sum.json"
    proc = tokenbench(
        "sim", "run", "--gpu", "h100", "--tp", "2", "--request-rates", "1,32",
        "--slo", "p99_ttft_ms<=1000", "--slo-iterations", "3", "--slo-draws", "0",
        "--point-duration", "60", "--warmup", "5", "--label", "H100 pair", "--db", db,
        "--summary-json", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "SIMULATED (virtual time)" in proc.stdout and "SLO capacity" in proc.stdout
    doc = json.loads(out.read_text())
    roles = [p["role"] for p in doc["points"]]  # no draws: only the bisection's points
    assert roles[:3] == ["grid", "grid", "slo-search"] and set(roles[2:]) == {"slo-search"}
    assert len(roles) <= 5
    run = get_run(doc["run_id"], db)
    assert run.simulated and run.endpoint == "sim://virtual" and run.label == "H100 pair"
    stored = run.summary_json["sweep"]["capacity"]
    assert stored["kind"] == "interpolated" and "draws" not in stored["parts"]
    assert "the simulator's held-out" in stored["covers"]
    assert all(lp.warmup_s == 5 for lp in run.load_points)


@pytest.mark.slow
def test_sweep_with_workers_searches_the_slo(server_factory, tmp_path):
    import json

    server = server_factory("--ttft-ms", "50", "--itl-ms", "10")
    db, out = f"sqlite:///{tmp_path / 'w.db'}", tmp_path / "sum.json"
    proc = tokenbench(
        "sweep", "--base-url", server.url, "--model", "fake-model", "--request-rates", "5,10",
        "--slo", "p99_ttft_ms<=5000", "--slo-iterations", "1", "--num-prompts", "20",
        "--random-output-len", "8", "--workers", "2", "--db", db, "--summary-json", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "SLO capacity (p99_ttft_ms<=5000): at least" in proc.stdout
    doc = json.loads(out.read_text())
    assert [p["role"] for p in doc["points"]] == ["grid", "grid", "slo-search"]
    run = get_run(doc["run_id"], db)
    assert run.extra_json["distributed"]["workers"] == 2
    assert all(lp.summary_json["distributed"]["backend"] == "processes" for lp in run.load_points)


def reason_kinds(reasons: list[str]) -> set[str]:
    """Which of the self-check's rules a list of reasons comes from."""
    rules = ("send lag", "read together", "event loop was busy", "event-loop lag")
    return {rule for rule in rules for r in reasons if rule in r}


@pytest.mark.slow
def test_one_overload_is_named_alike_by_one_process_and_two_workers(server_factory):
    """The client is starved of CPU mid-run (pinned to one CPU at the idle scheduling class,
    beside a process that spins 20 ms in every 30 for 1.5 s): one process and two workers,
    starved alike, must name the same kinds of reason."""
    import os
    import subprocess
    import sys

    from bench.distributed import run_distributed
    from bench.runner import run_blocking

    if not hasattr(os, "SCHED_IDLE") or os.geteuid() != 0 or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs Linux SCHED_IDLE, root (to leave it again) and two CPUs")
    busy = busy_share()  # the starvation below is ours only while the CPUs are otherwise idle
    if busy is not None and busy > 0.3:
        pytest.skip(f"other work keeps the CPUs {busy:.0%} busy: an idle-class client would "
                    "starve for its reasons, not ours")  # fmt: skip
    server = server_factory("--ttft-ms", "20", "--itl-ms", "5")
    os.sched_setaffinity(server.proc.pid, {1})  # the server keeps its schedule on CPU 1
    # 50 stalls of 20 ms, 10 ms apart: many late reads, tokens merged, sends late
    hog_code = (
        "import sys, time\nsys.stdin.readline()\nfor _ in range(50):\n"
        "    end = time.time() + 0.02\n    while time.time() < end: pass\n    time.sleep(0.01)\n"
    )
    sc = parse_scenario(f"target: {{base_url: '{server.url}', model: fake-model}}\n")
    affinity = os.sched_getaffinity(0)
    results = {}
    try:
        for name in ("one process", "two workers"):
            hog = subprocess.Popen([sys.executable, "-c", hog_code], stdin=subprocess.PIPE,
                                   text=True)  # fmt: skip
            os.sched_setaffinity(hog.pid, {0})
            started: list[bool] = []

            def tick(p, hog=hog, started=started) -> None:
                if p.completed >= 20 and not started:
                    started.append(True)
                    hog.stdin.write("go\n")
                    hog.stdin.flush()

            os.sched_setaffinity(0, {0})
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            try:
                p = plan(server.url, 120, out_len=64, rate=40.0)  # ~13 streams in flight
                if name == "one process":
                    results[name] = run_blocking(p, on_tick=tick, handle_sigint=False)
                else:
                    results[name] = run_distributed(p, workers=2, on_tick=tick,
                                                    handle_sigint=False)  # fmt: skip
            finally:
                os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
                os.sched_setaffinity(0, affinity)
                hog.stdin.close()
                hog.wait(timeout=30)
            assert started, f"{name}: the starvation never began"
    finally:
        os.sched_setaffinity(0, affinity)
    single = window_summary(results["one process"], sc)
    merged = window_summary(results["two workers"], sc)
    assert single.completed == merged.completed == 120
    kinds = reason_kinds(single.client_limited_reasons)
    assert "read together" in kinds, single.client_limited_reasons  # starved reads merge
    assert reason_kinds(merged.client_limited_reasons) == kinds, (
        single.client_limited_reasons, merged.client_limited_reasons
    )  # fmt: skip
    workers = results["two workers"].workers
    assert set().union(*(reason_kinds(w.client_limited_reasons) for w in workers)) <= kinds
