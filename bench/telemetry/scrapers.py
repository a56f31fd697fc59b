"""Polling the telemetry sources while a load point runs: server /metrics, DCGM, NVML.

A `Scraper` thread polls each source every `interval_s` (1 s):

- "server": the endpoint's Prometheus /metrics (vLLM, SGLang, TensorRT-LLM, the simulator);
- "dcgm": a DCGM exporter URL (Prometheus text too, one series per GPU);
- "nvml": the local GPUs through nvidia-ml-py, when the benchmark runs on the GPU host.

The scraper never touches the load generator's event loop: it is a thread with its own
small httpx client, it does one short parse per scrape, and every failure (404, garbage,
refused, timeout) becomes a warning, never a failed run. Its loops are bounded: a source
that never answered is dropped after GIVE_UP_AFTER tries, and a load point keeps at most
MAX_SERIES series per source and MAX_VALUES values in all.

Scrape times are perf_counter_ns, the clock of every RequestRecord, so server samples line
up exactly with the client's.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Protocol

from bench.telemetry.engines import engine_prefixes
from bench.telemetry.names import Point, canonicalize, engine_of
from bench.telemetry.prometheus import labels_text, parse_prometheus
from bench.telemetry.recording import Recording, SeriesLog, SourceLog
from bench.telemetry.sources import SOURCES

log = logging.getLogger("tokenbench.telemetry")

DEFAULT_INTERVAL_S = 1.0
MIN_INTERVAL_S = 0.05
GIVE_UP_AFTER = 3  # failed tries, with no success yet, before a source is dropped
MAX_SERIES = 5000  # per source and load point; a real vLLM /metrics has a few hundred
MAX_VALUES = 5_000_000  # per load point (40 MB of float64): about 4.6 h of vLLM at 1 Hz
MAX_BODY_BYTES = 8 * 1024 * 1024
STOP_WAIT_S = 10.0  # a scrape in flight ends within its timeout (2 s per URL)


class TelemetryError(RuntimeError):
    """A telemetry source cannot be read; the message says which and why."""


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
        return any(kind.obj.wanted(self) for kind in SOURCES.kinds())

    def sources(self, base_url: str, warn: Callable[[str], None]) -> list[Source]:
        """The sources to poll (bench.telemetry.sources); one that cannot even start (no
        NVML) is a warning."""
        timeout = min(max(self.interval_s, 0.5), 2.0)
        out: list[Source] = []
        for kind in SOURCES.kinds():
            if kind.obj.wanted(self):
                try:
                    out.append(kind.obj.make(self, base_url, timeout))
                except TelemetryError as exc:
                    warn(str(exc))
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
        self._logs = [SourceLog(s.name, s.where) for s in self.sources]
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

    def _check_engine(self, slog: SourceLog, points: list[Point]) -> None:
        """Name the engine behind a server's /metrics; warn once when it is none we know, as
        then queue depth, KV-cache and prompt-cache figures cannot be read from it."""
        slog.engine = engine_of(p.name for p in points)
        if slog.engine is None:
            known = ", ".join(engine_prefixes())
            self._warn(
                f"telemetry (server): {slog.where} answers with {len(points)} samples but none "
                f"from an engine tokenbench knows ({known}); they are stored raw, and queue "
                "depth, KV-cache and prompt-cache figures are not available for this run"
            )

    def _record(self, slog: SourceLog, t_ns: int, points: list[Point]) -> None:
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
                s = slog.series[key] = SeriesLog(p.metric, p.name, p.labels, p.type)
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
