"""Records -> Summary: percentiles, throughput, goodput, send lag, per-second time series.

Definitions follow `vllm bench serve` (see DESIGN.md): TTFT and E2EL from the actual send
time, TPOT = (E2EL - TTFT) / (output_tokens - 1), ITL = gaps between content chunks. TTFT is
also computed against the intended send time, so queueing inside the client stays visible.
This module is the only place these definitions are computed.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from math import log

import numpy as np

from bench.records import CANCELLED, FAILED, OK, RequestRecord

DEFAULT_PERCENTILES: tuple[float, ...] = (50, 90, 95, 99, 99.9)
LATENCY_METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2el")
# How a latency metric is named to people (tables, chart axes, legends).
LATENCY_LABELS: dict[str, str] = {
    "ttft": "TTFT",
    "tpot": "TPOT",
    "itl": "ITL",
    "e2el": "E2E latency",
}
# The figures an SLO, --fail-on or a sweep may name besides STAT_METRIC_ms (p99_ttft_ms, ...):
# Summary.value and CurvePoint.value read every one of them.
FLAT_METRICS: tuple[str, ...] = (
    "error_rate",
    "requests_per_s",
    "output_tokens_per_s",
    "total_tokens_per_s",
    "goodput_requests_per_s",
    "completed",
    "failed",
)
# A figure of one traffic class (bench.scenario's `classes:`) is named CLASS:FIGURE, e.g.
# agent:p99_ttft_ms; Summary.value and CurvePoint.value read it from that class's figures.
CLASS_SEP = ":"
CLASS_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,39}")


def class_scope(name: str) -> tuple[str | None, str]:
    """('agent', 'p99_ttft_ms') for agent:p99_ttft_ms; (None, name) for a run-wide figure."""
    cls, sep, rest = name.partition(CLASS_SEP)
    return (cls, rest) if sep else (None, name)


def scoped_slo(thresholds: Sequence[Threshold], traffic_class: str) -> list[Threshold]:
    """A class's own SLO as thresholds on that class's figures (p99_ttft_ms<=2000 ->
    chat:p99_ttft_ms<=2000): one SLO list carries every class's, and the one that breaks
    first names the class that binds."""
    return [Threshold(f"{traffic_class}{CLASS_SEP}{t.metric}", t.op, t.limit) for t in thresholds]


# Send lag (actual send - intended send, minus any wait for a --max-concurrency slot) below
# this is scheduler jitter on any busy host and never a verdict by itself.
# `run` and `sweep` exit 1 when more than this share of their requests failed and no
# --fail-on was given (--fail-on sets the gates instead): a server that went away mid-run
# must not pass for a result (README "A tour").
DEFAULT_MAX_FAILED_SHARE = 0.05
CLIENT_LIMIT_SEND_LAG_MS = 5.0
# Above the floor, lag is judged by what it does to the figures: the schedule's spacing
# (lag p99 over this share of the median gap between scheduled sends means the offered
# load was not the one scheduled) and TTFT (lag p99 over this share of the median TTFT
# means "TTFT from schedule" is off by that much, issue 15).
CLIENT_LIMIT_LAG_OF_GAP = 0.25
CLIENT_LIMIT_LAG_OF_TTFT = 0.5
CLIENT_LIMIT_LOOP_LAG_MS = 5.0
# Above this share of one core used by the event loop, reads queue behind each other long
# enough to move token timestamps by milliseconds (benchmarks/loadgen.py, README). With
# kernel arrival stamps queued reads keep their times; only a loop this close to its whole
# core is flagged, as one that may be what caps the throughput.
CLIENT_LIMIT_LOOP_CPU_SHARE = 0.8
CLIENT_LIMIT_LOOP_CPU_SHARE_STAMPED = 0.95
# Token times are the kernel's arrival stamps, so a read that waited is still timed right;
# what a busy client gets wrong is a token that waited so long that the next one arrived
# and both were read as one (the first then takes the second's time). More than this share
# of tokens read together with the next, while more than this share of reads waited > 2 ms
# in the socket, means the client itself merged them, and the p99 gap is off.
CLIENT_LIMIT_MERGED_SHARE = 0.01
CLIENT_LIMIT_LATE_READ_SHARE = 0.01
# Beside a reason above, more than this share of the run spent by the event loop waiting in the
# run queue for a CPU (Linux schedstat) names the machine's other processes as the cause; the
# reason then starts with HOST_CPU_WAIT.
CLIENT_LIMIT_HOST_WAIT_SHARE = 0.02
HOST_CPU_WAIT = "the event loop waited for a CPU"
# A summary whose requests had more than this share of their prompt tokens answered from the
# server's prefix cache says so: its TTFT is a cached prefill's, not a full one's.
CACHED_PROMPT_SHARE_WARN = 0.5
_NO_GAPS = np.zeros(0, dtype=np.int64)


def percentile_key(p: float) -> str:
    """'p99', 'p99.9': the names used in the summary JSON and the --fail-on grammar."""
    return f"p{p:g}"


@dataclass
class Stats:
    """Mean, std and percentiles of one metric in milliseconds (None when no samples).

    `ci` holds each percentile's 95% confidence interval (percentile_ci); an end that is
    None lies beyond the data (too few samples to bound it).
    """

    count: int
    mean: float | None
    std: float | None
    percentiles: dict[str, float | None]
    ci: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, float | None]:
        return {"mean": self.mean, "std": self.std, **self.percentiles}

    def confidence(self) -> dict:
        """The summary JSON's "confidence" entry: sample count and [low, high] per percentile."""
        return {
            "count": self.count,
            "level": CI_LEVEL,
            **{k: list(self.ci.get(k, (None, None))) for k in self.percentiles},
        }


