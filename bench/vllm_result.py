"""A run's result as `vllm bench serve --save-result` writes it, so scripts that read vLLM's
result files read ours unchanged.

Field names and units are vLLM's (vllm/benchmarks/serve.py): latencies summarised in ms
(`mean_ttft_ms`, `median_tpot_ms`, `p99_itl_ms`, ...) for the metrics of
--percentile-metrics at the percentiles of --metric-percentiles (vLLM's default: 99), and,
with --save-detailed, per-request lists in seconds (`ttfts`, `itls`, `latencies`). The
statistics come from bench/metrics.py like every other figure; only the layout is vLLM's.

Where vLLM has no counterpart the difference is stated rather than hidden: `failed` counts
failed and cancelled requests (vLLM has no "cancelled"), `generated_texts` are empty strings
(the load generator does not keep response text), `start_times` are seconds since the run's
start, and `tokenbench` carries what vLLM lacks (run id, the self-check verdict).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from bench.metrics import Summary, percentile_key, stats_ms, summarize
from bench.records import OK, RequestRecord

VLLM_DEFAULT_PERCENTILE_METRICS = ("ttft", "tpot", "itl")
VLLM_DEFAULT_PERCENTILES = (99.0,)
# Per-request lists vLLM writes only with --save-detailed.
DETAILED_FIELDS = (
    "input_lens",
    "output_lens",
    "start_times",
    "ttfts",
    "itls",
    "generated_texts",
    "errors",
)


@dataclass
class VllmResultOptions:
    """What vLLM's flags say about the result file (--save-result and its companions)."""

    result_dir: str | None = None
    result_filename: str | None = None
    save_detailed: bool = False
    metadata: list[str] = field(default_factory=list)
    percentile_metrics: Sequence[str] | None = None
    metric_percentiles: Sequence[float] | None = None
    tokenizer: str | None = None


def parse_metadata(items: Sequence[str]) -> dict[str, str]:
    """vLLM's --metadata KEY=VALUE ... -> {KEY: VALUE}; a bad item is a ValueError."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--metadata {item!r}: expected KEY=VALUE, e.g. version=0.3.3 tp=1")
        out[key.strip()] = value.strip()
    return out


def _p_word(p: float) -> str:
    # vLLM: str(int(p)) if int(p) == p else str(p) -> p99, p99.9
    return str(int(p)) if int(p) == p else str(p)


def peak_output_and_concurrency(records: Sequence[RequestRecord]) -> tuple[float, int]:
    """vLLM's max_output_tokens_per_s (most content chunks in one 1-s bucket of the run)
    and max_concurrent_requests (most requests in flight at once)."""
    ok = [r for r in records if r.state == OK and len(r.chunk_times_ns)]
    peak_tokens = 0.0
    if ok:
        times = np.concatenate([r.chunk_times_ns for r in ok])
        start = min(r.sent_ns for r in records)
        buckets = ((times - start) // 1_000_000_000).astype(np.int64)
        peak_tokens = float(np.bincount(buckets[buckets >= 0]).max(initial=0))
    spans = [(r.sent_ns, r.end_ns) for r in records if r.end_ns is not None]
    if not spans:
        return peak_tokens, 0
    starts = np.sort(np.array([s for s, _ in spans]))
    ends = np.sort(np.array([e for _, e in spans]))
    # in flight just after each start: starts so far minus ends strictly before it
    in_flight = np.arange(1, len(starts) + 1) - np.searchsorted(ends, starts, side="left")
    return peak_tokens, int(in_flight.max())


def vllm_result(
    *,
    records: Sequence[RequestRecord],
    summary: Summary,
    backend: str,
    model_id: str,
    num_prompts: int,
    request_rate: float,
    burstiness: float,
    max_concurrency: int | None,
    goodput: dict[str, float] | None,
    options: VllmResultOptions,
    label: str | None = None,
    run_id: str | None = None,
    now: datetime | None = None,
    ramp_up: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The result dict, key for key as vLLM's main_async() assembles it."""
    metrics = tuple(options.percentile_metrics or VLLM_DEFAULT_PERCENTILE_METRICS)
    percentiles = tuple(float(p) for p in (options.metric_percentiles or VLLM_DEFAULT_PERCENTILES))
    # The same definitions as the run's summary, at vLLM's percentiles (+ the median).
    stats = summarize(
        records, percentiles=(50.0, *percentiles), goodput=goodput, duration_s=summary.duration_s
    )
    result: dict[str, Any] = {
        "date": (now or datetime.now()).strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": backend,
        "backend": backend,
        "label": label,
        "model_id": model_id,
        "tokenizer_id": options.tokenizer or model_id,
        "num_prompts": num_prompts,
        **parse_metadata(options.metadata),
        "request_rate": request_rate if math.isfinite(request_rate) else "inf",
        "burstiness": burstiness,
        "max_concurrency": max_concurrency,
    }
    if ramp_up is not None:  # {strategy, start_rps, end_rps}, as vLLM adds them
        result.update({f"ramp_up_{key}": value for key, value in ramp_up.items()})
    peak_tokens, peak_concurrency = peak_output_and_concurrency(records)
    sent = sorted(records, key=lambda r: r.index)
    t0 = min((r.sent_ns for r in sent), default=0)
    result.update(
        {
            "duration": summary.duration_s,
            "completed": summary.completed,
            "failed": summary.failed + summary.cancelled,
            "total_input_tokens": summary.total_input_tokens,
            "total_output_tokens": summary.total_output_tokens,
            "request_throughput": summary.requests_per_s,
            "request_goodput": stats.goodput_requests_per_s if goodput else None,
            "output_throughput": summary.output_tokens_per_s,
            "total_token_throughput": summary.total_tokens_per_s,
            # a failed request's prompt length is the one asked for, as vLLM lists it
            "input_lens": [r.prompt_tokens or r.expected_input_len or 0 for r in sent],
            "output_lens": [(r.output_tokens or 0) if r.state == OK else 0 for r in sent],
            "ttfts": [_s(r.ttft_ns) if r.state == OK else 0.0 for r in sent],
            "itls": [[_s(g) for g in r.itl_ns().tolist()] if r.state == OK else [] for r in sent],
            "latencies": [_s(r.e2el_ns) if r.state == OK else 0.0 for r in sent],
            "start_times": [_s(r.sent_ns - t0) for r in sent],
            "queue_times": [_s(r.sent_ns - r.intended_ns) for r in sent],
            "generated_texts": ["" for _ in sent],
            "errors": [
                "" if r.state == OK else (r.error_message or r.error_kind or r.state) for r in sent
            ],  # fmt: skip
            "max_output_tokens_per_s": peak_tokens,
            "max_concurrent_requests": peak_concurrency,
            "rtfx": 0.0,
        }
    )
    ok = [r for r in sent if r.state == OK]
    # vLLM's two client-side queue metrics: the wait for a --max-concurrency slot (our send
    # wait plus send lag: actual - intended send) and E2EL including it, over completed requests.
    queue_ns = {
        "client_queue_time": [r.sent_ns - r.intended_ns for r in ok],
        "e2el_including_client_queue": [r.end_ns - r.intended_ns for r in ok],
    }
    for name in metrics:
        if name in queue_ns:
            s = stats_ms(np.asarray(queue_ns[name], dtype=np.float64), (50.0, *percentiles))
        elif name in stats.metrics:
            s = stats.metrics[name]
        else:
            continue
        result[f"mean_{name}_ms"] = s.mean
        result[f"median_{name}_ms"] = s.percentiles[percentile_key(50.0)]
        result[f"std_{name}_ms"] = s.std
        for p in percentiles:
            result[f"p{_p_word(p)}_{name}_ms"] = s.percentiles[percentile_key(p)]
    if not options.save_detailed:
        for name in DETAILED_FIELDS:
            result.pop(name, None)
    result["tokenbench"] = {
        "run_id": run_id,
        "client_limited": summary.client_limited,
        "client_limited_reasons": list(summary.client_limited_reasons),
        "interrupted": summary.interrupted,
        "notes": "failed counts failed and cancelled requests; generated_texts are not kept",
    }
    return result


