"""Excel workbook a finance person can work in: inputs, formulas, and the measured data.

- `inputs`: every assumption a buyer may change, in blue: fleet utilisation, electricity
  price and PUE, hours per month, the demand and its peak factor, GPUs per node, the price
  of every pricing tier (with source and date), and per system the GPU count to buy.
- `capacity`: what was measured at each run's capacity at the SLO (throughput, requests/s,
  tokens per request): numbers, not formulas.
- `cost`, `summary_cost`, `plan`, `energy`: formulas over those two sheets, so changing a
  price, the utilisation or the demand moves every $/Mtok and $/month in the workbook. They
  use named cells (Utilisation, HoursPerMonth, ...) so a formula reads like the definition:
  $/Mtok = $/GPU-hour x GPUs / (tokens/s x 3600) x 1e6 / Utilisation.
- then one sheet per measured table of the Report (summary, percentiles with intervals,
  raw load points, runs, assumptions, methodology, missing).

openpyxl stores formulas without cached results; Excel and LibreOffice compute them on open
(tests/test_export_report.py recalculates the workbook in headless LibreOffice).
"""

from __future__ import annotations

from pathlib import Path

from openpyxl import Workbook
from openpyxl.styles import Alignment, Font, PatternFill
from openpyxl.utils import get_column_letter
from openpyxl.workbook.defined_name import DefinedName

from bench.cost import cost_error_name
from bench.export.report import COST_SPAN_NOTE, Num, Report, Table, cell_text, cell_value
from bench.formulas import xlsx_text

HEADER_FONT = Font(bold=True, color="FFFFFF")
HEADER_FILL = PatternFill("solid", fgColor="1F4E79")
INPUT_FONT = Font(color="0000FF")  # the finance convention: blue = typed input
INPUT_FILL = PatternFill("solid", fgColor="FFF2CC")
WARN_FONT = Font(bold=True, color="B03A2E")
USD = '"$"#,##0.00'
USD3 = '"$"#,##0.000'
USD0 = '"$"#,##0'

# Sheets the formula sheets replace, and assumption rows that live on `inputs` instead.
REPLACED = {"plan", "summary_cost", "cost", "prices", "energy"}
ON_INPUTS = {"Fleet utilisation", "Electricity price", "Facility PUE"}


def number_format(cell: Num) -> str:
    """'#,##0.000' for 3 decimals, with the cell's "$" or "%" kept as literal text."""
    body = "#,##0" + ("." + "0" * cell.decimals if cell.decimals else "")
    prefix = f'"{cell.prefix}"' if cell.prefix else ""
    suffix = f'"{cell.suffix}"' if cell.suffix else ""
    return prefix + body + suffix


def _header(ws, row: int, headers: list[str]) -> None:
    for j, text in enumerate(headers, start=1):
        c = xlsx_text(ws.cell(row, j, text))
        c.font, c.fill = HEADER_FONT, HEADER_FILL
        c.alignment = Alignment(wrap_text=True, vertical="center")


def _widths(ws, widths: list[int]) -> None:
    for j, w in enumerate(widths, start=1):
        ws.column_dimensions[get_column_letter(j)].width = w


def _input(ws, row: int, col: int, value, fmt: str | None = None):
    c = ws.cell(row, col, value)
    c.font, c.fill = INPUT_FONT, INPUT_FILL
    if fmt:
        c.number_format = fmt
    return c


def _name(wb: Workbook, name: str, ws, row: int, col: int) -> None:
    ref = f"'{ws.title}'!${get_column_letter(col)}${row}"
    wb.defined_names[name] = DefinedName(name, attr_text=ref)


def _sheet(wb: Workbook, table: Table, skip_rows: set[str] = frozenset()) -> None:
    ws = wb.create_sheet(table.name[:31])
    ws.append(table.headers)
    for c in ws[1]:
        xlsx_text(c)
        c.font, c.fill = HEADER_FONT, HEADER_FILL
        c.alignment = Alignment(wrap_text=True, vertical="center")
    for row in table.rows:
        if row and row[0] in skip_rows:
            continue
        ws.append([cell_value(c) for c in row])
        for cell in ws[ws.max_row]:
            xlsx_text(cell)  # a label from outside (=1+41) is text, not a formula
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


