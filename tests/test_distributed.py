"""Scale-out: a run split across processes (--workers) and Ray actors (--ray) against the
deterministic fake server. Merged runs must send exactly the schedule and match a
single-process run; a worker killed mid-run must leave a partial run with its records kept.

The Ray tests share one small local cluster (2 CPUs, no dashboard) per module; they are
skipped, loudly, when Ray is not installed (`pip install 'tokenbench[ray]'`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import warnings

import numpy as np
import pytest

from bench.distributed import (
    DistributedError,
    DistributedExecutor,
    DistributedProgress,
    require_ray,
    run_distributed,
    split_plan,
)
from bench.drive import measure
from bench.executor import plan_from_scenario
from bench.metrics import summarize
from bench.runner import run_blocking, sessions_of
from bench.scenario import Scenario
from tests.helpers import cpu_pressure
from tests.test_runner import plan

try:
    import ray
except ImportError:  # pragma: no cover - depends on the environment
    ray = None

RAY_MISSING = "Ray is not installed: Ray tests SKIPPED (pip install 'tokenbench[ray]')"


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray cluster for the module, shut down even when a test fails."""
    if ray is None:
        warnings.warn(RAY_MISSING, stacklevel=1)
        print(f"\n*** {RAY_MISSING} ***", file=sys.stderr)
        pytest.skip(RAY_MISSING)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield "auto"  # already initialised: run_distributed uses this connection
    finally:
        ray.shutdown()


def killer(worker: int, after_completed: int):
    """An on_tick that SIGKILLs one worker's process once it has completed some requests."""
    killed: list[int] = []

    def tick(p: DistributedProgress) -> None:
        st = p.workers[worker]
        if not killed and st.pid and st.completed >= after_completed:
            os.kill(st.pid, signal.SIGKILL)
            killed.append(st.pid)

    return tick, killed


def assert_matches_single(fake_server, ray_address: str | None) -> None:
    """A 2-worker run sends exactly the schedule; its metrics match one process's."""
    p = plan(fake_server.url, 80, out_len=12, rate=80.0)
    sunk = []
    with cpu_pressure() as pressure:
        single = run_blocking(p, handle_sigint=False)
        merged = run_distributed(
            p, workers=2, ray_address=ray_address, sink=sunk.append, handle_sigint=False
        )
    assert not merged.partial and not merged.interrupted, merged.warnings
    assert len(merged.records) == len(sunk) == 80
    assert sorted(r.index for r in merged.records) == list(range(80))
    assert [w.sent for w in merged.workers] == [40, 40]
    assert all(w.alive and w.send_lag_p99_ms is not None for w in merged.workers)
    a = summarize(single.records, loop_lag_p99_ms=single.loop_lag_p99_ms)
    b = summarize(merged.records, loop_lag_p99_ms=merged.loop_lag_p99_ms)
    assert a.completed == b.completed == 80
    assert a.total_output_tokens == b.total_output_tokens
    # The server's TTFT is 50 ms and ITL 10 ms: the figures agree to within noise. On a
    # CPU-starved machine the (Python) fake server itself answers late, and by different
    # amounts in the two runs, so there only the counts and the schedule are compared.
    for metric, tol_ms in (("ttft", 5.0), ("tpot", 1.0), ("itl", 1.0), ("e2el", 6.0)):
        diff = abs(a.metrics[metric].percentiles["p50"] - b.metrics[metric].percentiles["p50"])
        assert diff < tol_ms or pressure.starved, (metric, diff)
    # Both follow the schedule: send times from each worker's own t0 land on its offsets.
    # Starved, the workers may fall behind it; then the merged run's self-check must say so.
    if pressure.starved and b.send_lag_ms["p50"] >= 5.0:
        assert any("send lag" in r for r in b.client_limited_reasons), b.client_limited_reasons
        return
    assert b.send_lag_ms["p50"] < 5.0
    assert abs(a.duration_s - b.duration_s) < 0.2


