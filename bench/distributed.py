"""Load generation across processes (`--workers N`) and machines (`--ray auto|ADDRESS`).

One Python process saturates its core long before a large deployment does, so a run's
schedule is split across workers, each with its own event loop and connection pool, and
their records are merged into one run.

How the pieces fit:

- Splitting (`split_plan`): open loop, sessions are dealt round-robin, so every worker's
  share is an even thinning of the same schedule (worker k of N gets sessions k, k+N, ...,
  at their original offsets); a --max-concurrency cap is divided between the workers.
  Closed loop, the users are divided and each user's sessions go with it. Request indices
  stay global, so merged records are exactly those of a single-process run. Each worker
  gets its RunPlan share and renders its own prompts locally (Workload.render is
  deterministic by seed and index): the plan travels, not the prompts.
- Shared start: every worker prepares (imports, plan, event-loop thread) and reports ready;
  only then does the driver broadcast a start *delay*. Each worker sets its own
  t0 = its clock at receipt + delay. No clock reading ever crosses a process or machine,
  so clock skew between hosts cannot corrupt any timing; the workers' start instants agree
  to within the broadcast's delivery time (well under a millisecond on one host).
- Records: all times in a RequestRecord are durations since the worker's own t0, so records
  merge as they are. Each worker buffers them and the driver pulls them in batches every
  BATCH_S and feeds them to the sink (the store's RunWriter) as they arrive.
- Accountability: per-worker counters and each worker's own read statistics (loop busy
  share, late reads, merged tokens, loop lag) are kept, and every worker is judged one by
  one by the same rule as the merged run (bench.metrics.client_limited_reasons), so one
  slow machine cannot hide inside the merged percentiles. A worker that
  dies mid-run is reported with its error; what it had already streamed back is kept and
  the run is marked partial, never silently short.

Two transports for the same worker code (`_WorkerCore`):
- processes: multiprocessing with the spawn start method, one duplex pipe per worker (a
  killed worker can only break its own pipe, which the driver sees as end-of-file).
- Ray: one actor per worker (1 CPU each, spread over the nodes); the driver keeps one
  `poll` call outstanding per actor, and each call returns a batch of records. Ray is an
  optional extra: `pip install 'tokenbench[ray]'`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from multiprocessing import connection as mp_connection
from time import perf_counter_ns
from typing import Any

import numpy as np

from bench.executor import Progress, RunPlan, RunResult, StoredAs
from bench.extras import install_hint
from bench.metrics import client_limited_reasons
from bench.records import RequestRecord
from bench.runner import execute, new_event_loop, sessions_of
from bench.workload import RequestSpec

BATCH_S = 0.25  # how often a worker's records are shipped to the driver
TICK_S = 0.25  # how often on_tick is called
READY_TIMEOUT_S = 120.0  # a worker must be placed and ready within this
HEARTBEAT_TIMEOUT_S = 30.0  # a worker silent this long is declared dead
STOP_GRACE_S = 15.0  # after a stop, how long workers get to cancel and send their last records
LOCAL_START_DELAY_S = 0.5  # start delay broadcast to processes on this host
RAY_START_DELAY_S = 2.0  # start delay broadcast to Ray actors (RPC fan-out across machines)
RAY_CONNECT_TIMEOUT_S = 10.0  # a Ray address must answer a TCP connect within this
# Ray Client starts one server process per connection on the head and gives it 30 s to answer
# (RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S there); on a loaded head that start can miss, and
# the client is told "Initialization failure from server". A fresh connection starts a fresh
# server: tried this many times in all.
RAY_CLIENT_INIT_TRIES = 3
SETUP_S_PER_SPEC = 2e-6  # the runner's own setup (sessions, gc) after the start: ~0.7 s/500k
LATE_START_MS = 50.0  # a worker whose first request leaves later than this is reported
RAY_INSTALL_HINT = install_hint("ray")


class DistributedError(RuntimeError):
    """A distributed run could not start (no Ray, workers not placed, bad arguments)."""


# ---------------------------------------------------------------------------- results


@dataclass
class WorkerStats:
    """One worker as the driver saw it: where it ran, what it did, whether it survived."""

    worker: int
    host: str = ""
    pid: int = 0
    node: str = ""  # the Ray node id it ran on ("" for a --workers process: this host)
    node_ip: str = ""  # that Ray node's address
    planned_sessions: int = 0
    users: int | None = None  # closed loop only
    sent: int = 0
    completed: int = 0
    failed: int = 0
    in_flight: int = 0
    received: int = 0  # records that reached the driver
    first_send_ms: float | None = None  # its first request, after the shared start
    # How far its first send fell from where the schedule put it, on its own clock: its
    # setup and an overloaded host show here (bench.metrics judges the rest of its sends).
    start_error_ms: float | None = None
    # Driver's clock, broadcast of the start to this worker's acknowledgement (Ray): how
    # much later than the driver's its start can be (the delivery time, at most this).
    start_ack_ms: float | None = None
    send_lag_p99_ms: float | None = None
    loop_lag_p99_ms: float | None = None
    loop_lag_max_ms: float | None = None
    # what the worker measured about its own reads (bench.runner.RunResult's fields)
    loop_cpu_share: float | None = None
    loop_cpu_wait_share: float | None = None
    late_read_share: float | None = None
    merged_token_share: float | None = None
    # bench.metrics.client_limited_reasons of this worker's records and read statistics
    client_limited_reasons: list[str] = field(default_factory=list)
    duration_s: float | None = None
    cpu_s: float | None = None  # the worker process's CPU time over its run (all threads)
    alive: bool = True
    finished: bool = False
    error: str | None = None

    @property
    def cpu_busy(self) -> float | None:
        """CPU time / run time: near 1.0 means this worker's core was its limit."""
        if self.cpu_s is None or not self.duration_s:
            return None
        return self.cpu_s / self.duration_s

    def to_json(self) -> dict[str, Any]:
        limited = bool(self.client_limited_reasons)
        return {**asdict(self), "cpu_busy": self.cpu_busy, "client_limited": limited}


