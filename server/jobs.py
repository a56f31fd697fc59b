"""Background runs for the service: one worker thread, one benchmark at a time.

Runs execute one after another, never side by side: two load generators sharing one
machine would limit each other and both results would be wrong. Each job measures in a
process of its own (server/job_process.py), so the service's own work (API readers, pages)
cannot skew its timings; the worker thread here only relays its progress. A job runs
through the same library calls as the CLI (bench.drive.measure, over the executor
bench.drive.choose_executor picks: this process's runner, or virtual time for a virtual
simulation), so it is stored and summarised exactly like a run started from a terminal,
and its run id is chosen at submission. Cancelling sets an event the process relays to the
executor (RunSession's stop_event): the point in flight stops like Ctrl-C (in virtual time
too, at the next engine step), what it measured is kept, and the run is stored as
interrupted.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import re
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from bench.executor import Progress as RunProgress
from bench.store import Redactor, strip_url
from bench.sweep import SweepPlan
from server import job_process
from server.job_process import failure_message
from server.models import JobOut, PointDone, ProgressOut

SCENARIOS_DIR = Path(__file__).resolve().parents[1] / "scenarios"
MAX_QUEUED = 8
RELAY_POLL_S = 0.25
PROCESS_EXIT_S = 30.0
URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
TERMINAL = ("completed", "interrupted", "failed", "cancelled")


class QueueFullError(RuntimeError):
    """Too many jobs waiting; the caller should retry after one finishes."""


@dataclass
class JobPlan:
    """Everything a job needs, validated when it was submitted (server/api.py builds it)."""

    kind: str  # "run" or "sweep"
    scenario: object  # bench.scenario.Scenario with target, gpu and label resolved
    base_dir: Path | None
    simulate: dict | None = None  # {gpu, model, precision, tp} for a simulated endpoint
    sweep: SweepPlan = field(default_factory=SweepPlan)  # a sweep's points, SLO and windows
    api_key: str | None = None


@dataclass
class Job:
    id: str
    plan: JobPlan
    created_at: datetime
    status: str = "queued"
    run_id: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: str | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    point: int = 0
    point_title: str | None = None
    points_planned: int | None = None
    progress: RunProgress | None = None
    points: list[PointDone] = field(default_factory=list)
    pid: int | None = None  # the measuring process (server/job_process.py)
    version: int = 0  # bumped on every change; SSE followers poll it

    @property
    def done(self) -> bool:
        return self.status in TERMINAL

    def touch(self, **changes) -> None:
        """Apply changes and tell SSE followers (they compare `version`)."""
        for k, v in changes.items():
            setattr(self, k, v)
        self.version += 1

    def to_out(self) -> JobOut:
        sc = self.plan.scenario
        sim = self.plan.simulate
        if sim:
            target = f"simulated {sim['gpu']} x{sim['tp']} {sim['model']} {sim['precision']}"
        else:
            target = strip_url(sc.target.base_url)  # jobs are readable by anyone reads are open to
        p = self.progress
        progress = None
        if p is not None:
            progress = ProgressOut(
                point=self.point,
                point_title=self.point_title,
                points_planned=self.points_planned,
                total=p.total,
                sent=p.sent,
                completed=p.completed,
                failed=p.failed,
                in_flight=p.in_flight,
                p99_ttft_ms=p.live_p99_ttft_ms(),
            )
        return JobOut(
            id=self.id,
            kind=self.plan.kind,
            status=self.status,
            label=sc.label,
            target=target,
            simulated=bool(sim),
            run_id=self.run_id,
            created_at=self.created_at,
            started_at=self.started_at,
            finished_at=self.finished_at,
            cancel_requested=self.stop.is_set(),
            error=_public(self.error, self.plan.api_key),
            progress=progress,
            points=list(self.points),
        )


class JobManager:
    """Queue, worker thread and registry of background jobs (kept in memory)."""

    def __init__(self, db_url: str | None, *, max_queued: int = MAX_QUEUED) -> None:
        self.db_url = db_url
        self.max_queued = max_queued
        self.jobs: dict[str, Job] = {}
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self._closing = threading.Event()

    # ------------------------------------------------------------ public

    def submit(self, plan: JobPlan) -> Job:
        with self._lock:
            waiting = sum(1 for j in self.jobs.values() if j.status == "queued")
            if waiting >= self.max_queued:
                raise QueueFullError(
                    f"{waiting} jobs are already waiting; retry when one has finished"
                )
            # The run id is chosen now, so the run is protected from deletion from its
            # first write (it was null until the run ended, and a DELETE got through).
            job = Job(
                id=uuid.uuid4().hex[:12],
                plan=plan,
                created_at=datetime.now(UTC),
                run_id=uuid.uuid4().hex,
            )
            self.jobs[job.id] = job
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(
                    target=self._work, name="tokenbench-jobs", daemon=True
                )
                self._worker.start()
        self._queue.put(job)
        return job

    def get(self, job_id: str) -> Job | None:
        return self.jobs.get(job_id)

    def list(self) -> list[Job]:
        return sorted(self.jobs.values(), key=lambda j: j.created_at, reverse=True)

    def cancel(self, job: Job) -> Job:
        """Ask a job to stop: a queued one never starts, a running one stops gently."""
        job.stop.set()
        with self._lock:
            if job.status == "queued":
                job.touch(status="cancelled", finished_at=datetime.now(UTC))
            else:
                job.touch()
        return job

    def active_run_ids(self) -> set[str]:
        return {j.run_id for j in self.jobs.values() if j.run_id and not j.done}

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop every job (keeping what they measured) and wait for the worker."""
        self._closing.set()
        for job in list(self.jobs.values()):
            if not job.done:
                self.cancel(job)
        self._queue.put(None)
        if self._worker is not None:
            self._worker.join(timeout_s)

    # ------------------------------------------------------------ the worker

    def _work(self) -> None:
        while not self._closing.is_set():
            try:
                job = self._queue.get(timeout=1.0)
            except queue.Empty:
                continue
            if job is None:
                return
            with self._lock:
                if job.status != "queued":  # cancelled while waiting
                    continue
                job.touch(status="running", started_at=datetime.now(UTC))
            try:
                status = self._execute(job)
                if status == "interrupted" and job.stop.is_set():
                    status = "cancelled"  # the stored run says interrupted, with its data
                job.touch(status=status, finished_at=datetime.now(UTC))
            except JobFailedError as exc:
                job.touch(status="failed", error=str(exc), finished_at=datetime.now(UTC))
            except Exception as exc:  # noqa: BLE001 - a job's failure is reported, not raised
                job.touch(
                    status="failed", error=failure_message(exc), finished_at=datetime.now(UTC)
                )

    def _execute(self, job: Job) -> str:
        """Measure in a spawned process (server/job_process.py) and relay what it reports.

        Spawned, not forked: the service has threads, and a fork would copy their locks.
        """
        ctx = multiprocessing.get_context("spawn")
        receiver, sender = ctx.Pipe(duplex=False)
        stop = ctx.Event()
        proc = ctx.Process(
            target=job_process.main,
            args=(job.plan, self.db_url, job.run_id, sender, stop, os.getpid()),
            name=f"tokenbench-job-{job.id}",
            daemon=True,
        )
        proc.start()
        sender.close()
        if job.plan.kind == "run":
            job.touch(pid=proc.pid, points_planned=1, point_title=job.plan.scenario.name)
        else:
            job.touch(pid=proc.pid)
        outcome: tuple[str, object] | None = None
        try:
            while outcome is None:
                if job.stop.is_set():
                    stop.set()
                if receiver.poll(RELAY_POLL_S):
                    try:
                        kind, payload = receiver.recv()
                    except EOFError:
                        break  # the process ended without a word
                    outcome = self._relay(job, kind, payload)
                elif not proc.is_alive() and not receiver.poll(0):
                    break
        finally:
            proc.join(PROCESS_EXIT_S)
            if proc.is_alive():
                proc.kill()
                proc.join(PROCESS_EXIT_S)
            receiver.close()
        if outcome is None:
            raise RuntimeError(f"the job's measuring process exited with code {proc.exitcode}")
        kind, payload = outcome
        if kind == "failed":
            raise JobFailedError(str(payload))
        return str(payload)

    def _relay(self, job: Job, kind: str, payload) -> tuple[str, object] | None:
        if kind == "progress":
            job.touch(progress=RunProgress(**payload))
        elif kind == "planned":
            job.touch(points_planned=payload)
        elif kind == "point":
            job.touch(points=[*job.points, payload], point=payload.index + 1, point_title=None)
        elif kind in ("done", "failed"):
            return kind, payload
        return None


class JobFailedError(RuntimeError):
    """The job's process reported a failure; the message is its own."""


def _public(text: str | None, api_key: str | None) -> str | None:
    """A job's error as anyone who may read jobs sees it: no URL credentials, no key."""
    if text is None:
        return None

    def strip(m: re.Match) -> str:
        try:
            return strip_url(m.group(0)) or ""
        except ValueError:
            return "<URL>"

    text = URL_IN_TEXT.sub(strip, text)
    return Redactor([api_key]).known(text)
