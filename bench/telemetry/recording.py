"""What a Scraper collected over one load point, and how it is stored with the run.

Storage: one run artifact per load point (`telemetry/lp<N>.json.gz`, gzip'd JSON, columnar:
per source one array of scrape times and one value array per series), written once when
the point ends. Why an artifact and not a table: telemetry is always read whole, one load
point or one run at a time, to draw it or to integrate power; nothing needs SQL across runs.
An artifact needs no schema migration (existing databases and the PostgreSQL path keep
working untouched), and vLLM's ~300 series at 1 Hz would be a million rows an hour as one
row per sample. The cost: samples of a point that was killed mid-way are lost (its requests
are not), and filtering by metric happens in pandas after the read.
"""

from __future__ import annotations

import gzip
import json
import math
from array import array
from dataclasses import dataclass, field
from typing import Any

ARTIFACT_PREFIX = "telemetry/lp"
ARTIFACT_SUFFIX = ".json.gz"
MEDIA_TYPE = "application/gzip"
FORMAT = "tokenbench-telemetry/1"


@dataclass
class SeriesLog:
    """One series of one source: a value per scrape (NaN where it was absent)."""

    metric: str
    name: str
    labels: str
    type: str
    values: array = field(default_factory=lambda: array("d"))


@dataclass
class SourceLog:
    """One source's samples: scrape times, and one value per scrape for every series."""

    name: str
    where: str
    times_ns: array = field(default_factory=lambda: array("q"))
    series: dict[tuple[str, str, str], SeriesLog] = field(default_factory=dict)
    ok: int = 0
    failed: int = 0
    dropped_series: int = 0
    engine: str | None = None  # the serving engine its metric names belong to (server only)


@dataclass
class Recording:
    """What one Scraper collected; to_payload() makes the stored artifact."""

    sources: list[SourceLog]
    warnings: list[str]
    interval_s: float

    @property
    def scrapes(self) -> int:
        return sum(s.ok for s in self.sources)

    def to_payload(self, t0_ns: int, load_point: int) -> dict[str, Any]:
        """Plain JSON: times as seconds since the load point's start (t0_ns), NaN as null."""
        out: dict[str, Any] = {
            "format": FORMAT,
            "load_point": load_point,
            "interval_s": self.interval_s,
            "warnings": self.warnings,
            "sources": {},
        }
        for src in self.sources:
            t = [round((ns - t0_ns) / 1e9, 6) for ns in src.times_ns]
            out["sources"][src.name] = {
                "where": src.where,
                "engine": src.engine,
                "scrapes": src.ok,
                "failed": src.failed,
                "t_s": t,
                "series": [
                    {
                        "metric": s.metric,
                        "name": s.name,
                        "labels": s.labels,
                        "type": s.type,
                        "values": [None if math.isnan(v) else v for v in s.values],
                    }
                    for s in src.series.values()
                ],
            }
        return out


def artifact_name(load_point: int) -> str:
    return f"{ARTIFACT_PREFIX}{load_point}{ARTIFACT_SUFFIX}"


def encode(payload: dict[str, Any]) -> bytes:
    return gzip.compress(json.dumps(payload, separators=(",", ":")).encode(), compresslevel=6)


def decode(data: bytes) -> dict[str, Any]:
    return json.loads(gzip.decompress(data))


def save_recording(
    recording: Recording, run_id: str, load_point: int, t0_ns: int, db: Any = None
) -> None:
    """Store a load point's samples with the run (replacing an earlier copy)."""
    from bench.store import save_artifact

    data = encode(recording.to_payload(t0_ns, load_point))
    save_artifact(run_id, artifact_name(load_point), data, media_type=MEDIA_TYPE, db=db)