@dataclass
class DistributedProgress(Progress):
    """Progress summed over the workers, plus each worker's own counters (for on_tick)."""

    workers: list[WorkerStats] = field(default_factory=list)


# ---------------------------------------------------------------------------- splitting


def _share(total: int, n: int, k: int) -> int:
    """Worker k's part of `total` items dealt round-robin to n workers."""
    return total // n + (1 if k < total % n else 0)


def _assign(plan: RunPlan, workers: int) -> tuple[list[np.ndarray], list[dict[str, Any]]]:
    """Which specs (positions in plan.specs) each worker gets, and its plan's overrides.

    Vectorised over session ordinals, since duration-bound closed loops carry a million specs.
    """
    if workers < 1:
        raise DistributedError(f"--workers must be at least 1, not {workers}")
    specs = plan.specs
    session = np.fromiter((s.session for s in specs), np.int64, len(specs))
    starts = np.ones(len(specs), dtype=bool)
    starts[1:] = session[1:] != session[:-1]
    ordinal = np.cumsum(starts) - 1  # 0, 1, 2, ... : which session each spec belongs to
    n_sessions = int(ordinal[-1]) + 1 if len(specs) else 0
    if plan.offsets_s is not None:
        offsets = np.asarray(plan.offsets_s, dtype=np.float64)
        n_sessions = min(n_sessions, len(offsets))  # the runner drops sessions past the schedule
        n = min(workers, max(1, n_sessions), plan.max_concurrency or workers)
        owner = np.where(ordinal < n_sessions, ordinal % n, -1)
        cap = plan.max_concurrency
        overrides = [
            {
                "offsets_s": offsets[:n_sessions][k::n],
                "max_concurrency": _share(cap, n, k) if cap else None,
            }
            for k in range(n)
        ]
    else:
        users = plan.concurrency or 1
        n = min(workers, users)
        # User j belongs to worker j % n; session i is the (i // users)-th of user i % users.
        owner = (ordinal % users) % n
        overrides = [{"concurrency": _share(users, n, k)} for k in range(n)]
    return [np.flatnonzero(owner == k) for k in range(n)], overrides


def split_plan(plan: RunPlan, workers: int) -> list[RunPlan]:
    """Split one plan into at most `workers` plans whose union is the original schedule.

    Fewer plans come back when there is less to share than workers (fewer sessions,
    closed-loop users, or --max-concurrency slots than workers): no worker idles.
    """
    return [share.unpack() for share in _shares(plan, workers)]


_SPEC_COLUMNS = ("index", "input_len", "output_len", "session", "turn")


