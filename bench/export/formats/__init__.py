"""Export formats: a Report laid out in one format, each format a kind of EXPORT_FORMATS.

Library code (the CLI's `export` and the service's export endpoint both call `write`), so
it lives in bench/export and not in a CLI module. The formats themselves are registered by
the modules of this package (builtin.py: pptx, xlsx, csv, html, png, svg); a new format is
one new module here that calls `EXPORT_FORMATS.register(name, description, ExportFormat(...))`,
and the CLI's --format choices, the API's allowed values, the compare page's buttons and
the README's list follow.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.registry import Registry


@dataclass(frozen=True)
class ExportFormat:
    """How one format is written, and what the CLI, the API and the pages need to know."""

    write: Callable[..., Path]  # (report, out) -> what was written; imports its libraries late
    label: str  # the compare page's button, e.g. "PowerPoint"
    extra: tuple[str, str] | None = None  # (module of its optional extra, what the user asked)
    folder: bool = False  # writes a folder by default (results/report-<name>/)
    # The API's download: its media type, or None when the format is not offered there
    # (it writes many files), and the suffix of the downloaded file.
    media_type: str | None = None
    download_suffix: str | None = None

    @property
    def downloadable(self) -> bool:
        return self.media_type is not None


EXPORT_FORMATS: Registry[ExportFormat] = Registry(
    "export format", package=__name__, where="--format / the API's format"
)


def require_extra(fmt: str) -> None:
    """Raise MissingExtraError (one line naming the pip extra) if fmt's extra is missing."""
    extra = EXPORT_FORMATS.get(fmt).extra
    if extra is not None:
        from bench.extras import require

        require(*extra)


def write(report, fmt: str, out: Path) -> Path:
    """Render `report` in `fmt` to `out`; returns what was written (file or folder)."""
    kind = EXPORT_FORMATS.get(fmt)
    require_extra(fmt)
    return kind.write(report, out)


def default_out(fmt: str) -> Path:
    """results/report.<fmt>, or a folder results/report-<fmt>/ for formats of many files."""
    folder = EXPORT_FORMATS.get(fmt).folder
    return Path("results") / (f"report-{fmt}" if folder else f"report.{fmt}")


def downloads() -> dict[str, ExportFormat]:
    """The formats the API serves as one download, by name."""
    return {k.name: k.obj for k in EXPORT_FORMATS.kinds() if k.obj.downloadable}
