"""The Prometheus (and OpenMetrics) text format: `name{labels} value` lines -> Samples.

Every telemetry source tokenbench reads over HTTP speaks it: vLLM, SGLang, TensorRT-LLM and
llama.cpp's /metrics, a DCGM exporter, the simulator. The parser runs on the scraper thread
beside the load generator, so it is a few regexes and caches, not a general grammar.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Sample:
    """One line of Prometheus text: `name{labels} value`, with its family's declared type."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float
    type: str = "untyped"  # counter, gauge, histogram, summary, info, untyped


_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created", "_gsum", "_gcount", "_info")
_LINE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_ESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"n": "\n"}


@functools.lru_cache(maxsize=1 << 16)
def _parse_labels(text: str) -> tuple[tuple[str, str], ...]:
    """The inside of `{...}`: key="value" pairs; values may hold commas, braces and
    escaped quotes. Regexes and a cache (the same label sets come back every scrape), not a
    character loop: a vLLM /metrics has hundreds of lines and this runs on a thread beside
    the load generator, so it must be cheap (~3 ms for 660 lines)."""
    labels = []
    pos, n = 0, len(text)
    while pos < n:
        m = _LABEL.match(text, pos)
        if m is None:
            if text[pos:].strip(" ,"):
                raise ValueError(f"bad labels {text[:60]!r}")
            break
        key, value = m.groups()
        if "\\" in value:
            value = _ESCAPE.sub(lambda e: _ESCAPES.get(e[1], e[1]), value)
        labels.append((key, value))
        pos = m.end()
    return tuple(labels)


def _parse_line(line: str) -> tuple[str, tuple[tuple[str, str], ...], float]:
    m = _LINE.fullmatch(line)
    if m is None:
        raise ValueError("not `name{labels} value [timestamp]`")
    name, labels, value = m.groups()
    return name, _parse_labels(labels) if labels else (), float(value)  # reads NaN, +Inf


def _family(name: str, types: dict[str, str]) -> str:
    """The declared family of a sample name: vllm:x_bucket belongs to histogram vllm:x."""
    if name in types:
        return name
    for suffix in _SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in types:
            return name[: -len(suffix)]
    return name


def parse_prometheus(text: str) -> list[Sample]:
    """Samples of a Prometheus (or OpenMetrics) text exposition.

    Lines that do not parse are skipped; text with lines but no valid sample at all (an
    HTML error page, JSON) raises ValueError, so the caller can warn "not Prometheus text".
    """
    types: dict[str, str] = {}
    samples: list[Sample] = []
    bad = 0
    first_bad = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line[0] == "#":
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3].strip().lower()
            continue
        try:
            name, labels, value = _parse_line(line)
        except ValueError:
            bad += 1
            first_bad = first_bad or line[:80]
            continue
        samples.append(Sample(name, labels, value, types.get(_family(name, types), "untyped")))
    if bad and not samples:
        raise ValueError(f"not Prometheus text ({bad} unreadable lines, first: {first_bad!r})")
    return samples


def labels_text(labels: Iterable[tuple[str, str]]) -> str:
    """Labels as one sortable string, `gpu="0",model_name="x"` (the DataFrame's `labels`)."""
    return _labels_text(tuple(labels))


@functools.lru_cache(maxsize=1 << 16)
def _labels_text(labels: tuple[tuple[str, str], ...]) -> str:
    def quoted(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return ",".join(f'{k}="{quoted(v)}"' for k, v in sorted(labels, key=lambda kv: kv[0]))


def parse_labels_text(text: str) -> dict[str, str]:
    """The inverse of labels_text."""
    return dict(_parse_labels(text)) if text else {}
