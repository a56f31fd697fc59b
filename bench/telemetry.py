"""Server-side telemetry during a run: the endpoint's /metrics, GPU power, joules per token.

Client latency says that P99 TTFT jumped; the server's own counters say why (requests
waiting, KV cache full, preemptions), and board power says what a token costs in energy.
While a load point runs, a `Scraper` thread polls each source every `interval_s` (1 s):

- "server": the endpoint's Prometheus /metrics (vLLM, SGLang, TensorRT-LLM, the simulator);
- "dcgm": a DCGM exporter URL (Prometheus text too, one series per GPU);
- "nvml": the local GPUs through nvidia-ml-py, when the benchmark runs on the GPU host.

Known metrics are renamed to one vocabulary whatever the engine (`KNOWN_METRICS`:
requests_waiting, requests_running, kv_cache_usage, ..., gpu_power_w); everything else is
kept under its own name, histograms included. The scraper never touches the load
generator's event loop: it is a thread with its own small httpx client, it does one short
parse per scrape, and every failure (404, garbage, refused, timeout) becomes a warning,
never a failed run. Its loops are bounded: a source that never answered is dropped after
GIVE_UP_AFTER tries, and a load point keeps at most MAX_SERIES series per source and
MAX_VALUES values in all.

Storage: one run artifact per load point (`telemetry/lp<N>.json.gz`, gzip'd JSON, columnar:
per source one array of scrape times and one value array per series), written once when
the point ends. Why an artifact and not a table: telemetry is always read whole, one load
point or one run at a time, to draw it or to integrate power; nothing needs SQL across runs.
An artifact needs no schema migration (existing databases and the PostgreSQL path keep
working untouched), and vLLM's ~300 series at 1 Hz would be a million rows an hour as one
row per sample. The cost: samples of a point that was killed mid-way are lost (its requests
are not), and filtering by metric happens in pandas after the read.

Times are `t_s`, seconds since the load point's start, on the same perf_counter clock as
every RequestRecord, so server samples line up exactly with bench.metrics.time_series.
Readers for the dashboard and exports: `load_telemetry`, `queue_depth`, `kv_cache_usage`,
`power_w`, `energy_per_output_token`.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import logging
import math
import re
import threading
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:  # pandas is imported where frames are built, not by every run
    import pandas as pd

log = logging.getLogger("tokenbench.telemetry")

ARTIFACT_PREFIX = "telemetry/lp"
ARTIFACT_SUFFIX = ".json.gz"
MEDIA_TYPE = "application/gzip"
FORMAT = "tokenbench-telemetry/1"

DEFAULT_INTERVAL_S = 1.0
MIN_INTERVAL_S = 0.05
GIVE_UP_AFTER = 3  # failed tries, with no success yet, before a source is dropped
MAX_SERIES = 5000  # per source and load point; a real vLLM /metrics has a few hundred
MAX_VALUES = 5_000_000  # per load point (40 MB of float64): about 4.6 h of vLLM at 1 Hz
MAX_BODY_BYTES = 8 * 1024 * 1024
STOP_WAIT_S = 10.0  # a scrape in flight ends within its timeout (2 s per URL)


class TelemetryError(RuntimeError):
    """A telemetry source cannot be read; the message says which and why."""


# ---------------------------------------------------------------- Prometheus text format


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


# ---------------------------------------------------------------- one vocabulary for all engines

# canonical name -> candidates (exposed name, required labels), first present one wins. One
# engine often exposes two names for one thing (vLLM's gpu_cache_usage_perc, renamed
# kv_cache_usage_perc, the only one left in vLLM 0.32); the first present is used and the
# other is kept raw. Names checked against the engines themselves: vLLM 0.32 (reference/
# real-servers.md), llama.cpp's llama-server as built from llama-cpp-python 0.3.36's sdist
# (tests/real_servers), SGLang and TensorRT-LLM from their docs.
KNOWN_METRICS: dict[str, tuple[tuple[str, dict[str, str]], ...]] = {
    "requests_running": (
        ("vllm:num_requests_running", {}),
        ("sglang:num_running_reqs", {}),
        ("nv_trt_llm_request_metrics", {"request_type": "active"}),  # Triton TRT-LLM backend
        ("llamacpp:requests_processing", {}),  # slots busy
    ),
    "requests_waiting": (
        ("vllm:num_requests_waiting", {}),
        ("sglang:num_queue_reqs", {}),
        ("nv_trt_llm_request_metrics", {"request_type": "waiting"}),
        ("llamacpp:requests_deferred", {}),  # waiting for a free slot
    ),
    "kv_cache_usage": (  # fraction of the KV cache in use, 0..1
        ("vllm:kv_cache_usage_perc", {}),
        ("vllm:gpu_cache_usage_perc", {}),
        ("sglang:token_usage", {}),
        ("trtllm_kv_cache_utilization", {}),  # trtllm-serve /prometheus/metrics
        ("trtllm:kv_cache_utilization", {}),  # the same through Dynamo
        ("nv_trt_llm_kv_cache_block_metrics", {"kv_cache_block_type": "fraction"}),
        ("llamacpp:kv_cache_usage_ratio", {}),  # older llama-server builds only
    ),
    # Every prompt token of every request, cached or not.
    "prompt_tokens_total": (
        ("vllm:prompt_tokens_total", {}),
        ("sglang:prompt_tokens_total", {}),
    ),
    # Prompt tokens the engine computed, the cached ones left out (llama.cpp counts these).
    "prompt_tokens_computed_total": (("llamacpp:prompt_tokens_total", {}),),
    # Prompt tokens answered from the prefix cache.
    "prompt_tokens_cached_total": (("llamacpp:prompt_tokens_cached_total", {}),),
    # vLLM's prefix cache, in tokens: looked up, and found.
    "prefix_cache_queries_total": (
        ("vllm:prefix_cache_queries_total", {}),
        ("vllm:gpu_prefix_cache_queries_total", {}),  # its name before vLLM 0.9
    ),
    "prefix_cache_hits_total": (
        ("vllm:prefix_cache_hits_total", {}),
        ("vllm:gpu_prefix_cache_hits_total", {}),
    ),
    # A recent hit rate, 0..1 (SGLang's gauge; vLLM's before the V1 engine).
    "prefix_cache_hit_rate": (
        ("sglang:cache_hit_rate", {}),
        ("vllm:gpu_prefix_cache_hit_rate", {}),
    ),
    "generation_tokens_total": (
        ("vllm:generation_tokens_total", {}),
        ("sglang:generation_tokens_total", {}),
        ("llamacpp:tokens_predicted_total", {}),
    ),
    "preemptions_total": (("vllm:num_preemptions_total", {}),),
    "gpu_power_w": (("DCGM_FI_DEV_POWER_USAGE", {}),),
    "gpu_sm_clock_mhz": (("DCGM_FI_DEV_SM_CLOCK", {}),),
    "gpu_memory_used_mib": (("DCGM_FI_DEV_FB_USED", {}),),
    "gpu_throttle_reasons": (  # bit mask, NVML's nvmlClocksEventReasons
        ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", {}),
        ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", {}),  # its name since DCGM 3.3
    ),
}

# Serving engines by the prefix of their metric names: a server /metrics that has none of
# these is an engine tokenbench cannot read (said once, with this list).
ENGINE_PREFIXES: dict[str, tuple[str, ...]] = {
    "vLLM": ("vllm:",),
    "SGLang": ("sglang:",),
    "TensorRT-LLM": ("trtllm", "nv_trt_llm"),
    "llama.cpp": ("llamacpp:",),
}


def engine_of(names: Iterable[str]) -> str | None:
    """The serving engine whose metric names these are, or None for none tokenbench knows."""
    for name in names:
        for engine, prefixes in ENGINE_PREFIXES.items():
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
    """Rename the samples KNOWN_METRICS knows; keep every other one raw under its name."""
    by_name: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        by_name.setdefault(s.name, []).append(i)
    metric_of: dict[int, tuple[str, tuple[str, ...]]] = {}
    for metric, candidates in KNOWN_METRICS.items():
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


# ---------------------------------------------------------------- sources


class Source(Protocol):
    """A thing the scraper polls: read() returns this instant's points or raises."""

    name: str
    where: str

    def read(self) -> list[Point]: ...

    def close(self) -> None: ...


