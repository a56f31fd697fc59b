"""Trace file formats: how a replayed trace's rows are read (`load.trace`).

Each format is a kind of TRACE_FORMATS (bench.registry) that turns a file into rows (one
dict per request) with the columns bench.arrivals.load_trace understands: a timestamp
(seconds or an ISO time) and, where the trace has them, input and output lengths. A file
is read by the format its scenario names (`load.trace.format`) or else by the first format
claiming its suffix. A new trace format (another public trace, another layout) is one new
module in this package; scenario files and the API accept its name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.registry import Registry


@dataclass(frozen=True)
class TraceFormat:
    """`rows(path)`: the file's rows as dicts; `suffixes`: file endings read by default."""

    rows: Callable[[Path], list[dict]]
    suffixes: tuple[str, ...] = ()


TRACE_FORMATS: Registry[TraceFormat] = Registry(
    "trace format", package=__name__, where="load.trace.format (default: by file suffix)"
)


def format_for(path: Path, name: str | None = None) -> TraceFormat:
    """The format called `name`, else the first whose suffixes claim the file, else csv."""
    if name is not None:
        return TRACE_FORMATS.get(name)
    suffix = path.suffix.lower()
    for kind in TRACE_FORMATS.kinds():
        if suffix in kind.obj.suffixes:
            return kind.obj
    return TRACE_FORMATS.get("csv")
