"""Accounting, cancellation, decoding and the metric definitions, in milliseconds.

The runner (bench.runner.execute) drives a ScriptedTransport (tests/helpers.py) instead of a
server: each request's response is raw HTTP bytes read at scripted times, parsed by the raw
transport's own parser and decoded by capture.to_record. So every figure below is known
exactly, and these run on every commit; the same behaviours against real sockets and the
fake server are the `slow` tests (test_runner.py, test_wire_faults.py, test_cli.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from bench.backends.capture import ReadStats, to_record
from bench.backends.openai import CHAT
from bench.executor import Progress
from bench.metrics import LATENCY_METRICS, summarize
from bench.records import (
    CANCELLED,
    ERR_BAD_FRAMING,
    ERR_BAD_USAGE,
    ERR_CANCELLED,
    ERR_HTTP_4XX,
    ERR_HTTP_5XX,
    ERR_HTTP_429,
    ERR_MALFORMED,
    ERR_NO_DONE,
    ERR_NOT_SSE,
    ERR_RESET,
    ERR_RESET_MID_STREAM,
    ERR_STREAM_ERROR,
    ERR_TIMEOUT,
    OK,
)
from bench.workload import LengthDist, Workload
from tests.helpers import (
    DONE,
    LAST_CHUNK,
    Reply,
    ScriptedTransport,
    chunked_reads,
    error_reads,
    feed_capture,
    http_chunk,
    http_head,
    ok_reply,
    plan,
    run_scripted,
    sse,
    stream_events,
    token_event,
    usage_event,
)

MS = 1_000_000


def _two_tokens_then(*events: bytes, then: str = "end") -> Reply:
    """A stream that sends two tokens, then the given events; the last chunk when it ends."""
    chunks = [http_chunk(e) for e in (token_event("a"), token_event("b"), *events)]
    if then == "end":
        chunks.append(LAST_CHUNK)
    return Reply([(MS, http_head() + chunks[0]), *((2 * MS, c) for c in chunks[1:])], then=then)


# Every way a response can fail, by what the scripted server does with it.
FAULTS = {
    ERR_HTTP_5XX: Reply([(MS, error_reads(500, {"error": {"message": "boom"}})[0])]),
    ERR_HTTP_429: Reply([(MS, error_reads(429, {"error": {"message": "slow down"}})[0])]),
    ERR_HTTP_4XX: Reply([(MS, error_reads(400, {"error": {"message": "bad model"}})[0])]),
    ERR_RESET: Reply([], then="reset"),
    ERR_RESET_MID_STREAM: _two_tokens_then(then="reset"),
    ERR_MALFORMED: _two_tokens_then(b"data: {oops\n\n", DONE),
    ERR_STREAM_ERROR: _two_tokens_then(sse({"error": {"message": "out of memory"}}), DONE),
    ERR_TIMEOUT: _two_tokens_then(then="hang"),  # the request timeout ends it
    ERR_NO_DONE: _two_tokens_then(usage_event(8, 2)),
    ERR_NOT_SSE: Reply([(MS, http_head(chunked=False, length=2) + b"{}")]),
    ERR_BAD_FRAMING: Reply([(MS, http_head() + b"zz\r\nnot a chunk size\r\n")]),
    ERR_BAD_USAGE: _two_tokens_then(
        sse({"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": "2"}}), DONE
    ),
}


def test_every_fault_is_one_failed_request_under_its_own_kind():
    """Each request is accounted for once: what the server received = completed + failed,
    each failure counted under its kind with the server's message; the run goes on."""
    kinds = list(FAULTS)
    n = 3 * (len(kinds) + 1)

    def reply(k: int, path: str, body: dict) -> Reply:
        slot = k % (len(kinds) + 1)
        return ok_reply(4) if slot == len(kinds) else FAULTS[kinds[slot]]

    transport = ScriptedTransport(reply)
    progress = Progress()
    # One user: request k is the server's k-th. The timeout only ends the stalled streams.
    p = plan("http://scripted", n, out_len=4, rate=None, concurrency=1, request_timeout_s=0.05)
    result = run_scripted(p, transport, progress)
    s = summarize(result.records)

    assert s.errors == {kind: 3 for kind in kinds}
    assert s.completed == 3 and s.failed == 3 * len(kinds) and s.cancelled == 0
    assert transport.started == n == s.completed + s.failed + s.cancelled
    assert (progress.sent, progress.completed, progress.failed) == (n, s.completed, s.failed)
    assert progress.in_flight == 0 and not result.interrupted
    messages = {r.error_kind: r.error_message for r in result.records if not r.ok}
    assert "HTTP 500" in messages[ERR_HTTP_5XX] and "boom" in messages[ERR_HTTP_5XX]
    assert "out of memory" in messages[ERR_STREAM_ERROR]
    assert "--request-timeout" in messages[ERR_TIMEOUT]
    assert "event 2" in messages[ERR_MALFORMED]  # names which event was bad
    # Tokens that arrived before a stream broke are kept with their times.
    broken = [r for r in result.records if r.error_kind == ERR_RESET_MID_STREAM]
    assert all(len(r.chunk_times_ns) == 2 for r in broken)


