"""One vocabulary for every engine: vLLM, SGLang, TensorRT-LLM, llama.cpp and DCGM names
mapped to tokenbench's own (requests_waiting, kv_cache_usage, gpu_power_w, ...).

Figures, the terminal digest and energy per token read the canonical names only, so a new
engine (or a renamed metric) is one module in bench/telemetry/engines/, not a change to
every reader.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bench.telemetry.engines import engine_prefixes, known_metrics
from bench.telemetry.prometheus import Sample, labels_text

# The vocabularies themselves are kinds of bench.telemetry.engines.ENGINES, one per engine.


def engine_of(names: Iterable[str]) -> str | None:
    """The serving engine whose metric names these are, or None for none tokenbench knows."""
    engines = engine_prefixes()
    for name in names:
        for engine, prefixes in engines.items():
            if name.startswith(prefixes):
                return engine
    return None


@dataclass(frozen=True, slots=True)
class Point:
    """One sample in the stored vocabulary: metric is canonical when known, else the name."""

    metric: str
    name: str
    labels: str
    value: float
    type: str


def canonicalize(samples: Sequence[Sample]) -> list[Point]:
    """Rename the samples an engine's vocabulary knows; keep every other one raw."""
    by_name: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        by_name.setdefault(s.name, []).append(i)
    metric_of: dict[int, tuple[str, tuple[str, ...]]] = {}
    for metric, candidates in known_metrics().items():
        for name, required in candidates:
            hits = [
                i
                for i in by_name.get(name, ())
                if i not in metric_of
                and all(dict(samples[i].labels).get(k) == v for k, v in required.items())
            ]
            if hits:
                for i in hits:
                    metric_of[i] = (metric, tuple(required))
                break
    out = []
    for i, s in enumerate(samples):
        metric, drop = metric_of.get(i, (s.name, ()))
        labels = labels_text(kv for kv in s.labels if kv[0] not in drop)
        out.append(Point(metric, s.name, labels, s.value, s.type))
    return out
