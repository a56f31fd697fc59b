"""The shipped telemetry sources. The readers live in bench.telemetry.scrapers (imported
when a source is opened: scrapers reads this registry)."""

from __future__ import annotations

from bench.telemetry.sources import SOURCES, SourceKind


def _server(config, base_url: str, timeout_s: float):
    from bench.backends.openai import METRICS_PATHS
    from bench.telemetry.scrapers import PrometheusSource

    base = base_url.rstrip("/")
    urls = [config.metrics_url] if config.metrics_url else [base + p for p in METRICS_PATHS]
    return PrometheusSource("server", urls, timeout_s)


def _dcgm(config, base_url: str, timeout_s: float):
    from bench.telemetry.scrapers import PrometheusSource

    return PrometheusSource("dcgm", [config.dcgm_url], timeout_s)


def _nvml(config, base_url: str, timeout_s: float):
    from bench.telemetry.scrapers import NvmlSource

    return NvmlSource()


SOURCES.register(
    "server",
    "the endpoint's Prometheus /metrics (then /prometheus/metrics): queue, KV cache, tokens",
    SourceKind(lambda config: config.scrape_metrics, _server),
)
SOURCES.register(
    "dcgm",
    "a DCGM exporter's /metrics (--dcgm-url): GPU power, clocks, memory, throttling",
    SourceKind(lambda config: bool(config.dcgm_url), _dcgm),
)
SOURCES.register(
    "nvml",
    "this host's GPUs through NVML (--nvml, nvidia-ml-py): power, clocks, memory",
    SourceKind(lambda config: config.nvml, _nvml),
)
