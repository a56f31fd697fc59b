"""Exports for procurement decks: PowerPoint, Excel, CSV, standalone HTML, PNG and SVG.

Every format renders the one `Report` that `bench.export.report.build_report` computes
from bench.curves, so all of them show the same numbers. The formats are the kinds of
`bench.export.formats.EXPORT_FORMATS`.
"""


def __getattr__(name: str):
    # Imported on first use, so mounting `tokenbench export` does not import numpy and plotly.
    if name in ("Report", "build_report"):
        from bench.export import report

        return getattr(report, name)
    raise AttributeError(f"module 'bench.export' has no attribute {name!r}")


__all__ = ["Report", "build_report"]
