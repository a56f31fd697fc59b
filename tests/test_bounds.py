"""bench.backends.bounds: the checks a transport runs as a body grows (issue 28)."""

from __future__ import annotations

from bench.backends.bounds import (
    EVENT_MAX_BYTES,
    check_stream,
    ends_with_done,
    response_limit,
    stream_overrun,
    token_slack,
    usage_disbelieved,
)
from bench.records import ERR_OVERSIZED, ERR_PROTOCOL

EVENT = b'data: {"choices":[{"text":" t"}]}\n\n'


def grow(body: bytes, step: int, max_tokens: int):
    """Feed `body` in reads of `step` bytes, checking as a transport does; (kind, events)."""
    buf = bytearray()
    check_at, events = 64 << 10, (0, 0)
    for i in range(0, len(body), step):
        buf += body[i : i + step]
        if len(buf) > check_at:
            check_at, events, kind, _ = check_stream(buf, events, max_tokens)
            if kind is not None:
                return kind, events
    return None, check_stream(buf, events, max_tokens)[1]


def test_events_are_counted_once_however_reads_cut_them():
    body = EVENT * 5000
    for step in (1000, 4093, 65536, 7):
        kind, (counted, _) = grow(body, step, max_tokens=10_000)
        assert kind is None and counted == 5000, step


def test_a_stream_past_max_tokens_is_a_protocol_violation():
    kind, _ = grow(EVENT * 5000, 4096, max_tokens=8)
    assert kind == ERR_PROTOCOL
    assert stream_overrun(8 + token_slack(8), 8) is None
    assert stream_overrun(9 + token_slack(8), 8) is not None


def test_comments_without_events_and_one_endless_line_are_oversized():
    comments = (b": " + b"x" * 1000 + b"\n\n") * (3 * EVENT_MAX_BYTES // 1000)
    assert grow(comments, 65536, max_tokens=4096)[0] == ERR_OVERSIZED
    line = b'data: {"choices":[{"text":"' + b"a" * (3 * EVENT_MAX_BYTES)
    assert grow(line, 65536, max_tokens=4096)[0] == ERR_OVERSIZED


def test_a_padded_but_honest_stream_is_within_bounds():
    """1.7 MB of comments before the first token (a server padding its stream) is allowed."""
    body = (b": " + b"p" * 60 + b"\n\n") * (1_700_000 // 64) + EVENT * 16 + b"data: [DONE]\n\n"
    assert len(body) < response_limit(16)
    assert grow(body, 65536, max_tokens=16)[0] is None


def test_the_whole_body_is_bounded_by_max_tokens():
    body = EVENT * 4 + b": " + b"x" * (response_limit(8) + 10) + b"\n\n"
    assert grow(body, 65536, max_tokens=8)[0] == ERR_OVERSIZED


def test_done_is_recognised_in_every_line_break_style():
    for tail in (b"data: [DONE]\n\n", b"data:[DONE]\r\n\r\n", b"data: [DONE]\r\r"):
        assert ends_with_done(bytearray(EVENT + tail)), tail
    assert not ends_with_done(bytearray(EVENT + b"data: [DONE]\n"))
    assert not ends_with_done(bytearray(b'data: {"text":"[DONE]"}\n\n'))


def test_usage_claims_that_cannot_be_true():
    assert usage_disbelieved(8, 8, 8) is None
    assert usage_disbelieved(0, 8, 8) is not None  # fewer tokens than content events
    assert usage_disbelieved(99_999_999, 8, 8) is not None  # past max_tokens
    assert usage_disbelieved(8 + token_slack(8), 8, 8) is None
    assert usage_disbelieved(40, 8, 64, counted=8) is not None  # tokenizer disagrees
    assert usage_disbelieved(9, 8, 64, counted=8) is None
