"""Reading runs back: listing, resolving RUN references, requests as records/Columns/pandas.

Requests are read from the column blobs of `request_batches` (codec.py), not row by row, so
a 1M-request run loads in a fraction of a second. A run still marked running whose heartbeat
is older than STALE_AFTER_S reads back as interrupted: its process died without finishing.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml
from sqlalchemy import delete, func, select
from sqlalchemy.engine import Engine

from bench.metrics import Columns
from bench.records import OK, RequestRecord
from bench.store import codec
from bench.store.engine import get_engine
from bench.store.errors import RunBusyError, RunNotFoundError
from bench.store.models import (
    INTERRUPTED,
    RUNNING,
    LoadPoint,
    Request,
    RequestBatch,
    Run,
    RunArtifact,
)
from bench.store.redact import repair_scenario_text, scenario_mapping

if TYPE_CHECKING:  # pandas is imported where a frame is made: a run that stores telemetry
    import pandas as pd  # artifacts (save_artifact) need not pay for it

STALE_AFTER_S = 15.0  # writers beat every 2 s; several missed beats mean the process died


def _utc(value: datetime | None) -> datetime | None:
    """SQLite hands datetimes back naive; they were stored as UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


@dataclass
class LoadPointInfo:
    load_point: int
    label: str | None
    mode: str | None
    target_rate: float | None
    concurrency: int | None
    started_ns: int | None
    ended_ns: int | None
    warmup_s: float | None
    cooldown_s: float | None
    params_json: dict | None
    summary_json: dict | None

    @property
    def duration_s(self) -> float | None:
        if self.started_ns is None or self.ended_ns is None:
            return None
        return (self.ended_ns - self.started_ns) / 1e9


@dataclass
class RunInfo:
    """A run's metadata as plain data; `status` is the effective one (see module doc)."""

    id: str
    name: str | None
    label: str | None
    created_at: datetime
    finished_at: datetime | None
    heartbeat_at: datetime | None
    status: str
    stored_status: str
    scenario_text: str | None
    endpoint: str | None
    backend: str | None
    model: str | None
    gpu_type: str | None
    gpu_count: int | None
    simulated: bool
    imported_from: str | None
    tool_version: str | None
    hostname: str | None
    cpu_count: int | None
    python_version: str | None
    platform: str | None
    request_count: int
    summary_json: dict | None
    extra_json: dict | None
    load_points: list[LoadPointInfo]

    @property
    def short_id(self) -> str:
        return self.id[:8]

    def scenario(self) -> dict:
        """The stored scenario as a dict; {} when absent or unreadable (never raises)."""
        return scenario_mapping(self.scenario_text)


def readable_scenario_text(text: str | None) -> str | None:
    """The stored scenario, repaired when an old redaction left it unparseable.

    Repair happens at read time, so runs stored before the fix read back whole on every
    path (API, pages, curves, export) without rewriting the database.
    """
    if not text:
        return text
    try:
        yaml.safe_load(text)
        return text
    except yaml.YAMLError:
        repaired = repair_scenario_text(text)
    try:
        yaml.safe_load(repaired)
        return repaired
    except yaml.YAMLError:
        return text


def _age_s(when: datetime | None) -> float:
    return (datetime.now(UTC) - _utc(when)).total_seconds() if when is not None else 0.0


def effective_status(
    status: str, heartbeat_at: datetime | None, now: datetime | None = None
) -> str:
    if status != RUNNING:
        return status
    now = now or datetime.now(UTC)
    if heartbeat_at is None or now - _utc(heartbeat_at) > timedelta(seconds=STALE_AFTER_S):
        return INTERRUPTED
    return RUNNING


_RUN_FIELDS = [f.name for f in fields(RunInfo) if f.name not in ("stored_status", "load_points")]