# ---------------------------------------------------------------- inputs


def _inputs(wb: Workbook, report: Report) -> dict[tuple[str, str], str]:
    """The inputs sheet; returns (GPU, tier) -> the absolute address of its price cell."""
    ws = wb.create_sheet("inputs")
    ws["A1"] = "Inputs: change the blue cells; every $/Mtok and $/month in this workbook follows."
    ws["A1"].font = Font(bold=True, size=12)
    plan = report.plan
    demand = plan.demand if plan else None
    tco = getattr(report.catalogue, "tco_defaults", None)

    def assumption(name: str, default: float):
        a = getattr(tco, name, None) if tco is not None else None
        return (a.value, a.source or a.note or "") if a is not None else (default, "assumed")

    kwh, kwh_why = assumption("usd_per_kwh", 0.08)
    pue, pue_why = assumption("pue", 1.3)
    rows = [
        ("Utilisation", "Fleet utilisation (0-1)", report.utilisation, "0%",
         "share of hours the GPUs are busy; $/Mtok at utilisation = busy $/Mtok / this"),
        ("UsdPerKwh", "Electricity price ($/kWh)", kwh, "0.000", kwh_why),
        ("FacilityPUE", "Facility PUE", pue, "0.00", pue_why),
        ("HoursPerMonth", "Hours per month", 730, "0", "8,760 hours a year / 12"),
        ("DemandRps", "Demand: mean requests/s",
         demand.requests_per_s if demand else None, "#,##0.000",
         (demand.source if demand and demand.requests_per_s is not None else
          "give this or output tokens/day")),
        ("DemandTokensPerDay", "Demand: mean output tokens/day",
         demand.output_tokens_per_day if demand else None, "#,##0",
         demand.source if demand and demand.output_tokens_per_day is not None else ""),
        ("PeakFactor", "Peak factor (busiest hour / mean)",
         demand.peak_factor if demand else 1.0, "0.00", "the fleet is sized for the peak"),
        ("GpusPerNode", "GPUs per node", plan.gpus_per_node if plan else 8, "0", ""),
    ]  # fmt: skip
    _header(ws, 3, ["Input", "Value", "Source or note"])
    for i, (name, label, value, fmt, why) in enumerate(rows, start=4):
        xlsx_text(ws.cell(i, 1, label))
        _input(ws, i, 2, value, fmt)
        xlsx_text(ws.cell(i, 3, why))
        _name(wb, name, ws, i, 2)

    top = 4 + len(rows) + 1
    ws.cell(top, 1, "Prices per GPU-hour (every tier of every GPU compared)").font = Font(bold=True)
    _header(ws, top + 1, ["GPU", "Tier", "$/GPU-hour", "Kind", "Provider", "Source", "Date"])
    prices: dict[tuple[str, str], str] = {}
    r = top + 2
    for row in report.prices.rows:
        gpu, tier, kind, provider, price, source, date = row
        xlsx_text(ws.cell(r, 1, gpu))
        xlsx_text(ws.cell(r, 2, tier))
        _input(ws, r, 3, cell_value(price), USD)
        for j, v in enumerate((kind, provider, source, date), start=4):
            xlsx_text(ws.cell(r, j, cell_value(v)))
        prices[(gpu, tier)] = f"inputs!$C${r}"
        r += 1
    _price_formulas(ws, report, prices)
    if report.tier_note:
        xlsx_text(ws.cell(r, 1, report.tier_note)).font = Font(italic=True)
        r += 1
    ws.cell(r + 1, 1, "Blue cells are inputs. Derived $ figures: sheets cost, summary_cost, plan, "
            "energy.")  # fmt: skip
    _widths(ws, [34, 26, 14, 14, 12, 90, 10])
    ws.freeze_panes = "A4"
    return prices


