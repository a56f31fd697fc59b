"""A background job's measuring, in a process of its own (spawned by server/jobs.py).

A run measured inside the service shares its event loop threads and GIL with every API
reader: with 50 clients polling, a background run's TTFT p99 read 311 ms against a true
72 ms, and the self-check could not tell. So each job measures in a fresh process that
does nothing else; the service only relays its progress. Messages to the service go over a
one-way pipe as (kind, payload) tuples: ("progress", dict), ("point", PointDone),
("done", status) or ("failed", message). The service asks it to stop by setting `stop`.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

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
        from server.jobs import _message

        message = ("failed", _message(exc))
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
    from bench.runner import check_reachable, discover_model

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
        check_reachable(sc.target.base_url)
        if not sc.target.model:
            sc.target.model = discover_model(sc.target.base_url, plan.api_key) or "default"
        return _measure(plan, db_url, run_id, conn, stop_event, service_pid)
    finally:
        if stop_sim is not None:
            stop_sim()


def _measure(plan, db_url, run_id, conn, stop_event, service_pid) -> str:  # noqa: ANN001
    """A run (bench.session.run_and_store) or a sweep (bench.sweep.run_sweep), stored as run_id;
    each finished point is reported as it ends."""
    from bench.runner import LocalExecutor, plan_from_scenario
    from bench.session import run_and_store
    from bench.sweep import run_sweep
    from server.jobs import point_done

    def on_tick(p) -> None:  # noqa: ANN001 - bench.runner.Progress
        fields = ("total", "sent", "completed", "failed", "in_flight")
        counts = {key: getattr(p, key) for key in fields}
        conn.send(("progress", {**counts, "recent_ttft_ms": list(p.recent_ttft_ms[-500:])}))

    sc = plan.scenario
    # Every job, a simulated one too (it measures the loopback endpoint started for it, over
    # HTTP in real time, as the API promises), runs on this process's runner, without signal
    # handlers: the service relays its stop through stop_event.
    options = dict(
        executor=LocalExecutor(handle_sigint=False), show_progress=False,
        simulated=bool(plan.simulate), stop_event=stop_event, on_tick=on_tick, run_id=run_id,
        extra={"measured_in": measured_in(service_pid)},
    )  # fmt: skip
    if plan.kind == "run":
        run_plan = plan_from_scenario(sc, base_dir=plan.base_dir, api_key=plan.api_key)
        _result, summary, _ = run_and_store(sc, run_plan, db_url=db_url, **options)
        conn.send(("point", point_done(0, sc.name, summary)))
    else:
        conn.send(("planned", plan.sweep.planned_points()))

        def on_point(point, remaining) -> None:  # noqa: ANN001
            conn.send(("point", point_done(point.index, point.spec.title, point.summary)))

        run_sweep(
            sc, plan.sweep, api_key=plan.api_key, base_dir=plan.base_dir, db=db_url,
            on_point=on_point, **options,
        )  # fmt: skip
    # The job says what its stored run says (a run whose requests all failed is "failed",
    # not "completed"): one truth for the job list and the run.
    from bench.store import get_run

    return get_run(run_id, db_url).status
