"""The SSE parser and the raw transport's read path, fed arbitrary splits of valid streams."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.backends.capture import Capture, to_record
from bench.backends.openai import interpret, interpret_objects
from bench.backends.sse import split_events
from bench.backends.transport import _Connection
from bench.records import ERR_MALFORMED, ERR_NO_DONE, ERR_STREAM_ERROR


def text_event(text: str) -> str:
    return "data: " + json.dumps({"choices": [{"index": 0, "text": text}]}) + "\n\n"


def chat_event(delta: dict) -> str:
    return "data: " + json.dumps({"choices": [{"index": 0, "delta": delta}]}) + "\n\n"


USAGE = 'data: {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5}}\n\n'
DONE = "data: [DONE]\n\n"


def chat_stream(n: int, *, crlf: bool = False, comments: bool = True) -> str:
    parts = [": ping\n\n"] if comments else []
    parts.append(chat_event({"role": "assistant", "content": ""}))
    for i in range(n):
        parts.append(chat_event({"content": f"t{i}"}))
        if comments and i == 1:
            parts.append(":\n\n")
    parts.append(chat_event({}))
    parts += [USAGE, DONE]
    text = "".join(parts)
    return text.replace("\n", "\r\n") if crlf else text


def test_split_events_many_per_read_and_comments():
    body = chat_stream(5).encode()
    events = split_events(body)
    result = interpret(events)
    assert result.done
    assert len(result.content_reads) == 5
    assert (result.prompt_tokens, result.completion_tokens) == (7, 5)


def test_crlf_and_cr_line_endings():
    for body in (chat_stream(4, crlf=True), chat_stream(4).replace("\n", "\r")):
        result = interpret(split_events(body.encode()))
        assert result.done and len(result.content_reads) == 4


def test_multiline_data_and_event_field():
    body = b'event: message\ndata: {"choices":\ndata: [{"text": "a"}]}\n\ndata: [DONE]\n\n'
    events = split_events(body)
    assert events[0].event == "message"
    assert json.loads(events[0].data) == {"choices": [{"text": "a"}]}
    assert len(interpret(events).content_reads) == 1


def test_stream_without_done_and_final_event_without_blank_line():
    body = (text_event("a") + text_event("b")).rstrip("\n").encode()
    result = interpret(split_events(body))
    assert len(result.content_reads) == 2
    assert result.error_kind == ERR_NO_DONE


def test_error_event_and_malformed_event():
    err = 'data: {"error": {"message": "out of memory"}}\n\n'
    result = interpret(split_events((text_event("a") + err + DONE).encode()))
    assert result.error_kind == ERR_STREAM_ERROR and "out of memory" in result.error_message
    result = interpret(split_events((text_event("a") + "data: {oops\n\n" + DONE).encode()))
    assert result.error_kind == ERR_MALFORMED and "event 1" in result.error_message


def test_read_index_is_the_read_that_completed_the_event():
    one, two = text_event("a").encode(), text_event("b").encode()
    body = one + two
    # Read 0 ends mid-way through the first event, read 1 completes both.
    events = split_events(body, [5, len(body)])
    assert [e.read_index for e in events] == [1, 1]
    events = split_events(body, [len(one), len(body)])
    assert [e.read_index for e in events] == [0, 1]


def chunked(events: list[str]) -> bytes:
    out = b""
    for e in events:
        data = e.encode()
        out += b"%x\r\n%s\r\n" % (len(data), data)
    return out + b"0\r\n\r\n"


def feed(raw: bytes, cuts: list[int]) -> Capture:
    """Push raw response bytes through the hot-path parser, split at the given offsets."""
    conn = _Connection(None, None)
    cap = Capture()
    conn.expect(cap)
    bounds = sorted({c for c in cuts if 0 < c < len(raw)})
    start = 0
    for k, end in enumerate([*bounds, len(raw)]):
        conn.feed(raw[start:end], k)
        start = end
    return cap


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(min_value=0, max_value=12),
    crlf=st.booleans(),
    data=st.data(),
)
def test_arbitrary_splits_of_a_chunked_stream(n, crlf, data):
    text = chat_stream(n, crlf=crlf)
    events = [
        e + ("\r\n\r\n" if crlf else "\n\n")
        for e in text.split("\r\n\r\n" if crlf else "\n\n")
        if e
    ]
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    raw = head + chunked(events)
    cuts = data.draw(st.lists(st.integers(min_value=1, max_value=len(raw) - 1), max_size=40))
    cap = feed(raw, cuts)
    assert cap.status == 200
    assert bytes(cap.body) == text.encode()
    assert cap.end_ns is not None
    rec = to_record(cap, index=0, intended_ns=0, t0_ns=0)
    assert rec.ok, rec.error_message
    assert len(rec.chunk_times_ns) == n
    # From the usage chunk (5) while it is possible; past 5 content events it is not (each
    # holds a token), so the streamed count is used and the claim kept beside it.
    assert rec.output_tokens == max(5, n)
    assert rec.claimed_output_tokens == (5 if n > 5 else None)
    # Token times never go backwards and lie within the reads' times.
    assert (rec.chunk_times_ns[1:] >= rec.chunk_times_ns[:-1]).all()


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_arbitrary_splits_of_a_content_length_body(data):
    body = (text_event("x") * 3 + DONE).encode()
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    cuts = data.draw(st.lists(st.integers(min_value=1, max_value=len(raw) - 1), max_size=20))
    cap = feed(raw, cuts)
    assert bytes(cap.body) == body and cap.end_ns is not None
    assert len(to_record(cap, index=0, intended_ns=0, t0_ns=0).chunk_times_ns) == 3


def test_a_choice_that_is_not_an_object_is_malformed_not_a_crash():
    good = {"choices": [{"text": "a"}]}
    result = interpret_objects([good, {"choices": ["oops"]}], [0, 1], True)
    assert result.error_kind == "malformed_sse"
    assert "OpenAI shape" in result.error_message
    assert interpret_objects([good, good], [0, 1], True).content_reads == [0, 1]