def assert_partial_when_killed(fake_server, ray_address: str | None) -> None:
    p = plan(fake_server.url, 160, out_len=8, rate=40.0)  # 4 s of schedule
    tick, killed = killer(worker=1, after_completed=10)
    sunk = []
    result = run_distributed(
        p,
        workers=2,
        ray_address=ray_address,
        sink=sunk.append,
        on_tick=tick,
        handle_sigint=False,
    )
    assert killed, "the worker was never killed"
    assert result.partial and result.interrupted
    dead, alive = result.workers[1], result.workers[0]
    assert not dead.alive and dead.error
    assert alive.alive and alive.completed == 80  # the survivor finished its whole share
    assert 10 <= dead.received < 80  # what the dead worker had streamed back is kept
    assert len(result.records) == len(sunk) == 80 + dead.received
    kept_from_dead = [r for r in result.records if r.index % 2 == 1]
    assert len(kept_from_dead) == dead.received and all(r.ok for r in kept_from_dead)
    assert any("died" in w for w in result.warnings)
    detail = result.detail_json()
    assert detail["partial"] is True
    assert detail["distributed"]["workers"][1]["alive"] is False


# ------------------------------------------------------------------ splitting (no processes)

NO_SERVER = "http://127.0.0.1:9"  # splitting a plan sends nothing


def test_open_loop_split_is_an_even_thinning_of_the_schedule():
    p = plan(NO_SERVER, 11, rate=10.0, max_concurrency=5)
    shares = split_plan(p, 3)
    assert [len(s.specs) for s in shares] == [4, 4, 3]
    assert [s.max_concurrency for s in shares] == [2, 2, 1]
    for k, share in enumerate(shares):
        assert [s.index for s in share.specs] == list(range(k, 11, 3))
        np.testing.assert_array_equal(share.offsets_s, p.offsets_s[k::3])
    assert len(split_plan(p, 50)) == 5  # never more workers than concurrency slots


def test_multi_turn_sessions_stay_whole_on_one_worker():
    p = plan(NO_SERVER, 12, rate=10.0)
    p.workload.turns = 3
    p.specs = p.workload.specs(12)
    p.offsets_s = np.arange(4) / 10.0
    shares = split_plan(p, 2)
    assert [[s[0].session for s in sessions_of(x.specs)] for x in shares] == [[0, 2], [1, 3]]
    assert all(len(t) == 3 for x in shares for t in sessions_of(x.specs))


def test_closed_loop_split_divides_users_and_their_sessions():
    p = plan(NO_SERVER, 30, rate=None, concurrency=3)
    shares = split_plan(p, 2)
    assert [s.concurrency for s in shares] == [2, 1]
    assert [len(s.specs) for s in shares] == [20, 10]  # work in proportion to users
    assert sorted(s.index for x in shares for s in x.specs) == list(range(30))
    assert len(split_plan(p, 8)) == 3
    with pytest.raises(DistributedError):
        split_plan(p, 0)


