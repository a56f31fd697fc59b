"""Metric vocabularies: each engine's /metrics names mapped to tokenbench's own.

Each engine (vLLM, SGLang, TensorRT-LLM, llama.cpp, the DCGM exporter) is a kind of
ENGINES (bench.registry) holding the prefixes that identify it and, per canonical name
(requests_waiting, kv_cache_usage, gpu_power_w, ...), the names it exposes. A new engine,
or a renamed metric, is one module in this package; bench.telemetry.names reads the
merged vocabulary, so figures, the terminal digest and energy per token follow.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.registry import Registry

# (exposed name, labels a sample must have): the first present candidate wins.
Candidate = tuple[str, dict[str, str]]


@dataclass(frozen=True)
class EngineNames:
    """One engine's vocabulary. `label` is how messages name it ("vLLM"); `prefixes` mark
    its metric names (empty for an exporter that is no serving engine, like DCGM)."""

    label: str
    prefixes: tuple[str, ...] = ()
    metrics: dict[str, tuple[Candidate, ...]] = field(default_factory=dict)


ENGINES: Registry[EngineNames] = Registry(
    "metrics vocabulary", package=__name__, where="a server's /metrics names"
)


def known_metrics() -> dict[str, tuple[Candidate, ...]]:
    """canonical name -> candidates of every engine, engines in registration order."""
    merged: dict[str, tuple[Candidate, ...]] = {}
    for kind in ENGINES.kinds():
        for metric, candidates in kind.obj.metrics.items():
            merged[metric] = merged.get(metric, ()) + tuple(candidates)
    return merged


def engine_prefixes() -> dict[str, tuple[str, ...]]:
    """Serving engines by the prefixes of their metric names (label -> prefixes)."""
    return {k.obj.label: k.obj.prefixes for k in ENGINES.kinds() if k.obj.prefixes}
