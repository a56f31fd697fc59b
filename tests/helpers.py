"""Helpers shared by tests: no fixtures here, plain functions and classes.

benchmarks/ never imports this (nor any test module): what both need lives in the library
(e.g. server.live.LiveServer) or is started by path (tests/fake_openai_server.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from time import perf_counter_ns

import numpy as np
import pytest

from bench.backends.capture import Capture
from bench.backends.dialects import get_dialect
from bench.backends.openai import COMPLETIONS
from bench.backends.transport import _Connection, _expire
from bench.executor import Progress, RunPlan, RunResult
from bench.metrics import summarize
from bench.records import FAILED, OK, RequestRecord
from bench.runner import execute
from bench.store.writer import RunWriter
from bench.workload import LengthDist, Workload


class CpuPressure:
    """How busy the machine was during a block: PSI CPU wait and the share of CPUs busy.

    A timing test on a shared 2-core machine may find the machine starved: then the client
    really was late (and should say so), and the kernel itself may stamp packets late. Tests
    use this to tell "our timing is wrong" from "the machine was too busy to time anything".
    PSI (`share`) sees tasks queued for a CPU, but a mostly sleeping client beside two busy
    loops is rarely queued long enough to show there, while each of its wake-ups still waits a
    scheduler slice; `busy` (/proc/stat, all CPUs, our own work included) sees that case.
    Either stays None where the kernel lacks the file.
    """

    STARVED = 0.5
    NO_IDLE_CPU = 0.9

    def __init__(self) -> None:
        self.share: float | None = None
        self.busy: float | None = None

    @property
    def starved(self) -> bool:
        psi_starved = self.share is not None and self.share > self.STARVED
        no_idle_cpu = self.busy is not None and self.busy > self.NO_IDLE_CPU
        return psi_starved or no_idle_cpu

    def __str__(self) -> str:
        def pct(v: float | None) -> str:
            return "n/a" if v is None else f"{v:.0%}"

        return f"CPU wait (PSI) {pct(self.share)}, CPUs busy {pct(self.busy)}"


def _cpu_wait() -> tuple[int, int] | None:
    """(monotonic us, PSI total us some task waited for a CPU), where the kernel has PSI."""
    try:
        with open("/proc/pressure/cpu") as f:
            return time.monotonic_ns() // 1000, int(f.readline().split("total=")[1])
    except (OSError, IndexError, ValueError):
        return None


def _cpu_times() -> tuple[int, int] | None:
    """(all CPU jiffies, idle + iowait jiffies) from /proc/stat, None without it."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(fields), fields[3] + (fields[4] if len(fields) > 4 else 0)


