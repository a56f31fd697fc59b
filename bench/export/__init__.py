"""Exports for procurement decks: PowerPoint, Excel, CSV, standalone HTML, PNG and SVG.

Every format renders the one `Report` that `bench.export.report.build_report` computes
from bench.curves, so all of them show the same numbers.
"""

from bench.export.report import Report, build_report

FORMATS = ("pptx", "xlsx", "csv", "html", "png", "svg")

__all__ = ["FORMATS", "Report", "build_report"]
