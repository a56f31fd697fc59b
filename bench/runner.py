"""The async engine: schedules, sends, times, records; open and closed loop.

One event loop per process (uvloop when installed), one transport with keep-alive
connections. The scheduler sleeps until each request's intended time and starts it (or, in
a closed loop, each user starts its next request when the last one ends); a request waits
for a --max-concurrency slot if there is one, stamps the actual send time and writes the
prepared bytes; the transport calls back when the stream has ended. No task is kept per
request. Decoding the stream into a RequestRecord happens after the stream ends. A loop-lag
probe, the send lag of every request and how long reads waited in the socket tell whether
the client itself limited the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import perf_counter_ns
from urllib.parse import urlsplit

import numpy as np

from bench.backends.capture import Capture, ReadStats, to_record
from bench.backends.openai import CHAT, MODELS_PATH, server_url
from bench.backends.transport import Transport, make_transport
from bench.executor import Progress, RunPlan, RunResult, StoredAs
from bench.records import FAILED, RequestRecord
from bench.workload import RequestSpec

LOOP_PROBE_INTERVAL_S = 0.005
# Decoding finished streams runs between reads in slices of at most this long, so a read
# that arrives meanwhile is timestamped at most this late (issue 10).
DECODE_SLICE_NS = 500_000
# Past this many streams waiting to be decoded the client is saturated: decode at once
# (back-pressure) instead of letting the backlog's memory grow.
DECODE_BACKLOG_MAX = 8192
# A closed loop's next requests are prepared ahead (rendered and encoded, ~65 us each) in
# slices this long, up to one per user and this many bytes in all.
PREPARE_SLICE_NS = 500_000
PREPARE_AHEAD_BYTES = 8 << 20


class UnreachableError(RuntimeError):
    """The endpoint cannot be reached: said in one line before any load is sent."""


def check_reachable(base_url: str, timeout_s: float = 3.0) -> None:
    """Open (and close) one TCP connection to the endpoint, or raise UnreachableError."""
    parts = urlsplit(base_url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except (OSError, UnicodeError, ValueError) as exc:  # UnicodeError: an unencodable name
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise UnreachableError(
            f"cannot reach {parts.scheme}://{host}:{port} ({reason}): is the server running and "
            "is --base-url right?"
        ) from None


def sessions_of(specs: list[RequestSpec]) -> Sequence[list[RequestSpec]]:
    """Group consecutive specs by session; single-turn workloads give one spec per session.

    Single-turn workloads (the common case) get a view that makes each one-spec list only
    when it is taken: a million-request closed loop would otherwise hold a million lists.
    """
    if not any(spec.turn for spec in specs):
        return _OneTurnEach(specs)
    out: list[list[RequestSpec]] = []
    for spec in specs:
        if out and out[-1][0].session == spec.session:
            out[-1].append(spec)
        else:
            out.append([spec])
    return out


class _OneTurnEach(Sequence):
    """specs as a sequence of one-turn sessions, without a list per spec held."""

    def __init__(self, specs: list[RequestSpec]) -> None:
        self.specs = specs

    def __len__(self) -> int:
        return len(self.specs)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return _OneTurnEach(self.specs[i])
        return [self.specs[i]]

    def __iter__(self):
        return ([spec] for spec in self.specs)


class _Engine:
    """One load point's requests, driven by callbacks rather than a task per request.

    A request is a Capture handed to the transport, which calls `finished` once when it has
    ended; what comes next (the next turn of a conversation, a closed-loop user's next
    request, or nothing) is the Capture's `then`. No task, coroutine or future is kept per
    request in flight: each cost memory (issue 10). A "flow" is an open-loop session or a
    closed-loop user; the run is over when the scheduler is done and no flow is left.
    """

    def __init__(
        self,
        plan: RunPlan,
        sink: Callable[[RequestRecord], None] | None,
        progress: Progress,
        transport: Transport | None = None,
    ) -> None:
        self.plan = plan
        self.sink = sink
        self.progress = progress
        self.records: list[RequestRecord] = []
        self.transport: Transport = transport or make_transport(
            plan.transport,
            plan.base_url,
            api_key=plan.api_key,
            max_connections=plan.max_concurrency or plan.concurrency or 0,
            headers=plan.headers,
        )
        self.limit = plan.max_concurrency or 0
        self.waiting: deque[Capture] = deque()  # held back by --max-concurrency
        self.flows = 0
        self.t0_ns = 0
        self.stop = asyncio.Event()
        self.idle = asyncio.Event()  # the scheduler is done and no flow is left
        self.scheduling = True
        self.error: BaseException | None = None
        self.backlog: deque[Capture] = deque()
        self.ready: dict[int, object] = {}  # prepared bytes of requests about to be sent
        self.backlog_ready = asyncio.Event()
        self.stats = ReadStats()
        self.served: set[str] = set()
        tokenizer = plan.workload.tokenizer
        self.count_tokens = None if tokenizer is None else tokenizer.count
        self.decode = plan.dialect.decode  # the server's stream format (bench.backends.dialects)
        # Bound once: every Capture in flight refers to these instead of its own closure.
        self.finished_cb = self.finished
        self.end_flow_cb = self.end_flow

    def prepare(self, spec: RequestSpec) -> object:
        plan = self.plan
        prompt, messages = plan.workload.render(spec)
        body = plan.dialect.build_body(
            endpoint=plan.endpoint,
            model=plan.model,
            prompt=prompt,
            messages=messages if plan.endpoint == CHAT else None,
            max_tokens=spec.output_len,
            ignore_eos=plan.ignore_eos,
            extra=plan.extra_body,
        )
        return self.transport.prepare(plan.endpoint, body)

    # -- requests
    def launch(self, spec: RequestSpec, intended_ns: int, then: Callable) -> None:
        """Send spec now, or as soon as a --max-concurrency slot frees; then(cap) after."""
        cap = Capture()
        cap.spec, cap.intended_ns, cap.then = spec, intended_ns, then
        cap.max_tokens = spec.output_len  # what the body asks for: the response's bounds
        if self.limit and self.progress.in_flight >= self.limit:
            self.waiting.append(cap)
            return
        self._send(cap)

    def _send(self, cap: Capture) -> None:
        progress = self.progress
        progress.sent += 1
        progress.in_flight += 1
        prepared = self.take(cap.spec)
        self.transport.start(prepared, cap, self.plan.request_timeout_s, self.finished_cb)

    def take(self, spec: RequestSpec) -> object:
        """The request's prepared bytes (made ahead of its send time), or made now."""
        prepared = self.ready.pop(spec.index, None)
        return self.prepare(spec) if prepared is None else prepared

    def finished(self, cap: Capture) -> None:
        """The transport is done with a request: count it, queue it for decoding, go on."""
        progress = self.progress
        progress.in_flight -= 1
        if cap.sent_ns == 0:
            progress.sent -= 1  # stopped before it left the client: not sent, not counted
        else:
            self._defer(cap)  # completed or failed once decoded (_record), as the summary
        then, cap.then = cap.then, None
        try:
            while self.waiting and not self.stop.is_set() and progress.in_flight < self.limit:
                waited = self.waiting.popleft()
                waited.released_ns = perf_counter_ns()
                self._send(waited)
            then(cap)
        except Exception as exc:  # a bug or bad input in what follows: stop, report it
            self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        self.stop.set()

    def halt(self) -> None:
        """Stopping: requests waiting for a slot never leave; those in flight end cancelled."""
        while self.waiting:
            cap = self.waiting.popleft()
            self._guarded(lambda cap=cap: cap.then(cap))  # its flow sees `stop` and ends
        self.transport.cancel_all()

    # -- flows
    def begin_flow(self) -> None:
        self.flows += 1

    def end_flow(self, _cap: Capture | None = None) -> None:
        self.flows -= 1
        if self.flows <= 0 and not self.scheduling:
            self.idle.set()

    def scheduler_done(self) -> None:
        self.scheduling = False
        if self.flows <= 0:
            self.idle.set()

    def begin_session(self, turns: list[RequestSpec], intended_ns: int, then: Callable) -> None:
        """Send a session's first turn; then(cap) once its last turn has ended."""
        if len(turns) == 1:
            self.launch(turns[0], intended_ns, then)
        else:
            self.launch(turns[0], intended_ns, _Conversation(self, turns, then).next)

    def later(self, delay_s: float, callback: Callable[[], None]) -> None:
        """Run callback once delay_s has passed (a think time, a ramp-up step)."""
        self.at(perf_counter_ns() + int(delay_s * 1e9), callback)

    def at(self, due_ns: int, callback: Callable[[], None]) -> None:
        call_after(due_ns, self._guarded, callback)

    def _guarded(self, callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception as exc:
            self.fail(exc)

    # -- decoding, off the read path
    def _defer(self, cap: Capture) -> None:
        """Queue a finished stream for decoding off the send/receive path."""
        if len(self.backlog) >= DECODE_BACKLOG_MAX:
            self._record(self.backlog.popleft())
        self.backlog.append(cap)
        self.backlog_ready.set()

    async def decoder(self) -> None:
        """Turn finished captures into records between reads, a short slice at a time."""
        backlog = self.backlog
        while True:
            if not backlog:
                self.backlog_ready.clear()
                await self.backlog_ready.wait()
            deadline = perf_counter_ns() + DECODE_SLICE_NS
            while backlog and perf_counter_ns() < deadline:
                self._record(backlog.popleft())
            await asyncio.sleep(0)  # let the loop poll sockets before the next slice

    def drain(self) -> None:
        while self.backlog:
            self._record(self.backlog.popleft())

    def _record(self, cap: Capture) -> None:
        spec = cap.spec
        rec = to_record(
            cap,
            index=spec.index,
            intended_ns=cap.intended_ns,
            t0_ns=self.t0_ns,
            load_point=self.plan.load_point,
            turn=spec.turn,
            expected_input_len=spec.input_len,
            expected_output_len=spec.output_len,
            stats=self.stats,
            served=self.served,
            count_tokens=self.count_tokens,
            decode=self.decode,
        )
        if (
            rec.prompt_tokens is None
            and self.count_tokens is not None
            and spec.text is None
            and spec.turn == 0
            and self.plan.endpoint != CHAT  # a chat template adds tokens of its own
        ):
            rec.prompt_tokens = spec.input_len  # rendered to exactly this many tokens
        if cap.released_ns:
            rec.slot_wait_ns = max(0, cap.released_ns - cap.intended_ns)
        # Counted from the decoded record, so live progress says what the summary will: a
        # 200 whose stream breaks (no [DONE], bad usage, not SSE) is a failure in both.
        if rec.ok:
            self.progress.completed += 1
        elif rec.state == FAILED:
            self.progress.failed += 1
        if rec.ok and rec.ttft_ns is not None:
            recent = self.progress.recent_ttft_ms
            recent.append(rec.ttft_ns / 1e6)
            if len(recent) > 2048:
                del recent[:1024]
        self.records.append(rec)
        if self.sink is not None:
            self.sink(rec)

    # -- schedules
    async def warm_up(self) -> None:
        """Open the connections a closed loop (or a concurrency cap) will need before t0."""
        plan = self.plan
        n = plan.concurrency if plan.offsets_s is None else plan.max_concurrency
        if n:
            await self.transport.warm(min(n, len(plan.specs)))

    async def open_loop(self, sessions: Sequence[list[RequestSpec]], offsets: np.ndarray) -> None:
        t0 = self.t0_ns
        for turns, offset in zip(sessions, offsets, strict=False):
            if self.stop.is_set():
                return
            target = t0 + int(offset * 1e9)
            self.ready[turns[0].index] = self.prepare(turns[0])
            delay = (target - perf_counter_ns()) / 1e9
            if delay > 0.05:  # long gaps wait on `stop` too, so Ctrl-C is prompt
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), delay)
            # uvloop's timers round to whole milliseconds from a clock read at the top of the loop
            # iteration, so a sleep can end up to ~1 ms early: never send before the intended time
            while (delay := (target - perf_counter_ns()) / 1e9) > 0 and not self.stop.is_set():
                await asyncio.sleep(delay)
            if self.stop.is_set():
                self.ready.pop(turns[0].index, None)
                return
            self.begin_flow()
            self.begin_session(turns, target, self.end_flow_cb)

    def closed_loop(self, upcoming: _Upcoming, users: int) -> None:
        """Start `users` users, spread over --ramp-up: users that all start at once finish
        together and restart together, turning every wave into one burst."""
        deadline = None
        if self.plan.duration_s:
            deadline = self.t0_ns + int(self.plan.duration_s * 1e9)
        for k in range(users):
            user = _User(self, upcoming, deadline)
            self.begin_flow()
            delay_s = self.plan.ramp_up_s * k / users
            if delay_s > 0:
                self.later(delay_s, user.next)
            else:
                user.next()


