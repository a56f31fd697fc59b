"""`tokenbench plan`: the buying answer for stored runs (bench.plan), in the terminal."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from bench.cli.common import _catalogue, fail
from bench.cli.options import DbOption
from bench.console import Table, console


def plan_command(
    runs: Annotated[list[str], typer.Argument(help="Run ids (or unique prefixes or names)")],
    requests_per_s: Annotated[
        float | None, typer.Option("--requests-per-s", help="Mean demand in requests/s")
    ] = None,
    tokens_per_day: Annotated[
        float | None, typer.Option("--tokens-per-day", help="Mean demand in output tokens/day")
    ] = None,
    mix: Annotated[
        str | None,
        typer.Option(
            "--mix",
            help="Mean demand as a mix of traffic classes, CLASS=REQ_PER_S: 'chat=30,agent=10'",
        ),
    ] = None,
    peak_factor: Annotated[
        float | None,
        typer.Option("--peak-factor", min=1.0, help="Busiest hour / mean (size for it); 1"),
    ] = None,
    slo: Annotated[
        str | None,
        typer.Option("--slo", help="e.g. 'p99_ttft_ms<=500,p99_tpot_ms<=50' or 'ttft:500 tpot:50'"),
    ] = None,
    gpus_per_node: Annotated[
        int, typer.Option("--gpus-per-node", min=1, help="GPUs in one node (HGX: 8)")
    ] = 8,
    prices_file: Annotated[
        Path | None, typer.Option("--prices-file", help="Your own price tiers")
    ] = None,
    price: Annotated[
        list[str] | None, typer.Option("--price", help="GPU:tier=USD_per_GPU_hour (repeatable)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON")] = False,
    db: DbOption = None,
) -> None:
    """GPUs and nodes each system needs for a demand at the SLO, $/month and $/Mtok on every
    pricing tier, and the cheapest option. Without a demand, the scenario's mean rate."""
    from bench.curves import compare_runs, resolve_slo, run_curves, slo_line
    from bench.plan import Demand, default_demand, gpus_text, plan_capacity, span_text
    from bench.store import StoreError, get_run

    try:
        curves = run_curves(runs, db)
        infos = [get_run(c.run_id, db) for c in curves]
        thresholds, source = resolve_slo(slo, infos)
        if mix is not None:
            if requests_per_s is not None or tokens_per_day is not None:
                raise ValueError("give --mix, or --requests-per-s, or --tokens-per-day (one)")
            from bench.plan import parse_mix

            classes = parse_mix(mix)
            demand = Demand(
                requests_per_s=sum(classes.values()), peak_factor=peak_factor or 1.0, mix=classes
            )
        elif requests_per_s is None and tokens_per_day is None:
            found = default_demand(infos)
            if found is None:
                raise ValueError(
                    "give --requests-per-s or --tokens-per-day (none is stored with the run "
                    "and its scenario has no mean request rate)"
                )
            factor = found.peak_factor if peak_factor is None else peak_factor
            demand = Demand(found.requests_per_s, found.output_tokens_per_day, factor,
                            found.source)  # fmt: skip
        else:
            if requests_per_s is not None and tokens_per_day is not None:
                raise ValueError("give --requests-per-s or --tokens-per-day, not both")
            demand = Demand(requests_per_s, tokens_per_day, peak_factor or 1.0)
    except (ValueError, StoreError, KeyError) as exc:
        raise fail(str(exc)) from None
    catalogue = _catalogue(prices_file, price)
    comparisons = compare_runs(curves, thresholds, catalogue)
    plan = plan_capacity(
        comparisons, demand, catalogue, slo_source=source, gpus_per_node=gpus_per_node
    )
    if as_json:
        payload = asdict(plan) | {"slo": [str(t) for t in plan.slo], "sentence": plan.sentence}
        console.print_json(json.dumps(payload, default=str))
        return
    console.print(slo_line(thresholds, source))
    console.print(f"Demand: {demand.text()}")
    head = Table(title="GPUs needed", title_justify="left")
    for col in ("system", "capacity at the SLO", "replicas", "GPUs (range)", "nodes",
                "cheapest tier", "$/month", "$/Mtok"):  # fmt: skip
        head.add_column(col, justify="left" if col in ("system", "cheapest tier") else "right")
    for s in plan.systems:
        cheap = s.cheapest
        head.add_row(
            s.legend,
            s.capacity_text,
            "—" if s.replicas is None else f"{s.replicas:,} x {s.gpus_per_replica}",
            gpus_text(s),
            "—" if s.nodes is None else f"{s.nodes:,}",
            cheap.tier if cheap else "—",
            span_text(cheap.usd_per_month, cheap.usd_per_month_range, 0) if cheap else "—",
            span_text(cheap.usd_per_mtok, cheap.usd_per_mtok_range, 3) if cheap else "—",
        )
    console.print(head)
    tiers = Table(
        title="$/month; $/Mtok output at the demand, on every tier (range: the GPU count's)",
        title_justify="left",
    )
    tiers.add_column("tier")
    for s in plan.systems:
        tiers.add_column(s.legend, justify="right")
    names: list[str] = []
    for s in plan.systems:
        names += [t.tier for t in s.tiers if t.tier not in names]
    for name in names:
        cells = []
        for s in plan.systems:
            t = next((t for t in s.tiers if t.tier == name), None)
            cells.append(
                "no tier"
                if t is None
                else f"{span_text(t.usd_per_month, t.usd_per_month_range, 0)}; "
                f"{span_text(t.usd_per_mtok, t.usd_per_mtok_range, 3, '/Mtok')}"
            )
        tiers.add_row(name, *cells)
    if names:
        console.print(tiers)
    for s in plan.systems:
        if s.note:
            console.print(f"[yellow]note[/] ({s.legend}): {s.note}")
    console.print(f"[bold]{plan.sentence}[/]")
    console.print("Assumptions:")
    for line in plan.assumptions:
        console.print(f"  - {line}")
