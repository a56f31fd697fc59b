"""Server-sent events, parsed after the stream ends from the bytes and read times captured.

The hot path only appends each read's bytes to a buffer and notes (arrival ns, buffer length);
this module later splits the buffer into events and gives each event the arrival time of the
read that completed it. That keeps JSON decoding and per-event objects off the hot path while
still timing every token at the moment its bytes reached the client.

Robust to: events split across reads, many events per read, ':' comments and keep-alives,
CRLF and CR line endings, multi-line data fields, a final event without its blank line.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

import numpy as np

# An event ends at a blank line: two line breaks in a row, in any of the three styles.
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r|\r\n\n|\n\r\n")
_LINE_BREAK = re.compile(rb"\r\n|\r|\n")
_DATA = b"data: "
_DONE_EVENT = b"data: [DONE]"
_DATA_ARR = np.frombuffer(_DATA, dtype=np.uint8)
_SPAN6 = np.arange(6)
_SPAN2 = np.arange(2)
_COLON, _SPACE, _BRACKET_OPEN = ord(":"), ord(" "), ord("[")
_COMMA = np.frombuffer(b", ", dtype=np.uint8)  # replaces each payload's "\n\n" but the last
_CLOSE = np.frombuffer(b"] ", dtype=np.uint8)  # replaces the last payload's "\n\n"


@dataclass(slots=True)
class SSEEvent:
    """One event: its joined data field, its name (if any) and the read it completed in."""

    data: bytes
    event: str | None
    read_index: int


def split_events(
    body: bytes | bytearray, read_ends: list[int] | None = None, *, final: bool = True
) -> list[SSEEvent]:
    """Split an SSE body into events.

    read_ends[i] is the buffer length after read i; an event's read_index is the first read
    whose end covers the event's terminating blank line. With final=True a trailing event
    without its blank line (a stream cut short) is still returned.
    """
    events: list[SSEEvent] = []
    pos = 0
    n = len(body)
    ends = read_ends or [n]
    while pos < n:
        m = _EVENT_END.search(body, pos)
        if m is None:
            if not final:
                break
            block, stop = body[pos:], n
            pos = n
        else:
            block, stop = body[pos : m.start()], m.end()
            pos = m.end()
        parsed = _parse_block(bytes(block))
        if parsed is None:
            continue
        data, name = parsed
        read_index = min(bisect.bisect_left(ends, stop), len(ends) - 1)
        events.append(SSEEvent(data=data, event=name, read_index=read_index))
    return events


def _parse_block(block: bytes) -> tuple[bytes, str | None] | None:
    """Fields of one event block; None for a block of only comments or keep-alives."""
    data_lines: list[bytes] = []
    name: str | None = None
    for line in _LINE_BREAK.split(block):
        if not line or line.startswith(b":"):
            continue
        field, sep, value = line.partition(b":")
        if sep and value.startswith(b" "):
            value = value[1:]
        if field == b"data":
            data_lines.append(value)
        elif field == b"event":
            name = value.decode("utf-8", "replace")
    if not data_lines and name is None:
        return None
    return b"\n".join(data_lines), name


def split_simple(body: bytes | bytearray, read_ends) -> tuple[bytes, list[int], bool] | None:
    """Fast path for the shape vLLM, SGLang, TensorRT-LLM and OpenAI all stream.

    When every event is exactly one `data: <payload>` line ended by a blank line (LF only,
    no other fields or empty blocks; one-line `:` comments, such as keep-alive pings, are
    allowed) and `data: [DONE]`, if present, is the last event, return (a JSON array of all
    payloads, each payload's read index, whether [DONE] came). The array is made from a copy
    of the body by overwriting each `data: ` with spaces, each event's blank line with a
    comma and every comment with spaces (JSON whitespace), so the work is a handful of numpy
    operations over the whole body and one json.loads, never a Python step per event:
    decoding must stay cheaper than receiving (issue 10), and a stream padded with
    thousands of comments must not hold the loop either (issue 18). Anything else returns
    None, and split_events handles it.
    """
    n = len(body)
    if n < 8 or body[:1] not in (b"d", b":") or body[-2:] != b"\n\n":
        return None
    arr = np.frombuffer(bytes(body), dtype=np.uint8)
    nl = np.flatnonzero(arr == 10)
    # Every line break must be half of one blank line: then each event is a single line.
    if nl.size % 2 or (nl[1::2] - nl[0::2] != 1).any() or (arr == 13).any():
        return None
    ends = nl[1::2] + 1  # just past each event's blank line
    starts = np.empty_like(ends)
    starts[0], starts[1:] = 0, ends[:-1]
    comment = arr[starts] == _COLON
    data_starts, data_ends = starts[~comment], ends[~comment]
    if data_starts.size == 0:
        return b"[]", [], False
    heads = arr[np.minimum(data_starts[:, None] + _SPAN6, n - 1)]
    if not (heads == _DATA_ARR).all():
        return None
    lengths = data_ends - data_starts
    last = data_starts[-1]
    done = lengths[-1] == len(_DONE_EVENT) + 2 and body[last : last + 12] == _DONE_EVENT
    for k in np.flatnonzero(lengths[:-1] == len(_DONE_EVENT) + 2):
        if body[data_starts[k] : data_ends[k] - 2] == _DONE_EVENT:
            return None  # [DONE] before the end: the general parser stops there
    m = len(data_ends) - 1 if done else len(data_ends)
    if m == 0:
        return b"[]", [], bool(done)
    stop = data_ends[m - 1]
    out = arr[:stop].copy()
    if comment.any():
        inside = np.zeros(stop + 1, dtype=np.int32)  # +1 where a comment starts, -1 after
        first, past = starts[comment], ends[comment]
        inside[first[first < stop]] += 1
        inside[np.minimum(past[first < stop], stop)] -= 1
        out[np.cumsum(inside[:-1]) > 0] = _SPACE
    out[data_starts[:m, None] + _SPAN6] = _SPACE
    out[data_starts[0]] = _BRACKET_OPEN
    out[(data_ends[: m - 1] - 2)[:, None] + _SPAN2] = _COMMA
    out[stop - 2 : stop] = _CLOSE
    reads = np.asarray(read_ends, dtype=np.int64) if len(read_ends) else np.array([n])
    index = np.minimum(np.searchsorted(reads, data_ends[:m], side="left"), len(reads) - 1)
    return out.tobytes(), index.tolist(), bool(done)
