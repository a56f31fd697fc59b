"""One benchmark run as a user starts it: progress display, storage, summary.

The CLI, sweeps and the service all start runs through here, so a run is stored and
summarised the same way whoever started it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench.metrics import Summary, parse_goodput, summarize
from bench.records import RequestRecord
from bench.runner import Progress as RunProgress
from bench.runner import RunPlan, RunResult, run_blocking


def summarize_result(result: RunResult, scenario) -> Summary:
    return summarize(
        result.records,
        percentiles=scenario.percentiles,
        goodput=parse_goodput(scenario.goodput),
        loop_lag_p99_ms=result.loop_lag_p99_ms,
        interrupted=result.interrupted,
    )


def live_p99(values: list[float]) -> float | None:
    return float(np.percentile(values, 99)) if values else None


def progress_bar(total: int, description: str) -> tuple[Progress, Callable[[RunProgress], None]]:
    """A rich progress bar and the tick callback that feeds it from the runner's counters."""
    bar = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("failed {task.fields[failed]}  in flight {task.fields[in_flight]}"),
        TextColumn("p99 TTFT {task.fields[p99]}"),
        TimeElapsedColumn(),
        transient=False,
    )
    task = bar.add_task(description, total=total, failed=0, in_flight=0, p99="—")

    def tick(p: RunProgress) -> None:
        p99 = live_p99(p.recent_ttft_ms[-500:])
        bar.update(
            task,
            completed=p.completed + p.failed,
            failed=p.failed,
            in_flight=p.in_flight,
            p99="—" if p99 is None else f"{p99:,.0f} ms",
        )

    return bar, tick


def open_writer(scenario, plan: RunPlan, db_url: str | None, *, simulated: bool = False):
    """A RunWriter for this run: metadata from the scenario and plan, the API key scrubbed."""
    from bench.store.writer import RunWriter

    load = scenario.load
    writer = RunWriter(
        db_url or None,
        name=scenario.name,
        label=scenario.label,
        scenario=scenario.model_dump(mode="json"),
        endpoint=plan.base_url,
        backend=plan.dialect.name,
        model=plan.model,
        gpu_type=scenario.gpu.type,
        gpu_count=scenario.gpu.count,
        simulated=simulated,
        secrets=[plan.api_key],
    )
    writer.start_load_point(
        plan.load_point,
        mode="closed" if plan.offsets_s is None else load.shape,
        target_rate=None if plan.offsets_s is None else load.request_rate,
        concurrency=plan.concurrency or plan.max_concurrency,
    )
    return writer


def run_and_store(
    scenario,
    plan: RunPlan,
    *,
    db_url: str | None = None,
    store: bool = True,
    show_progress: bool = True,
    simulated: bool = False,
) -> tuple[RunResult, Summary, str | None]:
    """Run one plan with a progress bar; store it unless store=False. Returns the run id.

    If the database fails mid-run the run goes on (the records are in memory), and at the
    end the unsaved records are written to a JSON file beside it and the error is raised
    with that file's name: nothing measured is lost.
    """
    from bench.store.errors import StoreError

    writer = open_writer(scenario, plan, db_url, simulated=simulated) if store else None
    store_error: list[StoreError] = []

    def sink(rec: RequestRecord) -> None:
        if store_error:
            return
        try:
            writer.submit(rec)
        except StoreError as exc:
            store_error.append(exc)

    bar, tick = progress_bar(len(plan.specs), scenario.name)
    status, summary = "failed", None
    try:
        run_sink = sink if writer is not None else None
        if show_progress:
            with bar:
                result = run_blocking(plan, sink=run_sink, on_tick=tick)
        else:
            result = run_blocking(plan, sink=run_sink)
        summary = summarize_result(result, scenario)
        status = "interrupted" if result.interrupted else "completed"
    finally:
        if writer is not None:
            try:
                writer.finish(status, summary.to_json() if summary else None)
            except StoreError as exc:
                store_error.append(exc)
    if store_error:
        path = save_fallback(result.records, writer.run_id)
        raise StoreError(f"{store_error[0]}; every record of this run was saved to {path}")
    return result, summary, writer.run_id if writer else None


def save_fallback(records: list[RequestRecord], run_id: str) -> str:
    """Write records as JSON lines when the database cannot take them."""
    import json
    import tempfile
    from pathlib import Path

    out = Path(tempfile.gettempdir()) / f"tokenbench-unsaved-{run_id}.jsonl"
    with out.open("w") as f:
        for r in records:
            row = {k: getattr(r, k) for k in r.__slots__ if k != "chunk_times_ns"}
            row["chunk_times_ns"] = r.chunk_times_ns.tolist()
            f.write(json.dumps(row) + "\n")
    return str(out)