class PrometheusSource:
    """An HTTP endpoint serving Prometheus text: the server's /metrics or a DCGM exporter.

    `urls` are tried in order until one answers; the first that does is kept (trtllm-serve
    serves /prometheus/metrics, the others /metrics).
    """

    def __init__(self, name: str, urls: Sequence[str], timeout_s: float) -> None:
        import httpx

        self.name = name
        self.urls = list(urls)
        self.where = self.urls[0]
        self._client = httpx.Client(timeout=timeout_s, trust_env=False, follow_redirects=True)
        self._chosen: str | None = None

    def _get(self, url: str) -> str:
        import httpx

        try:
            r = self._client.get(url, headers={"Accept": "text/plain"})
        except httpx.HTTPError as exc:
            raise TelemetryError(f"GET {url}: {type(exc).__name__}: {exc}") from None
        if r.status_code != 200:
            raise TelemetryError(f"GET {url} answered HTTP {r.status_code}")
        if len(r.content) > MAX_BODY_BYTES:
            raise TelemetryError(f"GET {url}: body over {MAX_BODY_BYTES} bytes")
        return r.text

    def read(self) -> list[Point]:
        urls = [self._chosen] if self._chosen else self.urls
        error: TelemetryError | None = None
        for url in urls:
            try:
                text = self._get(url)
            except TelemetryError as exc:
                error = error or exc
                continue
            try:
                points = canonicalize(parse_prometheus(text))
            except ValueError as exc:
                raise TelemetryError(f"GET {url}: {exc}") from None
            self._chosen = self.where = url
            return points
        assert error is not None
        raise error

    def close(self) -> None:
        self._client.close()