@dataclass
class Summary:
    """Everything a user reads about one load point (or one run)."""

    completed: int
    failed: int
    cancelled: int
    errors: dict[str, int]
    duration_s: float
    requests_per_s: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    total_input_tokens: int
    total_output_tokens: int
    metrics: dict[str, Stats]
    ttft_from_intended: Stats
    goodput_requests_per_s: float | None
    send_lag_ms: dict[str, float | None]
    client_limited: bool
    client_limited_reasons: list[str] = field(default_factory=list)
    interrupted: bool = False
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    # "ok", "client-limited", or "not judged: ..." (nothing completed to judge by)
    self_check: str = "ok"
    slot_wait_ms: dict[str, float | None] = field(default_factory=dict)
    # What the server said it answered from its prefix cache (bench.metrics.prompt_cache);
    # the session adds what the server's own counters said ("server").
    prompt_cache: dict = field(default_factory=dict)
    # Things the reader must know to read the figures right (fixed seed, approximate
    # prompt lengths, cached prompts), said in the console and the JSON.
    notes: list[str] = field(default_factory=list)
    # vLLM's --num-warmups sent before the point ({"sent", "completed"}): in no figure above
    # and in no stored request; None when there were none.
    warmups: dict | None = None
    # The same figures per traffic class (requests' traffic_class), when the run mixed
    # classes; throughput is each class's share of the point's duration.
    classes: dict[str, Summary] = field(default_factory=dict)
    # Speculative decoding as the server's counters measured it over the point
    # (bench.telemetry.spec_decode), with the simulator's modelled figures beside it when
    # the endpoint was simulated; {} when the server exposes none.
    spec_decode: dict = field(default_factory=dict)

    @property
    def cached_share(self) -> float | None:
        """Share of prompt tokens served from the server's prefix cache: the server's own
        counters when scraped, else what requests reported in usage; None if unknown."""
        for source in ("server", "usage"):
            part = self.prompt_cache.get(source)
            if part and part.get("share") is not None:
                return part["share"]
        return None

    @property
    def largely_cached(self) -> bool:
        share = self.cached_share
        return bool(share is not None and share > CACHED_PROMPT_SHARE_WARN)

    @property
    def sent(self) -> int:
        return self.completed + self.failed + self.cancelled

    @property
    def error_rate(self) -> float:
        done = self.completed + self.failed
        return self.failed / done if done else 0.0

    def value(self, name: str) -> float | None:
        """Look a figure up by its flat name: 'p99_ttft_ms', 'mean_tpot_ms', 'error_rate', ...

        One grammar shared by --fail-on, SLO checks and sweeps. CLASS:NAME reads one
        traffic class's figure (None when the class sent nothing here).
        """
        cls, bare = class_scope(name)
        if cls is not None:
            sub = self.classes.get(cls)
            return None if sub is None else sub.value(bare)
        if name in FLAT_METRICS:
            value = getattr(self, name)
            return None if value is None else float(value)
        stat, _, rest = name.partition("_")
        metric = rest.removesuffix("_ms")
        stats = self.metrics.get(metric)
        if stats is None or not rest.endswith("_ms"):
            raise KeyError(name)
        table = stats.as_dict()
        if stat not in table:
            raise KeyError(name)
        return table[stat]

    def to_json(self) -> dict:
        """The --summary-json contract (issue 2): keys and nesting must not change (keys are
        only ever added)."""
        return {
            "interrupted": self.interrupted,
            "completed": self.completed,
            "failed": self.failed,
            "errors": dict(self.errors),
            "duration_s": self.duration_s,
            "throughput": {
                "requests_per_s": self.requests_per_s,
                "output_tokens_per_s": self.output_tokens_per_s,
                "total_tokens_per_s": self.total_tokens_per_s,
            },
            "metrics": {f"{m}_ms": self.metrics[m].as_dict() for m in LATENCY_METRICS},
            "goodput_requests_per_s": self.goodput_requests_per_s,
            "send_lag_ms": dict(self.send_lag_ms),
            "client_limited": self.client_limited,
            "client_limited_reasons": list(self.client_limited_reasons),
            "self_check": self.self_check,
            "slot_wait_ms": dict(self.slot_wait_ms),
            "prompt_cache": {**self.prompt_cache, "largely_cached": self.largely_cached},
            "notes": list(self.notes),
            # Added keys (the ones above keep their shape): the samples behind each
            # percentile and its 95% order-statistic interval.
            "confidence": {f"{m}_ms": self.metrics[m].confidence() for m in LATENCY_METRICS},
            "warmups": self.warmups,
            # Added: speculative decoding from the server's counters, when it has them.
            **({"spec_decode": dict(self.spec_decode)} if self.spec_decode else {}),
            # Added: each traffic class's own figures (same keys), when the run mixed classes.
            **(
                {"classes": {k: v.to_json() for k, v in self.classes.items()}}
                if self.classes
                else {}
            ),
        }