class _Conversation:
    """A multi-turn session: each turn is sent when the previous one has ended."""

    __slots__ = ("engine", "turns", "pos", "then")

    def __init__(self, engine: _Engine, turns: list[RequestSpec], then: Callable) -> None:
        self.engine, self.turns, self.pos, self.then = engine, turns, 0, then

    def next(self, cap: Capture) -> None:
        engine = self.engine
        self.pos += 1
        if self.pos >= len(self.turns) or engine.stop.is_set():
            self.then(cap)
        elif engine.plan.think_time_s:
            engine.later(engine.plan.think_time_s, self._send)
        else:
            self._send()

    def _send(self) -> None:
        engine = self.engine
        if engine.stop.is_set():
            self.then(None)
            return
        spec = self.turns[self.pos]
        engine.ready[spec.index] = engine.prepare(spec)
        engine.launch(spec, perf_counter_ns(), self.next)


class _User:
    """A closed-loop user: takes the next session from the shared queue when one ends.

    Its next request is due when the last response arrived (the kernel's stamp of its last
    bytes) plus the think time, not when the event loop got round to it: a client too busy
    to send on time shows as send lag, which the self-check judges (issue 23)."""

    __slots__ = ("engine", "upcoming", "deadline", "after_cb", "due_ns")

    def __init__(self, engine: _Engine, upcoming: _Upcoming, deadline: int | None) -> None:
        self.engine, self.upcoming, self.deadline = engine, upcoming, deadline
        self.after_cb = self.after  # bound once, not once per request
        self.due_ns: int | None = None

    def next(self) -> None:
        engine = self.engine
        now = perf_counter_ns()
        if engine.stop.is_set() or (self.deadline and now >= self.deadline):
            engine.end_flow()
            return
        turns = self.upcoming.take()
        if turns is None:
            engine.end_flow()
            return
        due, self.due_ns = (now if self.due_ns is None else min(self.due_ns, now)), None
        engine.begin_session(turns, due, self.after_cb)

    def after(self, cap: Capture | None) -> None:
        think = self.engine.plan.think_time_s
        if cap is not None:
            self.due_ns = _arrived_ns(cap) + int(think * 1e9)
        if think and not self.engine.stop.is_set():
            # from the arrival; nothing arrived (a failed start): from now
            due = self.due_ns if self.due_ns is not None else perf_counter_ns() + int(think * 1e9)
            self.engine.at(due, self.next)
        else:
            self.next()


