"""`tokenbench kinds`: what each seam accepts (load shapes, datasets, dialects, export
formats, telemetry sources, metric vocabularies), read from bench.registry."""

from __future__ import annotations

import sys
from typing import Annotated

import typer


def kinds_command(
    registry: Annotated[
        str | None,
        typer.Argument(help="Only this registry, e.g. 'dialect' or 'load shape'"),
    ] = None,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="Print the README's list (docs are checked)")
    ] = False,
) -> None:
    """List every registered kind with its one-line description."""
    from bench.registry import all_registries
    from bench.registry import markdown as as_markdown

    if markdown:
        print(as_markdown(), end="")
        return
    registries = all_registries()
    if registry is not None:
        registries = [r for r in registries if r.noun == registry]
        if not registries:
            known = ", ".join(repr(r.noun) for r in all_registries())
            print(f"error: no registry {registry!r}: choose one of {known}", file=sys.stderr)
            raise typer.Exit(2)
    for reg in registries:
        print(f"{reg.noun} ({reg.where})")
        described = reg.describe()
        width = max(map(len, described), default=0)
        for name, text in described.items():
            print(f"  {name:<{width}}  {text}")
