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
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy.engine import Engine

from bench.metrics import summarize
from bench.records import CANCELLED, COUNT_TOKENIZER, COUNT_USAGE, FAILED, OK, RequestRecord
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
        if "records" in doc and ("input_config" in doc or "time_to_first_token" in str(doc)[:5000]):
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
    return _write(run, fmt, db)


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
    ttfts = doc.get("ttfts") or []
    itls = doc.get("itls") or [[] for _ in ttfts]
    in_lens = doc.get("input_lens") or [None] * len(ttfts)
    out_lens = doc.get("output_lens") or [None] * len(ttfts)
    errors = doc.get("errors") or [""] * len(ttfts)
    starts = doc.get("start_times")  # present in some versions; seconds, any origin
    t0 = min(starts) if starts else 0.0
    records = []
    for i, ttft in enumerate(ttfts):
        sent = _ns(starts[i] - t0) if starts else 0
        error = errors[i] if i < len(errors) else ""
        if error:
            records.append(
                RequestRecord(
                    index=i,
                    sent_ns=sent,
                    intended_ns=sent,
                    state=FAILED,
                    error_kind="imported_error",
                    error_message=str(error),
                    prompt_tokens=in_lens[i],
                    token_count_source=COUNT_TOKENIZER,
                )
            )
            continue
        first = sent + _ns(ttft)
        gaps = np.round(np.asarray(itls[i], dtype=np.float64) * S).astype(np.int64)
        times = first + np.concatenate([[0], np.cumsum(gaps)]).astype(np.int64)
        records.append(
            RequestRecord(
                index=i,
                intended_ns=sent,
                sent_ns=sent,
                first_token_ns=first,
                end_ns=int(times[-1]),
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
    benchmarks = doc["benchmarks"]
    starts = [b.get("start_time") or b.get("run_stats", {}).get("start_time") for b in benchmarks]
    t0 = min(s for s in starts if s is not None)
    records: list[RequestRecord] = []
    load_points = []
    worker: dict[str, Any] = {}
    for lp, bench in enumerate(benchmarks):
        worker = bench.get("worker") or worker
        args = bench.get("args") or {}
        strategy = args.get("strategy") or bench.get("strategy") or {}
        start = bench.get("start_time") or bench.get("run_stats", {}).get("start_time")
        end = bench.get("end_time") or bench.get("run_stats", {}).get("end_time")
        load_points.append(
            {
                "load_point": lp,
                "mode": strategy.get("type_"),
                "target_rate": strategy.get("rate"),
                "concurrency": strategy.get("streams"),
                "started_ns": _ns(start - t0) if start else None,
                "ended_ns": _ns(end - t0) if end else None,
                "warmup_s": args.get("warmup_duration"),
                "cooldown_s": args.get("cooldown_duration"),
            }
        )
        requests = bench.get("requests") or {}
        for state, key in ((OK, "successful"), (FAILED, "errored"), (CANCELLED, "incomplete")):
            for req in requests.get(key) or []:
                records.append(_guidellm_request(req, state, lp, len(records), t0))
    return {
        "endpoint": worker.get("backend_target"),
        "backend": worker.get("backend_type"),
        "model": worker.get("backend_model"),
        "created_at": _from_epoch(t0),
        "records": records,
        "load_points": load_points,
        "source_summary": {
            "benchmarks": [
                {"strategy": (b.get("args") or {}).get("strategy"), "metrics": b.get("metrics")}
                for b in benchmarks
            ]
        },
    }


def _guidellm_request(req: dict, state: str, lp: int, index: int, t0: float) -> RequestRecord:
    info = req.get("scheduler_info") or {}
    start = req.get("start_time") or info.get("request_start")
    sent = _ns(start - t0) if start is not None else 0
    targeted = info.get("targeted_start_time")
    first = req.get("first_token_time")
    end = req.get("end_time") or info.get("request_end")
    error = req.get("error")
    return RequestRecord(
        index=index,
        load_point=lp,
        intended_ns=_ns(targeted - t0) if targeted else sent,
        sent_ns=sent,
        first_token_ns=_ns(first - t0) if first else None,
        end_ns=_ns(end - t0) if end else None,
        prompt_tokens=req.get("prompt_tokens"),
        output_tokens=req.get("output_tokens"),
        token_count_source=COUNT_USAGE,
        state=state,
        error_kind=None if state == OK else ("imported_error" if state == FAILED else "cancelled"),
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
    loadgen = config.get("loadgen") or {}
    models = endpoint.get("model_names") or []
    records = _aiperf_records(lines or [])
    ends = [r.end_ns for r in records if r.end_ns is not None]
    url = endpoint.get("url")
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
                end_ns=None if end is None else end - t0,
                chunk_times_ns=times,
                prompt_tokens=_metric(metrics, "input_sequence_length"),
                output_tokens=_metric(metrics, "output_sequence_length"),
                token_count_source=COUNT_TOKENIZER,
                state=state,
                http_status=(error or {}).get("code") if isinstance(error, dict) else None,
                error_kind=None
                if state == OK
                else ("cancelled" if cancelled else "imported_error"),
                error_message=None
                if not error
                else (error.get("message") if isinstance(error, dict) else str(error)),
            )
        )
    return records
