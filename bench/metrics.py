"""Records -> Summary: percentiles, throughput, goodput, send lag, per-second time series.

Definitions follow `vllm bench serve` (see DESIGN.md): TTFT and E2EL from the actual send
time, TPOT = (E2EL - TTFT) / (output_tokens - 1), ITL = gaps between content chunks. TTFT is
also computed against the intended send time, so queueing inside the client stays visible.
This module is the only place these definitions are computed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from bench.records import CANCELLED, FAILED, OK, RequestRecord

DEFAULT_PERCENTILES: tuple[float, ...] = (50, 90, 95, 99, 99.9)
LATENCY_METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2el")
# A load generator whose send lag p99 exceeds this has limited the result (issue 2).
CLIENT_LIMIT_SEND_LAG_MS = 5.0
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
_NO_GAPS = np.zeros(0, dtype=np.int64)


def percentile_key(p: float) -> str:
    """'p99', 'p99.9': the names used in the summary JSON and the --fail-on grammar."""
    return f"p{p:g}"


@dataclass
class Stats:
    """Mean, std and percentiles of one metric in milliseconds (None when no samples)."""

    count: int
    mean: float | None
    std: float | None
    percentiles: dict[str, float | None]

    def as_dict(self) -> dict[str, float | None]:
        return {"mean": self.mean, "std": self.std, **self.percentiles}


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

    @property
    def sent(self) -> int:
        return self.completed + self.failed + self.cancelled

    @property
    def error_rate(self) -> float:
        done = self.completed + self.failed
        return self.failed / done if done else 0.0

    def value(self, name: str) -> float | None:
        """Look a figure up by its flat name: 'p99_ttft_ms', 'mean_tpot_ms', 'error_rate', ...

        One grammar shared by --fail-on, SLO checks and sweeps.
        """
        flat = {
            "error_rate": self.error_rate,
            "requests_per_s": self.requests_per_s,
            "output_tokens_per_s": self.output_tokens_per_s,
            "total_tokens_per_s": self.total_tokens_per_s,
            "goodput_requests_per_s": self.goodput_requests_per_s,
            "completed": float(self.completed),
            "failed": float(self.failed),
        }
        if name in flat:
            return flat[name]
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
        """The --summary-json contract (issue 2): keys and nesting must not change."""
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
        }


def stats_ms(values_ns: np.ndarray, percentiles: Sequence[float]) -> Stats:
    """Mean/std/percentiles of nanosecond samples, reported in milliseconds."""
    values = np.asarray(values_ns, dtype=np.float64)
    values = values[~np.isnan(values)]
    if values.size == 0:
        return Stats(0, None, None, {percentile_key(p): None for p in percentiles})
    ms = values / 1e6
    qs = np.percentile(ms, list(percentiles))
    return Stats(
        count=int(ms.size),
        mean=float(ms.mean()),
        std=float(ms.std()),
        percentiles={percentile_key(p): float(q) for p, q in zip(percentiles, qs, strict=True)},
    )


def parse_goodput(spec: Iterable[str] | str | None) -> dict[str, float]:
    """'ttft:500 tpot:50' (vLLM's --goodput) -> {'ttft': 500.0, 'tpot': 50.0} in ms."""
    if spec is None:
        return {}
    items = spec.replace(",", " ").split() if isinstance(spec, str) else list(spec)
    slos: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition(":")
        name = name.strip().lower().removesuffix("_ms")
        if not sep or name not in ("ttft", "tpot", "e2el", "itl"):
            raise ValueError(
                f"--goodput item {item!r}: expected METRIC:MS with METRIC one of ttft, tpot, e2el"
            )
        try:
            slos[name] = float(value)
        except ValueError:
            raise ValueError(f"--goodput item {item!r}: {value!r} is not a number of ms") from None
    return slos


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
        )

    def window(self, start_ns: float | None = None, end_ns: float | None = None) -> Columns:
        """Requests scheduled inside [start_ns, end_ns): warm-up and cool-down excluded."""
        mask = np.ones(self.state.shape, dtype=bool)
        if start_ns is not None:
            mask &= self.intended_ns >= start_ns
        if end_ns is not None:
            mask &= self.intended_ns < end_ns
        return self.select(mask)

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
        )


def summarize(
    records: Sequence[RequestRecord] | Columns,
    *,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    goodput: dict[str, float] | None = None,
    duration_s: float | None = None,
    loop_lag_p99_ms: float | None = None,
    loop_cpu_share: float | None = None,
    late_read_share: float | None = None,
    merged_token_share: float | None = None,
    interrupted: bool = False,
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

    lag = cols.sent_ns - cols.intended_ns
    lag = lag[np.isfinite(lag)]
    if lag.size:
        send_lag = {
            "p50": float(np.percentile(lag, 50) / 1e6),
            "p99": float(np.percentile(lag, 99) / 1e6),
            "max": float(lag.max() / 1e6),
        }
    else:
        send_lag = {"p50": None, "p99": None, "max": None}

    reasons = []
    if send_lag["p99"] is not None and send_lag["p99"] > CLIENT_LIMIT_SEND_LAG_MS:
        reasons.append(
            f"send lag p99 {send_lag['p99']:.1f} ms > {CLIENT_LIMIT_SEND_LAG_MS:g} ms: "
            "requests left the client later than scheduled"
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
        client_limited=bool(reasons),
        client_limited_reasons=reasons,
        interrupted=interrupted,
        percentiles=percentiles,
    )


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


def parse_thresholds(spec: str | None, *, flag: str = "--fail-on") -> list[Threshold]:
    """'p99_ttft_ms<800,p99_tpot_ms<60,error_rate<0.01' -> thresholds, checked by name."""
    if not spec:
        return []
    out = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        op = next((o for o in ("<=", ">=", "<", ">") if o in item), None)
        if op is None:
            raise ValueError(f"{flag} item {item!r}: expected NAME<VALUE (or <=, >, >=)")
        name, _, value = (p.strip() for p in item.partition(op))
        try:
            limit = float(value)
        except ValueError:
            raise ValueError(f"{flag} item {item!r}: {value!r} is not a number") from None
        _check_metric_name(name, flag, item)
        out.append(Threshold(name, op, limit))
    return out


def _check_metric_name(name: str, flag: str, item: str) -> None:
    flat = (
        "error_rate",
        "requests_per_s",
        "output_tokens_per_s",
        "total_tokens_per_s",
        "goodput_requests_per_s",
        "completed",
        "failed",
    )
    if name in flat:
        return
    stat, _, rest = name.partition("_")
    stats = {"mean", "std"} | {percentile_key(p) for p in (50, 90, 95, 99, 99.9)}
    if (
        rest.endswith("_ms")
        and rest.removesuffix("_ms") in LATENCY_METRICS
        and (stat in stats or stat.startswith("p"))
    ):
        return
    raise ValueError(
        f"{flag} item {item!r}: unknown metric {name!r}; use e.g. p99_ttft_ms, mean_tpot_ms, "
        f"p50_itl_ms, p99_e2el_ms, or one of {', '.join(flat)}"
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
