"""The one driver above RunSession: how every stored run is started, whoever starts it.

`tokenbench run`, `sweep`, `sim run`, the demo and the service's jobs all call `measure`:
it probes the endpoint (is it a tokenbench simulator?), opens one RunSession over the
executor `choose_executor` picked, measures one load point (the scenario's own load) or a
sweep (bench.sweep.Sweep), and finishes the run with its status whatever happens, so a run
is stored, summarised and concluded the same way from the terminal and from the service.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

from bench.curves import slo_to_store
from bench.executor import Executor, RunPlan, plan_from_scenario
from bench.scenario import Scenario, mean_rate
from bench.session import Display, RunSession
from bench.sweep import (
    PointResult,
    PointSpec,
    Sweep,
    SweepPlan,
    SweepResult,
    scenario_at,
    sweep_extra,
)
from bench.telemetry import TelemetryConfig

Probe = Callable[[str, str | None], dict | None]  # (base URL, API key) -> simulated hardware


def choose_executor(
    *, workers: int = 1, ray: str | None = None, virtual: dict | None = None,
    handle_sigint: bool = True,
) -> Executor:  # fmt: skip
    """The executor a run asks for, for the CLI and the service alike.

    `virtual`: a simulated deployment in virtual time (bench.sim.virtual.VirtualExecutor's
    fields: gpu, model, precision, tp, parallel, engine); `workers` > 1 or `ray`: the plan
    split over processes or Ray workers; otherwise this process's event loop.
    `handle_sigint=False` leaves signals alone (a service job relays its own stop instead).
    Raises ValueError for a combination that cannot run, naming the options.
    """
    if virtual is not None:
        if workers > 1 or ray is not None:
            raise ValueError("virtual time runs in one process: leave out --workers and --ray")
        from bench.sim.virtual import VirtualExecutor

        return VirtualExecutor(**virtual)
    if workers > 1 or ray is not None:
        from bench.distributed import DistributedExecutor

        return DistributedExecutor(workers=workers, ray_address=ray, handle_sigint=handle_sigint)
    from bench.runner import LocalExecutor

    return LocalExecutor(handle_sigint=handle_sigint)


def detect(base_url: str, api_key: str | None) -> dict | None:
    """The default probe: a `tokenbench sim serve` endpoint's simulated hardware, else None."""
    from bench.sim.detect import detect_simulated

    return detect_simulated(base_url, api_key)


def measure(
    scenario: Scenario,
    sweep: SweepPlan | None = None,
    *,
    executor: Executor | None = None,
    plan: RunPlan | None = None,
    base_dir: Path | None = None,
    api_key: str | None = None,
    transport: str = "raw",
    db: str | None = None,
    store: bool = True,
    simulated: bool = False,
    telemetry: TelemetryConfig | None = None,
    display: Display | None = None,
    stop_event: threading.Event | None = None,
    run_id: str | None = None,
    extra: dict | None = None,
    on_point: Callable[[PointResult, int | None], None] | None = None,
    probe: Probe | None = detect,
) -> SweepResult:
    """One stored run: a single load point at the scenario's own load (sweep=None), or a
    sweep's points. The scenario is not changed; the result's `scenario` is the one run.

    `executor` comes from choose_executor (this process by default). `plan` is the first
    point's plan when the caller resolved it already (a run's, to check it before
    anything starts). `probe` asks whether the endpoint is a tokenbench simulator, so the
    run is stored simulated on its GPUs (None: do not ask). Simulated endpoints serve
    /metrics, so a simulated run scrapes them unless `telemetry` says otherwise (virtual
    time has no endpoint: it scrapes nothing). Setting `stop_event` stops the point in
    flight and the sweep, keeping what was measured (status interrupted). Raises
    ValueError for a plan that cannot run and bench.store.StoreError when the database fails.
    """
    executor = executor or choose_executor()
    if telemetry is None and simulated:
        telemetry = TelemetryConfig()
    plan_for = partial(plan_from_scenario, base_dir=base_dir, api_key=api_key, transport=transport)
    if plan is None:  # the stored run is described by its first point's plan
        first = scenario
        if sweep is not None and sweep.specs:
            first = scenario_at(scenario, sweep.specs[0], point_duration_s=sweep.point_duration_s)
        plan = plan_for(first)
    hardware = None
    virtual_time = executor.stored_as().sim is not None
    if not virtual_time and store and not simulated and probe is not None:
        hardware = probe(plan.base_url, plan.api_key)
        if hardware is not None and display is not None:
            display.warn(
                f"{plan.base_url} is a tokenbench simulator ({hardware.get('gpu_count')}x "
                f"{hardware.get('gpu')}): the run is stored as simulated, on the simulated GPUs"
            )
    if sweep is not None:
        windows = {"warmup_s": sweep.warmup_s, "cooldown_s": sweep.cooldown_s}
        extra = {**(extra or {}), "sweep": {"slo": slo_to_store(sweep.thresholds), **windows}}
    session = RunSession(
        scenario, plan, executor=executor, db_url=db, store=store, simulated=simulated,
        hardware=hardware, display=display, extra=extra, stop_event=stop_event,
        telemetry=telemetry, run_id=run_id,
    )  # fmt: skip
    if sweep is None:
        result = _one_point(session, plan, on_point)
    else:
        result = _sweep(session, sweep, plan_for, on_point)
    if hardware is not None and result.run_id:
        _keep_simulated_saturation(result, plan, db)
    elif store and result.run_id and virtual_time:
        from bench.sim.error_bars import keep_virtual_saturation

        # virtual time: the executor's own engine answers (`sim run`, the demo, the service)
        keep_virtual_saturation(result.run_id, result.points, executor.build(), db)
    return result