@dataclass
class _Share:
    """What travels to one worker: its plan, with synthetic specs packed as int columns.

    Pickling a list of half a million RequestSpecs takes seconds and tens of MB; five int64
    arrays take milliseconds. Dataset specs (with prompt text) and specs of a traffic-class
    mix (with their class) travel as they are.
    """

    plan: RunPlan
    columns: dict[str, np.ndarray] | None = None

    def unpack(self) -> RunPlan:
        if self.columns is None:
            return self.plan
        cols = [self.columns[name].tolist() for name in _SPEC_COLUMNS]
        return replace(self.plan, specs=[RequestSpec(*row) for row in zip(*cols, strict=True)])

    @property
    def n_specs(self) -> int:
        return len(self.plan.specs) if self.columns is None else len(self.columns["index"])

    @property
    def n_sessions(self) -> int:
        if self.columns is None:
            return len(sessions_of(self.plan.specs))
        session = self.columns["session"]
        return int((session[1:] != session[:-1]).sum()) + 1 if len(session) else 0


def _shares(plan: RunPlan, workers: int) -> list[_Share]:
    positions, overrides = _assign(plan, workers)
    specs = plan.specs
    # Dataset prompts and a traffic-class mix's specs (each names its class) travel whole.
    if any(s.text is not None or s.messages is not None or s.traffic_class for s in specs):
        return [
            _Share(replace(plan, specs=[specs[i] for i in pos], **ov))
            for pos, ov in zip(positions, overrides, strict=True)
        ]
    columns = {
        name: np.fromiter((getattr(s, name) for s in specs), np.int64, len(specs))
        for name in _SPEC_COLUMNS
    }
    return [
        _Share(replace(plan, specs=[], **ov), {name: c[pos] for name, c in columns.items()})
        for pos, ov in zip(positions, overrides, strict=True)
    ]


# ---------------------------------------------------------------------------- worker side


class _WorkerCore:
    """One worker's run: its own event loop in its own thread, records queued for the driver.

    The transport (a pipe or a Ray actor) only calls start/stop/poll from other threads, so
    shipping records never runs on the event loop that timestamps them. No method here may
    be async: Ray would make its actor (a subclass) an asyncio actor, whose blocking poll
    would hold up a stop.
    """

    def __init__(self, share: _Share) -> None:
        self.plan = share.unpack()
        self.records: deque[RequestRecord] = deque()
        self.progress = Progress()
        self.result: RunResult | None = None
        self.error: str | None = None
        self.cpu_s: float | None = None
        self._t0_ns: int | None = None
        self._go = threading.Event()
        self._done = threading.Event()
        self._stopping = False
        self._stop_loop: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._run, name="tokenbench-loop", daemon=True)
        self._thread.start()

    def start(self, delay_s: float) -> None:
        """Start `delay_s` from now on this machine's clock (the broadcast start delay)."""
        self._t0_ns = perf_counter_ns() + int(delay_s * 1e9)
        self._go.set()

    def stop(self) -> None:
        """Stop gently: in-flight requests are cancelled and recorded, as Ctrl-C does."""
        self._stopping = True
        self._go.set()
        stop_loop = self._stop_loop
        if stop_loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                stop_loop()

    def poll(self, wait_s: float, limit: int = 20_000) -> tuple[list[RequestRecord], dict]:
        """Wait up to wait_s (less if the run ends), then hand over a batch of records."""
        self._done.wait(wait_s)
        batch = []
        for _ in range(min(limit, len(self.records))):
            batch.append(self.records.popleft())
        return batch, self.status()

    def status(self) -> dict[str, Any]:
        p, r = self.progress, self.result
        done = self._done.is_set()
        return {
            **{key: getattr(p, key) for key in _COUNTERS},
            "finished": done and not self.records,
            "error": self.error,
            "interrupted": bool(r and r.interrupted),
            "cpu_s": self.cpu_s,
            **{key: getattr(r, key) if r else None for key in _SHIPPED},
        }

    def _run(self) -> None:
        async def main() -> RunResult:  # nested, not a method: see the class docstring
            loop = asyncio.get_running_loop()
            stop = asyncio.Event()
            self._stop_loop = lambda: loop.call_soon_threadsafe(stop.set)
            if self._stopping:
                stop.set()
            return await execute(
                self.plan, sink=self.records.append, progress=self.progress, stop=stop,
                t0_ns=self._t0_ns,
            )  # fmt: skip

        try:
            if not self._go.wait(READY_TIMEOUT_S + HEARTBEAT_TIMEOUT_S):
                self.error = "never told to start"
                return
            if self._stopping:
                return
            cpu0 = time.process_time()
            with asyncio.Runner(loop_factory=new_event_loop) as runner:
                self.result = runner.run(main())
            self.cpu_s = time.process_time() - cpu0
        except BaseException as exc:  # noqa: BLE001 - reported to the driver, not swallowed
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._done.set()