def test_a_stop_cancels_what_is_in_flight_and_never_sends_what_waits():
    """Ctrl-C mid-run: streams in flight end cancelled (counted, never as failures),
    requests still waiting for a --max-concurrency slot never leave (not counted as sent)."""

    def reply(k: int, path: str, body: dict) -> Reply:
        return ok_reply(3) if k < 2 else Reply([], then="hang")

    # Stop once the two good streams have ended and the four slots hold hanging streams.
    transport = ScriptedTransport(reply, stop_when=lambda t: t.ended == 2 and len(t.in_flight) == 4)
    progress = Progress()
    p = plan("http://scripted", 12, out_len=3, rate=float("inf"), max_concurrency=4)
    result = run_scripted(p, transport, progress)
    s = summarize(result.records, interrupted=result.interrupted)

    assert result.interrupted and s.interrupted
    assert transport.started == 6 and transport.max_in_flight == 4
    assert (s.completed, s.failed, s.cancelled) == (2, 0, 4)
    assert s.sent == transport.started == len(result.records) == progress.sent
    cancelled = [r for r in result.records if r.state == CANCELLED]
    assert {r.error_kind for r in cancelled} == {ERR_CANCELLED}
    assert all(r.end_ns is not None and r.end_ns >= r.sent_ns for r in cancelled)
    assert s.error_rate == 0.0  # a cancelled request is not a failure of the server


def test_a_closed_loop_holds_its_users_in_flight_and_sends_every_request():
    transport = ScriptedTransport(lambda k, path, body: ok_reply(2))
    result = run_scripted(
        plan("http://scripted", 15, out_len=2, rate=None, concurrency=3), transport
    )
    assert summarize(result.records).completed == 15 == transport.started
    assert transport.max_in_flight == 3


def test_a_conversation_sends_each_turn_after_the_last_one_ended_with_the_history():
    workload = Workload(seed=2, input=LengthDist(mean=16), output=LengthDist(mean=3), turns=3)
    p = plan("http://scripted", 12, rate=None, endpoint=CHAT)
    p.workload, p.specs = workload, workload.specs(12)
    p.offsets_s = np.zeros(4)  # four 3-turn sessions, all at once
    transport = ScriptedTransport(lambda k, path, body: ok_reply(3, chat=True))
    result = run_scripted(p, transport)
    assert summarize(result.records).completed == 12
    for session in range(4):
        turns = [session * 3 + t for t in range(3)]
        at = {(event, index): i for i, (event, index, _turn) in enumerate(transport.log)}
        for earlier, later in zip(turns, turns[1:], strict=False):
            assert at[("end", earlier)] < at[("start", later)]
    # Later turns carry the conversation so far: the answer and a new user message.
    by_turn = {}
    for body in transport.bodies:
        by_turn.setdefault(len(body["messages"]), []).append(body)
    assert sorted(by_turn) == [1, 3, 5] and all(len(v) == 4 for v in by_turn.values())
    assert all(m["role"] == "assistant" for b in by_turn[3] for m in b["messages"][1:2])


# ---------------------------------------------------------------- the definitions, exactly


def test_ttft_itl_tpot_e2el_follow_their_definitions_exactly():
    """TTFT = first token - send; ITL = each gap between content chunks; TPOT = (E2EL -
    TTFT) / (tokens - 1); E2EL = last byte - send (DESIGN.md "Definitions")."""
    transport = ScriptedTransport(lambda k, path, body: ok_reply(6, ttft_ns=40 * MS, itl_ns=5 * MS))
    result = run_scripted(plan("http://scripted", 5, out_len=6, rate=1000.0), transport)
    for r in result.records:
        assert r.ok and r.output_tokens == 6 and r.token_count_source == "usage"
        assert r.ttft_ns == 40 * MS and r.e2el_ns == 65 * MS and r.tpot_ns == 5 * MS
        assert r.itl_ns().tolist() == [5 * MS] * 5
    s = summarize(result.records, percentiles=(50, 99))
    assert set(s.metrics) == set(LATENCY_METRICS)
    for metric, ms in {"ttft": 40.0, "tpot": 5.0, "itl": 5.0, "e2el": 65.0}.items():
        assert s.metrics[metric].percentiles == {"p50": ms, "p99": ms}, metric
        assert s.metrics[metric].mean == ms
    assert s.total_output_tokens == 30 and s.completed == 5