def _keep_simulated_saturation(result: SweepResult, plan: RunPlan, db: str | None) -> None:
    """A run measured through `tokenbench sim serve` keeps the saturation rate of the
    simulated deployment for its workload, as a `sim run` does, so every view flags its
    points near saturation; the simulator computes it (bench.sim.detect)."""
    from bench.sim.detect import simulated_saturation
    from bench.sim.error_bars import mean_lengths, save_saturation

    lengths = mean_lengths(result.points)
    if lengths is None:
        return
    sat = simulated_saturation(plan.base_url, *lengths, api_key=plan.api_key)
    if sat is not None:
        save_saturation(result.run_id, sat, db)


def _one_point(
    session: RunSession, plan: RunPlan, on_point: Callable[[PointResult, int | None], None] | None
) -> SweepResult:
    """The scenario's own load as the run's one point (`tokenbench run`)."""
    sc, load = session.scenario, session.scenario.load
    closed = plan.offsets_s is None
    result = SweepResult(run_id=session.run_id, scenario=sc)
    status, summary, extra = "failed", None, None
    try:
        run, summary = session.point(
            plan,
            title=sc.name,
            mode="closed" if closed else load.shape,
            target_rate=None if closed else load.request_rate,
            concurrency=plan.concurrency or plan.max_concurrency,
        )
        if closed:
            spec = PointSpec("concurrency", plan.concurrency or 1)
        else:
            spec = PointSpec("rate", mean_rate(sc) or load.request_rate or math.inf)
        point = PointResult(0, spec, summary, role="run", run=run)
        result.points.append(point)
        result.interrupted = run.interrupted
        status = "interrupted" if run.interrupted else "completed"
        if summary.completed == 0 and summary.failed and not run.interrupted:
            status = "failed"  # every request failed: no figure here measures the server
        # The store has no 'partial' status: a distributed run whose worker died is
        # 'interrupted', and its summary JSON says `partial: true` (bench.distributed).
        extra = {"served_models": run.served_models, **run.detail_json()}
        if on_point is not None:
            on_point(point, 0)
    finally:
        session.finish(status, summary, extra)
    return result


def _sweep(
    session: RunSession,
    plan: SweepPlan,
    plan_for: Callable[..., RunPlan],
    on_point: Callable[[PointResult, int | None], None] | None,
) -> SweepResult:
    """A sweep's points in the session's one stored run, concluded (capacity, knee)."""
    sweep = Sweep(session.scenario, session, plan, plan_for, on_point)
    sweep.result.scenario = session.scenario
    status = "failed"
    try:
        if plan.auto is not None:
            sweep.auto(plan.auto)
        else:
            sweep.grid(plan.specs)
        sweep.slo_search(plan.slo_iterations, plan.slo_draws)
        result = sweep.conclude()
        status = "interrupted" if result.interrupted else "completed"
    finally:
        res = sweep.result
        complete = [p for p in res.points if not p.summary.interrupted]
        best = res.capacity or (complete or res.points or [None])[-1]
        session.finish(status, best.summary if best else None, extra=sweep_extra(res))
    return result
