"""CSV: the Report's tables, one file each (summary.csv, cost.csv, ...), in a folder or a zip.

Numbers are written unrounded (the rounding is the slides' business); units are in the
headers; an empty field is a missing value. A README.txt says what the files are and what
the report could not show.
"""

from __future__ import annotations

import csv
import io
import zipfile
from pathlib import Path

from bench.export.report import Report, Table, cell_value
from bench.formulas import csv_text


def table_csv(table: Table) -> str:
    buf = io.StringIO()
    # RFC 4180's CRLF: then a CR inside a cell (a label from outside) is quoted too, and
    # cannot split a row
    w = csv.writer(buf, lineterminator="\r\n")
    w.writerow([csv_text(h) for h in table.headers])
    for row in table.rows:
        w.writerow(["" if (v := cell_value(c)) is None else csv_text(v) for c in row])
    return buf.getvalue()


def _readme(report: Report) -> str:
    lines = [report.title, report.subtitle, f"Generated {report.generated_at} by tokenbench"]
    if report.any_simulated:
        lines.append("Includes SIMULATED results, not measured on hardware.")
        if report.sim_error.rows:
            lines.append(f"{report.sim_error.name}.csv: {report.sim_error.note}")
    lines += ["", report.sentence or "No ratio between GPUs (see missing.csv).", "", "Files:"]
    lines += [f"  {t.name}.csv  {t.title}" for t in report.tables]
    return "\n".join(lines) + "\n"


def write_csv(report: Report, out: Path) -> Path:
    """A folder of CSV files, or a zip of them when `out` ends in .zip; returns `out`."""
    out = Path(out)
    files = {f"{t.name}.csv": table_csv(t) for t in report.tables}
    files["README.txt"] = _readme(report)
    if out.suffix.lower() == ".zip":
        out.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, text in files.items():
                zf.writestr(name, text)
        return out
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
    return out
