"""A background job's measuring, in a process of its own (spawned by server/jobs.py).

A run measured inside the service shares its event loop threads and GIL with every API
reader: with 50 clients polling, a background run's TTFT p99 read 311 ms against a true
72 ms, and the self-check could not tell. So each job measures in a fresh process that
does nothing else; the service only relays its progress. Messages to the service go over a
one-way pipe as (kind, payload) tuples: ("progress", dict), ("point", PointDone),
("done", status) or ("failed", message). The service asks it to stop by setting `stop`.
This module is below server/jobs.py (it never imports it), so what both need to say about
a job (point_done, failure_message) lives here.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from server.models import PointDone

STOP_POLL_S = 0.1


def measured_in(service_pid: int) -> dict[str, Any]:
    """What the stored run says about where it was measured."""
    return {
        "process": "tokenbench serve job process",
        "pid": os.getpid(),
        "service_pid": service_pid,
        "separate_from_service": os.getpid() != service_pid,
    }


def main(plan, db_url: str | None, run_id: str, conn, stop, service_pid: int) -> None:  # noqa: ANN001
    """The child's entry point: measure the plan, store it as run_id, report over conn."""
    stop_event = threading.Event()
    done = threading.Event()
    # Ctrl-C on the service reaches its whole process group: the service stops its jobs
    # gently itself. SIGTERM (a service manager stopping everything) stops this run gently.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop_event.set())

    def relay_stop() -> None:
        """Stop when the service asks, or when it is gone (killed: nobody would follow)."""
        while not done.is_set():
            if stop.wait(STOP_POLL_S) or os.getppid() != service_pid:
                stop_event.set()
                return

    threading.Thread(target=relay_stop, name="tokenbench-job-stop", daemon=True).start()
    reporter = _Reporter(conn, stop_event)
    try:
        message = ("done", _execute(plan, db_url, run_id, reporter, stop_event, service_pid))
    except BaseException as exc:  # noqa: BLE001 - a job's failure is reported, not raised
        message = ("failed", failure_message(exc))
    finally:
        done.set()
    reporter.send(message)
    conn.close()


class _Reporter:
    """conn.send that never raises: if the service has gone, the run stops gently instead."""

    def __init__(self, conn, stop_event: threading.Event) -> None:  # noqa: ANN001
        self.conn = conn
        self.stop_event = stop_event

    def send(self, message: tuple) -> None:
        try:
            self.conn.send(message)
        except (OSError, ValueError):  # broken pipe, closed connection
            self.stop_event.set()


def _execute(plan, db_url, run_id, conn, stop_event, service_pid) -> str:  # noqa: ANN001
    """Choose the executor (bench.drive.choose_executor: this process's runner, or virtual
    time for a virtual simulation), start a real-time simulated endpoint if one is asked
    for, check the target answers, and measure."""
    from bench.drive import choose_executor
    from bench.runner import check_reachable, discover_model

    sc, sim = plan.scenario, plan.simulate
    if sim and sim["clock"] == "virtual":
        deployment = {k: sim[k] for k in ("gpu", "model", "precision", "tp")}
        executor = choose_executor(virtual=deployment)
        return _measure(plan, executor.adopt(sc), executor, db_url, run_id, conn, stop_event,
                        service_pid)  # fmt: skip
    # Every other job, a real-time simulated one too (it measures the loopback endpoint
    # started for it over HTTP), runs on this process's runner, without signal handlers:
    # the service relays its stop through stop_event.
    executor = choose_executor(handle_sigint=False)
    stop_sim = None
    try:
        if sim:
            from bench.sim.server import start_sim_server_in_thread

            url, stop_sim = start_sim_server_in_thread(
                sim["gpu"], sim["model"], sim["precision"], sim["tp"]
            )
            sc.target.base_url = url
        check_reachable(sc.target.base_url)
        if not sc.target.model:
            sc.target.model = discover_model(sc.target.base_url, plan.api_key) or "default"
        return _measure(plan, sc, executor, db_url, run_id, conn, stop_event, service_pid)
    finally:
        if stop_sim is not None:
            stop_sim()


def _measure(plan, sc, executor, db_url, run_id, conn, stop_event, service_pid) -> str:  # noqa: ANN001
    """A run or a sweep (bench.drive.measure) of the scenario `sc`, stored as run_id; each
    finished point is reported as it ends."""
    from bench.drive import measure
    from bench.session import Headless

    def on_tick(p) -> None:  # noqa: ANN001 - bench.executor.Progress
        fields = ("total", "sent", "completed", "failed", "in_flight")
        counts = {key: getattr(p, key) for key in fields}
        conn.send(("progress", {**counts, "recent_ttft_ms": list(p.recent_ttft_ms[-500:])}))

    options = dict(
        executor=executor, display=Headless(on_tick), simulated=bool(plan.simulate),
        stop_event=stop_event, run_id=run_id, api_key=plan.api_key, base_dir=plan.base_dir,
        db=db_url, extra={"measured_in": measured_in(service_pid)},
    )  # fmt: skip
    if plan.kind == "run":
        result = measure(sc, **options)
        conn.send(("point", point_done(0, sc.name, result.points[0].summary)))
    else:
        conn.send(("planned", plan.sweep.planned_points()))

        def on_point(point, remaining) -> None:  # noqa: ANN001
            conn.send(("point", point_done(point.index, point.spec.title, point.summary)))

        result = measure(sc, plan.sweep, on_point=on_point, **options)
    return "interrupted" if result.interrupted else "completed"


def _value(summary, name: str) -> float | None:
    try:
        return summary.value(name)
    except KeyError:  # a scenario whose percentiles leave p99 out
        return None


def point_done(index: int, title: str, summary) -> PointDone:
    """A finished load point as the service reports it (server.models.PointDone)."""
    from server.models import PointDone

    return PointDone(
        index=index,
        title=title,
        requests_per_s=summary.requests_per_s,
        output_tokens_per_s=summary.output_tokens_per_s,
        p99_ttft_ms=_value(summary, "p99_ttft_ms"),
        p99_tpot_ms=_value(summary, "p99_tpot_ms"),
        failed=summary.failed,
    )


def failure_message(exc: BaseException) -> str:
    """A job's failure in one line: the exception's type and message."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
