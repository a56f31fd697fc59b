"""Server-side telemetry during a run: the endpoint's /metrics, GPU power, joules per token.

Client latency says that P99 TTFT jumped; the server's own counters say why (requests
waiting, KV cache full, preemptions), and board power says what a token costs in energy.

    prometheus.py  the Prometheus text format -> Samples
    engines/       each engine's vocabulary, a kind of ENGINES (vLLM, SGLang, TRT-LLM,
                   llama.cpp, DCGM)
    names.py       one vocabulary for every engine (known_metrics()); unknown series are
                   kept raw under their own names
    sources/       the kinds of source (server /metrics, DCGM exporter, NVML): SOURCES
    scrapers.py    the sources' readers and the Scraper thread
                   that polls them while a load point runs, never failing the run
    recording.py   what a Scraper collected (Recording) and its stored artifact, one per
                   load point
    readers.py     stored telemetry back as a long DataFrame, and its views: queue depth,
                   KV-cache use, board power, the prompt cache
    energy.py      measured energy per output token
    terminal.py    digest(): one line for the terminal when a load point ends

Every name is importable from `bench.telemetry` itself; callers need not know the layout.
Times are `t_s`, seconds since the load point's start, on the same perf_counter clock as
every RequestRecord, so server samples line up exactly with bench.metrics.time_series.
"""

from bench.telemetry.energy import ENERGY_COLUMNS, energy_per_output_token, mean_power
from bench.telemetry.engines import ENGINES, engine_prefixes, known_metrics
from bench.telemetry.names import Point, canonicalize, engine_of
from bench.telemetry.prometheus import Sample, labels_text, parse_labels_text, parse_prometheus
from bench.telemetry.readers import (
    COLUMNS,
    frame_from_payloads,
    kv_cache_usage,
    load_payloads,
    load_telemetry,
    power_w,
    prompt_cache,
    queue_depth,
    recording_frame,
    spec_decode,
    telemetry_warnings,
)
from bench.telemetry.recording import (
    ARTIFACT_PREFIX,
    ARTIFACT_SUFFIX,
    FORMAT,
    MEDIA_TYPE,
    Recording,
    artifact_name,
    decode,
    encode,
    save_recording,
)
from bench.telemetry.scrapers import (
    DEFAULT_INTERVAL_S,
    GIVE_UP_AFTER,
    MAX_BODY_BYTES,
    MAX_SERIES,
    MAX_VALUES,
    MIN_INTERVAL_S,
    STOP_WAIT_S,
    NvmlSource,
    PrometheusSource,
    Scraper,
    Source,
    TelemetryConfig,
    TelemetryError,
    start_scraper,
)
from bench.telemetry.terminal import digest

__all__ = [
    "ARTIFACT_PREFIX",
    "ARTIFACT_SUFFIX",
    "COLUMNS",
    "DEFAULT_INTERVAL_S",
    "ENERGY_COLUMNS",
    "ENGINES",
    "FORMAT",
    "GIVE_UP_AFTER",
    "MAX_BODY_BYTES",
    "MAX_SERIES",
    "MAX_VALUES",
    "MEDIA_TYPE",
    "MIN_INTERVAL_S",
    "STOP_WAIT_S",
    "NvmlSource",
    "Point",
    "PrometheusSource",
    "Recording",
    "Sample",
    "Scraper",
    "Source",
    "TelemetryConfig",
    "TelemetryError",
    "artifact_name",
    "canonicalize",
    "decode",
    "digest",
    "encode",
    "energy_per_output_token",
    "engine_of",
    "engine_prefixes",
    "frame_from_payloads",
    "known_metrics",
    "kv_cache_usage",
    "labels_text",
    "load_payloads",
    "load_telemetry",
    "mean_power",
    "parse_labels_text",
    "parse_prometheus",
    "power_w",
    "prompt_cache",
    "spec_decode",
    "queue_depth",
    "recording_frame",
    "save_recording",
    "start_scraper",
    "telemetry_warnings",
]
