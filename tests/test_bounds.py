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
from bench.records import ERR_OVERSIZED

EVENT = b'data: {"choices":[{"text":" t"}]}\n\n'


def grow(body: bytes, step: int, max_tokens: int) -> str | None:
    """Feed `body` in reads of `step` bytes, checking as a transport does; the kind."""
    buf = bytearray()
    check_at = 64 << 10
    for i in range(0, len(body), step):
        buf += body[i : i + step]
        if len(buf) > check_at:
            check_at, kind, _ = check_stream(buf, max_tokens)
            if kind is not None:
                return kind
    return None


def test_an_endless_stream_is_stopped_by_size_then_named_a_protocol_violation():
    assert grow(EVENT * 200_000, 4096, max_tokens=8) == ERR_OVERSIZED
    assert stream_overrun(8 + token_slack(8), 8) is None
    assert stream_overrun(9 + token_slack(8), 8) is not None
    assert grow(EVENT * 5000, 4096, max_tokens=4096) is None


def test_comments_without_events_and_one_endless_line_are_oversized():
    comments = (b": " + b"x" * 1000 + b"\n\n") * (3 * EVENT_MAX_BYTES // 1000)
    assert grow(comments, 65536, max_tokens=4096) == ERR_OVERSIZED
    line = b'data: {"choices":[{"text":"' + b"a" * (3 * EVENT_MAX_BYTES)
    assert grow(line, 65536, max_tokens=4096) == ERR_OVERSIZED


def test_a_padded_but_honest_stream_is_within_bounds():
    """1.7 MB of comments before the first token (a server padding its stream) is allowed."""
    body = (b": " + b"p" * 60 + b"\n\n") * (1_700_000 // 64) + EVENT * 16 + b"data: [DONE]\n\n"
    assert len(body) < response_limit(16)
    assert grow(body, 65536, max_tokens=16) is None


def test_the_whole_body_is_bounded_by_max_tokens():
    body = EVENT * 4 + b": " + b"x" * (response_limit(8) + 10) + b"\n\n"
    assert grow(body, 65536, max_tokens=8) == ERR_OVERSIZED


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


def _feed_stream(events: list[bytes], max_tokens: int):
    """Feed a chunked stream to the raw transport's parser, one chunk per read."""
    from bench.backends.capture import Capture
    from bench.backends.transport import _Connection

    conn, cap, ended = _Connection(None, None), Capture(), []
    cap.max_tokens = max_tokens
    conn.expect(cap, ended.append)
    conn.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", 1)
    for i, ev in enumerate(events):
        if ended:
            break
        conn.feed(b"%x\r\n%s\r\n" % (len(ev), ev), 2 + i)
    return cap, ended


def test_the_transport_checks_a_long_honest_stream_and_lets_it_through():
    cap, ended = _feed_stream([EVENT] * 20_000, max_tokens=20_000)  # ~700 KB, many checks
    assert cap.error_kind is None and not ended
    assert bytes(cap.body) == EVENT * 20_000


def test_the_transport_drops_a_stream_past_its_bound():
    cap, ended = _feed_stream([EVENT] * 200_000, max_tokens=8)
    assert ended == [cap] and cap.error_kind == ERR_OVERSIZED
    assert len(cap.body) <= response_limit(8) + len(EVENT)