def _process_main(share: _Share, conn: mp_connection.Connection) -> None:
    """Entry point of a `--workers` process: ready, wait for the start delay, stream, exit.

    Every wait is bounded; if the driver goes away (its end of the pipe closes) the worker
    stops its run and exits rather than lingering.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver handles Ctrl-C and tells us
    core = _WorkerCore(share)
    try:
        conn.send(("ready", socket.gethostname(), os.getpid()))
        if not conn.poll(READY_TIMEOUT_S):
            core.stop()
            return
        msg = conn.recv()
        if msg[0] == "start":
            core.start(msg[1])
        else:
            core.stop()
        deadline_after_stop: float | None = None
        while True:
            if conn.poll(0) and conn.recv()[0] == "stop":
                core.stop()
                deadline_after_stop = deadline_after_stop or time.monotonic() + STOP_GRACE_S
            records, status = core.poll(BATCH_S)
            conn.send(("batch", records, status))
            if status["finished"]:
                return
            if deadline_after_stop is not None and time.monotonic() > deadline_after_stop:
                return
    except (EOFError, BrokenPipeError, ConnectionResetError):
        core.stop()  # the driver is gone: nobody to report to
    finally:
        conn.close()


# ---------------------------------------------------------------------------- driver side


class _Driver:
    """Bookkeeping shared by both transports: stats, merged records, ticks, warnings."""

    def __init__(
        self,
        shares: list[_Share],
        sink: Callable[[RequestRecord], None] | None,
        on_tick: Callable[[DistributedProgress], None] | None,
    ) -> None:
        self.shares = shares
        self.sink = sink
        self.on_tick = on_tick
        self.records: list[RequestRecord] = []
        self.by_worker: list[list[RequestRecord]] = [[] for _ in shares]
        self.stats = [
            WorkerStats(
                worker=k,
                planned_sessions=sh.n_sessions,
                users=sh.plan.concurrency if sh.plan.offsets_s is None else None,
            )
            for k, sh in enumerate(shares)
        ]
        self.progress = DistributedProgress(total=sum(sh.n_specs for sh in shares))
        self.progress.workers = self.stats
        self.stop_requested = threading.Event()
        self.t0_ns = 0
        self._last_tick = 0.0
        self.last_heard = [time.monotonic()] * len(shares)

    def take(self, k: int, records: list[RequestRecord], status: dict) -> None:
        """One batch from worker k: keep the records, feed the sink, update counters."""
        self.last_heard[k] = time.monotonic()
        st = self.stats[k]
        if records:
            self.records.extend(records)
            self.by_worker[k].extend(records)
            st.received += len(records)
            first = min(r.sent_ns for r in records) / 1e6
            st.first_send_ms = first if st.first_send_ms is None else min(first, st.first_send_ms)
            recent = self.progress.recent_ttft_ms
            recent.extend(r.ttft_ns / 1e6 for r in records if r.ok and r.ttft_ns is not None)
            if len(recent) > 2048:
                del recent[:-1024]
            if self.sink is not None:
                for rec in records:
                    self.sink(rec)
        for key in (*_COUNTERS, *_SHIPPED, "cpu_s"):
            setattr(st, key, status[key])
        if status["error"]:
            self.died(k, status["error"])
        elif status["finished"]:
            st.finished = True
            st.in_flight = 0

    def died(self, k: int, error: str) -> None:
        st = self.stats[k]
        if st.finished:
            return
        st.alive, st.finished, st.in_flight, st.error = False, True, 0, error

    def active(self) -> list[int]:
        return [k for k, st in enumerate(self.stats) if not st.finished]

    def tick(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.on_tick is None or (not force and now - self._last_tick < TICK_S):
            return
        self._last_tick = now
        for key in _COUNTERS:
            setattr(self.progress, key, sum(getattr(s, key) for s in self.stats))
        self.on_tick(self.progress)

    def silent(self) -> list[int]:
        """Workers not heard from for HEARTBEAT_TIMEOUT_S: hung or cut off."""
        now = time.monotonic()
        return [k for k in self.active() if now - self.last_heard[k] > HEARTBEAT_TIMEOUT_S]

    def result(self, backend: str) -> RunResult:
        """The merged RunResult plus what each worker did (its distributed fields).

        The loop lag and read statistics are the worst worker's, since any one late or busy
        loop delays its own timestamps: the merged run's self-check then names what the
        worst worker's own would.
        """
        warnings = []
        for k, st in enumerate(self.stats):
            lags = [r.send_lag_ns for r in self.by_worker[k]]
            if lags:
                st.send_lag_p99_ms = float(np.percentile(lags, 99) / 1e6)
            reads = {key: getattr(st, key) for key in _READ_STATS}
            if any(r.ok for r in self.by_worker[k]):
                closed = self.shares[k].plan.offsets_s is None
                st.client_limited_reasons = client_limited_reasons(
                    self.by_worker[k], **reads, closed_loop=closed
                )
            node = f" node {st.node[:8]} {st.node_ip}" if st.node else ""
            where = f"worker {k} ({st.host or '?'}{node} pid {st.pid})"
            if not st.alive:
                warnings.append(
                    f"{where} died after {st.received} records: {st.error}; "
                    "its completed requests are kept and the run is partial"
                )
            planned_first_ms = 0.0
            offsets = self.shares[k].plan.offsets_s
            if offsets is not None and len(offsets):
                planned_first_ms = float(offsets[0]) * 1e3
            if st.first_send_ms is not None:
                st.start_error_ms = st.first_send_ms - planned_first_ms
                if st.start_error_ms > LATE_START_MS:
                    warnings.append(
                        f"{where}: first request {st.start_error_ms:.0f} ms after its scheduled "
                        "start: it started late (slow setup or an overloaded host)"
                    )
            warnings.extend(f"{where}: {reason}" for reason in st.client_limited_reasons)
        partial = any(not st.alive for st in self.stats)
        stopped = self.stop_requested.is_set()
        self.records.sort(key=lambda r: (r.sent_ns, r.index))
        worst = {key: _worst(self.stats, key) for key in _READ_STATS + ("loop_lag_max_ms",)}
        durations = [s.duration_s for s in self.stats if s.duration_s is not None]
        if not durations and self.records:  # every worker died: measure from the records
            ends = [r.end_ns or r.sent_ns for r in self.records]
            durations = [max(ends) / 1e9]
        self.tick(force=True)
        return RunResult(
            records=self.records,
            duration_s=max(durations, default=0.0),
            loop_lag_p99_ms=worst.pop("loop_lag_p99_ms") or 0.0,
            loop_lag_max_ms=worst.pop("loop_lag_max_ms") or 0.0,
            **worst,
            interrupted=stopped or partial,
            t0_ns=self.t0_ns,
            workers=self.stats,
            backend=backend,
            partial=partial,
            warnings=warnings,
        )


# What each worker measured about its own reads, shipped with its status (with the rest of
# its RunResult's figures named in _SHIPPED); the merged run carries the worst worker's.
_READ_STATS = (
    "loop_lag_p99_ms", "loop_cpu_share", "loop_cpu_wait_share", "late_read_share",
    "merged_token_share",
)  # fmt: skip
_SHIPPED = (*_READ_STATS, "loop_lag_max_ms", "duration_s")
_COUNTERS = ("sent", "completed", "failed", "in_flight")  # its live Progress, summed in ticks


def _worst(stats: list[WorkerStats], key: str) -> float | None:
    values = [getattr(s, key) for s in stats if getattr(s, key) is not None]
    return max(values, default=None)


@contextlib.contextmanager
def _sigint_sets(event: threading.Event, enabled: bool):
    """Ctrl-C (or SIGTERM) asks the workers to stop gently; a second one raises
    KeyboardInterrupt."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    from bench.runner import note_stop

    def handler(signum, frame) -> None:  # noqa: ANN001
        note_stop(signum)
        if event.is_set():
            raise KeyboardInterrupt
        event.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _drive(
    driver: _Driver,
    stop: threading.Event | None,
    poll: Callable[[float], Iterable[tuple[int, tuple | str]]],
    send_stop: Callable[[int], None],
    kill: Callable[[int], None],
) -> None:
    """Both transports' loop: `poll(timeout_s)` gives (worker, (records, status)) per batch,
    or (worker, error) when its pipe or actor is gone. A stop is broadcast once; workers
    silent for HEARTBEAT_TIMEOUT_S are killed, those still running STOP_GRACE_S later given up."""
    stop_sent_at: float | None = None
    # The heartbeat clock starts here: connecting, placing and starting the workers have
    # their own deadlines (READY_TIMEOUT_S), and on a loaded host they can take longer than
    # HEARTBEAT_TIMEOUT_S, which then killed every worker before its first batch.
    driver.last_heard = [time.monotonic()] * len(driver.last_heard)
    while driver.active():
        wanted = (stop is not None and stop.is_set()) or driver.stop_requested.is_set()
        if wanted and stop_sent_at is None:
            driver.stop_requested.set()
            stop_sent_at = time.monotonic()
            for k in driver.active():
                send_stop(k)
        for k, got in poll(0.1):
            if isinstance(got, str):
                driver.died(k, got)
            else:
                driver.take(k, *got)
        for k in driver.silent():
            kill(k)
            driver.died(k, f"no word for {HEARTBEAT_TIMEOUT_S:g} s; killed")
        if stop_sent_at is not None and time.monotonic() - stop_sent_at > STOP_GRACE_S:
            for k in driver.active():
                driver.died(k, f"did not stop within {STOP_GRACE_S:g} s of the stop")
        driver.tick()


