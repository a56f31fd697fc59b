"""Background runs for the service: one worker thread, one benchmark at a time.

Runs execute one after another, never side by side: two load generators sharing one
machine would limit each other and both results would be wrong. A job runs through the same
library calls as the CLI (bench.session.run_and_store for a run, bench.sweep.run_sweep for
a sweep), so it is stored and summarised exactly like a run started from a terminal. Cancelling sets a threading.Event the
runner polls (RunSession's stop_event): the point in flight stops like Ctrl-C, what it
measured is kept, and the run is stored as interrupted.
"""

from __future__ import annotations

import queue
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from bench.runner import Progress as RunProgress
from bench.session import live_p99
from server.models import JobOut, PointDone, ProgressOut

SCENARIOS_DIR = Path(__file__).resolve().parents[1] / "scenarios"
MAX_QUEUED = 8
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
    specs: list = field(default_factory=list)  # bench.sweep.PointSpec for a grid sweep
    auto: int | None = None
    thresholds: list = field(default_factory=list)
    slo_iterations: int = 0
    point_duration_s: float | None = None
    warmup_s: float = 0.0
    cooldown_s: float = 0.0
    max_error_rate: float = 0.5
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
            target = sc.target.base_url
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
                p99_ttft_ms=live_p99(list(p.recent_ttft_ms[-500:])),
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
            error=self.error,
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
            job = Job(id=uuid.uuid4().hex[:12], plan=plan, created_at=datetime.now(UTC))
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
            except Exception as exc:  # noqa: BLE001 - a job's failure is reported, not raised
                job.touch(status="failed", error=_message(exc), finished_at=datetime.now(UTC))

    def _tick(self, job: Job):
        def on_tick(progress: RunProgress) -> None:
            job.touch(progress=progress)

        return on_tick

    def _execute(self, job: Job) -> str:
        plan = job.plan
        sc = plan.scenario
        stop_sim = None
        try:
            if plan.simulate:
                from bench.sim.server import start_sim_server_in_thread

                s = plan.simulate
                url, stop_sim = start_sim_server_in_thread(
                    s["gpu"], s["model"], s["precision"], s["tp"]
                )
                sc.target.base_url = url
            from bench.runner import check_reachable, discover_model

            check_reachable(sc.target.base_url)
            if not sc.target.model:
                sc.target.model = discover_model(sc.target.base_url, plan.api_key) or "default"
            if plan.kind == "run":
                return self._run(job)
            return self._sweep(job)
        finally:
            if stop_sim is not None:
                stop_sim()

    def _run(self, job: Job) -> str:
        from bench.runner import plan_from_scenario
        from bench.session import run_and_store

        plan, sc = job.plan, job.plan.scenario
        run_plan = plan_from_scenario(sc, base_dir=plan.base_dir, api_key=plan.api_key)
        job.touch(points_planned=1, point_title=sc.name)
        result, summary, run_id = run_and_store(
            sc,
            run_plan,
            db_url=self.db_url,
            show_progress=False,
            simulated=bool(plan.simulate),
            stop_event=job.stop,
            on_tick=self._tick(job),
        )
        job.touch(run_id=run_id, points=[_point_done(0, sc.name, summary)])
        return "interrupted" if result.interrupted else "completed"

    def _sweep(self, job: Job) -> str:
        from bench.sweep import SweepPlan, run_sweep

        plan, sc = job.plan, job.plan.scenario
        sweep_plan = SweepPlan(
            specs=list(plan.specs),
            auto=plan.auto,
            thresholds=list(plan.thresholds),
            slo_iterations=plan.slo_iterations,
            point_duration_s=plan.point_duration_s,
            warmup_s=plan.warmup_s,
            cooldown_s=plan.cooldown_s,
            max_error_rate=plan.max_error_rate,
        )

        def on_point(point, remaining) -> None:
            done = [*job.points, _point_done(point.index, point.spec.title, point.summary)]
            job.touch(points=done, point=point.index + 1, point_title=None)

        result = run_sweep(
            sc,
            sweep_plan,
            api_key=plan.api_key,
            base_dir=plan.base_dir,
            db=self.db_url,
            simulated=bool(plan.simulate),
            show_progress=False,
            on_point=on_point,
            on_start=lambda run_id: job.touch(
                run_id=run_id, points_planned=sweep_plan.planned_points()
            ),
            stop_event=job.stop,
            on_tick=self._tick(job),
        )
        return "interrupted" if result.interrupted else "completed"


def _value(summary, name: str) -> float | None:
    try:
        return summary.value(name)
    except KeyError:  # a scenario whose percentiles leave p99 out
        return None


def _point_done(index: int, title: str, summary) -> PointDone:
    return PointDone(
        index=index,
        title=title,
        requests_per_s=summary.requests_per_s,
        output_tokens_per_s=summary.output_tokens_per_s,
        p99_ttft_ms=_value(summary, "p99_ttft_ms"),
        p99_tpot_ms=_value(summary, "p99_tpot_ms"),
        failed=summary.failed,
    )


def _message(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
