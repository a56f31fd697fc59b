"""Store commands: runs, show, rm, export-raw, import and db upgrade (bench/cli/__init__.py
registers them).

Every failure the user can fix is one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.markup import escape
from rich.table import Column

from bench.cli.options import DbOption
from bench.console import Table
from bench.console import console as out
from bench.console import err_console as err

F = TypeVar("F", bound=Callable[..., Any])


def _user_errors() -> tuple[type[BaseException], ...]:
    from bench.store import ImportFormatError, StoreError

    return (StoreError, ImportFormatError, FileNotFoundError, ValueError, OSError)


def _clean_errors(func: F) -> F:
    """Turn the errors a user can act on into one line and exit status 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except Exception as exc:
            if not isinstance(exc, _user_errors()):
                raise
            err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


def existing_database(db: str | None) -> str:
    """The database a read-only command will read, named for messages; raises
    MissingDatabaseError (a StoreError) when it is a SQLite file that does not exist, so
    that reading never creates a file or a results/ folder."""
    from bench.store import missing_sqlite_file, resolve_url, safe_url_text

    url = resolve_url(db)
    missing = missing_sqlite_file(url)
    if missing is not None:
        from bench.store import MissingDatabaseError

        raise MissingDatabaseError(
            f"no database at {missing} ({where_from(db)}); give --db or set $TOKENBENCH_DB"
        )
    return safe_url_text(url)


def where_from(db: str | None) -> str:
    """Why this database: the --db flag, $TOKENBENCH_DB, or the default under this folder."""
    import os

    from bench.store import ENV_VAR

    if db:
        return "from --db"
    if os.environ.get(ENV_VAR):
        return f"from ${ENV_VAR}"
    return f"the default: results/tokenbench.db under {Path.cwd()}"


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


@_clean_errors
def runs_command(
    db: DbOption = None,
    gpu: Annotated[str | None, typer.Option(help="Only runs whose GPU type contains this.")] = None,
    model: Annotated[str | None, typer.Option(help="Only runs whose model contains this.")] = None,
    label: Annotated[str | None, typer.Option(help="Only runs whose label contains this.")] = None,
    limit: Annotated[int, typer.Option(help="Show at most this many runs.")] = 50,
) -> None:
    """List stored runs, newest first, and say which database was read."""
    from bench.store import MissingDatabaseError, list_runs

    try:
        where = existing_database(db)
    except MissingDatabaseError as exc:
        out.print(f"no runs stored yet: {exc}", highlight=False, soft_wrap=True)
        return
    runs = list_runs(db, gpu=gpu, model=model, label=label, limit=limit)
    table = Table(
        Column("id", no_wrap=True, min_width=8),
        *("name", "label", "created (UTC)", "status", "model", "gpu", "requests", "source"),
    )
    for r in runs:
        gpu_text = f"{r.gpu_count or 1}x {r.gpu_type}" if r.gpu_type else "-"
        source = (
            "simulated"
            if r.simulated
            else (f"imported:{r.imported_from}" if r.imported_from else "measured")
        )
        table.add_row(
            r.short_id,
            r.name or "-",
            r.label or "-",
            r.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            r.status,
            r.model or "-",
            gpu_text,
            str(r.request_count),
            source,
        )
    if not runs:
        out.print(f"no runs stored yet in {where}", highlight=False, soft_wrap=True)
        return
    out.print(table)
    out.print(f"{len(runs)} run{'' if len(runs) == 1 else 's'} from {where}", highlight=False)