def stats_ms(values_ns: np.ndarray, percentiles: Sequence[float]) -> Stats:
    """Mean/std/percentiles of nanosecond samples, reported in milliseconds."""
    values = np.asarray(values_ns, dtype=np.float64)
    values = values[~np.isnan(values)]
    if values.size == 0:
        return Stats(0, None, None, {percentile_key(p): None for p in percentiles})
    ms = np.sort(values / 1e6)
    qs = np.percentile(ms, list(percentiles))
    return Stats(
        count=int(ms.size),
        mean=float(ms.mean()),
        std=float(ms.std()),
        percentiles={percentile_key(p): float(q) for p, q in zip(percentiles, qs, strict=True)},
        ci={percentile_key(p): percentile_ci(ms, p, presorted=True) for p in percentiles},
    )


# ---------------------------------------------------------------- confidence of a percentile

CI_LEVEL = 0.95
# A P99 from fewer samples than this is at (or interpolated beyond) the slowest request;
# every view flags it (issue 17). is_thin generalises it to any percentile.
THIN_SAMPLES = 100


def is_thin(count: int, p: float) -> bool:
    """Whether the p-th percentile of `count` samples has less than one sample above it
    (P99 from < 100, P99.9 from < 1000): it is the slowest request, or beyond the data."""
    return count * (1.0 - p / 100.0) < 1.0


_EXACT_BINOMIAL_MAX_N = 5000


def _binomial_cdf(n: int, p: float) -> np.ndarray:
    """P(B <= k) for k = 0..n, B ~ Binomial(n, p), exact (log-space pmf, then a running sum)."""
    k = np.arange(n + 1, dtype=np.float64)
    # log C(n, k) as a running sum of log((n - i) / (i + 1)).
    log_comb = np.concatenate(([0.0], np.cumsum(np.log((n - k[:-1]) / (k[:-1] + 1)))))
    log_pmf = log_comb + k * log(p) + (n - k) * log(1 - p)
    return np.cumsum(np.exp(log_pmf))


@lru_cache(maxsize=4096)
def order_statistic_ranks(
    n: int, q: float, level: float = CI_LEVEL
) -> tuple[int | None, int | None]:
    """1-based ranks (l, u) with P(X_(l) <= true q-quantile <= X_(u)) >= level, for any
    continuous distribution (the count of samples below the quantile is Binomial(n, q)).

    None for an end that no order statistic reaches: with 48 samples no rank bounds a P99
    from above, so the interval is open there.
    """
    if n <= 0:
        return None, None
    alpha = (1.0 - level) / 2
    if n <= _EXACT_BINOMIAL_MAX_N:
        cdf = _binomial_cdf(n, q)
        # X_(l) <= quantile  <=>  B >= l:  P(B <= l - 1) <= alpha, the largest such l.
        low_ok = np.nonzero(cdf <= alpha)[0]
        lower = int(low_ok[-1]) + 1 if low_ok.size else None
        # X_(u) >= quantile  <=>  B <= u - 1:  P(B <= u - 1) >= 1 - alpha, the smallest u.
        high_ok = np.nonzero(cdf >= 1.0 - alpha)[0]
        upper = int(high_ok[0]) + 1 if high_ok.size else None
    else:  # normal approximation, accurate when n q (1 - q) is large
        from statistics import NormalDist

        z = NormalDist().inv_cdf(1.0 - alpha)
        sd = (n * q * (1 - q)) ** 0.5
        lower = int(np.floor(n * q - z * sd))
        upper = int(np.ceil(n * q + z * sd)) + 1
        lower = lower if lower >= 1 else None
    if upper is not None and upper > n:
        upper = None
    return lower, upper


def percentile_ci(
    values, p: float, level: float = CI_LEVEL, *, presorted: bool = False
) -> tuple[float | None, float | None]:
    """Distribution-free confidence interval of the p-th percentile (0-100) of `values`.

    The interval runs between two order statistics chosen from the binomial distribution
    (no assumption about the latencies' shape). An end is None where the data cannot bound
    it: the upper end of a P99 from fewer than ~300 samples at 95%, for instance.
    """
    x = np.asarray(values, dtype=np.float64)
    if not presorted:
        x = np.sort(x[~np.isnan(x)])
    lower, upper = order_statistic_ranks(int(x.size), p / 100.0, level)
    return (
        None if lower is None else float(x[lower - 1]),
        None if upper is None else float(x[upper - 1]),
    )


def parse_goodput(spec: Iterable[str] | str | None) -> dict[str, float]:
    """Per-request goodput limits in ms from an SLO in the one grammar (parse_slo).

    'ttft:500 tpot:50' (vLLM's --goodput) and 'p99_ttft_ms<=500,p99_tpot_ms<=50' both give
    {'ttft': 500.0, 'tpot': 50.0}: a request is good when each of its own values is within
    the limit, as vLLM counts goodput.
    """
    thresholds = parse_slo(spec, flag="--goodput")
    limits = goodput_limits(thresholds)
    for t in thresholds:
        if t.metric.partition("_")[2].removesuffix("_ms") not in limits or t.op[0] != "<":
            raise ValueError(
                f"--goodput item {t}: goodput holds each request to latency limits, "
                "e.g. ttft:500 or p99_tpot_ms<=50 (use --slo or --fail-on for other figures)"
            )
    return limits


def goodput_limits(thresholds: Sequence[Threshold]) -> dict[str, float]:
    """The latency upper limits of an SLO as per-request limits: {'ttft': 500.0, ...}."""
    limits: dict[str, float] = {}
    for t in thresholds:
        stat, _, rest = t.metric.partition("_")
        metric = rest.removesuffix("_ms")
        if rest.endswith("_ms") and metric in LATENCY_METRICS and t.op in ("<", "<="):
            limits[metric] = min(limits.get(metric, t.limit), t.limit)
    return limits


