"""What the hot path writes for one request, and how it becomes a RequestRecord afterwards.

A Capture is filled by a transport while the response streams in: the response body bytes,
and for every read the time it was read, the kernel's stamp of when its bytes arrived (where
the transport gets one) and the body length after it. Nothing else happens per read.
`to_record` runs once the stream has ended: it splits events, decodes them, and turns the
arrival times of content events into token arrival times.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable
from time import perf_counter_ns

import numpy as np

from bench.backends.openai import StreamResult, decode_stream
from bench.records import (
    CANCELLED,
    COUNT_CHUNKS,
    COUNT_TOKENIZER,
    COUNT_USAGE,
    ERR_CANCELLED,
    ERR_CLIENT,
    ERR_HTTP_3XX,
    ERR_HTTP_4XX,
    ERR_HTTP_5XX,
    ERR_HTTP_429,
    ERR_HTTP_OTHER,
    ERR_RESET,
    ERR_RESET_MID_STREAM,
    FAILED,
    OK,
    RequestRecord,
)

# A dialect's stream reader: (body, body length after each read) -> what the stream said.
Decode = Callable[[bytearray, np.ndarray], StreamResult]


class Capture:
    """Per-request buffers written on the hot path, and the request it belongs to (`spec`,
    `intended_ns`, `then`: what the engine needs when the transport says it is done, so
    that no closure or task is kept per request). Slots keep it small (issue 10)."""

    __slots__ = (
        "status",
        "body",
        "reads",
        "spec",
        "intended_ns",
        "then",
        "sent_ns",
        "first_byte_ns",
        "end_ns",
        "error_kind",
        "error_message",
        "cancelled",
        "retries",
        "released_ns",
    )

    def __init__(self) -> None:
        self.status: int | None = None
        self.body = bytearray()
        # Four int64 per read: when it was read (perf_counter_ns), the body length after
        # it, and the kernel's CLOCK_REALTIME arrival stamp as timespec seconds and
        # nanoseconds (zeros where the read came without one). One array, not four: each
        # container costs ~60 bytes per request in flight (issue 10).
        self.reads = array("q")
        self.spec = None
        self.intended_ns = 0
        self.then = None
        self.sent_ns = 0
        self.first_byte_ns: int | None = None
        self.end_ns: int | None = None
        self.error_kind: str | None = None
        self.error_message: str | None = None
        self.cancelled = False
        self.retries = 0  # resent once after a reused connection closed before answering
        self.released_ns = 0  # when a --max-concurrency slot let it go (0: it never waited)


def mark_closed(cap: Capture, detail: str) -> None:
    """The connection went away before the response ended: a reset before any response byte
    and one mid-stream are different failures (the server never answered vs. broke off)."""
    if cap.first_byte_ns is None:
        cap.error_kind = ERR_RESET
        cap.error_message = f"connection closed before a response: {detail}"
    else:
        cap.error_kind = ERR_RESET_MID_STREAM
        cap.error_message = f"connection closed mid-stream: {detail}"


READ_LATE_NS = 2_000_000  # issue 10's honesty bar: a token read 2 ms after it arrived


class ReadStats:
    """How long reads waited in the socket before the client read them, over a run.

    Waits are known only from the kernel's arrival stamps. A read that waited is still timed
    right (its stamp is its arrival), but while bytes wait, a later token can arrive and be
    read with them as one read, and then the earlier token takes the later one's time: many
    merged tokens while many reads waited means the client no longer keeps up with what it
    is timing (bench.metrics' client_limited rules).
    """

    __slots__ = ("stamped", "late", "tokens", "merged", "streams", "first_merged")

    def __init__(self) -> None:
        self.stamped = 0  # reads with a kernel stamp
        self.late = 0  # ... that waited > 2 ms in the socket
        self.tokens = 0  # content events
        self.merged = 0  # content events that shared their read with the next one
        self.streams = 0  # streams with at least two content events
        self.first_merged = 0  # ... whose first token was read with the second (TTFT)

    def add(self, waits: np.ndarray | None) -> None:
        if waits is not None and waits.size:
            self.stamped += int(waits.size)
            self.late += int((waits > READ_LATE_NS).sum())

    def add_tokens(self, content_reads: list[int]) -> None:
        self.tokens += len(content_reads)
        if len(content_reads) > 1:
            self.merged += int((np.diff(content_reads) == 0).sum())
            self.streams += 1
            self.first_merged += content_reads[0] == content_reads[1]

    @property
    def late_share(self) -> float | None:
        """Share of stamped reads that waited > 2 ms; None when no read had a stamp."""
        return self.late / self.stamped if self.stamped else None

    @property
    def merged_share(self) -> float | None:
        """Share of content events read together with the next one; None without tokens.

        First tokens count on their own too: a merged first token moves TTFT by a whole
        inter-token gap, and TTFT's p99 sits on the 1% of streams, so a run whose first
        tokens merge more often than its tokens overall is judged by its first tokens."""
        if not self.tokens:
            return None
        share = self.merged / self.tokens
        if self.streams:
            share = max(share, self.first_merged / self.streams)
        return share


def read_columns(cap: Capture) -> np.ndarray:
    """The capture's reads as rows of (read_ns, body_end, stamp_s, stamp_ns)."""
    return np.frombuffer(cap.reads, dtype=np.int64).reshape(-1, 4)


def arrival_times(cap: Capture) -> tuple[np.ndarray, np.ndarray | None]:
    """Each read's arrival time on the perf_counter_ns clock, and how long it waited.

    With kernel stamps the arrival is the kernel's (converted from CLOCK_REALTIME with the
    offset between the clocks now: they drift by microseconds over a stream's life). Reads
    without a stamp, and every read of a capture whose stamps do not fit between its send
    and its reads (a wall-clock step mid-stream), keep the time they were read.
    """
    columns = read_columns(cap)
    read = columns[:, 0]
    stamped = columns[:, 2] != 0
    if not stamped.any():
        return read, None
    offset = time.time_ns() - perf_counter_ns()
    arrived = columns[:, 2] * 1_000_000_000 + columns[:, 3] - offset
    arrived = np.where(stamped, arrived, read)
    waits = read - arrived
    if (waits < -1_000_000).any() or (arrived < cap.sent_ns - 1_000_000).any():
        return read, None
    arrived = np.maximum(arrived, cap.sent_ns)  # a stamp cannot precede the send it answers
    return np.minimum(arrived, read), waits[stamped]


def http_error_kind(status: int) -> str:
    if status == 429:
        return ERR_HTTP_429
    if status >= 500:
        return ERR_HTTP_5XX
    if status >= 400:
        return ERR_HTTP_4XX
    return ERR_HTTP_3XX if 300 <= status < 400 else ERR_HTTP_OTHER


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
    stats: ReadStats | None = None,
    served: set[str] | None = None,
    count_tokens: Callable[[str], int] | None = None,
    decode: Decode = decode_stream,
) -> RequestRecord:
    """Decode a finished capture into a record; times become ns since the run start t0_ns.

    Token times are arrival times (`arrival_times`); `stats`, when given, collects how long
    the reads waited to be read; `served` collects the model names the server answered with.
    `count_tokens` (a tokenizer's) counts the output tokens of a stream whose server sent no
    usage; without it each content chunk counts as one. `decode` reads the body in the
    target's dialect (bench.backends.dialects; OpenAI's SSE by default).
    Whatever the response held, this returns a record: a response that breaks decoding is
    one failed request (client_error, with the exception), never a failed run.
    """
    try:
        return _to_record(
            cap, index, intended_ns, t0_ns, load_point, turn,
            expected_input_len, expected_output_len, stats, served, count_tokens, decode,
        )  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - one bad response fails one request
        rec = _bare_record(
            cap, index, intended_ns, t0_ns, load_point, turn,
            expected_input_len, expected_output_len,
        )  # fmt: skip
        rec.state, rec.error_kind = FAILED, ERR_CLIENT
        rec.error_message = f"tokenbench could not decode this response: {exc!r}"[:500]
        return rec