def _price_formulas(ws, report: Report, prices: dict[tuple[str, str], str]) -> None:
    """Prices that are not quoted become formulas over the inputs, so the workbook is the
    model: a derived tier is its factor x its base tier's cell (change the base, it
    follows); an owned tier is its TCO, capex / (life x 8760 h) + power x FacilityPUE / 1000
    x UsdPerKwh + hosting + operations (change electricity or PUE, the price follows)."""
    from bench.cost import HOURS_PER_YEAR, PriceCatalogueError, tco_breakdown

    cat = report.catalogue
    for (gpu, name), ref in prices.items():
        try:
            tier = cat.tier(gpu, name)
        except PriceCatalogueError:
            continue
        cell = ws[ref.split("!")[1].replace("$", "")]
        if tier.derived is not None and (gpu, tier.derived.from_tier) in prices:
            cell.value = f"={tier.derived.factor!r}*{prices[(gpu, tier.derived.from_tier)]}"
            cell.font = Font(color="000000")  # a formula, not a typed input
        elif tier.tco is not None:
            try:
                t = tco_breakdown(tier)
            except PriceCatalogueError:
                continue
            inputs = cat.tco_defaults
            pue = "FacilityPUE" if _same(t.pue, inputs, "pue") else repr(t.pue)
            kwh = (
                "UsdPerKwh" if _same(t.usd_per_kwh, inputs, "usd_per_kwh") else repr(t.usd_per_kwh)
            )
            cell.value = (
                f"={t.capex_usd_per_gpu!r}/({t.life_years!r}*{HOURS_PER_YEAR:g})"
                f"+{t.power_w!r}*{pue}/1000*{kwh}"
                f"+{t.hosting_usd_per_gpu_hr!r}+{t.operations_usd_per_gpu_hr!r}"
            )
            cell.font = Font(color="000000")


def _same(value: float, defaults, field: str) -> bool:
    """Whether a tier uses the catalogue's default for `field` (the inputs sheet's cell)."""
    d = getattr(defaults, field, None) if defaults is not None else None
    return d is not None and d.value == value


# ---------------------------------------------------------------- measured at capacity


def _capacity(wb: Workbook, report: Report) -> list[int]:
    """Measured figures at each run's capacity; returns each comparison's row (0: none)."""
    ws = wb.create_sheet("capacity")
    headers = ["Run", "GPU", "GPUs per replica", "Capacity at the SLO", "Load point",
               "Output tok/s (replica)", "Total tok/s (replica)", "Requests/s (replica)",
               "Output tokens per request", "Output tok/s per GPU", "Power per GPU (W)",
               "Power from", "Capacity range low (tok/s per GPU)",
               "Capacity range high (tok/s per GPU)"]  # fmt: skip
    _header(ws, 1, headers)
    energy = {row[0]: row for row in report.energy.rows}
    out = []
    r = 2
    for c in report.comparisons:
        p = c.capacity
        if p is None:
            out.append(0)
            continue
        e = energy.get(c.curve.legend)
        per_request = p.output_tps / p.requests_per_s if p.requests_per_s else None
        values = [
            c.curve.legend, c.curve.gpu_type or "", c.curve.gpu_count,
            c.at_slo.text() if c.at_slo else c.basis, p.title,
            p.output_tps, p.total_tps, p.requests_per_s, per_request, p.output_tps_per_gpu,
            cell_value(e[2]) if e else None, cell_value(e[3]) if e else "",
            *_capacity_range(c.at_slo),
        ]  # fmt: skip
        for j, v in enumerate(values, start=1):
            xlsx_text(ws.cell(r, j, v))
        for j, fmt in ((6, "#,##0.0"), (7, "#,##0.0"), (8, "#,##0.000"), (9, "#,##0.0"),
                       (10, "#,##0.0"), (11, "#,##0"), (13, "#,##0.0"), (14, "#,##0.0")):  # fmt: skip
            ws.cell(r, j).number_format = fmt
        out.append(r)
        r += 1
    ws.cell(r + 1, 1, "Measured (or simulated) at each run's capacity at the SLO; the formula "
            "sheets read these cells.")  # fmt: skip
    _widths(ws, [40, 12, 10, 48, 40, 14, 14, 14, 14, 14, 12, 26, 16, 16])
    ws.freeze_panes = "B2"
    return out