@dataclass
class Columns:
    """Per-request arrays (ns, float64 with NaN for missing) that every statistic reads.

    Built from in-memory records or straight from the database, so both paths compute the
    same numbers with the same code.
    """

    state: np.ndarray  # object array of 'ok' / 'failed' / 'cancelled'
    error_kind: np.ndarray  # object array (None for ok)
    intended_ns: np.ndarray
    sent_ns: np.ndarray
    first_token_ns: np.ndarray
    end_ns: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    itl_ns: np.ndarray  # all ITL gaps of completed requests, concatenated
    gap_counts: np.ndarray | None = None  # ITL gaps each row owns in itl_ns (0 unless ok)
    slot_wait_ns: np.ndarray | None = None  # waits for a --max-concurrency slot (0 = none)
    cached_prompt_tokens: np.ndarray | None = None  # NaN where the server did not say
    claimed_output_tokens: np.ndarray | None = None  # a usage not believed; NaN elsewhere
    traffic_class: np.ndarray | None = None  # object array: each request's class (None: none)

    def _optional(self, name: str, mask: np.ndarray) -> np.ndarray | None:
        values = getattr(self, name)
        return None if values is None else values[mask]

    def select(self, mask: np.ndarray) -> Columns:
        """The rows where mask is True (and their ITL gaps), e.g. a load point's window."""
        if self.gap_counts is None:
            raise ValueError("these Columns carry no gap_counts, so rows cannot be selected")
        gap_mask = np.repeat(mask, self.gap_counts)
        return Columns(
            state=self.state[mask],
            error_kind=self.error_kind[mask],
            intended_ns=self.intended_ns[mask],
            sent_ns=self.sent_ns[mask],
            first_token_ns=self.first_token_ns[mask],
            end_ns=self.end_ns[mask],
            prompt_tokens=self.prompt_tokens[mask],
            output_tokens=self.output_tokens[mask],
            itl_ns=self.itl_ns[gap_mask],
            gap_counts=self.gap_counts[mask],
            slot_wait_ns=self._optional("slot_wait_ns", mask),
            cached_prompt_tokens=self._optional("cached_prompt_tokens", mask),
            claimed_output_tokens=self._optional("claimed_output_tokens", mask),
            traffic_class=self._optional("traffic_class", mask),
        )

    def window(self, start_ns: float | None = None, end_ns: float | None = None) -> Columns:
        """Requests scheduled inside [start_ns, end_ns): warm-up and cool-down excluded."""
        mask = np.ones(self.state.shape, dtype=bool)
        if start_ns is not None:
            mask &= self.intended_ns >= start_ns
        if end_ns is not None:
            mask &= self.intended_ns < end_ns
        return self.select(mask)

    def measured(self, warmup_s: float | None = None, cooldown_s: float | None = None) -> Columns:
        """The requests a load point's statistics count: those scheduled after its first
        `warmup_s` seconds and before its last `cooldown_s` (by intended send time, from the
        point's start to its last scheduled request). The one rule for the session, stored
        curves and the dashboard."""
        if not len(self.state) or not (warmup_s or cooldown_s):
            return self
        last = float(np.nanmax(self.intended_ns))
        return self.window((warmup_s or 0) * 1e9, last - (cooldown_s or 0) * 1e9 + 1)

    @classmethod
    def from_records(cls, records: Sequence[RequestRecord]) -> Columns:
        def col(getter) -> np.ndarray:
            return np.array(
                [np.nan if (v := getter(r)) is None else v for r in records], dtype=np.float64
            )

        gaps = [r.itl_ns() if r.state == OK else _NO_GAPS for r in records]
        itl = np.concatenate(gaps) if gaps else _NO_GAPS
        return cls(
            state=np.array([r.state for r in records], dtype=object),
            error_kind=np.array([r.error_kind for r in records], dtype=object),
            intended_ns=col(lambda r: r.intended_ns),
            sent_ns=col(lambda r: r.sent_ns),
            first_token_ns=col(lambda r: r.first_token_ns),
            end_ns=col(lambda r: r.end_ns),
            prompt_tokens=col(lambda r: r.prompt_tokens),
            output_tokens=col(lambda r: r.output_tokens),
            itl_ns=itl.astype(np.float64),
            gap_counts=np.array([len(g) for g in gaps], dtype=np.int64),
            slot_wait_ns=col(lambda r: r.slot_wait_ns),
            cached_prompt_tokens=col(lambda r: r.cached_prompt_tokens),
            claimed_output_tokens=col(lambda r: r.claimed_output_tokens),
            traffic_class=np.array([r.traffic_class for r in records], dtype=object),
        )


