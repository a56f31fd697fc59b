"""`tokenbench prices`: show the pricing catalogue as a table (a thin shell over bench.cost)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from bench.console import Table, console

if TYPE_CHECKING:
    from bench.cost import Catalogue


def catalogue_table(catalogue: Catalogue, gpu: str | None = None) -> Table:
    """A rich table of tiers: GPU, tier, kind, $/GPU-h (computed for TCO and derived), source, date."""
    from bench.cost import PriceCatalogueError, price_per_gpu_hour

    table = Table(title="GPU pricing tiers (USD per GPU-hour)")
    for col in ("GPU", "tier", "kind", "$/GPU-h", "source", "date"):
        table.add_column(
            col, justify="right" if col == "$/GPU-h" else "left", overflow="fold", no_wrap=False
        )
    for tier in catalogue.tiers(gpu):
        try:
            price = f"{price_per_gpu_hour(tier, catalogue):.2f}"
        except PriceCatalogueError as exc:
            price = f"n/a ({exc})"
        if tier.derived is not None:
            price += f" (={tier.derived.factor:g}x {tier.derived.from_tier})"
        elif tier.tco is not None:
            price += " (TCO)"
        table.add_row(tier.gpu, tier.name, tier.kind, price, tier.source, tier.date)
    return table


def prices_command(
    gpu: Annotated[
        str | None, typer.Option("--gpu", help="Only this GPU (name or alias, e.g. B200).")
    ] = None,
    prices_file: Annotated[
        Path | None,
        typer.Option(
            "--prices-file", help="Your own prices YAML (same schema) adding/overriding tiers."
        ),
    ] = None,
    price: Annotated[
        list[str] | None,
        typer.Option(
            "--price", help="Override or add one tier: GPU:tier=USD_per_GPU_hour (repeatable)."
        ),
    ] = None,
) -> None:
    """List the GPU pricing catalogue: every tier with its $/GPU-hour, source and date."""
    from bench.cost import PriceCatalogueError, load_catalogue

    try:
        catalogue = load_catalogue(prices_file, price or [])
        table = catalogue_table(catalogue, gpu)
    except PriceCatalogueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    # Piped or captured output is printed at the table's natural width (bench.console).
    console.print(table)