def _busy_between(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    if before is None or after is None or after[0] == before[0]:
        return None
    return 1.0 - (after[1] - before[1]) / (after[0] - before[0])


@contextmanager
def cpu_pressure() -> Iterator[CpuPressure]:
    """Measure CPU pressure over the `with` block."""
    result = CpuPressure()
    before, times_before = _cpu_wait(), _cpu_times()
    yield result
    after, times_after = _cpu_wait(), _cpu_times()
    if before and after:
        result.share = (after[1] - before[1]) / max(1, after[0] - before[0])
    result.busy = _busy_between(times_before, times_after)


def busy_share(seconds: float = 0.5) -> float | None:
    """Share of all CPUs' time spent busy over `seconds` (/proc/stat), None without it.

    PSI (cpu_pressure) sees tasks waiting for a CPU; two busy loops on two cores wait for
    nothing, yet leave no CPU idle. Tests that starve their own client on purpose need idle
    CPUs to mean anything, and ask this first."""
    before = _cpu_times()
    time.sleep(seconds)
    return _busy_between(before, _cpu_times())


def wait_for(condition: Callable[[], object], timeout_s: float, what: str):
    """condition() once it is truthy, polled every 50 ms; fails naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# ---------------------------------------------------------------- stored runs


GPU_SPEED = {"B200-SXM": 2.5, "H100-SXM": 1.0}  # store_sweep: how fast latency grows per GPU


def store_sweep(
    db: str,
    *,
    gpu: str = "B200-SXM",
    gpu_count: int = 1,
    rates: tuple[float, ...] = (1.0, 2.0, 4.0),
    per_point: int = 40,
    output_tokens: int = 16,
    simulated: bool = True,
    label: str | None = None,
    failures: int = 0,
    seed: int = 0,
    slo: str = "p99_ttft_ms<=400",
) -> str:
    """A stored sweep whose latency grows with load, faster GPUs growing slower; its run id."""
    rng = np.random.default_rng(seed)
    speed = GPU_SPEED.get(gpu, 1.5)
    writer = RunWriter(
        db,
        name=f"synthetic-{gpu}",
        label=label or f"{gpu} x{gpu_count} test-model",
        gpu_type=gpu,
        gpu_count=gpu_count,
        model="test-model",
        simulated=simulated,
        endpoint="http://127.0.0.1:1",
        backend="vllm",
        extra={"sweep": {"slo": [slo] if slo else []}},
        batch_rows=5000,
    )
    last_summary = None
    for lp, rate in enumerate(rates):
        writer.start_load_point(
            lp, label=f"point {lp + 1}: rate {rate:g} req/s", mode="poisson", target_rate=rate
        )
        records = []
        for i in range(per_point):
            intended = int(i / rate * 1e9)
            ttft = int((40 + 25 * rate / speed + rng.exponential(10)) * 1e6)
            tpot = int((8 + 3 * rate / speed) * 1e6)
            first = intended + ttft
            failed = lp == 0 and i < failures  # errors in the first point only
            times = first + np.arange(output_tokens, dtype=np.int64) * tpot
            records.append(
                RequestRecord(
                    index=i,
                    load_point=lp,
                    intended_ns=intended,
                    sent_ns=intended,
                    first_byte_ns=None if failed else first,
                    first_token_ns=None if failed else first,
                    end_ns=intended + 1000 if failed else int(times[-1]),
                    chunk_times_ns=np.zeros(0, np.int64) if failed else times,
                    prompt_tokens=128,
                    output_tokens=0 if failed else output_tokens,
                    http_status=500 if failed else 200,
                    state=FAILED if failed else OK,
                    error_kind="http_5xx" if failed else None,
                )
            )
        for r in records:
            writer.submit(r)
        last_summary = summarize(records)
        writer.end_load_point(lp, ended_ns=int(per_point / rate * 1e9), summary_json=last_summary)
    writer.finish("completed", last_summary)
    return writer.run_id


@contextlib.contextmanager
def b200_h100_site(db: str):
    """A service over `db` holding a B200 sweep and an H100 x2 sweep: what the compare page,
    its downloads and the one-answer checks read. Yields (client, ids)."""
    from fastapi.testclient import TestClient

    from server.app import create_app

    ids = [
        store_sweep(db, gpu="B200-SXM", rates=(1, 2, 4, 8, 16)),
        store_sweep(db, gpu="H100-SXM", gpu_count=2, rates=(1, 2, 4, 8), seed=3),
    ]
    app = create_app(
        db, api_token="t", allow_hosts=[], open_reads=True, server_names=["testserver"]
    )
    try:
        with TestClient(app) as client:
            yield client, ids
    finally:
        app.state.tb.jobs.shutdown()


# ---------------------------------------------------------------- plans


def plan(url: str, n: int, *, out_len: int = 16, rate: float | None = 50.0, **kw) -> RunPlan:
    """A plan of n requests (32-token prompts, out_len tokens out, vLLM dialect): an open
    loop at `rate` req/s evenly spaced, or a closed loop when rate is None."""
    workload = Workload(seed=3, input=LengthDist(mean=32), output=LengthDist(mean=out_len))
    offsets = None if rate is None else np.arange(n) / rate
    defaults = dict(
        base_url=url,
        endpoint=COMPLETIONS,
        dialect=get_dialect("vllm"),
        model="fake-model",
        workload=workload,
        specs=workload.specs(n),
        offsets_s=offsets,
    )
    defaults.update(kw)
    return RunPlan(**defaults)


# ---------------------------------------------------------------- scripted responses
#
# A response is given as the reads a client would make of it: raw HTTP bytes, each read at a
# scripted time. They go through the raw transport's own parser (_Connection.feed) into a
# Capture, then through capture.to_record: the same path a real socket's bytes take, with
# no server and no socket, and stamped with the script's times, so accounting, decoding and
# the timing definitions are checked exactly and in milliseconds.


def sse(data: dict | str) -> bytes:
    """One SSE event: `data: <json>` (or the text as given, e.g. "[DONE]") and a blank line."""
    text = data if isinstance(data, str) else json.dumps(data)
    return f"data: {text}\n\n".encode()


def token_event(text: str, *, chat: bool = False) -> bytes:
    choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
    return sse({"choices": [choice]})


def usage_event(prompt_tokens: int, completion_tokens: int) -> bytes:
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    return sse({"choices": [], "usage": usage})


DONE = sse("[DONE]")


def stream_events(
    n_tokens: int, *, chat: bool = False, usage: bool = True, prompt_tokens: int = 8
) -> list[bytes]:
    """A good stream's events: one per token, the usage (if any), then [DONE]."""
    events = [token_event(f"t{i} ", chat=chat) for i in range(n_tokens)]
    if usage:
        events.append(usage_event(prompt_tokens, n_tokens))
    return [*events, DONE]


def http_head(
    status: int = 200,
    *,
    chunked: bool = True,
    length: int | None = None,
    content_type: str = "text/event-stream",
) -> bytes:
    lines = [f"HTTP/1.1 {status} X", f"Content-Type: {content_type}"]
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    elif length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"


def chunked_reads(events: list[bytes], *, status: int = 200, end: bool = True) -> list[bytes]:
    """A chunked response as reads: the head, one chunk per event, the last chunk."""
    return [http_head(status), *(http_chunk(e) for e in events), *([LAST_CHUNK] if end else [])]


def error_reads(status: int, body: dict | str) -> list[bytes]:
    """A non-200 answer with a JSON (or text) body framed by Content-Length, in one read."""
    data = (body if isinstance(body, str) else json.dumps(body)).encode()
    head = http_head(status, chunked=False, length=len(data), content_type="application/json")
    return [head + data]


def feed_capture(reads: list[tuple[int, bytes]], *, sent_ns: int = 0) -> Capture:
    """A Capture filled by the raw transport's parser from (read time ns, bytes) pairs.

    No kernel stamps: each read's arrival is its read time, so a token's time is exactly
    the time given for the read that completed its event."""
    conn = _Connection(None, None)
    cap = Capture()
    cap.sent_ns = sent_ns
    conn.expect(cap)
    for t, data in reads:
        conn.feed(data, t)
    return cap


@dataclass
class Reply:
    """What a scripted server does with one request.

    `reads`: (ns after the send, raw bytes) pairs, in time order: each is delivered that
    long after the send (or later) and stamped with exactly that time. `then`, what follows
    the last read: "end" (the bytes were the whole response), "reset" (the connection
    closes) or "hang" (nothing: only the request timeout or the run's stop ends it).
    """

    reads: list[tuple[int, bytes]]
    then: str = "end"


def ok_reply(
    n_tokens: int = 4, *, ttft_ns: int = 1_000_000, itl_ns: int = 1_000_000, chat: bool = False
) -> Reply:
    """A good stream: the head with the first token at ttft_ns, then one token every itl_ns,
    the last read carrying the usage, [DONE] and the last chunk (so E2EL = TTFT + (n-1) ITL
    and TPOT = ITL exactly)."""
    head, *chunks = chunked_reads(stream_events(n_tokens, chat=chat))
    tokens, tail = chunks[:n_tokens], b"".join(chunks[n_tokens:])
    reads = [head + tokens[0], *tokens[1:]]
    reads[-1] += tail
    return Reply([(ttft_ns + i * itl_ns, data) for i, data in enumerate(reads)])


class ScriptedTransport:
    """The Transport protocol (bench.backends.transport) answered by a script, not a server.

    `reply(n, path, body)` says what the n-th request started (0-based, in send order, as
    the fake server counts) gets. Its reads are handed to the raw transport's parser one
    after another, each once its scripted time after the send has passed (a loop timer per
    read, set from the one before, so reads keep their order) and stamped with exactly that
    time: the records' TTFT and ITL are the script's, and no stamp is later than the moment
    the client really read it (as with a kernel's arrival stamps). The runner drives it as
    it drives the raw transport (timeouts by `_expire`, a stop by cancel_all), so what it
    counts is what a run against a server counts. `started`, `bodies`, `log` (("start" |
    "end", request index, turn) in order), `max_in_flight` and `in_flight` are the server's
    truth; `stop_when(self)`, checked after every start and every end, sets the run's stop
    event once true.
    """

    def __init__(
        self,
        reply: Callable[[int, str, dict], Reply],
        *,
        stop_when: Callable[[ScriptedTransport], bool] | None = None,
    ) -> None:
        self.reply = reply
        self.stop_when = stop_when
        self.stop: asyncio.Event | None = None
        self.started = 0
        self.ended = 0
        self.bodies: list[dict] = []
        self.log: list[tuple[str, int, int]] = []
        # each request in flight: its parser and its pending timers (next read, timeout)
        self.in_flight: dict[Capture, tuple[_Connection, list[asyncio.Handle]]] = {}
        self.max_in_flight = 0

    def prepare(self, path: str, body: bytes) -> tuple[str, bytes]:
        return path, body

    async def warm(self, n: int) -> None:
        return None

    def start(self, prepared: tuple[str, bytes], cap: Capture, timeout_s: float, done) -> None:
        path, raw = prepared
        body = json.loads(raw)
        n = self.started
        self.started += 1
        self.bodies.append(body)
        self.log.append(("start", cap.spec.index, cap.spec.turn))
        reply = self.reply(n, path, body)
        conn = _Connection(None, None)
        conn.timeout_s = timeout_s

        def ended(cap: Capture) -> None:
            for handle in self.in_flight.pop(cap)[1]:
                handle.cancel()
            self.ended += 1
            self.log.append(("end", cap.spec.index, cap.spec.turn))
            done(cap)
            self._check()

        conn.expect(cap, ended)
        cap.sent_ns = perf_counter_ns()
        loop = asyncio.get_running_loop()
        first_s = reply.reads[0][0] / 1e9 if reply.reads else 0.0
        timers = [
            loop.call_later(first_s, self._deliver, conn, cap, reply, 0),
            loop.call_later(timeout_s, _expire, conn),
        ]
        self.in_flight[cap] = (conn, timers)
        self.max_in_flight = max(self.max_in_flight, len(self.in_flight))
        self._check()

    def _deliver(self, conn: _Connection, cap: Capture, reply: Reply, i: int) -> None:
        """Read i of the reply (or, past the last, what follows it); set the next one's timer."""
        if conn.cap is not cap:
            return  # the request has ended (timed out, cancelled, broken framing)
        if i == len(reply.reads):
            if reply.then == "reset":
                conn.close_lost(ConnectionResetError("connection reset by peer"))
            return  # "hang", or an "end" whose bytes did not end the response
        after_ns, data = reply.reads[i]
        conn.feed(data, cap.sent_ns + after_ns)
        if conn.cap is cap:
            wait_ns = reply.reads[i + 1][0] - after_ns if i + 1 < len(reply.reads) else 0
            later = asyncio.get_running_loop().call_later(
                max(0, wait_ns) / 1e9, self._deliver, conn, cap, reply, i + 1
            )
            self.in_flight[cap][1][0] = later

    def _check(self) -> None:
        if self.stop is not None and self.stop_when is not None and self.stop_when(self):
            self.stop.set()

    def cancel_all(self) -> None:
        """As RawTransport.cancel_all: every request in flight ends cancelled."""
        for cap, (conn, _timers) in list(self.in_flight.items()):
            cap.cancelled = True
            cap.end_ns = perf_counter_ns()
            conn.keep_alive = False
            conn.release()

    async def aclose(self) -> None:
        return None


def run_scripted(
    plan: RunPlan, transport: ScriptedTransport, progress: Progress | None = None
) -> RunResult:
    """Run `plan` with the real runner (bench.runner.execute), its requests answered by
    `transport` instead of the transport the plan names."""

    async def main() -> RunResult:
        transport.stop = asyncio.Event()
        return await execute(plan, progress=progress, stop=transport.stop, transport=transport)

    return asyncio.run(main())


# ---------------------------------------------------------------- what the CLI suggests


def suggested_commands(text: str) -> list[list[str]]:
    """Every `tokenbench ...` command the CLI suggested in `text` (in backticks, or in
    parentheses: "(tokenbench show ID)"), as argument lists without the program name, so a
    test can run each exactly as printed."""
    import re
    import shlex

    found = re.findall(r"`tokenbench ([^`]+)`", text) + re.findall(r"\(tokenbench ([^)]+)\)", text)
    return [shlex.split(command) for command in found]


# A small workload for simulated tune searches: 120 requests of 256 in / 48 out per point
# keeps each search near a second; batch limits well under the request count, so queues build
# and every capacity is bracketed (tests/test_sim_tune.py, test_sim_error_views.py, test_choose.py).
TINY_TUNE_SCENARIO = """
name: tiny
load: {shape: poisson, request_rate: 4, num_prompts: 120}
workload:
  input: {dist: fixed, mean: 256}
  output: {dist: fixed, mean: 48}
seed: 7
"""


@contextmanager
def ttft_checks_off_by(error: float) -> Iterator[None]:
    """held_out.yaml as shipped, but with its independent TTFT checks [S75] `error` off: the
    views that show a TTFT's own error beside the category's are tested where the two differ,
    whichever is larger in the shipped fit (the checks' x/÷ 1.52 is above the dense category's
    1.27 since ranges state what holds an under-predicted point, 2026-12-05)."""
    import copy

    from bench.sim.profiles import accuracy

    doc = copy.deepcopy(accuracy._held_out_doc())
    for check in doc["ttft"]:
        check["error"] = error
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(accuracy, "_held_out_doc", lambda: doc)
        yield