class NvmlSource:
    """The GPUs of this host through NVML (pip install nvidia-ml-py): power, SM clock,
    memory used and throttle reasons per GPU, in the same names as the DCGM exporter's."""

    def __init__(self, name: str = "nvml") -> None:
        try:
            import pynvml
        except ImportError:
            raise TelemetryError(
                "--nvml needs nvidia-ml-py (pip install 'tokenbench[gpu]'); no GPU telemetry"
            ) from None
        self.name = name
        self.where = "NVML"
        self._nv = pynvml
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except pynvml.NVMLError as exc:
            raise TelemetryError(
                f"NVML cannot start ({exc}); is this the GPU host with the NVIDIA driver?"
            ) from None
        if not self._handles:
            raise TelemetryError("NVML sees no GPU on this host")

    def read(self) -> list[Point]:
        nv = self._nv
        reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        points = []
        for i, h in enumerate(self._handles):
            labels = labels_text([("gpu", str(i))])
            readings = {
                "gpu_power_w": lambda h=h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0,  # mW
                "gpu_sm_clock_mhz": lambda h=h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                "gpu_memory_used_mib": lambda h=h: nv.nvmlDeviceGetMemoryInfo(h).used / 2**20,
                "gpu_throttle_reasons": (lambda h=h: reasons(h)) if reasons else None,
            }
            for metric, read in readings.items():
                if read is None:
                    continue
                try:
                    value = float(read())
                except nv.NVMLError:
                    continue  # not supported on this board: leave the series out
                points.append(Point(metric, metric, labels, value, "gauge"))
        if not points:
            raise TelemetryError("NVML returned no readings")
        return points

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._nv.nvmlShutdown()


# ---------------------------------------------------------------- configuration and scraper


