"""Telemetry sources: what the Scraper polls while a load point runs.

Each kind of SOURCES (bench.registry) says when a run's TelemetryConfig asks for it and
how to open it: the server's own /metrics, a DCGM exporter, this host's GPUs through NVML.
A new source is one module in this package whose `make` returns an object with the
`bench.telemetry.scrapers.Source` methods (name, where, read, close); its points are
stored, read and charted like every other source's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.registry import Registry


@dataclass(frozen=True)
class SourceKind:
    """`wanted(config)`: whether the run's TelemetryConfig asks for this source.
    `make(config, base_url, timeout_s)`: the opened source, or TelemetryError (a warning,
    never a failed run)."""

    wanted: Callable[[Any], bool]
    make: Callable[[Any, str, float], Any]


SOURCES: Registry[SourceKind] = Registry(
    "telemetry source", package=__name__, where="--scrape-metrics / --dcgm-url / --nvml"
)
