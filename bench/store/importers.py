"""Import other tools' result files as runs marked imported, with whatever detail each has.

- vLLM `vllm bench serve --save-result [--save-detailed]` JSON: per request `ttfts` and
  `itls` (seconds), `input_lens`, `output_lens`, `errors`; aggregates (duration, mean_*_ms,
  ...). It has no per-request send times, so every request is placed at t=0 and the run's
  duration comes from `duration`; E2EL is taken as the last token's arrival.
- guidellm benchmark report JSON (`benchmarks.json`): one load point per benchmark, with
  per-request start, first-token and end times (epoch seconds) and token counts; no
  per-token times, so ITL is absent (TPOT is computed from the ends as usual).
- aiperf: the profile export JSON (`profile_export_aiperf.json`, aggregates only) and its
  per-request JSONL (`profile_export.jsonl`: request_start_ns/request_end_ns, TTFT and
  inter_chunk_latency in ms). Given the JSON, a JSONL beside it is read too.
- tokenbench's own fallback file (`tokenbench-unsaved-RUN.jsonl`), written when the
  database failed mid-run: a header line describing the run, then every RequestRecord.

Without per-request data a run keeps the tool's own aggregates in extra_json["source_summary"].
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy.engine import Engine

from bench.metrics import summarize
from bench.records import (
    CANCELLED,
    COUNT_TOKENIZER,
    COUNT_USAGE,
    ERR_CANCELLED,
    ERR_IMPORTED,
    FAILED,
    OK,
    RequestRecord,
)
from bench.store.errors import RunNotFoundError
from bench.store.writer import RunWriter

FORMATS = ("vllm", "guidellm", "aiperf", "tokenbench")
FALLBACK_HEADER = "tokenbench_unsaved"  # bench.session.save_fallback's first line
S = 1_000_000_000  # ns per second
MS = 1_000_000  # ns per millisecond


class ImportFormatError(ValueError):
    """The file is not (or not quite) the format it was taken for."""


def _ns(seconds: float | None, scale: int = S) -> int | None:
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return None
    return round(float(seconds) * scale)


def _scalars(doc: dict[str, Any]) -> dict[str, Any]:
    """The aggregate (non-list) fields of a result document, kept verbatim."""
    return {k: v for k, v in doc.items() if not isinstance(v, list | dict)}


def _read(path: Path) -> tuple[str, Any]:
    text = path.read_text()
    try:
        return "json", json.loads(text)
    except json.JSONDecodeError:
        try:
            return "jsonl", [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise ImportFormatError(f"{path}: not JSON or JSON lines ({exc})") from None


def detect_format(doc: Any) -> str:
    if isinstance(doc, list) and doc and isinstance(doc[0], dict) and FALLBACK_HEADER in doc[0]:
        return "tokenbench"
    if isinstance(doc, list):
        if doc and isinstance(doc[0], dict) and "metadata" in doc[0] and "metrics" in doc[0]:
            return "aiperf"
    elif isinstance(doc, dict):
        if "benchmarks" in doc:
            return "guidellm"
        if "ttfts" in doc or ("request_throughput" in doc and "mean_ttft_ms" in doc):
            return "vllm"
        if "aiperf_version" in doc or (
            "records" in doc and ("input_config" in doc or "time_to_first_token" in str(doc)[:5000])
        ):
            return "aiperf"
    raise ImportFormatError(
        "cannot tell which tool wrote this file; pass --format vllm, guidellm or aiperf"
    )


def import_file(
    path: str | Path, fmt: str = "auto", *, db: str | Engine | None = None, name: str | None = None
) -> str:
    """Import one result file as a run; returns the new run's id."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    _, doc = _read(path)
    fmt = detect_format(doc) if fmt == "auto" else fmt
    if fmt not in FORMATS:
        raise ImportFormatError(f"--format {fmt!r}: expected auto, {', '.join(FORMATS)}")
    importer = {"vllm": _vllm, "guidellm": _guidellm, "aiperf": _aiperf, "tokenbench": _fallback}[
        fmt
    ]
    try:
        run = importer(doc, path)
    except (KeyError, TypeError, IndexError, AttributeError) as exc:
        raise ImportFormatError(f"{path}: not a {fmt} result file as expected ({exc!r})") from None
    if name:
        run["name"] = name
    run.setdefault("name", path.stem)
    _require_timings(run, fmt, path)
    if fmt == "tokenbench":
        _make_room_for(run, path, db)
    return _write(run, fmt, db)


