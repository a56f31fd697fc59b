"""`tokenbench demo`: B200 beside H100 on simulated endpoints."""

from __future__ import annotations

from typing import Annotated

import typer

from bench.cli.common import fail


def demo_command(
    db: Annotated[str | None, typer.Option("--db", help="Where to store the demo's runs")] = None,
) -> None:
    """B200 beside H100 on simulated endpoints: dense virtual-time sweeps of each, then a
    real-time check of one point each through the real load generator (about 40 s)."""
    from bench.demo import run_demo
    from bench.store import StoreError

    try:
        run_demo(db)
    except StoreError as exc:
        raise fail(str(exc)) from None