def _s(ns: float | None) -> float:
    return 0.0 if ns is None else float(ns) / 1e9


def default_filename(
    label: str | None, backend: str, request_rate: float, max_concurrency: int | None,
    model_id: str, date: str, ramp_up: dict[str, Any] | None = None,
) -> str:  # fmt: skip
    """vLLM's name: {label}-{rate}qps[-concurrency{N}]-{model}-{date}.json, and with a
    ramp-up {label}-ramp-up-{strategy}-{start}qps-{end}qps[-concurrency{N}]-{model}-{date}.json."""
    rate = "inf" if not math.isfinite(request_rate) else str(request_rate)
    if ramp_up is not None:
        rate = f"ramp-up-{ramp_up['strategy']}-{ramp_up['start_rps']:g}qps-{ramp_up['end_rps']:g}"
    conc = f"-concurrency{max_concurrency}" if max_concurrency is not None else ""
    model = re.sub(r"[^\w.-]", "_", model_id.split("/")[-1])
    return f"{label or backend}-{rate}qps{conc}-{model}-{date}.json"


def write_vllm_result(result: dict[str, Any], options: VllmResultOptions) -> Path:
    """Write the result where vLLM would: --result-dir / (--result-filename or its default)."""
    name = options.result_filename or default_filename(
        result.get("label"), result["backend"], _rate(result["request_rate"]),
        result["max_concurrency"], result["model_id"], result["date"], _ramp_up(result),
    )  # fmt: skip
    path = Path(options.result_dir or ".") / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, default=_plain))
    return path


def _ramp_up(result: dict[str, Any]) -> dict[str, Any] | None:
    if "ramp_up_strategy" not in result:
        return None
    return {k: result[f"ramp_up_{k}"] for k in ("strategy", "start_rps", "end_rps")}


def _rate(value: Any) -> float:
    return math.inf if value == "inf" else float(value)


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