def _run_processes(
    driver: _Driver, stop: threading.Event | None, start_delay_s: float
) -> RunResult:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    conns: list[mp_connection.Connection] = []
    procs = []

    def receive(workers: Iterable[int], timeout_s: float):
        """(worker, message), or (worker, None) at EOF: the process is gone (joined)."""
        for c in mp_connection.wait([conns[k] for k in workers], timeout=timeout_s):
            k = conns.index(c)
            try:
                yield k, c.recv()
            except (EOFError, OSError):
                procs[k].join(1.0)
                yield k, None

    def poll(timeout_s: float):
        for k, msg in receive(driver.active(), timeout_s):
            yield k, msg[1:] if msg else f"worker process exited (exit code {procs[k].exitcode})"

    def send_stop(k: int) -> None:
        with contextlib.suppress(OSError):
            conns[k].send(("stop",))

    try:
        for k, share in enumerate(driver.shares):
            ours, theirs = ctx.Pipe(duplex=True)
            proc = ctx.Process(
                target=_process_main,
                args=(share, theirs),
                name=f"tokenbench-worker-{k}",
                daemon=True,
            )
            proc.start()
            theirs.close()  # only the child holds its end: its death is EOF to us
            conns.append(ours)
            procs.append(proc)

        # Barrier: every worker ready (or dead) before anyone starts.
        waiting = set(range(len(conns)))
        deadline = time.monotonic() + READY_TIMEOUT_S
        while waiting and time.monotonic() < deadline:
            for k, msg in receive(waiting, 0.2):
                if msg is None:
                    driver.died(k, f"exited before the start (exit code {procs[k].exitcode})")
                else:
                    _, driver.stats[k].host, driver.stats[k].pid = msg
                waiting.discard(k)
        if waiting:
            raise DistributedError(
                f"{len(waiting)} of {len(conns)} worker processes not ready after "
                f"{READY_TIMEOUT_S:g} s"
            )
        driver.t0_ns = perf_counter_ns() + int(start_delay_s * 1e9)
        for k in driver.active():
            conns[k].send(("start", start_delay_s))
        _drive(driver, stop, poll, send_stop, lambda k: procs[k].kill())
        return driver.result("processes")
    finally:
        for c in conns:
            c.close()
        for proc in procs:
            proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(2.0)