@dataclass
class TelemetryConfig:
    """What to scrape during a run (the CLI's --scrape-metrics, --metrics-url, ...).

    `metrics_url` None means `{base_url}/metrics`, then `{base_url}/prometheus/metrics`
    (trtllm-serve's path) if that one does not answer.
    """

    scrape_metrics: bool = True
    metrics_url: str | None = None
    interval_s: float = DEFAULT_INTERVAL_S
    dcgm_url: str | None = None
    nvml: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.interval_s) and self.interval_s >= MIN_INTERVAL_S):
            raise ValueError(
                f"--metrics-interval {self.interval_s!r}: give at least {MIN_INTERVAL_S} s"
            )

    @property
    def enabled(self) -> bool:
        return self.scrape_metrics or bool(self.dcgm_url) or self.nvml

    def sources(self, base_url: str, warn: Callable[[str], None]) -> list[Source]:
        """The sources to poll; one that cannot even start (no NVML) is a warning."""
        timeout = min(max(self.interval_s, 0.5), 2.0)
        out: list[Source] = []
        if self.scrape_metrics:
            base = base_url.rstrip("/")
            urls = [self.metrics_url] if self.metrics_url else [f"{base}/metrics"]
            if not self.metrics_url:
                urls.append(f"{base}/prometheus/metrics")
            out.append(PrometheusSource("server", urls, timeout))
        if self.dcgm_url:
            out.append(PrometheusSource("dcgm", [self.dcgm_url], timeout))
        if self.nvml:
            try:
                out.append(NvmlSource())
            except TelemetryError as exc:
                warn(str(exc))
        return out


@dataclass
class _Series:
    metric: str
    name: str
    labels: str
    type: str
    values: array = field(default_factory=lambda: array("d"))


@dataclass
class _SourceLog:
    """One source's samples: scrape times, and one value per scrape for every series."""

    name: str
    where: str
    times_ns: array = field(default_factory=lambda: array("q"))
    series: dict[tuple[str, str, str], _Series] = field(default_factory=dict)
    ok: int = 0
    failed: int = 0
    dropped_series: int = 0
    engine: str | None = None  # the serving engine its metric names belong to (server only)


@dataclass
class Recording:
    """What one Scraper collected; to_payload() makes the stored artifact."""

    sources: list[_SourceLog]
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