def summarize(
    records: Sequence[RequestRecord] | Columns,
    *,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    goodput: dict[str, float] | None = None,
    duration_s: float | None = None,
    loop_lag_p99_ms: float | None = None,
    loop_cpu_share: float | None = None,
    loop_cpu_wait_share: float | None = None,
    late_read_share: float | None = None,
    merged_token_share: float | None = None,
    interrupted: bool = False,
    closed_loop: bool = False,
) -> Summary:
    """Compute the Summary of a set of requests.

    duration_s defaults to first send -> last end of the requests, as vLLM measures a run;
    pass the measured wall duration when the caller knows it.
    """
    cols = records if isinstance(records, Columns) else Columns.from_records(records)
    percentiles = tuple(percentiles)
    ok = cols.state == OK
    completed = int(ok.sum())
    failed = int((cols.state == FAILED).sum())
    cancelled = int((cols.state == CANCELLED).sum())
    errors = dict(Counter(cols.error_kind[~ok].tolist()))  # only the (few) failures are walked

    ttft = (cols.first_token_ns - cols.sent_ns)[ok]
    e2el = (cols.end_ns - cols.sent_ns)[ok]
    out_tokens = cols.output_tokens[ok]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out_tokens >= 2, (e2el - ttft) / (out_tokens - 1), np.nan)
    ttft_intended = (cols.first_token_ns - cols.intended_ns)[ok]

    if duration_s is None:
        if cols.sent_ns.size and np.isfinite(cols.end_ns).any():
            duration_s = float((np.nanmax(cols.end_ns) - np.nanmin(cols.sent_ns)) / 1e9)
        else:
            duration_s = 0.0
    total_out = int(np.nansum(out_tokens))
    total_in = int(np.nansum(cols.prompt_tokens[ok]))
    per_s = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: 0.0)

    metrics = {
        "ttft": stats_ms(ttft, percentiles),
        "tpot": stats_ms(tpot, percentiles),
        "itl": stats_ms(cols.itl_ns, percentiles),
        "e2el": stats_ms(e2el, percentiles),
    }
    goodput_rps = None
    if goodput:
        good = np.ones(completed, dtype=bool)
        per_metric = {"ttft": ttft, "tpot": tpot, "e2el": e2el}
        for name, limit_ms in goodput.items():
            values = _per_request_mean_itl(cols)[ok] if name == "itl" else per_metric[name]
            # A request with no value for a metric (e.g. TPOT of a 1-token output) is not
            # held to that SLO, as vLLM does.
            good &= np.isnan(values) | (values <= limit_ms * 1e6)
        goodput_rps = per_s(float(good.sum()))

    waits = np.nan_to_num(_slot_waits_ns(cols))
    send_lag = _lag_stats(_send_lag_ns(cols))
    slot_wait = _lag_stats(waits) if waits.any() else {"p50": None, "p99": None, "max": None}
    reasons = (
        client_limited_reasons(
            cols,
            loop_lag_p99_ms=loop_lag_p99_ms,
            loop_cpu_share=loop_cpu_share,
            loop_cpu_wait_share=loop_cpu_wait_share,
            late_read_share=late_read_share,
            merged_token_share=merged_token_share,
            closed_loop=closed_loop,
        )
        if completed
        else []
    )
    verdict = NOT_JUDGED if not completed else ("client-limited" if reasons else "ok")

    return Summary(
        completed=completed,
        failed=failed,
        cancelled=cancelled,
        errors=errors,
        duration_s=duration_s,
        requests_per_s=per_s(completed),
        output_tokens_per_s=per_s(total_out),
        total_tokens_per_s=per_s(total_out + total_in),
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        metrics=metrics,
        ttft_from_intended=stats_ms(ttft_intended, percentiles),
        goodput_requests_per_s=goodput_rps,
        send_lag_ms=send_lag,
        client_limited=verdict == "client-limited",
        client_limited_reasons=reasons,
        interrupted=interrupted,
        percentiles=percentiles,
        self_check=verdict,
        slot_wait_ms=slot_wait,
        prompt_cache={"usage": prompt_cache(cols)},
        notes=_usage_notes(cols),
        classes=_class_summaries(cols, percentiles, goodput, duration_s, interrupted),
    )


def _class_summaries(
    cols: Columns,
    percentiles: tuple[float, ...],
    goodput: dict[str, float] | None,
    duration_s: float,
    interrupted: bool,
) -> dict[str, Summary]:
    """Each traffic class's Summary over the same duration (so class throughputs add up to
    the point's); {} when no request carries a class. A class's self-check reads only its
    own requests' send lag; the event loop's figures belong to the point's verdict."""
    if cols.traffic_class is None or cols.gap_counts is None:
        return {}
    names = sorted({c for c in cols.traffic_class.tolist() if c is not None})
    out = {}
    for name in names:
        own = cols.select(cols.traffic_class == name)
        own.traffic_class = None  # its own summary has no classes beneath it
        out[name] = summarize(
            own,
            percentiles=percentiles,
            goodput=goodput,
            duration_s=duration_s,
            interrupted=interrupted,
        )
    return out


# What a summary recomputed from stored requests cannot say again: the reuse the workload
# implied and the server's own counters (the session added them when the point ran).
STORED_CACHE_SOURCES = ("intended", "server")


def restore_prompt_cache(summary: Summary, stored: dict) -> None:
    """Put a point's stored prompt-cache figures that its requests cannot give again
    (STORED_CACHE_SOURCES) back on a recomputed summary, and each traffic class's on its
    class: one rule for `show`, the curves and every view built on them."""
    for source in STORED_CACHE_SOURCES:
        part = (stored.get("prompt_cache") or {}).get(source)
        if part:
            summary.prompt_cache[source] = part
    for name, sub in summary.classes.items():
        restore_prompt_cache(sub, (stored.get("classes") or {}).get(name) or {})


def _usage_notes(cols: Columns) -> list[str]:
    """Say so when a server's usage was not believed (bench.backends.bounds): the figures
    count the streamed tokens of those requests instead."""
    claimed = cols.claimed_output_tokens
    n = 0 if claimed is None else int(np.isfinite(claimed).sum())
    if not n:
        return []
    return [
        f"usage_mismatch: {n} response(s) claimed output token counts that the stream or "
        "max_tokens makes impossible; their streamed counts are used (the claims are kept "
        "as claimed_output_tokens)"
    ]


