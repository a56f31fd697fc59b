"""`tokenbench compare`: stored runs side by side."""

from __future__ import annotations

from typing import Annotated

import typer

from bench.cli.common import _catalogue, fail
from bench.cli.options import DbOpt, PriceOpt, PricesFileOpt, UtilisationOpt
from bench.console import console


def compare_command(
    runs: Annotated[list[str], typer.Argument(help="Run ids (or unique prefixes or names)")],
    slo: Annotated[
        str | None,
        typer.Option("--slo", help="e.g. 'p99_ttft_ms<=500,p99_tpot_ms<=50': capacity at it"),
    ] = None,
    utilisation: UtilisationOpt = 1.0,
    prices_file: PricesFileOpt = None,
    price: PriceOpt = None,
    db: DbOpt = None,
) -> None:
    """Side by side: capacity at SLO, P99s at matched load, $/Mtok per tier, the ratio.

    Without --slo, the SLO stored with the runs (when they share one) is used, as the
    dashboard and the exports do; the line 'SLO used: ...' says which.
    """
    from bench.choose import rank_settings
    from bench.cli.store import existing_database
    from bench.console import comparison_tables
    from bench.curves import compare_runs, ratio_sentence, resolve_slo, run_curves, slo_line
    from bench.store import StoreError, get_run

    try:
        existing_database(db)
        curves = run_curves(runs, db)
        infos = [get_run(c.run_id, db) for c in curves]
        thresholds, source = resolve_slo(slo, infos)
    except (ValueError, StoreError, KeyError) as exc:
        raise fail(str(exc)) from None
    catalogue = _catalogue(prices_file, price)
    comparisons = compare_runs(curves, thresholds, catalogue, utilisation)
    console.print(slo_line(thresholds, source))
    for table in comparison_tables(comparisons, utilisation):
        console.print(table)
    for c in comparisons:
        for flag in c.at_slo.flags if c.at_slo else ():
            console.print(f"[yellow]caution[/] ({c.curve.legend}): {flag}")
    sentence = ratio_sentence(comparisons)
    if sentence:
        console.print(f"[bold]{sentence}[/]")
    print_settings_ranking(rank_settings(comparisons, infos))


def print_settings_ranking(ranking) -> None:
    """An experiment's settings ranked (bench.choose), when the runs are its settings."""
    from bench.console import Table

    if ranking is None:
        return
    name = f" of {ranking.experiment}" if ranking.experiment else ""
    table = Table(title=f"Settings{name} ranked by {ranking.basis}")
    for column in ranking.HEADERS:
        table.add_column(column)
    for row in ranking.rows():
        table.add_row(*row)
    console.print(table)
    console.print(f"[bold green]{ranking.verdict}[/]", highlight=False)