def call_after(due_ns: int, fn: Callable, *args: object) -> None:
    """Call fn(*args) once perf_counter_ns() has reached due_ns, never before.

    uvloop rounds a timer to whole milliseconds from a clock read at the top of the loop
    iteration, so call_later fires up to ~1.3 ms early (measured: 132 of 300 timers here); an
    early firing re-arms for what is left, which shrinks each time."""
    left_ns = due_ns - perf_counter_ns()
    if left_ns > 0:
        asyncio.get_running_loop().call_later(left_ns / 1e9, call_after, due_ns, fn, *args)
    else:
        fn(*args)


def _arrived_ns(cap: Capture) -> int:
    """When a response's last bytes arrived on the perf_counter_ns clock: the kernel's stamp
    of the last read where there is one (bench.backends.capture.arrival_times), else when
    it was read."""
    now = perf_counter_ns()
    read = cap.end_ns or now
    if len(cap.reads) < 4 or cap.reads[-2] == 0:
        return read
    arrived = cap.reads[-2] * 1_000_000_000 + cap.reads[-1] - (time.time_ns() - now)
    return max(cap.sent_ns, min(arrived, read))


class _Upcoming:
    """A closed loop's queue of sessions, the first request of the next ones prepared ahead.

    When a wave of users ends together (all started at once), each starts its next request
    from inside the read callback that ended the last one; rendering and encoding it there
    (~65 us) made a 512-user wave end take ~30 ms of reads-on-hold, long enough for tokens
    of other streams to arrive twice and be read as one (issue 10). So requests are
    prepared before t0 and then refilled between reads, a short slice at a time, and a user
    only prepares its own when the refill has fallen behind.
    """

    def __init__(self, engine: _Engine, sessions: Sequence[list[RequestSpec]], ahead: int):
        self.engine = engine
        self.queue = iter(sessions)
        self.prepared: deque[tuple[list[RequestSpec], int]] = deque()
        self.ahead = ahead
        self.bytes = 0
        self.wanted = asyncio.Event()

    def fill(self, deadline_ns: int | None = None) -> bool:
        """Prepare until `ahead` are ready (or the byte budget, or the deadline); False once
        the queue is exhausted."""
        engine = self.engine
        while len(self.prepared) < self.ahead and self.bytes < PREPARE_AHEAD_BYTES:
            if deadline_ns is not None and perf_counter_ns() >= deadline_ns:
                return True
            turns = next(self.queue, None)
            if turns is None:
                return False
            prepared = engine.prepare(turns[0])
            engine.ready[turns[0].index] = prepared
            size = len(prepared) if isinstance(prepared, bytes) else 0
            self.prepared.append((turns, size))
            self.bytes += size
        return True

    def take(self) -> list[RequestSpec] | None:
        """The next session, its first request ready to send (made now if none is)."""
        self.wanted.set()
        if self.prepared:
            turns, size = self.prepared.popleft()
            self.bytes -= size
            return turns
        turns = next(self.queue, None)
        if turns is not None:
            self.engine.ready[turns[0].index] = self.engine.prepare(turns[0])
        return turns

    async def refill(self) -> None:
        while True:
            self.wanted.clear()
            if not self.fill(perf_counter_ns() + PREPARE_SLICE_NS):
                return
            if len(self.prepared) >= self.ahead or self.bytes >= PREPARE_AHEAD_BYTES:
                await self.wanted.wait()
            else:
                await asyncio.sleep(0)  # let the loop poll sockets before the next slice