def _lag_stats(lag_ns: np.ndarray) -> dict[str, float | None]:
    lag = lag_ns[np.isfinite(lag_ns)]
    if not lag.size:
        return {"p50": None, "p99": None, "max": None}
    return {
        "p50": float(np.percentile(lag, 50) / 1e6),
        "p99": float(np.percentile(lag, 99) / 1e6),
        "max": float(lag.max() / 1e6),
    }


def _median_ms(values_ns: np.ndarray) -> float | None:
    values = values_ns[np.isfinite(values_ns)]
    return float(np.median(values) / 1e6) if values.size else None


def _median_gap_ms(intended_ns: np.ndarray) -> float | None:
    """The median gap between successive scheduled sends; None when all were due at once
    (rate inf) or in a closed loop's back-to-back waves, where there is no spacing to keep."""
    times = np.sort(intended_ns[np.isfinite(intended_ns)])
    gaps = np.diff(times)
    gaps = gaps[gaps > 0]
    return float(np.median(gaps) / 1e6) if gaps.size * 2 >= max(1, times.size - 1) else None


def _slot_waits_ns(cols: Columns) -> np.ndarray:
    if cols.slot_wait_ns is None:
        return np.zeros(cols.sent_ns.shape)
    return cols.slot_wait_ns


def _send_lag_ns(cols: Columns) -> np.ndarray:
    """Actual send - intended send, less any wait for a --max-concurrency slot."""
    return cols.sent_ns - cols.intended_ns - np.nan_to_num(_slot_waits_ns(cols))


NOT_JUDGED = "not judged: no request completed, so there is no figure to judge"


def client_limited_reasons(
    records: Sequence[RequestRecord] | Columns,
    *,
    loop_lag_p99_ms: float | None = None,
    loop_cpu_share: float | None = None,
    loop_cpu_wait_share: float | None = None,
    late_read_share: float | None = None,
    merged_token_share: float | None = None,
    closed_loop: bool = False,
) -> list[str]:
    """Why the client itself limited these figures ([] when it did not).

    The one rule for a whole run and for one worker of a distributed run alike: the records
    give the send lag, the schedule's spacing and the TTFT; the keyword arguments are what
    the client measured about itself while it ran (bench.runner.RunResult's fields, which
    each worker ships to the driver). Each rule judges what the client's lateness does to
    the figures measured, not a fixed bar alone: a 6 ms send lag is harmless beside 1 s
    between requests and a 120 ms TTFT, and decisive beside 2 ms gaps.

    A closed loop (`closed_loop`) has no schedule to keep: a user's next request is due when
    its last one ends, and on a batching server the users end together, so the gaps between
    due times are near zero and say nothing about the client (llama-server's closed loops
    were all flagged by lags of 10-35 ms beside TTFTs of 1-10 s). There the client is judged
    by what it controls: whether each request left when it was due, against its TTFT.
    """
    cols = records if isinstance(records, Columns) else Columns.from_records(records)
    reasons = []
    lag = _lag_stats(_send_lag_ns(cols))["p99"]
    if lag is not None and lag > CLIENT_LIMIT_SEND_LAG_MS:
        gap = None if closed_loop else _median_gap_ms(cols.intended_ns)
        ttft = _median_ms((cols.first_token_ns - cols.sent_ns)[cols.state == OK])
        if gap is not None and lag > CLIENT_LIMIT_LAG_OF_GAP * gap:
            reasons.append(
                f"send lag p99 {lag:.1f} ms is over {CLIENT_LIMIT_LAG_OF_GAP:.0%} of the median "
                f"{gap:.1f} ms between scheduled sends: the load offered was not the one scheduled"
            )
        elif ttft is not None and lag > CLIENT_LIMIT_LAG_OF_TTFT * ttft:
            reasons.append(
                f"send lag p99 {lag:.1f} ms is over {CLIENT_LIMIT_LAG_OF_TTFT:.0%} of the median "
                f"TTFT {ttft:.1f} ms: requests left the client late enough to change the figures"
            )
    # With kernel arrival stamps (late_read_share is known) a late loop no longer makes token
    # times late: what is left to check is tokens merged while reads waited, and a loop so
    # busy that it may cap the throughput. Without stamps a late loop shifts every time.
    stamped = late_read_share is not None
    merged = merged_token_share is not None and merged_token_share > CLIENT_LIMIT_MERGED_SHARE
    if merged and (not stamped or late_read_share > CLIENT_LIMIT_LATE_READ_SHARE):
        waits = f"; {late_read_share:.1%} of reads waited > 2 ms in the socket" if stamped else ""
        reasons.append(
            f"{merged_token_share:.1%} of tokens (first tokens counted on their own) were read "
            f"together with the next one{waits}: "
            "the client was too busy to read them apart, so they carry the later token's time"
        )
    busy_limit = CLIENT_LIMIT_LOOP_CPU_SHARE_STAMPED if stamped else CLIENT_LIMIT_LOOP_CPU_SHARE
    if loop_cpu_share is not None and loop_cpu_share > busy_limit:
        why = (
            "the client may be what caps the throughput"
            if stamped
            else "reads queue behind each other"
        )
        reasons.append(
            f"the event loop was busy {loop_cpu_share:.0%} of the time (> {busy_limit:.0%}): {why}"
        )
    if not stamped and loop_lag_p99_ms is not None and loop_lag_p99_ms > CLIENT_LIMIT_LOOP_LAG_MS:
        reasons.append(
            f"event-loop lag p99 {loop_lag_p99_ms:.1f} ms > {CLIENT_LIMIT_LOOP_LAG_MS:g} ms: "
            "token timestamps may be late"
        )
    host_wait = (
        loop_cpu_wait_share is not None and loop_cpu_wait_share > CLIENT_LIMIT_HOST_WAIT_SHARE
    )
    if reasons and host_wait:  # why, where the machine's other processes are the cause
        reasons.append(
            f"{HOST_CPU_WAIT} {loop_cpu_wait_share:.1%} of the run: other processes on this "
            "machine kept the client off its cores; give it cores of its own (taskset) or "
            "run it where the server and other work are not"
        )
    return reasons