def require_ray():
    """Import Ray or raise DistributedError naming the pip command that installs it."""
    try:
        import ray
    except ImportError:
        raise DistributedError(
            f"--ray needs Ray, an optional extra of tokenbench: {RAY_INSTALL_HINT}"
        ) from None
    return ray


class _RayWorker(_WorkerCore):
    """The Ray actor: a _WorkerCore (threaded, so stop never waits) that says where it runs."""

    def info(self) -> tuple[str, int, str, str]:
        import ray

        node = ray.get_runtime_context().get_node_id()
        return socket.gethostname(), os.getpid(), node, ray.util.get_node_ip_address()


def _run_ray(
    driver: _Driver, address: str, stop: threading.Event | None, start_delay_s: float
) -> RunResult:
    ray = require_ray()
    from ray.exceptions import GetTimeoutError, RayError

    gcs, host, port = _checked_address(ray, address)
    started_here = False
    if not ray.is_initialized():
        _connect_ray(ray, address, gcs, host, port)
        started_here = True
    actor_cls = ray.remote(num_cpus=1, max_concurrency=4, max_restarts=0)(_RayWorker)
    actors: list = []
    try:
        actors = [
            actor_cls.options(scheduling_strategy="SPREAD", name=None).remote(share)
            for share in driver.shares
        ]
        try:
            infos = ray.get([a.info.remote() for a in actors], timeout=READY_TIMEOUT_S)
        except GetTimeoutError:
            cpus = ray.cluster_resources().get("CPU", 0)
            raise DistributedError(
                f"could not place {len(actors)} Ray workers within {READY_TIMEOUT_S:g} s: "
                f"each needs 1 CPU and the cluster has {cpus:g}"
            ) from None
        except RayError as exc:
            raise DistributedError(f"a Ray worker failed to start: {_first_line(exc)}") from None
        for st, (host, pid, node, node_ip) in zip(driver.stats, infos, strict=True):
            st.host, st.pid, st.node, st.node_ip = host, pid, node, node_ip
        # Barrier passed (every actor answered); broadcast the start delay.
        sent_ns = perf_counter_ns()
        driver.t0_ns = sent_ns + int(start_delay_s * 1e9)
        acks = {
            a.start.remote(start_delay_s): st for a, st in zip(actors, driver.stats, strict=True)
        }
        waiting, deadline = list(acks), time.monotonic() + READY_TIMEOUT_S
        while waiting and time.monotonic() < deadline:
            done, waiting = ray.wait(waiting, num_returns=1, timeout=deadline - time.monotonic())
            for ref in done:
                acks[ref].start_ack_ms = (perf_counter_ns() - sent_ns) / 1e6
        ray.get(list(acks), timeout=READY_TIMEOUT_S)

        pending: dict = {}  # one outstanding poll call per running actor

        def poll(timeout_s: float):
            for ref in [r for r, k in pending.items() if driver.stats[k].finished]:
                del pending[ref]  # given up (killed, or past the grace): never waited for
            for k in set(driver.active()) - set(pending.values()):
                pending[actors[k].poll.remote(BATCH_S)] = k
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=timeout_s)
            for ref in ready:
                k = pending.pop(ref)
                try:
                    yield k, ray.get(ref)
                except RayError as exc:
                    yield k, f"Ray actor lost: {type(exc).__name__}: {_first_line(exc)}"

        _drive(driver, stop, poll, lambda k: actors[k].stop.remote(), lambda k: ray.kill(actors[k]))
        return driver.result("ray")
    finally:
        for a in actors:
            with contextlib.suppress(Exception):
                ray.kill(a)
        if started_here:
            ray.shutdown()