def _make_room_for(run: dict[str, Any], path: Path, db: str | Engine | None) -> None:
    """A fallback file completes the run it was measured as (same id), never a duplicate.

    Where the database already holds part of that run (the writer stored some batches
    before it failed), the partial run is replaced by the file's, which holds every record
    the run measured (bench.session.save_fallback) — but only if it holds at least as many
    requests.
    """
    from bench.store.read import delete_run, get_run

    run_id = run.get("run_id")
    if not run_id:
        return
    try:
        stored = get_run(run_id, db)
    except RunNotFoundError:
        return
    if stored.id != run_id:
        return  # a prefix of another run's id: leave it alone
    if stored.request_count > len(run["records"]):
        raise ImportFormatError(
            f"{path}: the database's run {run_id} holds {stored.request_count} requests, more "
            f"than this file's {len(run['records'])}; nothing was imported"
        )
    run["created_at"] = stored.created_at
    # force: the file is written only once the run's writer has stopped for good, so a
    # "running" status with a fresh heartbeat is the failed writer's last word
    delete_run(run_id, db, force=True)


_NO_TIMINGS_HINT = {
    "vllm": "vllm bench serve writes per-request timings only with --save-detailed: rerun it "
    "with --save-result --save-detailed",
    "guidellm": "expected per-request request_start_time / time_to_first_token_ms or "
    "info.timings under benchmarks[i].requests (guidellm 0.8 writes them to benchmarks.json)",
    "aiperf": "the aggregate export has no per-request data: give profile_export.jsonl, "
    "which aiperf writes beside it",
}


def _require_timings(run: dict[str, Any], fmt: str, path: Path) -> None:
    """Refuse a file in which no request has a timing: a run stored without latencies
    would look like a success and say nothing (issue 15)."""
    records: list[RequestRecord] = run.get("records") or []
    # A failed request is a result too; an "ok" one without a single time is not.
    timed = [r for r in records if r.end_ns is not None or r.first_token_ns is not None]
    if not timed and not any(r.state == FAILED for r in records):
        found = f"{len(records)} requests, none with a timing" if records else "no requests"
        raise ImportFormatError(
            f"{path}: found {found}, so nothing was imported; {_NO_TIMINGS_HINT.get(fmt, 'the file holds no per-request data')}"
        )


def _fallback(doc: list[dict[str, Any]], path: Path) -> dict[str, Any]:
    """A run `tokenbench run` measured but could not store (bench.session.save_fallback):
    the first line describes the run, every other line is one RequestRecord."""
    header, rows = doc[0], doc[1:]
    records = []
    for row in rows:
        row = dict(row)
        times = np.asarray(row.pop("chunk_times_ns", []), dtype=np.int64)
        records.append(RequestRecord(**row, chunk_times_ns=times))
    points = header.get("load_points") or [{"load_point": 0}]
    load_points = []
    for lp in points:
        load_points.append(
            {
                "load_point": lp["load_point"],
                "label": lp.get("label"),
                "mode": lp.get("mode"),
                "target_rate": lp.get("target_rate"),
                "concurrency": lp.get("concurrency"),
                "warmup_s": lp.get("warmup_s"),
                "cooldown_s": lp.get("cooldown_s"),
                "params": lp.get("params"),
                "started_ns": 0,
                "ended_ns": lp.get("ended_ns"),
            }
        )
    run = dict(header.get("run") or {})
    extra = dict(run.pop("extra", None) or {})
    extra["restored_from"] = {"file": str(path), "run_id": header.get("run_id")}
    run_id = header.get("run_id")
    if isinstance(run_id, str) and re.fullmatch(r"[0-9a-f]{32}", run_id):
        run["run_id"] = run_id  # the same run, completed (see _make_room_for)
    return {
        **run,
        "extra": extra,
        "status": header.get("status") or "interrupted",
        "records": records,
        "load_points": load_points,
    }


