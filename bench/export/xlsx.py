"""Excel workbook: an "About" sheet, then one sheet per Report table (raw load points too).

Cells hold the unrounded numbers with a number format that shows the report's rounding, so
a reader can recompute from them; units are in the headers.
"""

from __future__ import annotations

from pathlib import Path

from openpyxl import Workbook
from openpyxl.styles import Alignment, Font, PatternFill
from openpyxl.utils import get_column_letter

from bench.export.report import Num, Report, Table, cell_text, cell_value

HEADER_FONT = Font(bold=True, color="FFFFFF")
HEADER_FILL = PatternFill("solid", fgColor="1F4E79")
WARN_FONT = Font(bold=True, color="B03A2E")


def number_format(cell: Num) -> str:
    """'#,##0.000' for 3 decimals, with the cell's "$" or "%" kept as literal text."""
    body = "#,##0" + ("." + "0" * cell.decimals if cell.decimals else "")
    prefix = f'"{cell.prefix}"' if cell.prefix else ""
    suffix = f'"{cell.suffix}"' if cell.suffix else ""
    return prefix + body + suffix


def _sheet(wb: Workbook, table: Table) -> None:
    ws = wb.create_sheet(table.name[:31])
    ws.append(table.headers)
    for c in ws[1]:
        c.font, c.fill = HEADER_FONT, HEADER_FILL
        c.alignment = Alignment(wrap_text=True, vertical="center")
    for row in table.rows:
        ws.append([cell_value(c) for c in row])
        for j, c in enumerate(row):
            if isinstance(c, Num) and c.value is not None:
                ws.cell(ws.max_row, j + 1).number_format = number_format(c)
    if table.note:
        ws.append([])
        ws.append([table.note])
    ws.freeze_panes = "B2"
    for j, head in enumerate(table.headers, start=1):
        texts = [head] + [cell_text(r[j - 1]) for r in table.rows]
        ws.column_dimensions[get_column_letter(j)].width = min(60, max(10, *map(len, texts)) + 2)


def write_xlsx(report: Report, out: Path) -> Path:
    """Write the workbook to `out` (.xlsx); returns it."""
    wb = Workbook()
    about = wb.active
    about.title = "about"
    about.append([report.title])
    about["A1"].font = Font(bold=True, size=14)
    about.append([report.subtitle])
    about.append([f"Generated {report.generated_at} by tokenbench"])
    if report.any_simulated:
        about.append(["Includes SIMULATED results, not measured on hardware"])
        about.cell(about.max_row, 1).font = WARN_FONT
    about.append([])
    about.append([report.sentence or "No ratio between GPUs (see 'missing')."])
    about.cell(about.max_row, 1).font = Font(bold=True)
    about.append([])
    about.append(["Sheets:"])
    for t in report.tables:
        about.append([t.name, t.title])
    about.column_dimensions["A"].width = 24
    about.column_dimensions["B"].width = 60
    for table in report.tables:
        _sheet(wb, table)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    wb.save(out)
    return out