def _run_info(run: Run, load_points: list[LoadPoint] | None = None) -> RunInfo:
    values: dict[str, Any] = {name: getattr(run, name) for name in _RUN_FIELDS}
    for key in ("created_at", "finished_at", "heartbeat_at"):
        values[key] = _utc(values[key])
    values["status"] = effective_status(run.status, run.heartbeat_at)
    values["scenario_text"] = readable_scenario_text(run.scenario_text)
    lps = [
        LoadPointInfo(**{f.name: getattr(lp, f.name) for f in fields(LoadPointInfo)})
        for lp in sorted(load_points or [], key=lambda lp: lp.load_point)
    ]
    return RunInfo(stored_status=run.status, load_points=lps, **values)


def list_runs(
    db: str | Engine | None = None,
    *,
    gpu: str | None = None,
    model: str | None = None,
    label: str | None = None,
    status: str | None = None,
    imported: bool | None = None,
    limit: int | None = None,
) -> list[RunInfo]:
    """Runs, newest first; gpu/model/label match case-insensitive substrings."""
    engine = get_engine(db)
    query = select(*Run.__table__.c).order_by(Run.created_at.desc())
    for column, value in ((Run.gpu_type, gpu), (Run.model, model), (Run.label, label)):
        if value:
            query = query.where(func.lower(column).contains(value.lower(), autoescape=True))
    if imported is not None:
        imp = Run.imported_from
        query = query.where(imp.is_not(None) if imported else imp.is_(None))
    if limit is not None and status is None:
        query = query.limit(limit)
    with engine.connect() as conn:
        runs = [_run_info(Run(**row._mapping)) for row in conn.execute(query)]
    if status is not None:
        runs = [r for r in runs if r.status == status][:limit]
    return runs


def resolve_run(ref: str, db: str | Engine | None = None) -> str:
    """A run id from an id, a unique id prefix or a run name (RUN on the command line)."""
    engine = get_engine(db)
    ref = ref.strip()
    with engine.connect() as conn:
        if conn.execute(select(Run.id).where(Run.id == ref)).first():
            return ref
        by_prefix = (
            conn.execute(
                select(Run.id).where(Run.id.startswith(ref.lower(), autoescape=True)).limit(10)
            )
            .scalars()
            .all()
            if ref
            else []
        )
        by_name = conn.execute(select(Run.id).where(Run.name == ref).limit(10)).scalars().all()
    matches = list(dict.fromkeys([*by_prefix, *by_name]))
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise RunNotFoundError(
            f"no run matches {ref!r} (give a run id, id prefix or name; see `tokenbench runs`)"
        )
    shown = ", ".join(m[:12] for m in matches[:5])
    raise RunNotFoundError(f"{ref!r} matches several runs ({shown}...); give more of the id")


def get_run(ref: str, db: str | Engine | None = None) -> RunInfo:
    """One run with its load points, by id, id prefix or name."""
    engine = get_engine(db)
    run_id = resolve_run(ref, engine)
    with engine.connect() as conn:
        row = conn.execute(select(*Run.__table__.c).where(Run.id == run_id)).one()
        lps = conn.execute(select(*LoadPoint.__table__.c).where(LoadPoint.run_id == run_id)).all()
    return _run_info(Run(**row._mapping), [LoadPoint(**lp._mapping) for lp in lps])


# What metrics.Columns needs; the rest of a batch is not even copied.
_COLUMNS_FIELDS = (
    "intended_ns",
    "sent_ns",
    "first_token_ns",
    "end_ns",
    "prompt_tokens",
    "output_tokens",
    "state",
    "error_kind",
    "gaps",
    "slot_wait_ns",
    "cached_prompt_tokens",
    "claimed_output_tokens",
    "traffic_class",
)


def _decoded(
    run_id: str,
    load_point: int | None,
    db: str | Engine | None,
    only: tuple[str, ...] | None = None,
) -> codec.Decoded:
    engine = get_engine(db)
    query = select(RequestBatch.load_point, RequestBatch.data).where(RequestBatch.run_id == run_id)
    if load_point is not None:
        query = query.where(RequestBatch.load_point == load_point)
    query = query.order_by(RequestBatch.id)
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            # Binary results: bytea in text format is hex, twice the bytes plus a parse.
            compiled = query.compile(engine, compile_kwargs={"literal_binds": True})
            with conn.connection.driver_connection.cursor(binary=True) as cur:
                batches = cur.execute(str(compiled)).fetchall()
        else:
            batches = conn.execute(query).all()
    return codec.decode_batches([(lp, data) for lp, data in batches], only)