def _gcs_address(ray, address: str) -> str | None:
    """host:port of the cluster a driver joins directly ('auto': from RAY_ADDRESS or the file
    `ray start` leaves), or None where Ray itself decides ('local', Ray Client's ray://)."""
    if address == "local" or address.startswith("ray://"):
        return None
    if address != "auto":
        return address
    found = os.environ.get("RAY_ADDRESS")
    with contextlib.suppress(Exception):  # Ray's own lookup, private: absent in some versions
        from ray._private.services import get_ray_address_from_environment

        found = get_ray_address_from_environment("auto", None)
    return None if not found or found.startswith("ray://") else found


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host.strip("[]"), port), timeout=RAY_CONNECT_TIMEOUT_S):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def _driver_on_loopback(ray, enabled: bool):
    """Let this driver join a cluster whose nodes are bound to loopback.

    Ray rewrites a loopback address ("127.0.0.1:6379") to this host's outward IP before
    connecting (ray-project/ray#59110; on purpose since ray#1556, so that "localhost" means
    "this node"). A head started with `--node-ip-address 127.0.0.1` is not listening there,
    and ray.init then retries without end: a run that waits forever. Ray keeps loopback only
    where multi-node clusters are off (its Windows/macOS default), a switch it reads on each
    lookup; it is flipped only for this connect, only when the GCS answers on loopback and
    not on the outward IP."""
    if not enabled:
        yield
        return
    constants = ray._private.ray_constants
    before = constants.ENABLE_RAY_CLUSTER
    constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        constants.ENABLE_RAY_CLUSTER = before


def _checked_address(ray, address: str) -> tuple[str | None, str | None, int | None]:
    """(the GCS address a driver joins or None, and the host and port that answered) for
    `--ray ADDRESS`; a malformed address or one nobody answers at is a DistributedError
    within RAY_CONNECT_TIMEOUT_S, never an endless retry. Checked on every run, also when
    this process already holds a Ray connection, so a wrong address is never ignored."""
    gcs = _gcs_address(ray, address)
    client = address.removeprefix("ray://") if address.startswith("ray://") else None
    if not (gcs or client):
        return None, None, None
    host, _, port_text = (gcs or client).rpartition(":")
    if not port_text.isdigit() or not host:
        raise DistributedError(
            f"--ray {address!r}: expected HOST:PORT, ray://HOST:PORT, auto or local"
        )
    port = int(port_text)
    if not _reachable(host, port):
        raise DistributedError(
            f"cannot connect to the Ray cluster at {address!r}: nothing answers at "
            f"{host}:{port} within {RAY_CONNECT_TIMEOUT_S:g} s (is `ray start --head` "
            "running there? `--ray local` starts a cluster on this machine)"
        )
    return gcs, host, port