@_clean_errors
def show_command(
    run: Annotated[str, typer.Argument(help="Run id, unique id prefix or run name.")],
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Print a run's summary, recomputed from its stored requests."""
    from bench.metrics import restore_prompt_cache, summarize
    from bench.store import get_run, load_columns

    existing_database(db)
    info = get_run(run, db)
    points = info.load_points or []
    sections: list[tuple[str, dict | None]] = []
    workers: dict[str, list[dict]] = {}  # a distributed run's workers, per section
    if info.request_count:
        targets = [(None, None)] if len(points) <= 1 else [(lp.load_point, lp) for lp in points]
        for index, lp in targets:
            lp = lp or (points[0] if points else None)
            # A sweep's points: each one's own flag (only the last of an interrupted sweep
            # is partial); one point: the run's status.
            partial = (
                bool((lp.summary_json or {}).get("interrupted"))
                if index is not None and lp is not None
                else info.status == "interrupted"
            )
            summary = summarize(
                load_columns(info.id, index, db),
                duration_s=lp.duration_s if lp else None,
                interrupted=partial,
            )
            # What the records cannot say again: the server's cache counters, the notes.
            stored = (lp.summary_json if lp else None) or info.summary_json or {}
            restore_prompt_cache(summary, stored)  # the reuse implied, the server's counters
            summary.notes = list(stored.get("notes") or [])
            summary.spec_decode = dict(stored.get("spec_decode") or {})  # server counters
            title = (
                "run"
                if index is None
                else f"load point {index}" + (f" ({lp.label})" if lp and lp.label else "")
            )
            sections.append((title, summary.to_json()))
            if (stored.get("distributed") or {}).get("workers"):
                workers[title] = stored["distributed"]["workers"]
    else:
        sections.append(
            (
                "summary as imported",
                (info.extra_json or {}).get("source_summary") or info.summary_json,
            )
        )
    if as_json:
        out.print_json(
            json.dumps(
                {
                    "run": info.id,
                    "status": info.status,
                    "summaries": dict(sections),
                    **({"workers": workers} if workers else {}),
                },
                default=str,
            )
        )
        return
    kind = "SIMULATED " if info.simulated else ("IMPORTED " if info.imported_from else "")
    sim = (info.extra_json or {}).get("sim") or {}
    split = (
        f" ({sim['disagg']}: prefill {sim.get('prefill_gpus')} GPUs, "
        f"{sim.get('prefill_parallel')} each; decode {sim.get('decode_gpus')} GPUs, "
        f"{sim.get('decode_parallel')} each)"
        if sim.get("disagg")
        else ""
    )
    out.print(
        f"[bold]{kind}run {info.id}[/bold] {info.name or ''}  status={info.status}  "
        f"model={info.model or '-'}  gpu={info.gpu_type or '-'}x{info.gpu_count or '-'}{split}  "
        f"endpoint={info.endpoint or '-'}",
        highlight=False,
    )
    for title, summary in sections:
        if summary is None:
            out.print(f"{title}: nothing stored")
        elif "metrics" in summary and isinstance(summary.get("throughput"), dict):
            out.print(_summary_table(title, summary))
            from bench.console import spec_decode_rows

            for label, value in spec_decode_rows(summary.get("spec_decode") or {}):
                out.print(f"{label}: {value}", highlight=False, markup=False)
            if summary.get("classes"):
                from bench.console import classes_table
                from bench.curves import class_slo

                out.print(classes_table(summary["classes"], class_slo(info)))
            if (summary.get("prompt_cache") or {}).get("largely_cached"):
                out.print("[yellow]CACHED PROMPTS: most prompt tokens came from the server's cache")
            for note in summary.get("notes") or []:
                out.print(f"note: {note}", highlight=False, markup=False)
            if title in workers:
                out.print(workers_table(title, workers[title]))
        else:
            out.print(title)
            out.print_json(json.dumps(summary, default=str))
    if info.simulated:
        _print_expected_error(info, db)
    if len(points) > 1:
        _print_capacity(info, db)


def _print_expected_error(info, db) -> None:
    """A simulated run's expected error per figure and each point's utilisation of the
    simulated saturation rate, as `sim run` printed them (bench.curves.run_curve)."""
    from bench.console import error_bars_table, near_saturation_note
    from bench.curves import run_curve

    curve = run_curve(info.id, db)
    if not curve.error_bars:
        return
    points = sorted((p for p in curve.points if p.error_bars), key=lambda p: p.load_point)
    rows = [(str(p.load_point + 1), p.title, p.error_bars) for p in points]
    out.print(error_bars_table(curve.error_bars["basis"], curve.error_bars["expected_error"], rows))
    if any(p.error_bars.get("near_saturation") for p in points):
        out.print(near_saturation_note(curve.error_bars.get("saturation_requests_per_s")))


def _print_capacity(info, db) -> None:
    """A sweep's capacity at the SLO stored with it (bench.curves, as `compare` prints it)."""
    from bench.curves import capacity_at_slo, resolve_slo, run_curve, slo_line

    slo, source = resolve_slo(None, [info])
    if not slo:
        return
    cap = capacity_at_slo(run_curve(info.id, db), slo)
    out.print(slo_line(slo, source), highlight=False)
    out.print(f"Capacity: {cap.text()}", highlight=False)
    if cap.deciding:
        out.print(f"  decided by {cap.deciding}", highlight=False)
    if cap.covers():
        out.print(f"  {cap.covers()}", highlight=False)
    for flag in cap.flags:
        out.print(f"  [yellow]caution:[/] {flag}", highlight=False)


def workers_table(title: str, workers: list[dict]) -> Table:
    """Each worker of a distributed run (bench.distributed.WorkerStats.to_json): where it
    ran, what it did, how far its start fell from the schedule, and its own self-check, so
    a skewed or overloaded node is named rather than averaged away."""

    def ms(value: float | None) -> str:
        return "—" if value is None else f"{value:.1f}"

    table = Table(
        "worker", "node", "node ip", "host", "pid", "sent", "done", "failed", "start err ms",
        "start ack ms", "loop lag p99 ms", "cpu busy", "self-check",
        title=f"{title}: workers",
        caption="start err: its first send minus its scheduled offset, on its own clock; "
        "start ack: the driver's clock from the start broadcast to the worker's reply",
    )  # fmt: skip
    for w in workers:
        if not w.get("alive", True):
            verdict = f"DIED: {w.get('error') or '?'}"
        elif w.get("client_limited_reasons"):
            verdict = "client-limited: " + "; ".join(w["client_limited_reasons"])
        else:
            verdict = "ok"
        busy = w.get("cpu_busy")
        table.add_row(
            str(w["worker"]), (w.get("node") or "")[:12] or "this host", w.get("node_ip") or "—",
            w.get("host") or "?",
            str(w.get("pid") or "?"), str(w.get("sent", 0)), str(w.get("completed", 0)),
            str(w.get("failed", 0)), ms(w.get("start_error_ms")), ms(w.get("start_ack_ms")),
            ms(w.get("loop_lag_p99_ms")), "—" if busy is None else f"{busy:.0%}", verdict,
        )  # fmt: skip
    return table


def _summary_table(title: str, summary: dict) -> Table:
    from bench.console import percentile_cell, thin_tails
    from bench.metrics import LATENCY_METRICS

    tp = summary["throughput"]
    caption = (
        f"completed {summary['completed']}  failed {summary['failed']}  "
        f"duration {summary['duration_s']:.2f} s  {tp['requests_per_s']:.2f} req/s  "
        f"{tp['output_tokens_per_s']:.1f} out tok/s"
        + ("  INTERRUPTED" if summary.get("interrupted") else "")
    )
    first = summary["metrics"][f"{LATENCY_METRICS[0]}_ms"]
    keys = list(first)
    confidence = summary.get("confidence") or {}
    table = Table("metric (ms)", "n", *keys, title=title, caption=caption)
    thin = []
    for name in LATENCY_METRICS:
        stats = summary["metrics"][f"{name}_ms"]
        conf = confidence.get(f"{name}_ms") or {}
        n = conf.get("count")
        cells = [percentile_cell(stats.get(k), conf.get(k)) for k in keys]
        table.add_row(name.upper(), "—" if n is None else f"{n:,}", *cells)
        thin += thin_tails(name.upper(), conf, keys)
    if confidence:
        table.caption = (
            f"{caption}\n\\[brackets]: 95% confidence interval (order statistics); "
            "open = too few samples to bound"
            + (f"\nthin tail (at or beyond the slowest request): {'; '.join(thin)}" if thin else "")
        )
    return table


@_clean_errors
def rm_command(
    run: Annotated[str, typer.Argument(help="Run id, unique id prefix or run name.")],
    db: DbOption = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Delete even a run a live process is writing.")
    ] = False,
) -> None:
    """Delete a run and all its requests."""
    from bench.store import delete_run, get_run, refuse_if_busy

    existing_database(db)
    info = get_run(run, db)
    if not force:  # refused before asking: a "yes" would be wasted on a run it cannot delete
        refuse_if_busy(info.id, info.stored_status, info.heartbeat_at)
    if not yes and not typer.confirm(
        f"delete run {info.id} ({info.name or '-'}, {info.request_count} requests)?"
    ):
        err.print("not deleted")
        raise typer.Exit(1)
    n = delete_run(info.id, db, force=force)
    out.print(f"deleted run {info.id} and its {n} requests")