async def _probe_loop(stop: asyncio.Event, lags: list[int]) -> None:
    """Measure how late the loop wakes a sleeper: a busy loop delays every timestamp too."""
    interval_ns = int(LOOP_PROBE_INTERVAL_S * 1e9)
    while not stop.is_set():
        expected = perf_counter_ns() + interval_ns
        await asyncio.sleep(LOOP_PROBE_INTERVAL_S)
        lags.append(max(0, perf_counter_ns() - expected))


async def execute(
    plan: RunPlan,
    *,
    sink: Callable[[RequestRecord], None] | None = None,
    progress: Progress | None = None,
    stop: asyncio.Event | None = None,
    t0_ns: int | None = None,
    transport: Transport | None = None,
) -> RunResult:
    """Run one load point to the end (or until `stop` is set) and return its records.

    `transport` (as httpx takes one) answers the requests; by default the one the plan
    names (`make_transport`). It is closed when the point ends."""
    progress = progress or Progress()
    progress.total = len(plan.specs)
    engine = _Engine(plan, sink, progress, transport)
    if stop is not None:
        engine.stop = stop
    sessions = sessions_of(plan.specs)
    lags: list[int] = []
    await engine.warm_up()
    probe_stop = asyncio.Event()
    probe = asyncio.ensure_future(_probe_loop(probe_stop, lags))
    decoder = asyncio.ensure_future(engine.decoder())
    upcoming = refill = None
    if plan.offsets_s is None:
        users = plan.concurrency or 1
        upcoming = _Upcoming(engine, sessions, ahead=users)
        upcoming.fill()  # the first wave before t0; the next in slices while it streams
        refill = asyncio.ensure_future(upcoming.refill())
        refill.add_done_callback(lambda task: _scheduler_ended(engine, task, done=False))
    gc.collect()
    gc.freeze()  # the setup's objects never need scanning again: fewer, shorter GC pauses
    engine.t0_ns = t0_ns if t0_ns is not None else perf_counter_ns()
    busy0, queued0 = _loop_cpu_s()
    interrupted = False
    sched_task = None
    try:
        if plan.offsets_s is not None:
            if len(plan.offsets_s) < len(sessions):
                sessions = sessions[: len(plan.offsets_s)]
            sched_task = asyncio.ensure_future(engine.open_loop(sessions, plan.offsets_s))
            sched_task.add_done_callback(lambda task: _scheduler_ended(engine, task))
        else:
            engine.closed_loop(upcoming, plan.concurrency or 1)
            engine.scheduler_done()
        stop_wait = asyncio.ensure_future(engine.stop.wait())
        idle_wait = asyncio.ensure_future(engine.idle.wait())
        await asyncio.wait([idle_wait, stop_wait], return_when=asyncio.FIRST_COMPLETED)
        idle_wait.cancel()
        stop_wait.cancel()
        if engine.stop.is_set():
            interrupted = True
            if sched_task is not None:
                sched_task.cancel()
                await asyncio.gather(sched_task, return_exceptions=True)
            engine.halt()
    finally:
        end_ns = perf_counter_ns()
        busy1, queued1 = _loop_cpu_s()
        busy_s, queued_s = busy1 - busy0, queued1 - queued0
        probe_stop.set()
        probe.cancel()
        decoder.cancel()
        if refill is not None:
            refill.cancel()
        await asyncio.gather(probe, decoder, *([refill] if refill else []), return_exceptions=True)
        await engine.transport.aclose()  # httpx's cancelled requests report as they unwind
        engine.drain()
        gc.unfreeze()
    if engine.error is not None:
        raise engine.error
    lag = np.array(lags, dtype=np.float64) / 1e6 if lags else np.zeros(1)
    engine.records.sort(key=lambda r: (r.sent_ns, r.index))
    run_s = (end_ns - engine.t0_ns) / 1e9
    return RunResult(
        records=engine.records,
        duration_s=run_s,
        loop_lag_p99_ms=float(np.percentile(lag, 99)),
        loop_lag_max_ms=float(lag.max()),
        interrupted=interrupted,
        t0_ns=engine.t0_ns,
        loop_cpu_share=busy_s / max(1e-9, run_s),
        loop_cpu_wait_share=None if queued_s is None else queued_s / max(1e-9, run_s),
        late_read_share=engine.stats.late_share,
        merged_token_share=engine.stats.merged_share,
        served_models=sorted(engine.served),
    )