def _capacity_range(cap) -> tuple[float | None, float | None]:
    """The capacity's two-sided range (bench.curves.Capacity: sampling, bracket, reruns and a
    simulated run's error), which the plan sheet sizes the GPU range from; empty when it is
    a bound or one-sided, as bench.plan leaves the range there."""
    if cap is None or cap.kind == "at_least" or cap.low is None or cap.high is None:
        return (None, None)
    return (cap.low, cap.high)


# ---------------------------------------------------------------- formula sheets


def _cost(wb: Workbook, report: Report, prices, cap_rows) -> dict[tuple[str, str], int]:
    """$/Mtok per run and tier at capacity; returns (run legend, tier) -> its row."""
    ws = wb.create_sheet("cost")
    headers = ["Run", "GPU", "Tier", "$/GPU-hour", "GPUs per replica", "Output tok/s",
               "Total tok/s", "Output $/Mtok (busy)", "Total $/Mtok (busy)",
               "Output $/Mtok at utilisation", "Total $/Mtok at utilisation"]  # fmt: skip
    simulated = any(c.curve.error_bars for c in report.comparisons)
    if simulated:  # as report.cost: a range from the throughput's error, measured runs empty
        headers += [f"{t} $/Mtok {what}" for t in ("Output", "Total")
                    for what in ("expected error (simulated)", "at utilisation, simulated low",
                                 "at utilisation, simulated high")]  # fmt: skip
    _header(ws, 1, headers)
    rows: dict[tuple[str, str], int] = {}
    r = 2
    for c, cr in zip(report.comparisons, cap_rows, strict=True):
        if not cr or not c.curve.gpu_type:
            continue
        for row in c.cost_rows:
            price = prices.get((row.gpu, row.tier))
            if price is None:
                continue
            xlsx_text(ws.cell(r, 1, c.curve.legend))
            xlsx_text(ws.cell(r, 2, row.gpu))
            xlsx_text(ws.cell(r, 3, row.tier))
            ws.cell(r, 4, f"={price}").number_format = USD
            ws.cell(r, 5, f"=capacity!$C${cr}")
            ws.cell(r, 6, f"=capacity!$F${cr}").number_format = "#,##0.0"
            ws.cell(r, 7, f"=capacity!$G${cr}").number_format = "#,##0.0"
            ws.cell(r, 8, f'=IF(F{r}>0,D{r}*E{r}/(F{r}*3600)*1000000,"")').number_format = USD3
            ws.cell(r, 9, f'=IF(G{r}>0,D{r}*E{r}/(G{r}*3600)*1000000,"")').number_format = USD3
            ws.cell(r, 10, f'=IF(F{r}>0,H{r}/Utilisation,"")').number_format = USD3
            ws.cell(r, 11, f'=IF(G{r}>0,I{r}/Utilisation,"")').number_format = USD3
            if simulated:
                _cost_span(ws, r, c.curve)
            rows[(c.curve.legend, row.tier)] = r
            r += 1
    ws.cell(r + 1, 1, "$/Mtok = $/GPU-hour x GPUs / (tokens/s x 3600) x 1e6; at utilisation: "
            "divided by the Utilisation input (idle hours are paid for too).")  # fmt: skip
    if simulated:
        ws.cell(r + 2, 1, COST_SPAN_NOTE)
    _widths(ws, [40, 12, 26, 12, 10, 12, 12, 14, 14, 16, 16] + [16] * (6 if simulated else 0))
    ws.freeze_panes = "B2"
    return rows


def _cost_span(ws, r: int, curve) -> None:
    """A simulated run's $/Mtok at utilisation within x/÷ (1 + e), e its throughput's expected
    error (bench.cost.cost_error_name; accuracy.bounds as formulas, so the range follows a
    changed price or utilisation); a measured run's cells stay empty."""
    for col, tokens, value in ((12, "output", "J"), (15, "total", "K")):
        error = curve.expected_error(cost_error_name(tokens))
        if error is None:
            continue
        e = get_column_letter(col)
        ws.cell(r, col, error).number_format = "0.0%"
        for offset, op in ((1, "/"), (2, "*")):  # low, high
            formula = f'=IF(ISNUMBER({value}{r}),{value}{r}{op}(1+{e}{r}),"")'
            ws.cell(r, col + offset, formula).number_format = USD3


