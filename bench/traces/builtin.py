"""The shipped trace formats: CSV with a header row, and JSON lines."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from bench.traces import TRACE_FORMATS, TraceFormat


def _csv_rows(path: Path) -> list[dict]:
    return list(csv.DictReader(path.read_text().splitlines()))


def _jsonl_rows(path: Path) -> list[dict]:
    rows = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError as exc:
                raise ValueError(f"trace file {path} line {lineno}: not JSON ({exc})") from None
    return rows


TRACE_FORMATS.register(
    "csv",
    "CSV with a header: a timestamp column, optional lengths (Azure LLM inference, BurstGPT)",
    TraceFormat(_csv_rows, (".csv",)),
)
TRACE_FORMATS.register(
    "jsonl",
    "JSON lines, one object per request with the same columns as csv",
    TraceFormat(_jsonl_rows, (".jsonl", ".ndjson", ".json")),
)
