"""Spreadsheet formula injection: text from outside (a run label, a model name, a server's
error message) must reach a spreadsheet as text, never as a formula (issue 28, F5).

OWASP's rule for CSV: a cell beginning with `=`, `+`, `-`, `@`, TAB or CR is read as a
formula by Excel and LibreOffice, so such text is written with a leading `'` (which both
show as text). In XLSX a string cell is text whatever it begins with, except that
openpyxl stores a string beginning with `=` as a formula: such cells are typed back to
text. Numbers are never touched (a negative number is a number, not a formula).
"""

from __future__ import annotations

from typing import Any

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_text(value: Any) -> Any:
    """The value to write in a CSV cell: text that a spreadsheet would run is quoted."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def xlsx_text(cell: Any) -> Any:
    """An openpyxl cell written from outside text, made text if openpyxl took it for a
    formula; returns the cell so that number_format and font can still be chained."""
    if cell.data_type == "f":
        cell.data_type = "s"
    return cell