@_clean_errors
def db_upgrade_command(db: DbOption = None) -> None:
    """Migrate the database to this tokenbench's schema (back it up first)."""
    from bench.store import make_engine, resolve_url, safe_url_text, upgrade

    rev = upgrade(make_engine(db))
    out.print(f"{safe_url_text(resolve_url(db))}: schema at revision {rev}", highlight=False)


@_clean_errors
def export_raw_command(
    run: Annotated[str, typer.Argument(help="Run id, unique id prefix or run name.")],
    out_path: Annotated[Path, typer.Option("--out", "-o", help="File to write.")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="json, csv or parquet.")] = "json",
    load_point: Annotated[int | None, typer.Option(help="Only this load point.")] = None,
    db: DbOption = None,
) -> None:
    """Write every request of a run to a JSON, CSV or Parquet file."""
    from bench.store import export_raw

    existing_database(db)
    path = export_raw(run, fmt, out_path, load_point=load_point, db=db)
    out.print(f"wrote {path}", highlight=False)


@_clean_errors
def import_command(
    file: Annotated[
        Path,
        typer.Argument(
            help="A result file of vLLM, guidellm or aiperf, or tokenbench's own "
            "tokenbench-unsaved-RUN.jsonl (written when the database failed mid-run)."
        ),
    ],
    fmt: Annotated[
        str, typer.Option("--format", "-f", help="vllm, guidellm, aiperf, tokenbench or auto.")
    ] = "auto",
    name: Annotated[
        str | None, typer.Option(help="Name of the new run (default: file name).")
    ] = None,
    db: DbOption = None,
) -> None:
    """Import another tool's results as a run marked imported."""
    from bench.store import get_run, import_file

    run_id = import_file(file, fmt, db=db, name=name)
    info = get_run(run_id, db)
    out.print(
        f"imported {file} as run {info.id} ({info.imported_from}, {info.request_count} requests)",
        highlight=False,
    )