def _summary_cost(wb: Workbook, report: Report, cost_rows) -> None:
    """Output $/Mtok at utilisation: tiers down, runs across, each cell a link to `cost`."""
    ws = wb.create_sheet("summary_cost")
    runs = [c.curve.legend for c in report.comparisons]
    _header(ws, 1, ["Pricing tier", *runs])
    tiers = list(dict.fromkeys(t for _, t in cost_rows))
    for i, tier in enumerate(tiers, start=2):
        xlsx_text(ws.cell(i, 1, tier))
        for j, run in enumerate(runs, start=2):
            row = cost_rows.get((run, tier))
            cell = ws.cell(i, j, f"=cost!$J${row}" if row else "no tier")
            cell.number_format = USD3
    end = len(tiers) + 2
    ws.cell(end, 1, "Cheapest").font = Font(bold=True)
    for j in range(2, len(runs) + 2):
        col = get_column_letter(j)
        c = ws.cell(end, j, f"=MIN({col}2:{col}{end - 1})")
        c.number_format, c.font = USD3, Font(bold=True)
    ws.cell(end + 2, 1, "$ per million output tokens at each run's capacity, at the "
            "Utilisation input.")  # fmt: skip
    _widths(ws, [28] + [36] * len(runs))
    ws.freeze_panes = "B2"