def test_events_read_together_share_one_arrival_time_and_are_counted_as_merged():
    events = stream_events(4)
    head, *chunks = chunked_reads(events)
    # Tokens 1 and 2 arrive in one read at 20 ms; the rest one per read.
    reads = [(10 * MS, head + chunks[0]), (20 * MS, chunks[1] + chunks[2])]
    reads += [(30 * MS, chunks[3]), (31 * MS, b"".join(chunks[4:]))]
    stats = ReadStats()
    rec = to_record(feed_capture(reads), index=0, intended_ns=0, t0_ns=0, stats=stats)
    assert rec.chunk_times_ns.tolist() == [10 * MS, 20 * MS, 20 * MS, 30 * MS]
    assert rec.itl_ns().tolist() == [10 * MS, 0, 10 * MS]
    assert rec.end_ns == 31 * MS
    assert (stats.tokens, stats.merged, stats.streams) == (4, 1, 1)
    assert stats.merged_share == pytest.approx(1 / 4)


@pytest.mark.parametrize("chat", [False, True])
def test_tokens_are_counted_from_chunks_when_the_server_sends_no_usage(chat):
    head, *chunks = chunked_reads(stream_events(5, chat=chat, usage=False))
    reads = [(MS * (i + 1), data) for i, data in enumerate([head + chunks[0], *chunks[1:]])]
    rec = to_record(feed_capture(reads), index=0, intended_ns=0, t0_ns=0)
    assert rec.state == OK and rec.output_tokens == 5 and rec.token_count_source == "chunks"
    assert rec.prompt_tokens is None


def test_a_noisy_stream_without_framing_counts_only_content_chunks():
    """Comments, a role-only and an empty delta, CRLF line ends, usage in its own event, and
    a body that simply ends when the server closes (no chunking, no length)."""
    crlf = [
        b": keep-alive comment\r\n\r\n",
        sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
        *(token_event(f"t{i} ", chat=True) for i in range(5)),
        sse({"choices": [{"index": 0, "delta": {}}]}),
        usage_event(8, 5),
        DONE,
    ]
    events = [e.replace(b"\n", b"\r\n") if i < 4 else e for i, e in enumerate(crlf)]
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    reads = [(MS * (i + 1), data) for i, data in enumerate([head + events[0], *events[1:]])]
    transport = ScriptedTransport(lambda k, path, body: Reply(reads, then="reset"))
    result = run_scripted(plan("http://scripted", 3, out_len=5, endpoint=CHAT), transport)
    for r in result.records:
        assert r.ok, r.error_message
        assert len(r.chunk_times_ns) == 5 and r.output_tokens == 5
        assert r.ttft_ns == 3 * MS  # the first content, not the comment or the role chunk


def test_output_is_counted_with_the_tokenizer_when_the_server_sends_no_usage():
    head, *chunks = chunked_reads(stream_events(3, usage=False))
    reads = [(MS * (i + 1), data) for i, data in enumerate([head + chunks[0], *chunks[1:]])]
    counted = []

    def count(text: str) -> int:
        counted.append(text)
        return 2 * len(text.split())  # a tokenizer that makes two tokens of every word

    rec = to_record(feed_capture(reads), index=0, intended_ns=0, t0_ns=0, count_tokens=count)
    assert counted == ["t0 t1 t2 "]  # the whole output text, once
    assert rec.output_tokens == 6 and rec.token_count_source == "tokenizer"
    assert len(rec.chunk_times_ns) == 3


def test_waiting_for_a_concurrency_slot_is_recorded_as_slot_wait_not_send_lag():
    transport = ScriptedTransport(lambda k, path, body: ok_reply(2, ttft_ns=2 * MS))
    p = plan("http://scripted", 6, out_len=2, rate=float("inf"), max_concurrency=2)
    result = run_scripted(p, transport)
    assert transport.max_in_flight == 2 and summarize(result.records).completed == 6
    records = sorted(result.records, key=lambda r: r.sent_ns)
    first, queued = records[:2], records[2:]
    assert all(r.slot_wait_ns == 0 for r in first)
    # A queued request waited for an earlier one to end: at least that one's 2 ms.
    assert all(r.slot_wait_ns >= 2 * MS for r in queued)
    # TTFT from the schedule includes the wait; the send lag (the client's own lateness)
    # does not.
    assert all(r.ttft_from_intended_ns >= r.ttft_ns + r.slot_wait_ns for r in queued)
    assert all(r.send_lag_ns >= 0 for r in queued)
