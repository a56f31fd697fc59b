"""PNG and SVG of each chart, through plotly's image export (kaleido 1.x + Chromium).

kaleido 1.x drives a Chrome/Chromium it finds through choreographer: the BROWSER_PATH
environment variable if set, else `chromium`, `chromium-browser` or `google-chrome` on PATH
(Debian: `apt-get install -y chromium` gives /usr/bin/chromium). Without one the export
fails with a message saying so, rather than kaleido's advice to download Chrome.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from bench.export.figures import report_figures
from bench.export.report import Report

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
WIDTH, HEIGHT, SCALE = 1280, 720, 2  # 16:9, crisp on a slide


class ImageExportError(RuntimeError):
    """No browser for kaleido, or kaleido failed; the message says what to install."""


def find_browser() -> str | None:
    """The browser kaleido will use, or None."""
    path = os.environ.get("BROWSER_PATH")
    if path:
        return path if os.access(path, os.X_OK) else None
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


def write_images(report: Report, out: Path, fmt: str = "png") -> list[Path]:
    """One `<chart>.png` (or .svg) per chart in the folder `out`; returns the files."""
    if fmt not in ("png", "svg"):
        raise ValueError(f"image format {fmt!r}: expected png or svg")
    if find_browser() is None:
        raise ImageExportError(
            "PNG/SVG export needs Chrome or Chromium for kaleido: install it "
            "(Debian/Ubuntu: apt-get install -y chromium) or set BROWSER_PATH to its binary"
        )
    import plotly.io as pio

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    figs = report_figures(report)
    paths = [out / f"{key}.{fmt}" for key in figs]
    for path in paths:  # a file left by an earlier export must not pass for this one's
        path.unlink(missing_ok=True)
    try:
        # One browser for all charts (plotly >= 6.1); otherwise one start per chart.
        if hasattr(pio, "write_images"):
            pio.write_images(
                list(figs.values()), paths, format=fmt, width=WIDTH, height=HEIGHT, scale=SCALE
            )
        else:  # pragma: no cover - older plotly
            for fig, path in zip(figs.values(), paths, strict=True):
                fig.write_image(path, format=fmt, width=WIDTH, height=HEIGHT, scale=SCALE)
        # kaleido has been seen to return with a file unwritten on a loaded machine: each
        # missing chart gets one more try on its own, then the export fails naming it.
        for fig, path in zip(figs.values(), paths, strict=True):
            if not _written(path):
                fig.write_image(path, format=fmt, width=WIDTH, height=HEIGHT, scale=SCALE)
    except Exception as exc:  # kaleido raises several kinds; all mean the same to a user
        raise ImageExportError(f"image export failed: {exc}") from exc
    missing = [p.name for p in paths if not _written(p)]
    if missing:
        raise ImageExportError(
            f"image export wrote no {', '.join(missing)} in {out} (kaleido returned without "
            "an error); run the export again"
        )
    return paths


def _written(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 0