def _connect_ray(ray, address: str, gcs: str | None, host: str | None, port: int | None) -> None:
    """ray.init for `--ray ADDRESS` (checked by _checked_address)."""
    loopback = False
    if gcs and host in ("127.0.0.1", "localhost", "::1", "[::1]"):
        outward = ray.util.get_node_ip_address()
        loopback = outward != host and not _reachable(outward, port)
    tries = RAY_CLIENT_INIT_TRIES if address.startswith("ray://") else 1
    for attempt in range(1, tries + 1):
        try:
            with _driver_on_loopback(ray, loopback):
                ray.init(
                    address=None if address == "local" else (gcs or address),
                    include_dashboard=False if address == "local" else None,
                    log_to_driver=False,
                )
            return
        except ConnectionAbortedError as exc:  # Ray Client: the head's server did not start
            with contextlib.suppress(Exception):
                ray.shutdown()
            if attempt == tries:
                raise DistributedError(
                    f"cannot connect to the Ray cluster at {address!r}: the head could not "
                    f"start a Ray Client server for this connection ({tries} tries; its last "
                    f"words: {_last_line(exc)}). See ray_client_server*.err under "
                    "/tmp/ray/session_latest/logs on the head"
                ) from None
        except (ConnectionError, RuntimeError, ValueError, AttributeError) as exc:
            raise DistributedError(
                f"cannot connect to the Ray cluster at {address!r}: {_first_line(exc)} (is `ray "
                "start --head` running there? `--ray local` starts a cluster on this machine)"
            ) from None


def _last_line(exc: BaseException) -> str:
    """The message at the bottom of a remote traceback (Ray Client sends the whole one)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def run_distributed(
    plan: RunPlan,
    *,
    workers: int,
    ray_address: str | None = None,
    sink: Callable[[RequestRecord], None] | None = None,
    on_tick: Callable[[DistributedProgress], None] | None = None,
    stop: threading.Event | None = None,
    handle_sigint: bool = True,
    start_delay_s: float | None = None,
) -> RunResult:
    """Run one plan split across `workers` processes, or Ray actors when ray_address is set.

    ray_address: None = processes on this host; "auto" = the Ray cluster this machine
    belongs to (`ray start` or RAY_ADDRESS); "ray://host:10001" or "host:6379" = that
    cluster; "local" = start a throw-away Ray on this machine. If Ray is already initialised
    in this process, that connection is used and left open.

    `sink` gets every record on the calling thread as batches arrive (feed a RunWriter);
    `on_tick` gets summed progress plus per-worker stats every TICK_S; setting `stop` (or
    Ctrl-C, when handle_sigint) stops every worker gently, as Ctrl-C does a local run.
    """
    shares = _shares(plan, workers)
    driver = _Driver(shares, sink, on_tick)
    if start_delay_s is None:
        # Long enough for the broadcast and for the runner's own setup after it.
        base = LOCAL_START_DELAY_S if ray_address is None else RAY_START_DELAY_S
        start_delay_s = base + SETUP_S_PER_SPEC * max(sh.n_specs for sh in shares)
    with _sigint_sets(driver.stop_requested, handle_sigint):
        if ray_address is None:
            return _run_processes(driver, stop, start_delay_s)
        return _run_ray(driver, ray_address, stop, start_delay_s)


@dataclass
class DistributedExecutor:
    """The Executor (bench.executor) over `workers` processes, or Ray actors when
    `ray_address` is set (see run_distributed). The stored run says how it was measured."""

    workers: int
    ray_address: str | None = None
    handle_sigint: bool = True

    def run(
        self,
        plan: RunPlan,
        sink: Callable[[RequestRecord], None],
        stop: threading.Event | None = None,
        on_tick: Callable[[Progress], None] | None = None,
    ) -> RunResult:
        return run_distributed(
            plan, workers=self.workers, ray_address=self.ray_address, sink=sink,
            on_tick=on_tick, stop=stop, handle_sigint=self.handle_sigint,
        )  # fmt: skip

    def stored_as(self) -> StoredAs:
        backend = "processes" if self.ray_address is None else "ray"
        where = {"backend": backend, "workers": self.workers, "ray": self.ray_address}
        return StoredAs(extra={"distributed": where})
