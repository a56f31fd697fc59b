"""RunWriter: records go from the event loop to SQL without blocking it or losing them.

`submit()` only appends to a queue.SimpleQueue (O(1), no lock contention, no I/O). A
background thread drains the queue and commits every `flush_interval_s` (0.5 s) or
`batch_rows` (1,000) records, whichever comes first: one transaction holds the batch's
`requests` rows (executemany), its column blob (codec.py) and the run's heartbeat, so a
process killed with SIGKILL loses at most the last half second.

Failures are loud: a commit that fails (database locked past the busy timeout, read-only,
disk full, server gone) is retried a few times, then the writer stops, keeps the records it
could not save, and raises StoreError naming the database from `submit()`, `check()` and
`finish()`. It never drops a record silently and never waits forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import queue
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import insert, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from bench.records import RequestRecord
from bench.store import codec
from bench.store.engine import check_integrity, describe, get_engine
from bench.store.errors import StoreError
from bench.store.models import COMPLETED, RUN_STATUSES, RUNNING, LoadPoint, RequestBatch, Run
from bench.store.redact import Redactor, strip_url

FLUSH_INTERVAL_S = 0.5
BATCH_ROWS = 1000
HEARTBEAT_S = 2.0
RETRIES = 3
# A server that went away (PostgreSQL restarted, a network blip) is retried this long, with
# backoff from FLUSH_INTERVAL_S doubling up to RECONNECT_MAX_WAIT_S; records keep queueing.
RECONNECT_S = 60.0
RECONNECT_MAX_WAIT_S = 8.0


def tool_version() -> str:
    try:
        from importlib.metadata import version

        return version("tokenbench")
    except Exception:  # noqa: BLE001 - running from a source tree
        return "0+unknown"


def host_facts() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "python_version": platform.python_version(),
        "platform": platform.platform(),
    }


def now_utc() -> datetime:
    return datetime.now(UTC)


def _summary_dict(summary: Any) -> dict | None:
    """Accept a metrics.Summary (anything with to_json) or a plain dict."""
    if summary is None or isinstance(summary, dict):
        return summary
    return summary.to_json()


class DatabaseFileGone(RuntimeError):
    """The SQLite file the run writes to was deleted, replaced or made read-only mid-run:
    SQLite would go on committing into the open (unlinked or read-only) file and every
    record would be lost while the run reported success (issue 28, F6)."""


class _SqliteFile:
    """The SQLite file a writer opened: checked before each commit, a stat or two."""

    def __init__(self, engine: Engine) -> None:
        database = engine.url.database or ""
        self.path = None
        on_disk = database not in ("", ":memory:") and not database.startswith("file:")
        if engine.dialect.name == "sqlite" and on_disk:
            self.path = os.path.abspath(database)
            info = os.stat(self.path)
            self.identity = (info.st_dev, info.st_ino)

    def check(self) -> None:
        if self.path is None:
            return
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            raise DatabaseFileGone(
                f"the database file {self.path} was deleted during the run"
            ) from None
        if (info.st_dev, info.st_ino) != self.identity:
            raise DatabaseFileGone(f"the database file {self.path} was replaced during the run")
        statvfs = getattr(os, "statvfs", None)  # not on Windows
        read_only_fs = statvfs is not None and bool(statvfs(self.path).f_flag & os.ST_RDONLY)
        if read_only_fs or not info.st_mode & 0o222:
            raise DatabaseFileGone(f"the database file {self.path} turned read-only during the run")


def _lost_connection(engine: Engine, exc: BaseException) -> bool:
    """Whether a failure is the database server going away (worth reconnecting for)."""
    from sqlalchemy.exc import InterfaceError, OperationalError

    if engine.dialect.name == "sqlite":
        return False
    return bool(getattr(exc, "connection_invalidated", False)) or isinstance(
        exc, OperationalError | InterfaceError
    )


def _friendly(engine: Engine, exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    hint = ""
    lowered = text.lower()
    if "locked" in lowered or "busy" in lowered:
        hint = " (another process holds a write lock; close it or use another --db)"
    elif "readonly" in lowered or "read-only" in lowered or "read only" in lowered:
        hint = " (the file or its folder is not writable; check permissions or use another --db)"
    elif "full" in lowered or "no space" in lowered:
        hint = " (the disk or database is full; free space or use another --db)"
    return f"{describe(engine)}: {text}{hint}"


@dataclass
class _LoadPointStart:
    values: dict[str, Any]


@dataclass
class _LoadPointEnd:
    load_point: int
    values: dict[str, Any]


@dataclass
class _Stop:
    status: str
    summary: dict | None
    done: threading.Event = field(default_factory=threading.Event)


class RunWriter:
    """Writes one run: its row, its load points and every request, off the event loop."""

    def __init__(
        self,
        db: str | Engine | None = None,
        *,
        name: str | None = None,
        label: str | None = None,
        scenario: str | dict | None = None,
        endpoint: str | None = None,
        backend: str | None = None,
        model: str | None = None,
        gpu_type: str | None = None,
        gpu_count: int | None = None,
        simulated: bool = False,
        imported_from: str | None = None,
        extra: dict[str, Any] | None = None,
        secrets: Iterable[str | None] = (),
        run_id: str | None = None,
        created_at: datetime | None = None,
        flush_interval_s: float = FLUSH_INTERVAL_S,
        batch_rows: int = BATCH_ROWS,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        """Insert the run row now (so a bad database fails before the run starts).

        `scenario` is stored as given (text, or a dict stored as JSON), scrubbed field by field
        (redact.Redactor.scenario) so it always parses back; `secrets` (the API key in use)
        are scrubbed from every stored string, as are credentials in URLs.
        """
        self.engine = get_engine(db)
        check_integrity(self.engine)  # a damaged SQLite file is refused, not written to
        self._file = _SqliteFile(self.engine)
        self.run_id = run_id or uuid.uuid4().hex
        self.redact = Redactor(secrets)
        self.flush_interval_s = flush_interval_s
        self.batch_rows = batch_rows
        self.heartbeat_s = heartbeat_s
        self.submitted = 0
        self.written = 0
        self._error: StoreError | None = None
        self._unsaved: list[RequestRecord] = []
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._next_load_point = 0
        self._finished = False
        self._stopped = False

        row = {
            "id": self.run_id,
            "name": self.redact.maybe_known(name),
            "label": self.redact.maybe_known(label),
            "created_at": created_at or now_utc(),
            "heartbeat_at": now_utc(),
            "status": RUNNING,
            "scenario_text": self.redact.scenario(scenario),
            "endpoint": self.redact.maybe(strip_url(endpoint)),
            "backend": backend,
            "model": model,
            "gpu_type": gpu_type,
            "gpu_count": gpu_count,
            "simulated": bool(simulated),
            "imported_from": imported_from,
            "tool_version": tool_version(),
            "request_count": 0,
            "extra_json": extra,
            **host_facts(),
        }
        try:
            with self.engine.begin() as conn:
                conn.execute(insert(Run), row)
        except SQLAlchemyError as exc:
            raise StoreError(f"cannot start a run in {_friendly(self.engine, exc)}") from exc

        names = ("run_id", "load_point", *codec.SQL_COLUMNS)
        self._copy = self.engine.dialect.name == "postgresql"
        if self._copy:
            self._insert_sql = f"COPY requests ({', '.join(names)}) FROM STDIN"
        else:
            mark = "?" if self.engine.dialect.paramstyle == "qmark" else "%s"
            marks = ", ".join(mark for _ in names)
            self._insert_sql = f"INSERT INTO requests ({', '.join(names)}) VALUES ({marks})"
        self._thread = threading.Thread(
            target=self._run, name=f"tokenbench-writer-{self.run_id[:8]}", daemon=True
        )
        self._thread.start()

    # ---- called from the event loop -------------------------------------------------

    def submit(self, record: RequestRecord) -> None:
        """Queue one finished request; O(1), never blocks. Raises once the writer failed."""
        if self._error is not None:
            raise self._error
        if self._finished:
            raise StoreError(f"run {self.run_id}: submit() after finish()")
        self.submitted += 1
        self._queue.put(record)

    def start_load_point(
        self,
        load_point: int | None = None,
        *,
        label: str | None = None,
        mode: str | None = None,
        target_rate: float | None = None,
        concurrency: int | None = None,
        started_ns: int | None = None,
        warmup_s: float | None = None,
        cooldown_s: float | None = None,
        params: dict[str, Any] | None = None,
    ) -> int:
        """Record a load point (queued like records, so it never blocks); returns its number.

        The number is what RequestRecord.load_point must hold; it defaults to 0, 1, 2, ...
        """
        if load_point is None:
            load_point = self._next_load_point
        self._next_load_point = max(self._next_load_point, load_point + 1)
        values = {
            "run_id": self.run_id,
            "load_point": load_point,
            "label": label,
            "mode": mode,
            "target_rate": target_rate,
            "concurrency": concurrency,
            "started_ns": started_ns,
            "warmup_s": warmup_s,
            "cooldown_s": cooldown_s,
            "params_json": params,
        }
        self._queue.put(_LoadPointStart(values))
        return load_point

    def end_load_point(
        self, load_point: int, *, ended_ns: int | None = None, summary_json: Any = None
    ) -> None:
        """Record a load point's end time and (optionally) its summary."""
        values: dict[str, Any] = {"ended_ns": ended_ns}
        if summary_json is not None:
            values["summary_json"] = _summary_dict(summary_json)
        self._queue.put(_LoadPointEnd(load_point, values))

    @property
    def error(self) -> StoreError | None:
        """The failure that stopped the writer, if any (the runner checks it)."""
        return self._error

    def check(self) -> None:
        """Raise the writer's failure, if any."""
        if self._error is not None:
            raise self._error

    def finish(
        self, status: str = COMPLETED, summary_json: Any = None, *, timeout_s: float | None = 120.0
    ) -> None:
        """Flush everything, set the final status and summary; raise if anything was lost.

        Blocks until the queue is written (at ~100k rows/s); use `afinish` from async code.
        """
        if status not in RUN_STATUSES:
            raise ValueError(f"status {status!r}: expected one of {', '.join(RUN_STATUSES)}")
        if self._finished:
            self.check()
            return
        self._finished = True
        stop = _Stop(status, _summary_dict(summary_json))
        self._queue.put(stop)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._error = StoreError(
                f"{describe(self.engine)}: writer still busy after {timeout_s:g} s; "
                f"{self.submitted - self.written} records not yet saved"
            )
        self.check()

    async def afinish(self, status: str = COMPLETED, summary_json: Any = None) -> None:
        """finish() in a worker thread, so the event loop keeps running meanwhile."""
        await asyncio.to_thread(self.finish, status, summary_json)

    def unsaved_records(self) -> list[RequestRecord]:
        """After a failure: the records that were not committed (for a fallback export)."""
        if self._thread.is_alive():
            return []
        return self._unsaved + [i for i in _drain(self._queue) if isinstance(i, RequestRecord)]

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:  # noqa: ANN001
        if self._finished:
            return
        if exc_type is None:
            self.finish(COMPLETED)
        else:
            status = (
                "interrupted"
                if issubclass(exc_type, KeyboardInterrupt | asyncio.CancelledError)
                else "failed"
            )
            with contextlib.suppress(StoreError):
                self.finish(status)

    # ---- the background thread ------------------------------------------------------

    def _run(self) -> None:
        records: list[RequestRecord] = []
        ops: list[Any] = []
        stop: _Stop | None = None
        deadline = time.monotonic() + self.flush_interval_s
        last_beat = time.monotonic()
        failures = 0
        lost_since: float | None = None  # when the server went away, while reconnecting
        while True:
            timeout = max(0.0, deadline - time.monotonic())
            with contextlib.suppress(queue.Empty):
                item = self._queue.get(timeout=timeout)
                for it in (item, *_drain(self._queue, self.batch_rows - len(records))):
                    if isinstance(it, RequestRecord):
                        records.append(it)
                    elif isinstance(it, _Stop):
                        stop = it
                    else:
                        ops.append(it)
            if stop is not None:
                records.extend(r for r in _drain(self._queue) if isinstance(r, RequestRecord))
            now = time.monotonic()
            due = now >= deadline or len(records) >= self.batch_rows or stop is not None
            beat = now - last_beat >= self.heartbeat_s
            if not (due and (records or ops or beat or stop is not None)):
                if now >= deadline:
                    deadline = now + self.flush_interval_s
                continue
            try:
                # A final flush writes everything left in batch_rows chunks, then the status.
                while True:
                    chunk = records[: self.batch_rows]
                    last = len(records) <= self.batch_rows
                    self._commit(chunk, ops, stop if last else None)
                    self.written += len(chunk)
                    del records[: len(chunk)]
                    ops = []
                    if stop is None or last:
                        break
                failures = 0
                lost_since = None
                last_beat = time.monotonic()
            except Exception as exc:  # noqa: BLE001 - any failure must reach the caller
                failures += 1
                transient = isinstance(exc, SQLAlchemyError)
                if transient and _lost_connection(self.engine, exc):
                    # Reconnect with backoff: the pool drops the dead connection and the
                    # next attempt opens a new one; what failed is committed then.
                    lost_since = lost_since or time.monotonic()
                    if time.monotonic() - lost_since < RECONNECT_S:
                        wait = self.flush_interval_s * 2 ** min(failures - 1, 6)
                        time.sleep(min(wait, RECONNECT_MAX_WAIT_S))
                        deadline = time.monotonic()
                        continue
                elif transient and failures <= RETRIES and stop is None:
                    time.sleep(self.flush_interval_s * failures)
                    deadline = time.monotonic()
                    continue
                if transient:
                    what = _friendly(self.engine, exc)
                elif isinstance(exc, DatabaseFileGone):
                    what = f"{describe(self.engine)}: {exc}"
                else:
                    what = f"{describe(self.engine)}: {exc!r}"
                self._error = StoreError(
                    f"{what}; {self.submitted - self.written} records of run {self.run_id} not saved"
                )
                self._error.reason = what  # without the count, which grows as a run goes on
                self._unsaved = records
                return
            deadline = time.monotonic() + self.flush_interval_s
            if stop is not None:
                return

    def _insert_rows(self, conn: Any, rows: list[tuple]) -> None:
        """executemany of plain tuples (3x faster than ORM dicts); COPY on PostgreSQL."""
        if not self._copy:
            conn.exec_driver_sql(self._insert_sql, rows)
            return
        with conn.connection.driver_connection.cursor() as cur, cur.copy(self._insert_sql) as copy:
            for row in rows:
                copy.write_row(row)

    def _insert_batches(self, conn: Any, batches: list[dict[str, Any]]) -> None:
        if not batches:
            return
        if not self._copy:
            conn.execute(insert(RequestBatch), batches)
            return
        # %b sends the blob in binary; psycopg's default text escaping doubles its size.
        sql = "INSERT INTO request_batches (run_id, load_point, n_requests, data) VALUES (%s, %s, %s, %b)"
        with conn.connection.driver_connection.cursor() as cur:
            cur.executemany(
                sql, [(b["run_id"], b["load_point"], b["n_requests"], b["data"]) for b in batches]
            )

    def _commit(self, records: list[RequestRecord], ops: list[Any], stop: _Stop | None) -> None:
        by_point: dict[int, list[RequestRecord]] = {}
        for r in records:
            by_point.setdefault(r.load_point, []).append(r)
        run_values: dict[str, Any] = {
            "heartbeat_at": now_utc(),
            "request_count": self.written + len(records),
        }
        if stop is not None:
            run_values.update(status=stop.status, finished_at=now_utc())
            if stop.summary is not None:
                run_values["summary_json"] = stop.summary
        self._file.check()  # before SQLite commits into a file nobody will read
        with self.engine.begin() as conn:
            for op in ops:
                if isinstance(op, _LoadPointStart):
                    conn.execute(insert(LoadPoint), op.values)
                else:
                    conn.execute(
                        update(LoadPoint)
                        .where(LoadPoint.run_id == self.run_id)
                        .where(LoadPoint.load_point == op.load_point)
                        .values(**op.values)
                    )
            batches = []
            for load_point, group in by_point.items():
                blob, rows = codec.encode_batch(group, self.redact)
                self._insert_rows(conn, [(self.run_id, load_point, *row) for row in rows])
                batches.append(
                    {
                        "run_id": self.run_id,
                        "load_point": load_point,
                        "n_requests": len(group),
                        "data": blob,
                    }
                )
            self._insert_batches(conn, batches)
            conn.execute(update(Run).where(Run.id == self.run_id).values(**run_values))


def _drain(q: queue.SimpleQueue, limit: int | None = None) -> list:
    items = []
    while limit is None or len(items) < limit:
        try:
            items.append(q.get_nowait())
        except queue.Empty:
            break
    return items