def prompt_cache(cols: Columns) -> dict | None:
    """What completed requests said about prompt tokens served from the server's prefix
    cache (usage.prompt_tokens_details.cached_tokens); None when none said anything."""
    if cols.cached_prompt_tokens is None:
        return None
    ok = cols.state == OK
    cached = cols.cached_prompt_tokens[ok]
    said = np.isfinite(cached)
    if not said.any():
        return None
    prompt = float(np.nansum(cols.prompt_tokens[ok][said]))
    total = float(np.nansum(cached[said]))
    return {
        "requests": int(said.sum()),
        "cached_tokens": int(total),
        "prompt_tokens": int(prompt),
        "share": total / prompt if prompt > 0 else None,
    }


def _per_request_mean_itl(cols: Columns) -> np.ndarray:
    """Each request's mean gap between content chunks (NaN with fewer than two chunks).

    Not TPOT: a server that sends several tokens per chunk has fewer, longer gaps, and an
    `itl:` SLO must judge those gaps, as the ITL figures do.
    """
    if cols.gap_counts is None:
        raise ValueError("these Columns carry no gap_counts, so per-request ITL is unknown")
    counts = cols.gap_counts.astype(np.int64)
    ends = np.cumsum(counts)
    sums = np.concatenate([[0.0], np.cumsum(cols.itl_ns)])
    with np.errstate(invalid="ignore", divide="ignore"):
        means = (sums[ends] - sums[ends - counts]) / counts
    return np.where(counts > 0, means, np.nan)


