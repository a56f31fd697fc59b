"""What the hot path writes for one request, and how it becomes a RequestRecord afterwards.

A Capture is filled by a transport while the response streams in: the response body bytes,
and for every read the arrival time and the body length after it. Nothing else happens per
read. `to_record` runs once the stream has ended: it splits events, decodes them, and turns
the read times of content events into token arrival times.
"""

from __future__ import annotations

from array import array

import numpy as np

try:  # 2-3x faster than the standard library on a stream's events; optional
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - depends on the environment
    from json import loads as _loads

from bench.backends.openai import StreamResult, interpret, interpret_objects
from bench.backends.sse import split_events, split_simple
from bench.records import (
    CANCELLED,
    COUNT_CHUNKS,
    COUNT_USAGE,
    ERR_HTTP_4XX,
    ERR_HTTP_5XX,
    ERR_HTTP_429,
    ERR_RESET,
    ERR_RESET_MID_STREAM,
    FAILED,
    OK,
    RequestRecord,
)


class Capture:
    """Per-request buffers written on the hot path. Slots keep it small (issue 10)."""

    __slots__ = (
        "status",
        "body",
        "read_times",
        "read_ends",
        "sent_ns",
        "first_byte_ns",
        "end_ns",
        "error_kind",
        "error_message",
        "cancelled",
    )

    def __init__(self) -> None:
        self.status: int | None = None
        self.body = bytearray()
        self.read_times = array("q")
        self.read_ends = array("q")
        self.sent_ns = 0
        self.first_byte_ns: int | None = None
        self.end_ns: int | None = None
        self.error_kind: str | None = None
        self.error_message: str | None = None
        self.cancelled = False


def mark_closed(cap: Capture, detail: str) -> None:
    """The connection went away before the response ended: a reset before any response byte
    and one mid-stream are different failures (the server never answered vs. broke off)."""
    if cap.first_byte_ns is None:
        cap.error_kind = ERR_RESET
        cap.error_message = f"connection closed before a response: {detail}"
    else:
        cap.error_kind = ERR_RESET_MID_STREAM
        cap.error_message = f"connection closed mid-stream: {detail}"


def http_error_kind(status: int) -> str:
    if status == 429:
        return ERR_HTTP_429
    return ERR_HTTP_5XX if status >= 500 else ERR_HTTP_4XX


def to_record(
    cap: Capture,
    *,
    index: int,
    intended_ns: int,
    t0_ns: int,
    load_point: int = 0,
    turn: int = 0,
    expected_input_len: int | None = None,
    expected_output_len: int | None = None,
) -> RequestRecord:
    """Decode a finished capture into a record; times become ns since the run start t0_ns."""
    rec = RequestRecord(
        index=index,
        load_point=load_point,
        turn=turn,
        intended_ns=intended_ns - t0_ns,
        sent_ns=cap.sent_ns - t0_ns,
        first_byte_ns=None if cap.first_byte_ns is None else cap.first_byte_ns - t0_ns,
        end_ns=None if cap.end_ns is None else cap.end_ns - t0_ns,
        http_status=cap.status,
        expected_input_len=expected_input_len,
        expected_output_len=expected_output_len,
    )
    if cap.cancelled:
        rec.state, rec.error_kind, rec.error_message = CANCELLED, "cancelled", "run stopped"
        return rec
    if cap.status is not None and cap.status != 200 and cap.error_kind is None:
        text = bytes(cap.body[:300]).decode("utf-8", "replace").strip()
        rec.state, rec.error_kind = FAILED, http_error_kind(cap.status)
        rec.error_message = f"HTTP {cap.status}: {text}"
        return rec

    result = decode_stream(cap)
    if result.content_reads:
        times = np.frombuffer(cap.read_times, dtype=np.int64)
        rec.chunk_times_ns = times[np.asarray(result.content_reads)] - t0_ns
        rec.first_token_ns = int(rec.chunk_times_ns[0])
    if result.completion_tokens is not None:
        rec.output_tokens = int(result.completion_tokens)
        rec.prompt_tokens = result.prompt_tokens
        rec.token_count_source = COUNT_USAGE
    else:
        rec.output_tokens = len(result.content_reads)
        rec.token_count_source = COUNT_CHUNKS

    # A transport error (reset, timeout) outranks what the partial stream said.
    kind = cap.error_kind or result.error_kind
    if kind is not None:
        rec.state, rec.error_kind = FAILED, kind
        rec.error_message = cap.error_message if cap.error_kind else result.error_message
    else:
        rec.state = OK
    return rec


def decode_stream(cap: Capture) -> StreamResult:
    """What the captured body says; the fast path first, the general SSE parser if needed."""
    if not cap.body:
        return interpret([])
    fast = split_simple(cap.body, cap.read_ends)
    if fast is not None:
        array, reads, done = fast
        try:
            objects = _loads(array)
        except ValueError:
            objects = None  # let the general path name the bad event
        if objects is not None and len(objects) == len(reads):
            return interpret_objects(objects, reads, done)
    return interpret(split_events(cap.body, list(cap.read_ends)))
