"""Mooncake's block-hashed trace (FAST'25, kvcache-ai/Mooncake `mooncake_trace.jsonl`).

One JSON object a line: `{"timestamp": ms, "input_length": n, "output_length": n,
"hash_ids": [...]}`, one hash id per block of the prompt (512 tokens in Mooncake's
traces; the last block may be short), equal ids meaning identical blocks. AIPerf and
inference-perf replay the same layout. Rows come back with the columns
bench.arrivals.load_trace reads (timestamp in seconds, input_len, output_len) and the
hash ids, in file order.

Every line is checked: a bad line is an error naming the file and line, never skipped.
Timestamps must not go backwards, so request i of the replay is line i's request (the
prompt renderer finds its hash ids by that index).
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.traces import TRACE_FORMATS, TraceFormat

FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


def mooncake_rows(path: Path) -> list[dict]:
    """The trace's requests, checked line by line (ValueError names the file and line)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"trace file {path}: {exc.strerror or exc}") from None
    rows: list[dict] = []
    last_ms = None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"trace file {path} line {lineno}"
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{where}: not JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected an object with {', '.join(FIELDS)}")
        missing = [f for f in FIELDS if f not in obj]
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)} (needs {', '.join(FIELDS)})")
        ms = obj["timestamp"]
        if isinstance(ms, bool) or not isinstance(ms, int | float) or ms < 0:
            raise ValueError(f"{where}: timestamp {ms!r} is not a number of ms >= 0")
        if last_ms is not None and ms < last_ms:
            raise ValueError(
                f"{where}: timestamp {ms} is earlier than the line before ({last_ms}); "
                "sort the trace by timestamp"
            )
        last_ms = ms
        lengths = {}
        for field in ("input_length", "output_length"):
            n = obj[field]
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"{where}: {field} {n!r} is not a whole number >= 1")
            lengths[field] = n
        ids = obj["hash_ids"]
        if not isinstance(ids, list) or not ids:
            raise ValueError(f"{where}: hash_ids must be a non-empty list of integers")
        if any(isinstance(h, bool) or not isinstance(h, int) for h in ids):
            raise ValueError(f"{where}: hash_ids must be integers (got {ids[:5]!r}...)")
        rows.append(
            {
                "timestamp": ms / 1000.0,
                "input_len": lengths["input_length"],
                "output_len": lengths["output_length"],
                "hash_ids": ids,
                "line": lineno,
            }
        )
    return rows


TRACE_FORMATS.register(
    "mooncake",
    'Mooncake JSONL: {"timestamp": ms, "input_length", "output_length", "hash_ids"} '
    "(block-hashed prompts)",
    TraceFormat(mooncake_rows),
)
