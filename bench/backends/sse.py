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

# An event ends at a blank line: two line breaks in a row, in any of the three styles.
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r|\r\n\n|\n\r\n")
_LINE_BREAK = re.compile(rb"\r\n|\r|\n")


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