def _gap_mask(d: codec.Decoded, rows: np.ndarray) -> np.ndarray:
    """Boolean mask over d.gaps selecting the gaps of the rows marked True."""
    return np.repeat(rows, np.maximum(d.ints["n_chunks"] - 1, 0))


def columns_from_decoded(d: codec.Decoded) -> Columns:
    state = d.text("state")
    ok = state == OK
    return Columns(
        state=state,
        error_kind=d.text("error_kind"),
        intended_ns=d.as_float("intended_ns"),
        sent_ns=d.as_float("sent_ns"),
        first_token_ns=d.as_float("first_token_ns"),
        end_ns=d.as_float("end_ns"),
        prompt_tokens=d.as_float("prompt_tokens"),
        output_tokens=d.as_float("output_tokens"),
        itl_ns=d.gaps[_gap_mask(d, ok)].astype(np.float64),
        gap_counts=np.where(ok, np.maximum(d.ints["n_chunks"] - 1, 0), 0),
        slot_wait_ns=np.nan_to_num(d.as_float("slot_wait_ns")),
        cached_prompt_tokens=d.as_float("cached_prompt_tokens"),
        claimed_output_tokens=d.as_float("claimed_output_tokens"),
        traffic_class=d.text("traffic_class") if "traffic_class" in d.codes else None,
    )


def load_columns(
    run_id: str, load_point: int | None = None, db: str | Engine | None = None
) -> Columns:
    """The run's (or one load point's) requests as metrics.Columns, straight from the blobs."""
    return columns_from_decoded(_decoded(run_id, load_point, db, _COLUMNS_FIELDS))


def load_records(
    run_id: str, load_point: int | None = None, db: str | Engine | None = None
) -> list[RequestRecord]:
    """The run's requests as RequestRecords, exactly as they were submitted."""
    d = _decoded(run_id, load_point, db)
    ints = {k: [None if v == codec.NULL else v for v in a.tolist()] for k, a in d.ints.items()}
    texts = {k: d.text(k).tolist() for k in codec.STR_FIELDS}
    gap_ends = np.cumsum(np.maximum(d.ints["n_chunks"] - 1, 0)).tolist()
    records = []
    start = 0
    for i in range(d.n):
        end = gap_ends[i]
        first = ints["first_chunk_ns"][i]
        if first is None:
            times = np.zeros(0, np.int64)
        else:
            times = np.empty(end - start + 1, np.int64)
            times[0] = first
            np.cumsum(d.gaps[start:end], out=times[1:])
            times[1:] += first
        start = end
        rec = RequestRecord(
            chunk_times_ns=times,
            load_point=int(d.load_point[i]),
            **{attr: ints[name][i] for name, attr in codec.INT_FIELDS},
            **{name: texts[name][i] for name in codec.STR_FIELDS},
        )
        rec.slot_wait_ns = rec.slot_wait_ns or 0  # unknown in runs stored before schema 0002
        records.append(rec)
    return records


_NOT_NULL = ("request_index", "turn", "intended_ns", "sent_ns", "n_chunks")


