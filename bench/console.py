"""Rich renderings of summaries for the terminal: one place, used by run, show and sweep."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from bench.metrics import LATENCY_METRICS, Summary

console = Console(stderr=False, highlight=False)
err_console = Console(stderr=True, highlight=False)

_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E latency"}


def _fmt(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def summary_tables(
    summary: Summary, *, title: str = "Results", metrics: tuple[str, ...] = LATENCY_METRICS
) -> list[Table]:
    """The results table (counts, throughput) and the latency table (ms)."""
    head = Table(title=title, show_header=False, title_justify="left")
    head.add_column("what")
    head.add_column("value", justify="right")
    head.add_row("Completed requests", f"{summary.completed:,}")
    head.add_row("Failed requests", f"{summary.failed:,}")
    if summary.cancelled:
        head.add_row("Cancelled requests", f"{summary.cancelled:,}")
    for kind, count in sorted(summary.errors.items()):
        head.add_row(f"  {kind}", f"{count:,}")
    head.add_row("Duration (s)", _fmt(summary.duration_s))
    head.add_row("Request throughput (req/s)", _fmt(summary.requests_per_s))
    head.add_row("Output token throughput (tok/s)", _fmt(summary.output_tokens_per_s, 1))
    head.add_row("Total token throughput (tok/s)", _fmt(summary.total_tokens_per_s, 1))
    if summary.goodput_requests_per_s is not None:
        head.add_row("Goodput (req/s)", _fmt(summary.goodput_requests_per_s))
    lag = summary.send_lag_ms
    head.add_row(
        "Send lag p50 / p99 / max (ms)",
        f"{_fmt(lag['p50'])} / {_fmt(lag['p99'])} / {_fmt(lag['max'])}",
    )

    lat = Table(title="Latency (ms)", title_justify="left")
    lat.add_column("metric")
    lat.add_column("mean", justify="right")
    lat.add_column("std", justify="right")
    keys = list(summary.metrics["ttft"].percentiles)
    for key in keys:
        lat.add_column(key, justify="right")
    for m in metrics:
        stats = summary.metrics[m]
        lat.add_row(
            _NAMES[m],
            _fmt(stats.mean),
            _fmt(stats.std),
            *(_fmt(stats.percentiles.get(k)) for k in keys),
        )
    queued = summary.ttft_from_intended
    lat.add_row(
        "TTFT from schedule",
        _fmt(queued.mean),
        _fmt(queued.std),
        *(_fmt(queued.percentiles.get(k)) for k in keys),
    )
    return [head, lat]


def print_summary(summary: Summary, *, title: str = "Results", metrics=LATENCY_METRICS) -> None:
    for table in summary_tables(summary, title=title, metrics=metrics):
        console.print(table)
    if summary.interrupted:
        console.print("[bold yellow]Interrupted: these figures cover only what ran.[/]")
    if summary.client_limited:
        console.print(
            "[bold red]CLIENT-LIMITED: the load generator itself limited this result.[/] "
            + "; ".join(summary.client_limited_reasons)
            + ". Lower the load, use --workers, or move the client to a bigger machine."
        )