def time_series(records: Sequence[RequestRecord], bucket_s: float = 1.0) -> dict[str, list]:
    """Per-second offered and achieved load and P99 TTFT, so a burst's effect can be seen.

    Offered = requests scheduled in the bucket (intended time); achieved = requests that
    completed in it; TTFT p99 of requests whose first token arrived in it.
    """
    if not records:
        return {
            "t_s": [],
            "offered_rps": [],
            "achieved_rps": [],
            "p99_ttft_ms": [],
            "output_tps": [],
        }
    cols = Columns.from_records(records)
    bucket_ns = bucket_s * 1e9
    end = np.nanmax(np.concatenate([cols.intended_ns, cols.end_ns]))
    n = int(end // bucket_ns) + 1
    offered = np.bincount((cols.intended_ns // bucket_ns).astype(int), minlength=n)[:n]
    ok = (cols.state == OK) & np.isfinite(cols.end_ns)
    achieved = np.bincount((cols.end_ns[ok] // bucket_ns).astype(int), minlength=n)[:n]
    tokens = np.bincount(
        (cols.end_ns[ok] // bucket_ns).astype(int),
        weights=np.nan_to_num(cols.output_tokens[ok]),
        minlength=n,
    )[:n]
    p99 = [None] * n
    ft = ok & np.isfinite(cols.first_token_ns)
    ft_bucket = (cols.first_token_ns[ft] // bucket_ns).astype(int)
    ttft = (cols.first_token_ns[ft] - cols.sent_ns[ft]) / 1e6
    for b in np.unique(ft_bucket):
        p99[int(b)] = float(np.percentile(ttft[ft_bucket == b], 99))
    return {
        "t_s": [i * bucket_s for i in range(n)],
        "offered_rps": (offered / bucket_s).tolist(),
        "achieved_rps": (achieved / bucket_s).tolist(),
        "p99_ttft_ms": p99,
        "output_tps": (tokens / bucket_s).tolist(),
    }


# ---------------------------------------------------------------- thresholds (--fail-on, --slo)

_OPS = {
    "<=": lambda a, b: a <= b,
    ">=": lambda a, b: a >= b,
    "<": lambda a, b: a < b,
    ">": lambda a, b: a > b,
}


@dataclass(frozen=True)
class Threshold:
    """One condition such as p99_ttft_ms<800; `metric` uses Summary.value's names."""

    metric: str
    op: str
    limit: float

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.limit:g}"

    def passes(self, value: float | None) -> bool:
        """Whether a measured value meets this threshold; no value never does."""
        return value is not None and _OPS[self.op](value, self.limit)

    def holds(self, summary: Summary) -> bool:
        return self.passes(summary.value(self.metric))


# A load point whose requests failed more often than this does not meet an SLO that says
# nothing about errors: the percentiles of the requests that survived would flatter it (a
# sweep once said "every load met the SLO" with 8 of 16 requests failed). An SLO that names
# error_rate sets its own bound.
# 5%, not 0: one failure in a thin point of 30 requests must not decide a capacity on its own.
SLO_DEFAULT_MAX_ERROR_RATE = 0.05


def with_error_bound(slo: Sequence[Threshold]) -> list[Threshold]:
    """The SLO as it is judged: one that does not bound error_rate gets the default bound,
    and so does each traffic class it names (a class's failures are its own)."""
    slo = list(slo)
    scopes = [None] if slo else []
    scopes += sorted({c for t in slo if (c := class_scope(t.metric)[0]) is not None})
    for cls in scopes:
        name = "error_rate" if cls is None else f"{cls}{CLASS_SEP}error_rate"
        if not any(t.metric == name for t in slo):
            slo.append(Threshold(name, "<=", SLO_DEFAULT_MAX_ERROR_RATE))
    return slo


def meets_slo(
    slo: Sequence[Threshold], value: Callable[[str], float | None], completed: int,
    error_rate: float,
) -> bool:  # fmt: skip
    """Whether a load point meets every threshold: the one rule for sweeps and curves."""
    if completed <= 0:
        return False
    return all(t.passes(value(t.metric)) for t in with_error_bound(slo))


# vLLM's `--goodput ttft:500 tpot:50` names a per-request limit; as a capacity SLO it is
# read at this percentile (the tail every planning tool quotes), e.g. p99_ttft_ms<=500.
SHORT_SLO_PERCENTILE = "p99"


def parse_slo(spec: Iterable[str] | str | None, *, flag: str = "--slo") -> list[Threshold]:
    """The one SLO grammar of --slo, --goodput, --fail-on, scenario files and the API.

    Items are separated by commas or spaces (or given as a list, as repeated flags are):
      NAME<VALUE, NAME<=VALUE, NAME>VALUE, NAME>=VALUE  with Summary.value's names, e.g.
        p99_ttft_ms<=500, mean_tpot_ms<60, error_rate<0.01, output_tokens_per_s>1000
      METRIC:MS  (vLLM's --goodput), e.g. ttft:500 tpot:50 -> p99_ttft_ms<=500, p99_tpot_ms<=50
    Errors name the flag, the item and what is expected.
    """
    if not spec:
        return []
    texts = [spec] if isinstance(spec, str) else list(spec)
    items = [i for text in texts for i in text.replace(",", " ").split()]
    out: list[Threshold] = []
    for item in items:
        op = next((o for o in ("<=", ">=", "<", ">") if o in item), None)
        if op is None:
            out.append(_short_item(item, flag))
            continue
        name, _, value = (p.strip() for p in item.partition(op))
        try:
            limit = float(value)
        except ValueError:
            raise ValueError(f"{flag} item {item!r}: {value!r} is not a number") from None
        _check_metric_name(name, flag, item)
        out.append(Threshold(name, op, limit))
    return out


def _short_item(item: str, flag: str) -> Threshold:
    name, sep, value = item.partition(":")
    name = name.strip().lower().removesuffix("_ms")
    if not sep or name not in LATENCY_METRICS:
        raise ValueError(
            f"{flag} item {item!r}: expected NAME<=VALUE (e.g. p99_ttft_ms<=500, "
            f"error_rate<0.01) or METRIC:MS (e.g. ttft:500) with METRIC one of "
            f"{', '.join(LATENCY_METRICS)}"
        )
    try:
        limit = float(value)
    except ValueError:
        raise ValueError(f"{flag} item {item!r}: {value!r} is not a number of ms") from None
    return Threshold(f"{SHORT_SLO_PERCENTILE}_{name}_ms", "<=", limit)


def parse_thresholds(
    spec: Iterable[str] | str | None, *, flag: str = "--fail-on"
) -> list[Threshold]:
    """--fail-on's name for parse_slo (the same grammar)."""
    return parse_slo(spec, flag=flag)


def slo_text(thresholds: Sequence[Threshold]) -> str:
    """How an SLO is written back: 'p99_ttft_ms<=2000,p99_tpot_ms<=50' (parse_slo reads it)."""
    return ",".join(str(t) for t in thresholds)


def _check_metric_name(name: str, flag: str, item: str) -> None:
    cls, name = class_scope(name)
    if cls is not None and not CLASS_NAME.fullmatch(cls):
        raise ValueError(
            f"{flag} item {item!r}: {cls!r} is not a traffic class name (letters, digits, "
            "'_' and '-', starting with a letter), as in agent:p99_ttft_ms<=2000"
        )
    if name in FLAT_METRICS:
        return
    stat, _, rest = name.partition("_")
    stats = {"mean", "std"} | {percentile_key(p) for p in DEFAULT_PERCENTILES}
    if (
        rest.endswith("_ms")
        and rest.removesuffix("_ms") in LATENCY_METRICS
        and (stat in stats or stat.startswith("p"))
    ):
        return
    raise ValueError(
        f"{flag} item {item!r}: unknown metric {name!r}; use e.g. p99_ttft_ms, mean_tpot_ms, "
        f"p50_itl_ms, p99_e2el_ms, or one of {', '.join(FLAT_METRICS)}; CLASS:NAME for one "
        "traffic class's figure"
    )


def broken_thresholds(summary: Summary, thresholds: Sequence[Threshold]) -> list[str]:
    """Human-readable lines for every threshold the summary breaks."""
    broken = []
    for t in thresholds:
        try:
            value = summary.value(t.metric)
        except KeyError:
            broken.append(f"{t}: percentile not computed (add it to --metric-percentiles)")
            continue
        if not t.passes(value):
            shown = "no data" if value is None else f"{value:.4g}"
            broken.append(f"{t} broken: measured {shown}")
    return broken