def requests_dataframe(
    run_id: str,
    load_point: int | None = None,
    db: str | Engine | None = None,
    *,
    gaps: bool = False,
) -> pd.DataFrame:
    """One row per request: raw fields (ns since run start), nullable Int64, text as category.

    gaps=True adds `chunk_gaps_ns` (an int64 array per request); it costs a Python object
    per row, so it is off by default.
    """
    import pandas as pd

    d = _decoded(run_id, load_point, db)
    data: dict[str, Any] = {"load_point": d.load_point}
    for name in [n for n, _ in codec.INT_FIELDS] + ["first_chunk_ns", "n_chunks"]:
        col = d.ints[name]
        if name in _NOT_NULL:
            data[name] = col
        else:
            null = col == codec.NULL
            data[name] = pd.arrays.IntegerArray(np.where(null, 0, col), null)
    for name in codec.STR_FIELDS:
        data[name] = pd.Categorical.from_codes(
            d.codes[name], categories=pd.Index(d.vocab[name], dtype=object)
        )
    frame = pd.DataFrame(data)
    if gaps:
        ends = np.cumsum(np.maximum(d.ints["n_chunks"] - 1, 0))
        frame["chunk_gaps_ns"] = np.split(d.gaps.astype(np.int64), ends[:-1]) if d.n else []
    return frame


def refuse_if_busy(run_id: str, status: str, heartbeat_at: datetime | None) -> None:
    """RunBusyError if a live process is still writing the run (delete_run's refusal, also
    said by `tokenbench rm` before it asks for confirmation)."""
    if effective_status(status, heartbeat_at) == RUNNING:
        raise RunBusyError(
            f"run {run_id[:8]} is still being written (its writer beat "
            f"{_age_s(heartbeat_at):.0f} s ago); stop its run first, or wait "
            f"{STALE_AFTER_S:.0f} s after its process died"
        )


def delete_run(run_id: str, db: str | Engine | None = None, *, force: bool = False) -> int:
    """Delete a run and everything it owns; returns how many requests went with it.

    A run still being written (status running, heartbeat fresh) is refused with
    RunBusyError unless `force`: its writer would fail on its next batch and lose it.
    """
    engine = get_engine(db)
    with engine.begin() as conn:
        found = conn.execute(select(Run.status, Run.heartbeat_at).where(Run.id == run_id)).first()
        if found is None:
            raise RunNotFoundError(f"no run {run_id!r}")
        if not force:
            refuse_if_busy(run_id, found.status, found.heartbeat_at)
        n = conn.execute(
            select(func.count()).select_from(Request).where(Request.run_id == run_id)
        ).scalar_one()
        for table in (RunArtifact, RequestBatch, Request, LoadPoint):
            conn.execute(delete(table).where(table.run_id == run_id))
        conn.execute(delete(Run).where(Run.id == run_id))
    return int(n)


def save_artifact(
    run_id: str,
    name: str,
    data: bytes | str,
    *,
    media_type: str = "application/json",
    db: str | Engine | None = None,
) -> None:
    """Keep any extra file with a run (replacing one of the same name)."""
    engine = get_engine(db)
    payload = data.encode() if isinstance(data, str) else data
    with engine.begin() as conn:
        conn.execute(
            delete(RunArtifact).where(RunArtifact.run_id == run_id, RunArtifact.name == name)
        )
        conn.execute(
            RunArtifact.__table__.insert(),
            {
                "run_id": run_id,
                "name": name,
                "media_type": media_type,
                "data": payload,
                "created_at": datetime.now(UTC),
            },
        )


def load_artifact(run_id: str, name: str, db: str | Engine | None = None) -> bytes | None:
    engine = get_engine(db)
    with engine.connect() as conn:
        data = conn.execute(
            select(RunArtifact.data).where(RunArtifact.run_id == run_id, RunArtifact.name == name)
        ).scalar_one_or_none()
    return None if data is None else bytes(data)


def load_artifacts(
    run_id: str, prefix: str, db: str | Engine | None = None
) -> list[tuple[str, bytes]]:
    """A run's artifacts whose names start with `prefix`, as (name, data), in one query.

    For artifacts kept one per load point (telemetry/lp0.json.gz, telemetry/lp1...): the
    caller reads them all at once and orders them by what they hold.
    """
    engine = get_engine(db)
    query = select(RunArtifact.name, RunArtifact.data).where(
        RunArtifact.run_id == run_id, RunArtifact.name.startswith(prefix, autoescape=True)
    )
    with engine.connect() as conn:
        return [(name, bytes(data)) for name, data in conn.execute(query).all()]