class Scraper:
    """Polls sources on a background thread from start() to stop(), never raising.

    Each tick reads every source in turn; one that fails is logged once per distinct
    error, and dropped after GIVE_UP_AFTER failures if it never answered. Ticks are on a
    fixed cadence (no drift); a slow source makes the thread skip ticks, never pile them
    up. stop() takes one last reading, so counters are known at the point's very end.
    """

    def __init__(
        self,
        sources: Sequence[Source],
        interval_s: float = DEFAULT_INTERVAL_S,
        *,
        warnings: Sequence[str] = (),
        on_warning: Callable[[str], None] | None = None,
    ) -> None:
        self.sources = list(sources)
        self.interval_s = interval_s
        self.warnings: list[str] = list(warnings)
        self.on_warning = on_warning or log.warning
        self._logs = [_SourceLog(s.name, s.where) for s in self.sources]
        self._alive = [True] * len(self.sources)
        self._values = 0
        self._full = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)
            with contextlib.suppress(Exception):
                self.on_warning(message)

    def _read(self, i: int) -> None:
        source, slog = self.sources[i], self._logs[i]
        before = perf_counter_ns()
        try:
            points = source.read()
        except Exception as exc:  # noqa: BLE001 - any failure is a warning, never a failed run
            slog.failed += 1
            text = str(exc) if isinstance(exc, TelemetryError) else f"{type(exc).__name__}: {exc}"
            self._warn(f"telemetry ({source.name}): {text}")
            if slog.ok == 0 and slog.failed >= GIVE_UP_AFTER:
                self._alive[i] = False
                self._warn(
                    f"telemetry ({source.name}): no answer from {source.where} after "
                    f"{slog.failed} tries; not scraped for the rest of this load point"
                )
            return
        self._record(slog, (before + perf_counter_ns()) // 2, points)
        slog.where = source.where
        if source.name == "server" and slog.ok == 1:
            self._check_engine(slog, points)

    def _check_engine(self, slog: _SourceLog, points: list[Point]) -> None:
        """Name the engine behind a server's /metrics; warn once when it is none we know, as
        then queue depth, KV-cache and prompt-cache figures cannot be read from it."""
        slog.engine = engine_of(p.name for p in points)
        if slog.engine is None:
            known = ", ".join(ENGINE_PREFIXES)
            self._warn(
                f"telemetry (server): {slog.where} answers with {len(points)} samples but none "
                f"from an engine tokenbench knows ({known}); they are stored raw, and queue "
                "depth, KV-cache and prompt-cache figures are not available for this run"
            )

    def _record(self, slog: _SourceLog, t_ns: int, points: list[Point]) -> None:
        if self._full:
            return
        k = len(slog.times_ns)
        if self._values + len(slog.series) + len(points) > MAX_VALUES:
            self._full = True
            self._warn(
                f"telemetry: {MAX_VALUES:,} values kept; later samples of this point dropped"
            )
            return
        slog.times_ns.append(t_ns)
        slog.ok += 1
        seen = set()
        for p in points:
            key = (p.metric, p.labels, p.name)
            if key in seen:
                continue  # a duplicated line: keep the first
            seen.add(key)
            s = slog.series.get(key)
            if s is None:
                if len(slog.series) >= MAX_SERIES:
                    slog.dropped_series += 1
                    if slog.dropped_series == 1:
                        self._warn(
                            f"telemetry ({slog.name}): over {MAX_SERIES} series; rest dropped"
                        )
                    continue
                s = slog.series[key] = _Series(p.metric, p.name, p.labels, p.type)
                s.values.extend([math.nan] * k)
            s.values.append(p.value)
        for s in slog.series.values():
            if len(s.values) == k:  # absent from this scrape
                s.values.append(math.nan)
        self._values += len(slog.series)

    def tick(self) -> None:
        """Read every live source once (the thread calls this; tests may too)."""
        with self._lock:
            for i in range(len(self.sources)):
                if self._alive[i]:
                    self._read(i)

    def _loop(self, start: int) -> None:
        step = int(self.interval_s * 1e9)
        k = 0
        while True:
            k = max(k + 1, (perf_counter_ns() - start) // step + 1)  # skip missed ticks
            if self._stop.wait(max(0.0, (start + k * step - perf_counter_ns()) / 1e9)):
                return
            self.tick()

    def start(self) -> Scraper:
        """Take the first reading now, before the point's first request (so counters have a
        baseline; it costs one scrape, milliseconds), then keep reading on the thread."""
        if self.sources and self._thread is None:
            start = perf_counter_ns()
            self.tick()
            self._thread = threading.Thread(
                target=self._loop, args=(start,), name="tokenbench-telemetry"
            )
            self._thread.daemon = True
            self._thread.start()
        return self

    def stop(self) -> Recording:
        """Stop the thread (waiting at most a few seconds), take a last reading, close."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=STOP_WAIT_S)
            if self._thread.is_alive():
                self._warn(f"telemetry: the scraper did not stop in {STOP_WAIT_S:g} s; left behind")
            else:
                self.tick()
        for s in self.sources:
            with contextlib.suppress(Exception):
                s.close()
        return Recording(self._logs, list(self.warnings), self.interval_s)


def start_scraper(
    config: TelemetryConfig, base_url: str, on_warning: Callable[[str], None] | None = None
) -> Scraper | None:
    """A started Scraper for the config, or None when nothing is to be scraped.

    `on_warning` sees each distinct problem once (default: the tokenbench.telemetry logger).
    """
    if not config.enabled:
        return None
    early: list[str] = []
    sources = config.sources(base_url, early.append)
    for message in early:
        (on_warning or log.warning)(message)
    return Scraper(sources, config.interval_s, warnings=early, on_warning=on_warning).start()


# ---------------------------------------------------------------- storage


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


def load_payloads(run_id: str, db: Any = None, load_point: int | None = None) -> list[dict]:
    """The stored telemetry artifacts of a run (one per load point), in load-point order."""
    from bench.store import load_artifact, load_artifacts

    if load_point is None:
        found = [data for _, data in load_artifacts(run_id, ARTIFACT_PREFIX, db)]
    else:
        data = load_artifact(run_id, artifact_name(load_point), db)
        found = [] if data is None else [data]
    payloads = [decode(data) for data in found]
    return sorted(payloads, key=lambda p: p.get("load_point", 0))


COLUMNS = ["load_point", "t_s", "source", "metric", "labels", "value", "name", "type"]


def frame_from_payloads(payloads: Iterable[dict]) -> pd.DataFrame:
    """Long format, one row per sample; NaN (series absent from a scrape) left out."""
    import pandas as pd

    parts: list[pd.DataFrame] = []
    for p in payloads:
        for source, src in p.get("sources", {}).items():
            t = np.asarray(src.get("t_s", []), dtype=np.float64)
            for s in src.get("series", []):
                v = np.array([np.nan if x is None else x for x in s["values"]], dtype=np.float64)
                m = min(len(t), len(v))
                keep = ~np.isnan(v[:m])
                n = int(keep.sum())
                if not n:
                    continue
                parts.append(
                    pd.DataFrame(
                        {
                            "load_point": np.full(n, p.get("load_point", 0), dtype=np.int64),
                            "t_s": t[:m][keep],
                            "source": source,
                            "metric": s["metric"],
                            "labels": s.get("labels", ""),
                            "value": v[:m][keep],
                            "name": s.get("name", s["metric"]),
                            "type": s.get("type", "untyped"),
                        }
                    )
                )
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype=_dtype(c)) for c in COLUMNS})
    df = pd.concat(parts, ignore_index=True)
    return df.sort_values(["load_point", "source", "metric", "labels", "t_s"], ignore_index=True)


def _dtype(column: str) -> str:
    return {"load_point": "int64", "t_s": "float64", "value": "float64"}.get(column, "object")


def load_telemetry(run_id: str, db: Any = None, load_point: int | None = None) -> pd.DataFrame:
    """A run's telemetry (or one load point's) as a long DataFrame.

    Columns: load_point, t_s (seconds since that load point's start, the clock of its
    RequestRecords), source ("server", "dcgm", "nvml"), metric (canonical name from
    KNOWN_METRICS, else the exposed name), labels (`k="v",...`), value, name (the exposed
    name), type (counter, gauge, histogram, ...). Empty (with these columns) when the run
    has none. `run_id` may be an id prefix or a run name.
    """
    from bench.store import resolve_run

    run_id = resolve_run(run_id, db)
    return frame_from_payloads(load_payloads(run_id, db, load_point))


def telemetry_warnings(run_id: str, db: Any = None) -> dict[int, list[str]]:
    """Per load point, what went wrong while scraping (for "no server telemetry because...")."""
    return {p["load_point"]: p.get("warnings", []) for p in load_payloads(run_id, db)}


# ---------------------------------------------------------------- helpers for figures and exports


def _per_scrape(df: pd.DataFrame, metrics: Sequence[str], how: str) -> pd.DataFrame:
    """Server samples of the given metrics aggregated over labels, one row per scrape."""
    import pandas as pd

    sub = df[(df["source"] == "server") & df["metric"].isin(metrics)]
    cols = ["load_point", "t_s", *metrics]
    if sub.empty:
        return pd.DataFrame({c: pd.Series(dtype=_dtype(c)) for c in cols})
    wide = sub.pivot_table(
        index=["load_point", "t_s"], columns="metric", values="value", aggfunc=how
    )
    wide = wide.reindex(columns=list(metrics)).reset_index()
    wide.columns.name = None
    return wide[cols]


def queue_depth(df: pd.DataFrame) -> pd.DataFrame:
    """Requests waiting and running on the server per scrape (summed over engines/ranks).

    Columns: load_point, t_s, requests_waiting, requests_running (NaN where not exposed).
    """
    return _per_scrape(df, ["requests_waiting", "requests_running"], "sum")


def kv_cache_usage(df: pd.DataFrame) -> pd.DataFrame:
    """KV-cache use per scrape as a fraction 0..1 (the fullest engine when several).

    Columns: load_point, t_s, kv_cache_usage.
    """
    return _per_scrape(df, ["kv_cache_usage"], "max")


def _gpu(labels: str) -> str:
    found = parse_labels_text(labels)
    return found.get("gpu", found.get("UUID", labels))


def power_w(df: pd.DataFrame) -> pd.DataFrame:
    """Board power per GPU and sample: load_point, t_s, source, gpu, power_w.

    When both a DCGM exporter and NVML report, DCGM is used (one source per load point,
    so the same board is never counted twice).
    """
    import pandas as pd

    sub = df[(df["metric"] == "gpu_power_w") & df["source"].isin(["dcgm", "nvml"])]
    cols = ["load_point", "t_s", "source", "gpu", "power_w"]
    if sub.empty:
        return pd.DataFrame({c: pd.Series(dtype=_dtype(c)) for c in cols})
    keep = []
    for _, part in sub.groupby("load_point"):
        sources = set(part["source"])
        keep.append(part[part["source"] == ("dcgm" if "dcgm" in sources else "nvml")])
    out = pd.concat(keep)
    out = out.assign(gpu=out["labels"].map(_gpu), power_w=out["value"])
    return out[cols].sort_values(["load_point", "gpu", "t_s"], ignore_index=True)


def mean_power(t_s: np.ndarray, watts: np.ndarray, duration_s: float) -> float | None:
    """Time-weighted mean power over [0, duration_s] from samples (trapezoids between
    them, each end held flat), None without a sample in the window."""
    inside = (t_s >= 0) & (t_s <= duration_s)
    t, w = t_s[inside], watts[inside]
    if len(t) == 0:
        return None
    order = np.argsort(t)
    t, w = t[order], w[order]
    if len(t) == 1 or duration_s <= 0:
        return float(np.mean(w))
    t = np.concatenate([[0.0], t, [duration_s]])
    w = np.concatenate([[w[0]], w, [w[-1]]])
    return float(np.sum((w[1:] + w[:-1]) / 2 * np.diff(t)) / duration_s)


ENERGY_COLUMNS = [
    "load_point",
    "source",
    "gpus",
    "duration_s",
    "mean_power_w_per_gpu",
    "energy_j",
    "output_tokens",
    "output_tokens_per_s",
    "joules_per_output_token",
    "kwh_per_mtok",
    "energy_usd_per_mtok",
]


def energy_per_output_token(run_id: str, db: Any = None, catalogue: Any = None) -> pd.DataFrame:
    """Measured energy per delivered output token, one row per load point with power samples.

    Energy = each GPU's time-weighted mean board power over the whole load point x its
    duration, summed over the GPUs the telemetry saw; output tokens = those of its completed
    requests. J/token, kWh/Mtok and electricity $/Mtok come from bench.cost.energy_estimate
    with the measured power (so $/kWh and PUE are the catalogue's). Empty when no GPU power
    was recorded: callers then fall back to energy_estimate's profile-TDP figure.
    """
    import pandas as pd

    from bench.cost import energy_estimate
    from bench.records import OK
    from bench.store import get_run, load_columns

    run = get_run(run_id, db)
    power = power_w(load_telemetry(run.id, db))
    rows = []
    for lp in run.load_points:
        part = power[power["load_point"] == lp.load_point]
        if part.empty or lp.ended_ns is None:
            continue
        duration = (lp.ended_ns - (lp.started_ns or 0)) / 1e9
        means = [
            mean_power(g["t_s"].to_numpy(), g["power_w"].to_numpy(), duration)
            for _, g in part.groupby("gpu")
        ]
        means = [m for m in means if m is not None]
        if not means or duration <= 0:
            continue
        cols = load_columns(run.id, lp.load_point, db)
        tokens = float(np.nansum(cols.output_tokens[cols.state == OK]))
        gpus = len(means)
        per_gpu = sum(means) / gpus
        est = energy_estimate(
            run.gpu_type or "unknown",
            gpus,
            tokens / duration,
            catalogue,
            measured_power_w=per_gpu,
        )
        rows.append(
            {
                "load_point": lp.load_point,
                "source": part["source"].iloc[0],
                "gpus": gpus,
                "duration_s": duration,
                "mean_power_w_per_gpu": per_gpu,
                "energy_j": per_gpu * gpus * duration,
                "output_tokens": tokens,
                "output_tokens_per_s": tokens / duration,
                "joules_per_output_token": est.joules_per_token,
                "kwh_per_mtok": est.kwh_per_mtok,
                "energy_usd_per_mtok": est.energy_usd_per_mtok,
            }
        )
    return pd.DataFrame(rows, columns=ENERGY_COLUMNS)


def _growth(df: pd.DataFrame, metric: str) -> float | None:
    """How much a server counter grew over the samples given (summed over label sets);
    None when it is absent or went down (a restarted server)."""
    sub = df[(df["source"] == "server") & (df["metric"] == metric)]
    if sub.empty:
        return None
    grew = sub.sort_values("t_s").groupby("labels")["value"].agg(lambda v: v.iloc[-1] - v.iloc[0])
    total = float(grew.sum())
    return total if total >= 0 else None


def prompt_cache(df: pd.DataFrame) -> dict | None:
    """What the server's own counters say about its prefix cache over one load point:
    {"counters", "cached_tokens", "prompt_tokens", "share"}, or None when it exposes none.

    llama.cpp counts cached and computed prompt tokens apart; vLLM counts prefix-cache
    lookups and hits in tokens; SGLang only has a recent hit-rate gauge (its mean is used).
    """
    cached = _growth(df, "prompt_tokens_cached_total")
    computed = _growth(df, "prompt_tokens_computed_total")
    if cached is not None and computed is not None:
        total = cached + computed
        return _cache_figures("llama.cpp prompt_tokens_cached/prompt_tokens", cached, total)
    hits = _growth(df, "prefix_cache_hits_total")
    queries = _growth(df, "prefix_cache_queries_total")
    if hits is not None and queries is not None:
        return _cache_figures("vLLM prefix_cache_hits/queries", hits, queries)
    rate = df[(df["source"] == "server") & (df["metric"] == "prefix_cache_hit_rate")]
    if not rate.empty:
        return {
            "counters": f"{rate['name'].iloc[0]} (mean of the gauge)",
            "cached_tokens": None,
            "prompt_tokens": None,
            "share": float(rate["value"].mean()),
        }
    return None


def _cache_figures(counters: str, cached: float, total: float) -> dict:
    return {
        "counters": counters,
        "cached_tokens": int(cached),
        "prompt_tokens": int(total),
        "share": cached / total if total > 0 else None,
    }


def recording_frame(recording: Recording, t0_ns: int) -> pd.DataFrame:
    """A Recording (one load point) as load_telemetry's long DataFrame."""
    return frame_from_payloads([recording.to_payload(t0_ns, 0)])


# ---------------------------------------------------------------- a digest for the terminal


def digest(recording: Recording, t0_ns: int, duration_s: float) -> str | None:
    """One line about a load point's telemetry ("server: waiting max 12, KV max 93%, ...")."""
    df = recording_frame(recording, t0_ns)
    if df.empty:
        return None
    bits = []
    q = queue_depth(df)
    if q["requests_waiting"].notna().any():
        bits.append(f"waiting max {q['requests_waiting'].max():,.0f}")
    if q["requests_running"].notna().any():
        bits.append(f"running max {q['requests_running'].max():,.0f}")
    kv = kv_cache_usage(df)
    if kv["kv_cache_usage"].notna().any():
        bits.append(f"KV cache max {kv['kv_cache_usage'].max():.0%}")
    pre = df[(df["source"] == "server") & (df["metric"] == "preemptions_total")]
    if not pre.empty:
        grew = pre.groupby("labels")["value"].agg(lambda v: v.iloc[-1] - v.iloc[0]).sum()
        bits.append(f"preemptions +{grew:,.0f}")
    cache = prompt_cache(df)
    if cache is not None and cache["share"] is not None:
        of = f" of {cache['prompt_tokens']:,} prompt tokens" if cache["prompt_tokens"] else ""
        bits.append(f"prompt cache {cache['share']:.0%}{of}")
    power = power_w(df)
    if not power.empty:
        means = [
            mean_power(g["t_s"].to_numpy(), g["power_w"].to_numpy(), duration_s)
            for _, g in power.groupby("gpu")
        ]
        means = [m for m in means if m is not None]
        if means:
            bits.append(f"GPU power {sum(means) / len(means):,.0f} W/GPU x{len(means)}")
    return "server telemetry: " + ", ".join(bits) if bits else None
