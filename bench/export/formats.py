"""The export format dispatcher: a Report laid out in one format, and the extra each needs.

Library code (the CLI's `export` and the service's export endpoint both call it), so it
lives in bench/export and not in a CLI module.
"""

from __future__ import annotations

from pathlib import Path

# format -> (module of its optional extra, what the user asked for)
NEEDS = {
    "pptx": ("pptx", "PowerPoint export"),
    "xlsx": ("openpyxl", "Excel export"),
    "png": ("kaleido", "PNG export"),
    "svg": ("kaleido", "SVG export"),
}


def require_extra(fmt: str) -> None:
    """Raise MissingExtraError (one line naming the pip extra) if fmt's extra is missing."""
    if fmt in NEEDS:
        from bench.extras import require

        require(*NEEDS[fmt])


def write(report, fmt: str, out: Path) -> Path:
    """Render `report` in `fmt` to `out`; returns what was written (file or folder)."""
    require_extra(fmt)
    if fmt == "pptx":
        from bench.export.pptx import write_pptx

        return write_pptx(report, out)
    if fmt == "xlsx":
        from bench.export.xlsx import write_xlsx

        return write_xlsx(report, out)
    if fmt == "csv":
        from bench.export.csv import write_csv

        return write_csv(report, out)
    if fmt == "html":
        from bench.export.html import write_html

        return write_html(report, out)
    if fmt in ("png", "svg"):
        from bench.export.images import write_images

        write_images(report, out, fmt)
        return out
    raise ValueError(f"--format {fmt!r}: expected one of pptx, xlsx, csv, html, png, svg")
