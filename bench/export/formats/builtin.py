"""The shipped export formats. Each writer imports its libraries when called, so listing
the formats (the CLI's --help, the API) costs no import of pptx, openpyxl or plotly."""

from __future__ import annotations

from pathlib import Path

from bench.export.formats import EXPORT_FORMATS, ExportFormat


def _pptx(report, out: Path) -> Path:
    from bench.export.pptx import write_pptx

    return write_pptx(report, out)


def _xlsx(report, out: Path) -> Path:
    from bench.export.xlsx import write_xlsx

    return write_xlsx(report, out)


def _csv(report, out: Path) -> Path:
    from bench.export.csv import write_csv

    return write_csv(report, out)


def _html(report, out: Path) -> Path:
    from bench.export.html import write_html

    return write_html(report, out)


def _images(fmt: str):
    def write(report, out: Path) -> Path:
        from bench.export.images import write_images

        write_images(report, out, fmt)
        return out

    return write


EXPORT_FORMATS.register(
    "pptx",
    "PowerPoint deck: capacity, cost and curve slides (needs tokenbench[export])",
    ExportFormat(
        _pptx,
        "PowerPoint",
        extra=("pptx", "PowerPoint export"),
        media_type="application/vnd.openxmlformats-officedocument.presentationml.presentation",
        download_suffix="pptx",
    ),
)
EXPORT_FORMATS.register(
    "xlsx",
    "Excel workbook: every load point, cost and the raw figures (needs tokenbench[export])",
    ExportFormat(
        _xlsx,
        "Excel",
        extra=("openpyxl", "Excel export"),
        media_type="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        download_suffix="xlsx",
    ),
)
EXPORT_FORMATS.register(
    "csv",
    "CSV tables in a folder or a .zip (the API serves the zip)",
    ExportFormat(
        _csv, "CSV (zip)", folder=True, media_type="application/zip", download_suffix="zip"
    ),
)
EXPORT_FORMATS.register(
    "html",
    "one standalone HTML report with interactive charts",
    ExportFormat(
        _html, "HTML report", media_type="text/html; charset=utf-8", download_suffix="html"
    ),
)
for _fmt in ("png", "svg"):
    EXPORT_FORMATS.register(
        _fmt,
        f"one {_fmt.upper()} per chart in a folder (needs tokenbench[export] and Chromium)",
        ExportFormat(
            _images(_fmt), _fmt.upper(), extra=("kaleido", f"{_fmt.upper()} export"), folder=True
        ),
    )