def _loop_cpu_s() -> tuple[float, float | None]:
    """(seconds this thread has been running or runnable, seconds of that it was runnable
    but waiting in the run queue for a CPU); the second None where unknown.

    CPU time alone understates a busy loop on a shared machine: a loop that always has work
    but gets half a core shows 50%. Linux's schedstat adds the time the thread waited in the
    run queue, so "busy" means "not asleep waiting for I/O", on an idle or a loaded machine;
    the wait alone is what other processes took from the client. Elsewhere, CPU time.
    """
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            on_cpu_ns, queued_ns, _ = f.read().split()
        return (int(on_cpu_ns) + int(queued_ns)) / 1e9, int(queued_ns) / 1e9
    except (OSError, ValueError):
        return time.thread_time(), None


def _scheduler_ended(engine: _Engine, task: asyncio.Task, done: bool = True) -> None:
    """A scheduling task ended: an exception in it stops the run and is raised by execute."""
    if not task.cancelled() and task.exception() is not None:
        engine.fail(task.exception())
    if done:
        engine.scheduler_done()


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (measured faster per token, see README), else asyncio's own."""
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


# The signal that stopped the last run gently (SIGINT or SIGTERM), for the CLI's exit code.
_stopped_by: list[int] = []


def defer_termination() -> None:
    """From now on SIGTERM stops a run the way Ctrl-C does instead of killing the process.

    `tokenbench run` and `sweep` call this first. Outside a run's loop (setting up, the final
    flush) a SIGTERM is only noted: the next run stops at once and the process still writes
    every finished request and marks the run interrupted, then exits 143 (128 + SIGTERM).
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, _frame: note_stop(signum))


def note_stop(signum: int) -> None:
    if signum not in _stopped_by:
        _stopped_by.append(signum)


def stopped_by_signal() -> int | None:
    """The signal that stopped a run in this process (SIGTERM wins over SIGINT), or None."""
    if signal.SIGTERM in _stopped_by:
        return int(signal.SIGTERM)
    return int(_stopped_by[0]) if _stopped_by else None


def interrupted_exit_code() -> int:
    """128 + the signal that stopped the run: 143 after SIGTERM, 130 after Ctrl-C."""
    return 128 + (stopped_by_signal() or int(signal.SIGINT))


def run_blocking(
    plan: RunPlan,
    *,
    sink: Callable[[RequestRecord], None] | None = None,
    progress: Progress | None = None,
    on_tick: Callable[[Progress], None] | None = None,
    tick_s: float = 0.25,
    handle_sigint: bool = True,
    stop_event: threading.Event | None = None,
) -> RunResult:
    """Run a plan on a fresh event loop; Ctrl-C (and SIGTERM) stop gently, keeping what
    was measured. Setting `stop_event` from any thread (a service job's cancel) does too;
    off the main thread, or with handle_sigint=False, no signal handler is installed."""
    progress = progress or Progress()
    signals = (signal.SIGINT, signal.SIGTERM)

    async def main() -> RunResult:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        previous = {}
        if handle_sigint and threading.current_thread() is threading.main_thread():
            for sig in signals:
                previous[sig] = signal.getsignal(sig)

                def on_signal(sig: int = sig) -> None:
                    note_stop(sig)
                    stop.set()

                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(sig, on_signal)
        if signal.SIGTERM in _stopped_by:
            stop.set()  # terminated while setting up: measure nothing more
        ticker = None
        if on_tick is not None or stop_event is not None:

            async def tick() -> None:
                while True:
                    if on_tick is not None:
                        on_tick(progress)
                    if stop_event is not None and stop_event.is_set():
                        stop.set()
                    await asyncio.sleep(tick_s)

            ticker = asyncio.ensure_future(tick())
        try:
            return await execute(plan, sink=sink, progress=progress, stop=stop)
        finally:
            if ticker is not None:
                ticker.cancel()
            if on_tick is not None:
                on_tick(progress)
            for sig, handler in previous.items():
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError, TypeError):
                    loop.remove_signal_handler(sig)
                    # remove_signal_handler leaves SIG_DFL; put back what was there (a
                    # deferred SIGTERM must not kill the process while it flushes).
                    signal.signal(sig, handler)

    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main())


@dataclass
class LocalExecutor:
    """The Executor (bench.executor) of this process: run_blocking on one event loop.

    handle_sigint: Ctrl-C and SIGTERM stop the point gently when run on the main thread;
    a service job's process turns it off (it relays its own stop event instead).
    """

    handle_sigint: bool = True

    def run(
        self,
        plan: RunPlan,
        sink: Callable[[RequestRecord], None],
        stop: threading.Event | None = None,
        on_tick: Callable[[Progress], None] | None = None,
    ) -> RunResult:
        return run_blocking(
            plan, sink=sink, on_tick=on_tick, stop_event=stop, handle_sigint=self.handle_sigint
        )

    def stored_as(self) -> StoredAs:
        return StoredAs()


def discover_model(base_url: str, api_key: str | None = None, timeout_s: float = 5.0) -> str | None:
    """The first model the server lists at /v1/models, as vLLM's client does when none is given."""
    models = list_models(base_url, api_key, timeout_s)
    return models[0] if models else None


def list_models(
    base_url: str, api_key: str | None = None, timeout_s: float = 5.0
) -> list[str] | None:
    """The model ids the server lists at /v1/models; None when it lists none it can say."""
    import httpx

    from bench.backends.bounds import bounded_get

    url, headers = server_url(base_url, MODELS_PATH, api_key)
    try:
        _, body = bounded_get(url, headers=headers, timeout_s=timeout_s)
        data = json.loads(body).get("data") or []
        return [str(m["id"]) for m in data] or None
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError, TimeoutError):
        return None