def _plan(wb: Workbook, report: Report, prices, cap_rows) -> None:
    """GPUs to buy for the demand, nodes, $/month and $/Mtok at the demand, every tier."""
    ws = wb.create_sheet("plan")
    ws["A1"] = "The buying answer, computed from the inputs sheet (demand, prices) and capacity."
    ws["A1"].font = Font(bold=True, size=12)
    _header(ws, 3, ["Run", "GPU", "GPUs per replica", "Requests/s per replica at capacity",
                    "Output tok/s per replica at capacity", "GPUs to buy", "Nodes",
                    "Mean output tok/s at the demand", "Note", "GPUs to buy (range low)",
                    "GPUs to buy (range high)"])  # fmt: skip
    sized: dict[str, int] = {}
    systems = {s.run_id: s for s in (report.plan.systems if report.plan else [])}
    r = 4
    for c, cr in zip(report.comparisons, cap_rows, strict=True):
        xlsx_text(ws.cell(r, 1, c.curve.legend))
        xlsx_text(ws.cell(r, 2, c.curve.gpu_type or ""))
        s = systems.get(c.curve.run_id)
        if not cr or (s is not None and s.gpus is None):
            xlsx_text(
                ws.cell(r, 9, (s.note if s else None) or "no capacity at the SLO: cannot be sized")
            )
            r += 1
            continue
        ws.cell(r, 3, f"=capacity!$C${cr}")
        ws.cell(r, 4, f"=capacity!$H${cr}").number_format = "#,##0.000"
        ws.cell(r, 5, f"=capacity!$F${cr}").number_format = "#,##0.0"
        # Sized for the peak, whole replicas: the demand in requests/s, else output tokens/day.
        _input(ws, r, 6, "=" + _sized(r), "0")
        # The range: the same sizing at the capacity's high end (fewer GPUs) and low end.
        for col, end in ((10, "N"), (11, "M")):
            scale = f"capacity!${end}${cr}/capacity!$J${cr}"
            ws.cell(r, col, f'=IF(N(capacity!${end}${cr})>0,{_sized(r, scale)},"")'
                    ).number_format = "0"  # fmt: skip
        ws.cell(r, 7, f"=CEILING(F{r}/GpusPerNode,1)").number_format = "0"
        mean = (
            f"=IF(ISNUMBER(DemandRps),DemandRps*capacity!$I${cr},"
            f'IF(ISNUMBER(DemandTokensPerDay),DemandTokensPerDay/86400,""))'
        )
        ws.cell(r, 8, mean).number_format = "#,##0.0"
        xlsx_text(ws.cell(r, 9, (s.note if s else None) or ""))
        sized[c.curve.legend] = r
        r += 1
    ws.cell(r, 1, "GPUs to buy is a formula of the demand (blue: type a number over it to "
            "price a fleet of your own size).")  # fmt: skip

    r += 2
    _header(ws, r, ["Run", "GPU", "Tier", "$/GPU-hour", "GPUs", "$/month",
                    "$/Mtok output at the demand", "Cheapest for this run", "$/month (range low)",
                    "$/month (range high)", "$/Mtok at the demand (range low)",
                    "$/Mtok at the demand (range high)"])  # fmt: skip
    first = r + 1
    r = first
    spans: dict[str, tuple[int, int]] = {}
    for c in report.comparisons:
        row_of = sized.get(c.curve.legend)
        if row_of is None or not c.curve.gpu_type:
            continue
        start = r
        for (gpu, tier), price in prices.items():
            if gpu != _gpu_of(report, c):
                continue
            xlsx_text(ws.cell(r, 1, c.curve.legend))
            xlsx_text(ws.cell(r, 2, gpu))
            xlsx_text(ws.cell(r, 3, tier))
            ws.cell(r, 4, f"={price}").number_format = USD
            ws.cell(r, 5, f"=$F${row_of}").number_format = "0"
            ws.cell(r, 6, f"=E{r}*D{r}*HoursPerMonth").number_format = USD0
            ws.cell(r, 7, f'=IF(N($H${row_of})>0,F{r}/($H${row_of}*3600*HoursPerMonth)*1000000,"")'
                    ).number_format = USD3  # fmt: skip
            # what the GPU count's range costs (bench.plan: TierCost.*_range)
            for col, gpus_col in ((9, "J"), (10, "K")):
                count = f"${gpus_col}${row_of}"
                ws.cell(r, col, f'=IF(N({count})>0,{count}*D{r}*HoursPerMonth,"")'
                        ).number_format = USD0  # fmt: skip
                month = ws.cell(r, col).column_letter
                ws.cell(r, col + 2, f'=IF(AND(N({month}{r})>0,N($H${row_of})>0),'
                        f'{month}{r}/($H${row_of}*3600*HoursPerMonth)*1000000,"")'
                        ).number_format = USD3  # fmt: skip
            r += 1
        spans[c.curve.legend] = (start, r - 1)
        for k in range(start, r):
            ws.cell(k, 8, f'=IF(F{k}=MIN($F${start}:$F${r - 1}),"cheapest","")')
    last = r - 1
    r += 1
    ws.cell(r, 1, "Cheapest option ($/month)").font = Font(bold=True)
    if last >= first:
        best = ws.cell(r, 6, f"=MIN(F{first}:F{last})")
        best.number_format, best.font = USD0, Font(bold=True)
        which = f"=INDEX(A{first}:A{last},MATCH(F{r},F{first}:F{last},0))"
        ws.cell(r + 1, 1, "which run")
        ws.cell(r + 1, 6, which)
        ws.cell(r + 2, 1, "on which tier")
        ws.cell(r + 2, 6, f"=INDEX(C{first}:C{last},MATCH(F{r},F{first}:F{last},0))")
    ws.cell(r + 4, 1, "$/month = GPUs x $/GPU-hour x HoursPerMonth, busy or idle; $/Mtok at the "
            "demand = $/month over the output tokens served in a month at the mean demand. "
            "The range columns size the fleet at the two ends of the capacity's range "
            "(capacity sheet), as the plan's text does.")  # fmt: skip
    _widths(ws, [40, 12, 26, 16, 16, 14, 16, 28, 60, 16, 16, 16])


def _sized(r: int, scale: str | None = None) -> str:
    """GPUs to buy on plan row r, as bench.plan sizes them: whole replicas for the peak of the
    demand in requests/s (else output tokens/day) over the capacity per replica, that
    capacity times `scale` (an end of its range over its value) when given."""
    k = f"*{scale}" if scale else ""
    return (
        f"IF(ISNUMBER(DemandRps),CEILING(DemandRps*PeakFactor/(D{r}{k}),1)*C{r},"
        f"IF(ISNUMBER(DemandTokensPerDay),CEILING(DemandTokensPerDay/86400*PeakFactor/(E{r}{k}),1)"
        f"*C{r},C{r}))"
    )