def test_without_ray_the_flag_names_the_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` fail
    with pytest.raises(DistributedError, match=r"pip install 'tokenbench\[ray\]'"):
        require_ray()


# ------------------------------------------------------------------ --workers (processes)


@pytest.mark.slow
def test_processes_two_workers_match_one(fake_server):
    assert_matches_single(fake_server, None)


@pytest.mark.slow
def test_processes_killed_worker_gives_partial_run_with_its_records(fake_server):
    assert_partial_when_killed(fake_server, None)


@pytest.mark.slow
def test_processes_closed_loop_sends_exactly_num_prompts(fake_server):
    p = plan(fake_server.url, 40, out_len=6, rate=None, concurrency=4)
    result = run_distributed(p, workers=2, handle_sigint=False)
    assert sorted(r.index for r in result.records) == list(range(40))
    assert [w.users for w in result.workers] == [2, 2]
    assert not result.partial


@pytest.mark.slow
def test_partial_run_is_stored_interrupted_with_worker_detail(fake_server, tmp_path, monkeypatch):
    import bench.distributed as dist
    from bench.store.read import get_run, load_records

    sc = Scenario.model_validate(
        {
            "name": "scale-out",
            "target": {"base_url": fake_server.url, "model": "fake-model"},
            "load": {"shape": "constant", "request_rate": 40, "num_prompts": 120},
            "workload": {"input": {"mean": 16}, "output": {"mean": 8}},
        }
    )
    p = plan_from_scenario(sc)
    tick, killed = killer(worker=0, after_completed=8)
    real = dist.run_distributed
    monkeypatch.setattr(
        dist, "run_distributed", lambda plan, **kw: real(plan, **{**kw, "on_tick": tick})
    )
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    measured = measure(sc, executor=DistributedExecutor(workers=2), plan=p, db=db)
    result, summary, run_id = measured.points[0].run, measured.points[0].summary, measured.run_id
    assert killed and result.partial and summary.interrupted
    info = get_run(run_id, db)
    assert info.status == "interrupted"
    assert info.summary_json["partial"] is True
    assert info.summary_json["distributed"]["workers"][0]["alive"] is False
    assert len(load_records(run_id, db=db)) == len(result.records) == summary.sent


# ------------------------------------------------------------------ --ray (local cluster)


@pytest.mark.slow
def test_ray_two_workers_match_one(fake_server, ray_cluster):
    assert_matches_single(fake_server, ray_cluster)


@pytest.mark.slow
def test_ray_killed_worker_gives_partial_run_with_its_records(fake_server, ray_cluster):
    assert_partial_when_killed(fake_server, ray_cluster)


@pytest.mark.slow
def test_ray_reports_every_worker_where_it_ran(fake_server, ray_cluster):
    result = run_distributed(
        plan(fake_server.url, 20, out_len=4, rate=50.0),
        workers=2,
        ray_address=ray_cluster,
        handle_sigint=False,
    )
    assert result.backend == "ray"
    assert {w.pid for w in result.workers} & {os.getpid()} == set()  # really other processes
    assert all(w.host and w.loop_lag_p99_ms is not None for w in result.workers)


@pytest.mark.slow
def test_processes_stop_keeps_what_was_measured_and_is_not_partial(fake_server):
    stop = threading.Event()

    def tick(p: DistributedProgress) -> None:
        if p.completed >= 10:
            stop.set()

    result = run_distributed(
        plan(fake_server.url, 400, out_len=8, rate=40.0),
        workers=2,
        on_tick=tick,
        stop=stop,
        handle_sigint=False,
    )
    assert result.interrupted and not result.partial
    assert 10 <= len(result.records) < 400
    assert all(w.alive for w in result.workers)
    assert sum(w.sent for w in result.workers) == len(result.records)


def test_a_late_and_overloaded_worker_is_named_with_its_node():
    """Two workers' batches as the driver gets them: worker 1 first sent 120 ms after its
    scheduled offset and read late; the warnings name it and its node, its stats say why,
    and worker 0 (on time) is not named."""
    from bench.distributed import _COUNTERS, _Driver, _shares
    from bench.records import RequestRecord

    p = plan(NO_SERVER, 20, rate=10.0)  # offsets 0, 0.1, ... : worker k gets k, k+2, ...
    driver = _Driver(_shares(p, 2), None, None)
    nodes = ["a" * 56, "b" * 56]
    for k, late_ms in ((0, 0.4), (1, 120.0)):
        driver.stats[k].node, driver.stats[k].host = nodes[k], "host"
        records = []
        for i in range(k, 20, 2):
            intended = int(p.offsets_s[i] * 1e9)
            sent = intended + int(late_ms * 1e6)
            first = sent + 50_000_000
            records.append(
                RequestRecord(index=i, intended_ns=intended, sent_ns=sent, first_token_ns=first,
                              end_ns=first + 40_000_000, output_tokens=5, http_status=200,
                              chunk_times_ns=np.arange(5, dtype=np.int64) * 10_000_000 + first)
            )  # fmt: skip
        status = {key: 0 for key in _COUNTERS} | {
            "finished": True, "error": None, "interrupted": False, "cpu_s": 1.0,
            "loop_lag_p99_ms": 1.0 if k == 0 else 130.0, "loop_lag_max_ms": 140.0,
            "loop_cpu_share": 0.1 if k == 0 else 0.97, "late_read_share": 0.0,
            "merged_token_share": 0.0, "duration_s": 2.0, "loop_cpu_wait_share": 0.0,
        }  # fmt: skip
        driver.take(k, records, status)
    result = driver.result("ray")
    on_time, late = result.workers
    assert on_time.start_error_ms == pytest.approx(0.4) and not on_time.client_limited_reasons
    assert late.start_error_ms == pytest.approx(120.0) and late.client_limited_reasons
    named = [w for w in result.warnings if "worker 1 " in w]
    assert named and all("node bbbbbbbb" in w for w in named)
    assert any("120 ms after its scheduled start" in w for w in named)
    assert not any("worker 0 " in w for w in result.warnings)
    detail = result.detail_json()["distributed"]["workers"]
    assert [w["node"] for w in detail] == nodes and detail[1]["client_limited"] is True


@pytest.mark.parametrize(
    "address, message",
    [
        ("127.0.0.1:9", "nothing answers at 127.0.0.1:9 within"),
        ("ray://127.0.0.1:9", "nothing answers at 127.0.0.1:9 within"),
        ("headnode", "expected HOST:PORT, ray://HOST:PORT, auto or local"),
    ],
)
def test_a_ray_address_nobody_answers_at_is_an_error_not_a_wait(address, message):
    """Issue 31: ray.init retries an unreachable GCS without end; --ray checks first."""
    if ray is None:
        pytest.skip(RAY_MISSING)
    connected = ray.is_initialized()  # this module's cluster may be up: checked all the same
    with pytest.raises(DistributedError, match=message):
        run_distributed(plan(NO_SERVER, 4, rate=10.0), workers=2, ray_address=address,
                        handle_sigint=False)  # fmt: skip
    assert ray.is_initialized() == connected  # no connection opened (or closed) by a refusal


class _FlakyRayClient:
    """ray's init/shutdown as Ray Client shows them when the head's per-connection server
    misses its start: ConnectionAbortedError with the server's traceback, `fails` times."""

    def __init__(self, fails: int) -> None:
        self.fails, self.inits, self.shutdowns = fails, 0, 0

    def init(self, **kwargs) -> None:
        self.inits += 1
        if self.inits <= self.fails:
            raise ConnectionAbortedError(
                "Initialization failure from server:\nTraceback (most recent call last):\n"
                '  File "proxier.py", line 771, in Datapath\n'
                "RuntimeError: Proxy failed to Connect to backend! Check `ray_client_server.err`"
            )

    def shutdown(self) -> None:
        self.shutdowns += 1


def test_ray_client_retries_a_head_whose_client_server_missed_its_start():
    """CI once saw "Initialization failure from server" on a loaded head; a new connection
    starts a new server, so the connect is tried again, a bounded number of times."""
    from bench.distributed import RAY_CLIENT_INIT_TRIES, _connect_ray

    flaky = _FlakyRayClient(fails=RAY_CLIENT_INIT_TRIES - 1)
    _connect_ray(flaky, "ray://127.0.0.1:10001", None, None, None)
    assert flaky.inits == RAY_CLIENT_INIT_TRIES and flaky.shutdowns == RAY_CLIENT_INIT_TRIES - 1

    dead = _FlakyRayClient(fails=99)
    with pytest.raises(DistributedError, match="Proxy failed to Connect to backend") as info:
        _connect_ray(dead, "ray://127.0.0.1:10001", None, None, None)
    assert dead.inits == RAY_CLIENT_INIT_TRIES and "ray_client_server" in str(info.value)
    # a GCS address is not Ray Client: its failure is not retried
    once = _FlakyRayClient(fails=1)
    with pytest.raises(DistributedError):
        _connect_ray(once, "10.0.0.1:6379", "10.0.0.1:6379", "10.0.0.1", 6379)
    assert once.inits == 1


def test_slow_placement_does_not_count_as_worker_silence():
    """Connecting and placing workers has its own deadline; on a loaded host it took longer
    than HEARTBEAT_TIMEOUT_S and every worker was killed before its first batch."""
    from bench.distributed import _COUNTERS, _SHIPPED, HEARTBEAT_TIMEOUT_S, _drive, _Driver, _shares

    driver = _Driver(_shares(plan(NO_SERVER, 4, rate=10.0), 2), None, None)
    driver.last_heard = [x - 4 * HEARTBEAT_TIMEOUT_S for x in driver.last_heard]  # placement
    done = {key: 0 for key in (*_COUNTERS, *_SHIPPED, "cpu_s")}
    done |= {"finished": True, "error": None, "interrupted": False}
    killed: list[int] = []
    polls = iter([[], [], [(0, ([], done)), (1, ([], done))]])  # quiet at first: warming up
    _drive(driver, None, lambda _t: next(polls), lambda k: None, killed.append)
    assert killed == [] and all(st.finished and st.error is None for st in driver.stats)