def _write(run: dict[str, Any], source: str, db: str | Engine | None) -> str:
    records: list[RequestRecord] = run.pop("records", [])
    load_points: list[dict[str, Any]] = run.pop("load_points", [{"load_point": 0}])
    status = run.pop("status", "completed")
    extra = {"source_summary": run.pop("source_summary", None), **(run.pop("extra", None) or {})}
    writer = RunWriter(db, imported_from=source, extra=extra, **run)
    for lp in load_points:
        lp = dict(lp)
        ended = lp.pop("ended_ns", None)
        index = writer.start_load_point(lp.pop("load_point"), **lp)
        writer.end_load_point(index, ended_ns=ended)
    for record in records:
        writer.submit(record)
    summary = None
    if records:
        durations = [
            lp["ended_ns"] - (lp.get("started_ns") or 0) for lp in load_points if lp.get("ended_ns")
        ]
        summary = summarize(records, duration_s=sum(durations) / S if durations else None).to_json()
    writer.finish(status, summary)
    return writer.run_id


def _from_epoch(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(float(seconds), UTC)


# ---- vLLM ------------------------------------------------------------------------------


def _vllm(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    """`vllm bench serve --save-result --save-detailed`: per request `ttfts`, `itls`,
    `latencies` (E2EL) and `start_times` (perf_counter seconds, any origin) in seconds,
    `queue_times` (the wait for a --max-concurrency slot), `input_lens`, `output_lens` and
    `errors` ("" when it succeeded), as vLLM's serve.py writes them."""
    ttfts = doc.get("ttfts") or []
    n = len(ttfts)
    itls = doc.get("itls") or [[] for _ in ttfts]
    in_lens = doc.get("input_lens") or [None] * n
    out_lens = doc.get("output_lens") or [None] * n
    errors = doc.get("errors") or [""] * n
    latencies = doc.get("latencies") or [None] * n
    queues = doc.get("queue_times") or [None] * n
    starts = doc.get("start_times")  # present since vLLM 0.10; seconds, any origin
    t0 = min(starts) if starts else 0.0
    records = []
    for i, ttft in enumerate(ttfts):
        sent = _ns(starts[i] - t0) if starts else 0
        wait = (_ns(queues[i]) if i < len(queues) else None) or 0
        error = errors[i] if i < len(errors) else ""
        if error:
            records.append(
                RequestRecord(
                    index=i,
                    sent_ns=sent,
                    intended_ns=sent - wait,
                    slot_wait_ns=wait,
                    state=FAILED,
                    error_kind=ERR_IMPORTED,
                    error_message=str(error),
                    prompt_tokens=in_lens[i],
                    token_count_source=COUNT_TOKENIZER,
                )
            )
            continue
        first = sent + _ns(ttft)
        gaps = np.round(np.asarray(itls[i], dtype=np.float64) * S).astype(np.int64)
        times = first + np.concatenate([[0], np.cumsum(gaps)]).astype(np.int64)
        latency = latencies[i] if i < len(latencies) else None
        records.append(
            RequestRecord(
                index=i,
                intended_ns=sent - wait,
                sent_ns=sent,
                slot_wait_ns=wait,
                first_token_ns=first,
                # vLLM's own E2EL when it wrote one, else the last token's arrival
                end_ns=sent + _ns(latency) if latency else int(times[-1]),
                chunk_times_ns=times,
                prompt_tokens=in_lens[i],
                output_tokens=out_lens[i],
                token_count_source=COUNT_TOKENIZER,
                state=OK,
            )
        )
    rate = doc.get("request_rate")
    rate = (
        None
        if rate in (None, "inf") or (isinstance(rate, float) and math.isinf(rate))
        else float(rate)
    )
    duration = doc.get("duration")
    created = None
    if doc.get("date"):
        try:  # vLLM writes "%Y%m%d-%H%M%S" local time
            created = datetime.strptime(doc["date"], "%Y%m%d-%H%M%S").replace(tzinfo=UTC)
        except ValueError:
            created = None
    return {
        "label": doc.get("label"),
        "backend": doc.get("backend") or doc.get("endpoint_type"),
        "model": doc.get("model_id"),
        "created_at": created,
        "records": records,
        "load_points": [
            {
                "load_point": 0,
                "mode": "rate" if rate else "max",
                "target_rate": rate,
                "concurrency": doc.get("max_concurrency"),
                "started_ns": 0,
                "ended_ns": _ns(duration) if duration else None,
                "params": {
                    "burstiness": doc.get("burstiness"),
                    "num_prompts": doc.get("num_prompts"),
                },
            }
        ],
        "source_summary": _scalars(doc),
    }


# ---- guidellm ----------------------------------------------------------------------------


def _guidellm(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    """guidellm's benchmarks.json. 0.8 writes per request `info.timings` (epoch seconds:
    targeted_start, request_start, first_token_iteration, last_token_iteration,
    request_end) with `request_start_time` and `time_to_first_token_ms` beside them, and a
    benchmark's strategy under `config.strategy`; earlier releases wrote `start_time`,
    `first_token_time`, `end_time`, `scheduler_info` and `args.strategy`. Both are read."""
    benchmarks = doc["benchmarks"]
    requests = [
        req
        for bench in benchmarks
        for key in ("successful", "errored", "incomplete")
        for req in (bench.get("requests") or {}).get(key) or []
    ]
    starts = [t for req in requests for t in _guidellm_times(req)[:2]]
    starts += [_guidellm_bounds(b)[0] for b in benchmarks]
    starts = [t for t in starts if t is not None]
    t0 = min(starts) if starts else 0.0
    records: list[RequestRecord] = []
    load_points = []
    for lp, bench in enumerate(benchmarks):
        config = bench.get("config") or {}
        args = bench.get("args") or {}
        strategy = config.get("strategy") or args.get("strategy") or bench.get("strategy") or {}
        start, end = _guidellm_bounds(bench)
        load_points.append(
            {
                "load_point": lp,
                "mode": strategy.get("type_"),
                "target_rate": strategy.get("rate"),
                "concurrency": strategy.get("streams") or strategy.get("max_concurrency"),
                "started_ns": _ns(start - t0) if start else None,
                "ended_ns": _ns(end - t0) if end else None,
                "warmup_s": args.get("warmup_duration"),
                "cooldown_s": args.get("cooldown_duration"),
            }
        )
        groups = bench.get("requests") or {}
        for state, key in ((OK, "successful"), (FAILED, "errored"), (CANCELLED, "incomplete")):
            for req in groups.get(key) or []:
                records.append(_guidellm_request(req, state, lp, len(records), t0))
    target, model, backend = _guidellm_target(doc, benchmarks)
    return {
        "endpoint": target,
        "backend": backend,
        "model": model,
        "created_at": _from_epoch(t0) if starts else None,
        "records": records,
        "load_points": load_points,
        "source_summary": {
            "benchmarks": [
                {
                    "strategy": (b.get("config") or {}).get("strategy")
                    or (b.get("args") or {}).get("strategy"),
                    "metrics": b.get("metrics"),
                }
                for b in benchmarks
            ]
        },
    }


def _guidellm_bounds(bench: dict) -> tuple[float | None, float | None]:
    """A benchmark's start and end (epoch s), wherever this release keeps them."""
    for holder in (bench, bench.get("run_stats") or {}, bench.get("scheduler_state") or {}):
        start, end = holder.get("start_time"), holder.get("end_time")
        if start is not None:
            return start, end
    return None, None


def _guidellm_target(doc: dict, benchmarks: list[dict]) -> tuple[str | None, ...]:
    """(target URL, model, backend type) from the report's args (0.8) or a worker (older)."""
    spec = ((doc.get("config") or {}).get("spec") or {}).get("backend") or {}  # 0.8
    args = doc.get("args") or {}
    worker: dict[str, Any] = {}
    for bench in benchmarks:
        worker = bench.get("worker") or worker
    backend_kwargs = args.get("backend_kwargs") or {}
    target = (
        spec.get("target")
        or args.get("target")
        or backend_kwargs.get("target")
        or worker.get("backend_target")
    )
    model = (
        spec.get("model")
        or args.get("model")
        or backend_kwargs.get("model")
        or worker.get("backend_model")
    )
    backend = spec.get("kind") or args.get("backend") or worker.get("backend_type")
    if isinstance(backend, dict):
        backend = backend.get("kind") or backend.get("type_")
    return target, model, backend


def _guidellm_times(req: dict) -> tuple[float | None, ...]:
    """(targeted start, request start, first token, end) of one request, epoch seconds."""
    timings = (req.get("info") or {}).get("timings") or {}
    info = req.get("scheduler_info") or {}
    start = timings.get("request_start") or req.get("request_start_time") or req.get("start_time")
    start = start or info.get("request_start")
    targeted = timings.get("targeted_start") or info.get("targeted_start_time")
    first = timings.get("first_token_iteration") or req.get("first_token_time")
    if first is None and start is not None and req.get("time_to_first_token_ms") is not None:
        first = start + req["time_to_first_token_ms"] / 1000
    end = timings.get("request_end") or req.get("end_time") or info.get("request_end")
    return targeted, start, first, end


def _guidellm_request(req: dict, state: str, lp: int, index: int, t0: float) -> RequestRecord:
    targeted, start, first, end = _guidellm_times(req)
    sent = _ns(start - t0) if start is not None else 0
    intended = _ns(targeted - t0) if targeted is not None else sent
    error = req.get("error") or (req.get("info") or {}).get("error")
    return RequestRecord(
        index=index,
        load_point=lp,
        intended_ns=min(intended, sent),
        sent_ns=sent,
        first_token_ns=_ns(first - t0) if first is not None else None,
        end_ns=_ns(end - t0) if end is not None else None,
        prompt_tokens=req.get("prompt_tokens"),
        output_tokens=req.get("output_tokens"),
        cached_prompt_tokens=req.get("cached_tokens"),  # 0.8: the server's usage said so
        token_count_source=COUNT_USAGE,
        state=state,
        error_kind=None if state == OK else (ERR_IMPORTED if state == FAILED else ERR_CANCELLED),
        error_message=None if error is None else str(error),
    )


# ---- aiperf ------------------------------------------------------------------------------


def _aiperf(doc: Any, path: Path) -> dict[str, Any]:
    lines: list[dict] | None = doc if isinstance(doc, list) else None
    aggregate: dict[str, Any] = doc if isinstance(doc, dict) else {}
    if lines is None:
        sibling = path.with_name("profile_export.jsonl")
        if sibling.is_file():
            _, lines = _read(sibling)
    else:
        sibling = path.with_name("profile_export_aiperf.json")
        if sibling.is_file():
            aggregate = json.loads(sibling.read_text())
    config = aggregate.get("input_config") or {}
    endpoint = config.get("endpoint") or {}
    # 0.13 keeps the load in input_config.phases and the models under models.items; older
    # releases in loadgen and endpoint.model_names
    phases = [p for p in config.get("phases") or [] if p.get("kind") != "warmup"]
    loadgen = config.get("loadgen") or (phases[0] if phases else {})
    models = endpoint.get("model_names") or [
        m.get("name") for m in (config.get("models") or {}).get("items") or []
    ]
    records = _aiperf_records(lines or [])
    ends = [r.end_ns for r in records if r.end_ns is not None]
    url = endpoint.get("url") or next(iter(endpoint.get("urls") or []), None)
    if url and "://" not in url:
        url = f"http://{url}"
    return {
        "endpoint": url,
        "backend": endpoint.get("type"),
        "model": models[0] if models else None,
        "records": records,
        "load_points": [
            {
                "load_point": 0,
                "mode": "concurrency" if loadgen.get("concurrency") else "rate",
                "target_rate": loadgen.get("request_rate"),
                "concurrency": loadgen.get("concurrency"),
                "started_ns": 0 if records else None,
                "ended_ns": max(ends) if ends else None,
            }
        ],
        "source_summary": {"records": aggregate.get("records"), **_scalars(aggregate)}
        if aggregate
        else None,
    }


def _metric(metrics: dict, name: str) -> Any:
    value = metrics.get(name)
    return value.get("value") if isinstance(value, dict) else value


def _aiperf_records(lines: Iterable[dict]) -> list[RequestRecord]:
    rows = [
        r
        for r in lines
        if (r.get("metadata") or {}).get("benchmark_phase", "profiling") != "warmup"
    ]
    starts = [
        r["metadata"]["request_start_ns"] for r in rows if r["metadata"].get("request_start_ns")
    ]
    t0 = min(starts) if starts else 0
    records = []
    for i, row in enumerate(rows):
        meta, metrics, error = row["metadata"], row.get("metrics") or {}, row.get("error")
        sent = meta.get("request_start_ns", t0) - t0
        end = meta.get("request_end_ns")
        ttft = _metric(metrics, "time_to_first_token")
        first = sent + _ns(ttft, MS) if ttft is not None else None
        chunks = _metric(metrics, "inter_chunk_latency") or []
        times = np.zeros(0, np.int64)
        if first is not None:
            gaps = np.round(np.asarray(chunks, dtype=np.float64) * MS).astype(np.int64)
            times = first + np.concatenate([[0], np.cumsum(gaps)]).astype(np.int64)
        cancelled = bool(meta.get("was_cancelled"))
        state = CANCELLED if cancelled else (FAILED if error else OK)
        records.append(
            RequestRecord(
                index=i,
                turn=meta.get("turn_index") or 0,
                intended_ns=sent,
                sent_ns=sent,
                first_token_ns=first,
                # aiperf's own E2E latency where it kept one, else the record's end stamp
                end_ns=sent + _ns(latency, MS)
                if (latency := _metric(metrics, "request_latency")) is not None
                else (None if end is None else end - t0),
                chunk_times_ns=times,
                # the server's usage where aiperf kept it (0.13), else aiperf's tokenizer's
                prompt_tokens=_metric(metrics, "usage_prompt_tokens")
                or _metric(metrics, "input_sequence_length"),
                output_tokens=_metric(metrics, "usage_completion_tokens")
                or _metric(metrics, "output_sequence_length"),
                cached_prompt_tokens=_metric(metrics, "usage_prompt_cache_read_tokens"),
                token_count_source=COUNT_USAGE
                if _metric(metrics, "usage_completion_tokens") is not None
                else COUNT_TOKENIZER,
                state=state,
                http_status=(error or {}).get("code") if isinstance(error, dict) else None,
                error_kind=None if state == OK else (ERR_CANCELLED if cancelled else ERR_IMPORTED),
                error_message=None
                if not error
                else (error.get("message") if isinstance(error, dict) else str(error)),
            )
        )
    return records