def _gpu_of(report: Report, comp) -> str | None:
    try:
        return report.catalogue.resolve_gpu(comp.curve.gpu_type)
    except Exception:  # noqa: BLE001 - an unknown GPU simply has no prices
        return None


def _energy(wb: Workbook, report: Report, cap_rows) -> None:
    """Electricity per output token at capacity, from power, PUE and the $/kWh input."""
    ws = wb.create_sheet("energy")
    _header(ws, 1, ["Run", "Power per GPU (W)", "Power from", "GPUs per replica", "Output tok/s",
                    "J per output token", "kWh per M output tokens (with PUE)",
                    "Electricity $/Mtok"])  # fmt: skip
    r = 2
    for c, cr in zip(report.comparisons, cap_rows, strict=True):
        if not cr:
            continue
        xlsx_text(ws.cell(r, 1, c.curve.legend))
        ws.cell(r, 2, f"=capacity!$K${cr}").number_format = "#,##0"
        ws.cell(r, 3, f"=capacity!$L${cr}")
        ws.cell(r, 4, f"=capacity!$C${cr}")
        ws.cell(r, 5, f"=capacity!$F${cr}").number_format = "#,##0.0"
        ws.cell(r, 6, f'=IF(AND(N(B{r})>0,E{r}>0),B{r}*D{r}/E{r},"")').number_format = "0.000"
        ws.cell(r, 7, f'=IF(F{r}<>"",F{r}*FacilityPUE*1000000/3600000,"")').number_format = "0.000"
        ws.cell(r, 8, f'=IF(G{r}<>"",G{r}*UsdPerKwh,"")').number_format = '"$"0.0000'
        r += 1
    ws.cell(r + 1, 1, "Electricity only (the GPU-hour prices already include it for rented "
            "tiers); power is measured when GPU telemetry was recorded, else the GPU's TDP.")  # fmt: skip
    _widths(ws, [40, 14, 26, 10, 12, 14, 18, 16])


# ---------------------------------------------------------------- the workbook


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
        if report.sim_error.rows:
            about.append([f"Each simulated figure's expected error and near-saturation flag: "
                          f"sheet {report.sim_error.name} (its note says where the error "
                          "comes from)"])  # fmt: skip
    about.append([])
    about.append([report.sentence or "No ratio between GPUs (see 'missing')."])
    about.cell(about.max_row, 1).font = Font(bold=True)
    if report.plan is not None:
        about.append([report.plan.sentence + " (as exported; the plan sheet recomputes it "
                      "from the inputs)"])  # fmt: skip
    about.append([])
    about.append(["How to use: change the blue cells on 'inputs' (prices, utilisation, "
                  "electricity, demand, GPU counts); cost, summary_cost, plan and energy "
                  "follow. The other sheets are the measured data."])  # fmt: skip
    about.append([])
    about.append(["Sheets:"])
    sheets = [("inputs", "Inputs: prices per tier, utilisation, electricity, demand"),
              ("capacity", "Measured at each run's capacity at the SLO"),
              ("cost", "$/Mtok per tier at capacity (formulas)"),
              ("summary_cost", "$/Mtok output at capacity, tiers x runs (formulas)"),
              ("plan", "GPUs, nodes, $/month and $/Mtok for the demand (formulas)"),
              ("energy", "Electricity per output token (formulas)")]  # fmt: skip
    sheets += [(t.name, t.title) for t in report.tables if t.name not in REPLACED]
    for name, title in sheets:
        about.append([name, title])
    about.column_dimensions["A"].width = 24
    about.column_dimensions["B"].width = 60
    prices = _inputs(wb, report)
    cap_rows = _capacity(wb, report)
    cost_rows = _cost(wb, report, prices, cap_rows)
    _summary_cost(wb, report, cost_rows)
    _plan(wb, report, prices, cap_rows)
    _energy(wb, report, cap_rows)
    for table in report.tables:
        if table.name not in REPLACED:
            _sheet(wb, table, ON_INPUTS if table.name == "assumptions" else frozenset())
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    wb.save(out)
    return out