def _bare_record(
    cap: Capture,
    index: int,
    intended_ns: int,
    t0_ns: int,
    load_point: int,
    turn: int,
    expected_input_len: int | None,
    expected_output_len: int | None,
) -> RequestRecord:
    """What is known of any request, decoded or not: who it was and when it went and ended."""
    return RequestRecord(
        index=index,
        load_point=load_point,
        turn=turn,
        intended_ns=intended_ns - t0_ns,
        sent_ns=cap.sent_ns - t0_ns,
        end_ns=None if cap.end_ns is None else cap.end_ns - t0_ns,
        http_status=cap.status,
        expected_input_len=expected_input_len,
        expected_output_len=expected_output_len,
        retries=cap.retries,
    )


def _to_record(
    cap: Capture,
    index: int,
    intended_ns: int,
    t0_ns: int,
    load_point: int,
    turn: int,
    expected_input_len: int | None,
    expected_output_len: int | None,
    stats: ReadStats | None,
    served: set[str] | None,
    count_tokens: Callable[[str], int] | None,
    decode: Decode,
) -> RequestRecord:
    arrived, waits = arrival_times(cap)
    if stats is not None:
        stats.add(waits)
    if waits is not None:
        # The first byte and a stream's end are arrivals too, on the same clock as tokens.
        if cap.first_byte_ns is not None:
            cap.first_byte_ns = min(cap.first_byte_ns, int(arrived[0]))
        if cap.end_ns is not None and cap.end_ns == cap.reads[-4]:  # ended by its last read
            cap.end_ns = int(arrived[-1])
    rec = _bare_record(
        cap, index, intended_ns, t0_ns, load_point, turn, expected_input_len, expected_output_len
    )
    rec.first_byte_ns = None if cap.first_byte_ns is None else cap.first_byte_ns - t0_ns
    if cap.cancelled:
        rec.state, rec.error_kind, rec.error_message = CANCELLED, ERR_CANCELLED, "run stopped"
        return rec
    if cap.status is not None and cap.status != 200 and cap.error_kind is None:
        text = bytes(cap.body[:300]).decode("utf-8", "replace").strip()
        rec.state, rec.error_kind = FAILED, http_error_kind(cap.status)
        rec.error_message = f"HTTP {cap.status}: {text}"
        return rec

    result = decode(cap.body, read_columns(cap)[:, 1])
    if served is not None and result.model is not None and len(served) < 16:
        served.add(result.model)
    if stats is not None:
        stats.add_tokens(result.content_reads)
    if result.content_reads:
        rec.chunk_times_ns = arrived[np.asarray(result.content_reads)] - t0_ns
        rec.first_token_ns = int(rec.chunk_times_ns[0])
    if result.completion_tokens is not None:
        rec.output_tokens = int(result.completion_tokens)
        rec.prompt_tokens = result.prompt_tokens
        rec.cached_prompt_tokens = result.cached_prompt_tokens
        rec.token_count_source = COUNT_USAGE
    elif count_tokens is not None:
        rec.output_tokens = count_tokens("".join(result.content_text))
        rec.token_count_source = COUNT_TOKENIZER
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
