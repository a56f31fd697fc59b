"""`tokenbench export`: chosen runs -> a report in one of bench.export.formats' formats.

A thin shell over bench.export (the formats: bench.export.formats.EXPORT_FORMATS).
Bad input (unknown run, bad SLO, unknown format, unreadable price file, no browser for
images) prints one line and exits 2.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from bench.cli.options import DbOption
from bench.export.formats import EXPORT_FORMATS, default_out, require_extra, write

# The --format choices: every registered export format.
ExportFormat = EXPORT_FORMATS.as_enum("ExportFormat")


def _fail(message: str) -> typer.Exit:
    print(f"error: {message}", file=sys.stderr)
    return typer.Exit(2)


def export_command(
    run_ids: Annotated[
        list[str] | None,
        typer.Argument(help="Run ids (or unique prefixes or names), as `compare` takes them"),
    ] = None,
    runs: Annotated[
        str | None,
        typer.Option("--runs", help="Comma-separated run ids (the same as the arguments)"),
    ] = None,
    format: Annotated[  # noqa: A002 - the flag is --format
        ExportFormat, typer.Option("--format", "-f", help=EXPORT_FORMATS.help())
    ] = ExportFormat.pptx,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="File (pptx/xlsx/html), folder or .zip (csv), folder (png/svg); "
            "default results/report.<format>",
        ),
    ] = None,
    slo: Annotated[
        str | None,
        typer.Option(
            "--slo",
            help="e.g. 'p99_ttft_ms<=2000,p99_tpot_ms<=50'; default: the SLO the runs were "
            "swept against, if they share one",
        ),
    ] = None,
    utilisation: Annotated[
        float, typer.Option("--utilisation", min=0.01, max=1.0, help="Fleet utilisation")
    ] = 1.0,
    prices_file: Annotated[
        Path | None, typer.Option("--prices-file", help="Your own price tiers (YAML)")
    ] = None,
    price: Annotated[list[str] | None, typer.Option("--price", help="GPU:tier=USD")] = None,
    db: DbOption = None,
) -> None:
    """Export runs for a procurement deck: PowerPoint, Excel, CSV, HTML, PNG or SVG."""
    from bench.cli.store import existing_database
    from bench.cost import PriceCatalogueError, load_catalogue
    from bench.export.images import ImageExportError
    from bench.export.report import build_report
    from bench.store import StoreError

    refs = [r.strip() for r in [*(run_ids or ()), *(runs or "").split(",")] if r.strip()]
    if not refs:
        raise _fail("give at least one run id, e.g. tokenbench export 2bbb352d a3289346")
    fmt = format.value if isinstance(format, ExportFormat) else str(format)
    label = "shipped bench/data/prices.yaml"
    if prices_file:
        label += f" + {prices_file}"
    if price:
        label += " + --price " + ", ".join(price)
    try:
        require_extra(fmt)  # an unknown format is a ValueError naming the known ones
        existing_database(db)
        catalogue = load_catalogue(prices_file, price or ())
        report = build_report(refs, db, slo, catalogue, utilisation, catalogue_label=label)
        target = out or default_out(fmt)
        written = write(report, fmt, target)
    except (PriceCatalogueError, StoreError, ImageExportError, ValueError, KeyError) as exc:
        # a KeyError's text is its repr, quoted; every other message is shown as it is
        text = str(exc).strip("'\"") if isinstance(exc, KeyError) else str(exc)
        raise _fail(text) from None
    except OSError as exc:
        raise _fail(f"cannot write {exc.filename or out}: {exc.strerror or exc}") from None
    for line in report.missing:
        print(f"note: {line}", file=sys.stderr)
    print(f"wrote {written}")


__all__ = ["ExportFormat", "default_out", "export_command"]
