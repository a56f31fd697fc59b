"""The one data object every export format renders from.

`build_report` reads the chosen runs once, through bench.curves (the same functions the
CLI's `compare` and the dashboard call), and turns them into tables of cells and charts of
series. The PowerPoint, Excel, CSV, HTML and image writers only lay these out; none of them
computes a number, so a figure on a slide is the figure in the spreadsheet and the report.

Cells keep their raw value (a `Num`) next to how it is shown (rounding, "$" prefix), so
Excel gets real numbers with a number format and CSV gets full precision, while slides and
HTML show the rounded text. What a report cannot show (no GPU type, so no $/Mtok; no SLO,
so capacity is peak throughput; no point met the SLO) is collected in `Report.missing` and
shown on the summary, instead of failing the export.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import yaml

from bench.choose import SettingsRanking, rank_settings
from bench.cost import (
    Catalogue,
    PriceCatalogueError,
    cost_error_name,
    load_catalogue,
    price_decimals,
    price_per_gpu_hour,
)
from bench.curves import (
    CurvePoint,
    RunComparison,
    RunCurve,
    class_rows,
    compare_runs,
    latency_curve,
    ratio_sentence,
    resolve_slo,
    run_curves,
    with_range,
)
from bench.metrics import LATENCY_METRICS, Threshold
from bench.plan import Demand, Plan, default_demand, gpus_text, plan_capacity
from bench.sim.profiles.accuracy import COVERAGE, NEAR_SATURATION

# --------------------------------------------------------------------------- data model


@dataclass(frozen=True)
class Num:
    """A number with its display rounding; `value` None shows as an em dash."""

    value: float | None
    decimals: int = 0
    prefix: str = ""  # "$"
    suffix: str = ""  # "%"
    # a simulated figure's [low, high] (accuracy.bounds): text tables (slides, HTML) show it
    # beside the value; Excel and CSV keep the bare value (their tables carry low/high columns)
    span: tuple[float, float] | None = None

    def text(self) -> str:
        if self.value is None or (isinstance(self.value, float) and not math.isfinite(self.value)):
            return "—"
        return with_range(self.value, self.span, self._fmt)

    def _fmt(self, v: float) -> str:
        return f"{self.prefix}{v:,.{self.decimals}f}{self.suffix}"


Cell = str | Num | None


def cell_text(cell: Cell) -> str:
    """How a cell reads on a slide or in HTML."""
    if cell is None:
        return "—"
    return cell.text() if isinstance(cell, Num) else str(cell)


def cell_value(cell: Cell) -> Any:
    """The raw value of a cell, for Excel and CSV (numbers unrounded)."""
    if isinstance(cell, Num):
        return cell.value
    return cell


@dataclass
class Table:
    """One table: a sheet in Excel, a CSV file, slides in the deck, a table in HTML."""

    name: str  # file/sheet name: summary, cost, percentiles, ...
    title: str
    headers: list[str]  # units go in headers (or row labels of a transposed table)
    rows: list[list[Cell]]
    note: str | None = None
    empty_text: str = "Nothing to list."  # shown instead of a table without rows

    def text_rows(self) -> list[list[str]]:
        return [[cell_text(c) for c in row] for row in self.rows]


@dataclass
class Series:
    name: str  # the run's legend (carries "(simulated)"), or the SLO line's name
    colour: str
    x: list[float]
    y: list[float | None]
    labels: list[str] = field(default_factory=list)  # load point titles
    reference: bool = False  # an SLO limit line, drawn dashed without markers
    simulated: bool = False  # drawn dotted, as the dashboard does
    marker_only: bool = False  # a capacity point (or other mark): a marker, no line
    style_index: int = 0  # the run's place: its marker and dash (dashboards.figures.run_styles)
    # a simulated run's relative expected error on x and y (RunCurve.expected_error): drawn as
    # error bars, value x/÷ (1 + e); None on measured runs
    x_error: float | None = None
    y_error: float | None = None


@dataclass
class Chart:
    """A chart as data: native in PowerPoint, plotly in HTML/PNG/SVG."""

    key: str  # file name of its image: tput_vs_p99_ttft, ...
    title: str
    kind: Literal["xy", "bar"]
    x_title: str
    y_title: str
    series: list[Series]
    categories: list[str] = field(default_factory=list)  # bar charts: the x categories
    note: str | None = None  # e.g. runs left out and why
    log_x: bool = False  # values span more than 20x: a logarithmic axis
    log_y: bool = False
    alt_text: str = ""  # what the chart shows, in words, for a screen reader (deck alt text)

    @property
    def empty(self) -> bool:
        return not any(any(v is not None for v in s.y) for s in self.series if not s.reference)


@dataclass
class RunFacts:
    """What the assumptions slide says about one run (from bench.store.RunInfo)."""

    run_id: str
    legend: str
    gpu_type: str | None
    gpu_count: int
    model: str | None
    provenance: str  # "simulated", "measured", "imported (vllm)"
    software: str
    scenario: str
    status: str
    created: str


@dataclass
class Report:
    title: str
    subtitle: str
    generated_at: str
    curves: list[RunCurve]
    comparisons: list[RunComparison]
    runs: list[RunFacts]
    slo: list[Threshold]
    slo_source: str  # "given", "stored with the runs", "none"
    utilisation: float
    catalogue: Catalogue
    sentence: str | None
    missing: list[str]
    summary: Table
    summary_cost: Table
    cost: Table
    percentiles: Table
    load_points: Table
    prices: Table
    energy: Table
    runs_table: Table
    assumptions: Table
    methodology: Table
    charts: list[Chart]
    # The buying answer (bench.plan.Plan; its docstring gives the shape): GPUs, nodes,
    # $/month and $/Mtok per tier for each run, the cheapest option meeting the SLO and the
    # assumptions. None when no demand was given and the runs' scenario has no mean rate.
    plan: Plan | None = None
    # Why a figure might be wrong, one line each: capacity bounds, thin tails, misses within
    # their interval, interrupted points, a late simulated endpoint, simulated results,
    # pricing tiers that differ between GPUs, systems the plan cannot size.
    caveats: list[str] = field(default_factory=list)
    tier_note: str | None = None  # which tiers some GPUs lack, when they differ
    # An experiment's settings ranked (bench.choose) when the runs are its settings
    # (`tokenbench tune`, `sim tune`); None otherwise.
    ranking: SettingsRanking | None = None

    @property
    def ranking_table(self) -> Table:
        r = self.ranking
        name = f" of {r.experiment}" if r and r.experiment else ""
        return Table(
            "settings",
            f"Settings{name} ranked by {r.basis if r else 'capacity'}",
            list(SettingsRanking.HEADERS),
            [list(row) for row in r.rows()] if r else [],
            note=r.verdict if r else None,
        )

    # Prompt tokens served from cache per load point: intended, simulated or measured, counters
    prompt_cache: Table = field(default_factory=lambda: _prompt_cache_table([]))
    # Each traffic class at each load point, for runs that mixed classes (bench.curves.ClassRow)
    classes: Table = field(default_factory=lambda: _classes_table([], []))
    # Each simulated point's figures with their expected error and near-saturation flag;
    # no rows (and no sheet, slide or file) when every run was measured
    sim_error: Table = field(default_factory=lambda: _sim_error_table([]))

    @property
    def plan_table(self) -> Table:
        """The buying answer per system (GPUs, nodes, cheapest tier, $/month): the answer
        slide, the HTML report, the CSV files and the workbook's values all lay this out."""
        return _plan_table(self.plan)

    @property
    def any_simulated(self) -> bool:
        return any(c.simulated for c in self.curves)

    @property
    def tables(self) -> list[Table]:
        """Every table, in the order Excel sheets and CSV files use."""
        ranking = [self.ranking_table] if self.ranking is not None else []
        return [
            self.plan_table,
            *ranking,
            self.summary,
            self.summary_cost,
            self.cost,
            self.percentiles,
            self.load_points,
            *([self.sim_error] if self.sim_error.rows else []),
            self.prompt_cache,
            *([self.classes] if self.classes.rows else []),
            self.prices,
            self.energy,
            self.runs_table,
            self.assumptions,
            self.methodology,
            self.missing_table,
        ]

    @property
    def missing_table(self) -> Table:
        rows: list[list[Cell]] = [[m] for m in self.missing] or [["nothing missing"]]
        return Table("missing", "What this report could not show", ["What is missing"], rows)

    def chart(self, key: str) -> Chart:
        return next(c for c in self.charts if c.key == key)


# --------------------------------------------------------------------------- methodology

# Short forms of the definitions in bench/metrics.py and DESIGN.md ("Definitions").
METHODOLOGY: tuple[tuple[str, str], ...] = (
    (
        "TTFT (ms)",
        "Time to first token: arrival of the first content token minus the actual send time "
        "(as vLLM's `vllm bench serve`).",
    ),
    (
        "TPOT (ms)",
        "Time per output token: (E2EL - TTFT) / (output tokens - 1), per request; requests "
        "with one output token have none.",
    ),
    ("ITL (ms)", "Inter-token latency: the gaps between successive streamed content chunks."),
    ("E2EL (ms)", "End-to-end latency: last byte minus the actual send time."),
    (
        "P50 / P90 / P99",
        "Percentiles over the requests of one load point (warm-up and cool-down excluded).",
    ),
    (
        "Throughput per GPU (tok/s)",
        "Output (or input + output) tokens completed per second of the load point, divided "
        "by the number of GPUs serving.",
    ),
    ("Interactivity (tok/s per user)", "1000 / median TPOT in ms: the speed one user sees."),
    (
        "Capacity at the SLO",
        "The highest load meeting every SLO threshold: where a monotone fit of each SLO "
        "metric against load (over every measurement: grid, search, fresh prompt draws, "
        "longer points) crosses its limit, interpolated between the two loads around it, on "
        "the metric that crosses first; never below a load that passed every time with "
        "nothing failing beneath it; 'at least' when every load met it (a lower bound), "
        "'below' when none did. Its range is the hull of named parts, each shown with its "
        "span: the bracket between the two loads, the percentiles' 95% intervals, fresh "
        "draws and points twice as long at those loads, and for simulated runs the "
        "simulator's held-out error. Without an SLO, the peak-throughput point.",
    ),
    (
        "95% interval of a percentile",
        "Distribution-free: between two order statistics chosen from the binomial "
        "distribution of the samples below the true percentile. 'open' where the samples "
        "cannot bound it (a P99 from fewer than ~300 requests has no upper end); a P99 from "
        "fewer than 100 requests is flagged as thin.",
    ),
    (
        "$/Mtok",
        "(price per GPU-hour x GPUs) / (tokens per second x 3600) x 1e6, divided by the "
        "fleet utilisation (idle hours are paid for too).",
    ),
    (
        "Simulated",
        "Results from tokenbench's simulated endpoint (a roofline model of the GPU serving "
        "a vLLM-like engine), not from hardware.",
    ),
)

# --------------------------------------------------------------------------- building


def _provenance(curve: RunCurve) -> str:
    if curve.simulated:
        return "simulated"
    if curve.imported_from:
        return f"imported ({curve.imported_from})"
    return "measured"


def _scenario_text(text: str | None) -> str:
    if not text:
        return "not stored"
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return "stored, unreadable"
    if not isinstance(data, dict):
        return "stored, unreadable"
    name, desc = data.get("name"), data.get("description")
    return ": ".join(str(s) for s in (name, desc) if s) or "unnamed scenario"


def _software(info) -> str:
    parts = [f"backend {info.backend}" if info.backend else "backend not recorded"]
    if info.simulated:
        parts.append("tokenbench simulated endpoint")
    elif info.endpoint:
        parts.append(f"endpoint {info.endpoint}")
    if info.imported_from:
        parts.append(f"imported from {info.imported_from}")
    parts.append(f"tokenbench {info.tool_version or '?'}")
    return ", ".join(parts)


def _capacity_label(c: RunComparison) -> str:
    if c.capacity is None:
        return "no load point met the SLO" if c.basis == "SLO capacity" else "no load points"
    return c.capacity.title


def _tiers(comparisons: Sequence[RunComparison]) -> list[str]:
    tiers: list[str] = []
    for c in comparisons:
        tiers += [r.tier for r in c.cost_rows if r.tier not in tiers]
    return tiers


def _summary_table(comparisons, slo, utilisation) -> Table:
    headers = [""] + [c.curve.legend for c in comparisons]
    rows: list[list[Cell]] = []

    def row(label: str, fn) -> None:
        rows.append([label] + [fn(c) for c in comparisons])

    def at_cap(fn, decimals: int, name: str | None = None):
        """A figure at capacity; `name` (its Summary.value name) gives a simulated run's
        expected range beside it (RunCurve.expected_span)."""

        def cell(c):
            if c.capacity is None:
                return None
            v = fn(c, c.capacity)
            return Num(v, decimals, span=c.curve.expected_span(name, v) if name else None)

        return cell

    row("GPU", lambda c: f"{c.curve.gpu_type or 'unknown GPU'} x{c.curve.gpu_count}")
    row("Measured or simulated", lambda c: _provenance(c.curve))
    row("Basis", lambda c: c.basis)
    row("Capacity", lambda c: c.at_slo.text() if c.at_slo else "—")
    row("Load point at capacity", _capacity_label)
    row("Output tok/s per GPU", at_cap(lambda c, p: p.output_tps_per_gpu, 0))
    row("Capacity range low (tok/s per GPU)", lambda c: Num(c.at_slo.low if c.at_slo else None, 0))
    row(
        "Capacity range high (tok/s per GPU)", lambda c: Num(c.at_slo.high if c.at_slo else None, 0)
    )
    row(
        "Last load meeting the SLO",
        lambda c: c.at_slo.last_pass.title if c.at_slo and c.at_slo.last_pass else "—",
    )
    row(
        "First load breaking it",
        lambda c: c.at_slo.first_fail.title if c.at_slo and c.at_slo.first_fail else "—",
    )
    row("Decided by", lambda c: (c.at_slo.deciding or "—") if c.at_slo else "—")
    row("Requests/s per GPU", at_cap(lambda c, p: p.requests_per_s / c.curve.gpu_count, 2))
    row("P99 TTFT (ms)", at_cap(lambda c, p: p.latency("ttft"), 0, "p99_ttft_ms"))
    row("P99 TPOT (ms)", at_cap(lambda c, p: p.latency("tpot"), 1, "p99_tpot_ms"))
    # 1000 / TPOT p50: x/÷ (1 + e) is the same range inverted
    row("Interactivity (tok/s per user)", at_cap(lambda c, p: p.interactivity, 1, "p50_tpot_ms"))
    note = "SLO " + ", ".join(str(t) for t in slo) if slo else "No SLO: peak throughput"
    if any(c.curve.error_bars for c in comparisons):
        note += "; a simulated run's P99s and interactivity carry its expected range in brackets"
    return Table("summary", "Capacity at the SLO", headers, rows, note)


def _summary_cost_table(comparisons, utilisation) -> Table:
    """$/Mtok of output tokens at each run's capacity point: tiers down, runs across."""
    headers = ["Pricing tier"] + [c.curve.legend for c in comparisons]
    rows: list[list[Cell]] = []
    for tier in _tiers(comparisons):
        cells: list[Cell] = [tier]
        for c in comparisons:
            r = next((r for r in c.cost_rows if r.tier == tier), None)
            usd = r.output_usd_per_mtok_at_utilisation if r else None
            span = cost_span(c.curve, "output", usd)
            cells.append(Num(usd, 3, prefix="$", span=span) if r else "no tier")
        rows.append(cells)
    simulated = any(c.curve.error_bars for c in comparisons)
    return Table(
        "summary_cost",
        "$/Mtok output at capacity",
        headers,
        rows,
        f"$ per million output tokens at {utilisation:.0%} utilisation"
        + ("; a simulated run's range in brackets (its throughput's expected error)"
           if simulated else ""),
    )  # fmt: skip


COST_SPAN_NOTE = (
    "A simulated run's $/Mtok is price / simulated throughput, so it carries the throughput's "
    "expected error: it lies within $/Mtok x/÷ (1 + error), the simulated low and high columns "
    "(total tokens/s: the largest of the run's errors). Measured runs leave them empty."
)


def cost_span(curve: RunCurve, tokens: Literal["output", "total"], usd_per_mtok: float | None):
    """[low, high] of a $/Mtok of `tokens` on a simulated run: its throughput's expected error
    (bench.cost.cost_error_name says why), x/÷ (1 + e) by accuracy.bounds; None on a measured
    run or a missing value."""
    return curve.expected_span(cost_error_name(tokens), usd_per_mtok)


def _cost_span_cells(curve: RunCurve, row) -> list[Cell]:
    """Low and high of a cost row's output and total $/Mtok at utilisation (`cost_span`);
    empty cells on a measured run."""
    cells: list[Cell] = []
    for tokens, value in (("output", row.output_usd_per_mtok_at_utilisation),
                          ("total", row.total_usd_per_mtok_at_utilisation)):  # fmt: skip
        lo, hi = cost_span(curve, tokens, value) or (None, None)
        cells += [Num(lo, 3, prefix="$"), Num(hi, 3, prefix="$")]
    return cells


def _cost_table(comparisons, utilisation) -> Table:
    """$/Mtok per run and tier at capacity. When a run is simulated, low and high columns give
    the at-utilisation figures' range from its throughput's expected error (`cost_span`),
    empty on measured runs; a report of measured runs alone has no such columns."""
    simulated = any(c.curve.error_bars for c in comparisons)
    at = f"at {utilisation:.0%} utilisation"
    spans = [f"{t} $/Mtok {at}, simulated {end}" for t in ("Output", "Total")
             for end in ("low", "high")] if simulated else []  # fmt: skip
    headers = [
        "Run",
        "GPU",
        "GPUs",
        "Tier",
        "Kind",
        "Provider",
        "$/GPU-hr",
        "Output $/Mtok (busy)",
        "Total $/Mtok (busy)",
        f"Output $/Mtok at {utilisation:.0%} utilisation",
        f"Total $/Mtok at {utilisation:.0%} utilisation",
        *spans,
        "Note",
    ]
    rows: list[list[Cell]] = []
    for c in comparisons:
        for r in c.cost_rows:
            rows.append(
                [
                    c.curve.legend,
                    r.gpu,
                    Num(r.gpus, 0),
                    r.tier,
                    r.kind,
                    r.provider,
                    Num(r.price_usd_per_gpu_hr, price_decimals(r.price_usd_per_gpu_hr), prefix="$"),
                    Num(r.output_usd_per_mtok, 3, prefix="$"),
                    Num(r.total_usd_per_mtok, 3, prefix="$"),
                    Num(r.output_usd_per_mtok_at_utilisation, 3, prefix="$"),
                    Num(r.total_usd_per_mtok_at_utilisation, 3, prefix="$"),
                    *(_cost_span_cells(c.curve, r) if simulated else []),
                    r.note or "",
                ]
            )
    return Table(
        "cost",
        "$/Mtok per pricing tier at capacity",
        headers,
        rows,
        note=COST_SPAN_NOTE if simulated else None,
        empty_text="No $/Mtok: no run has both a priced GPU type and a capacity point.",
    )


def _meets(point: CurvePoint, slo) -> str:
    if not slo:
        return "no SLO"
    return "yes" if point.meets(slo) else "no"


def _ci_cell(p: CurvePoint, metric: str, decimals: int) -> str:
    """'81-96' (95% interval of the P99), 'open' at an end the data cannot bound."""
    ci = p.ci(metric, "p99")
    if ci is None:
        return "—"
    lo, hi = (("open" if v is None else f"{v:,.{decimals}f}") for v in ci)
    return f"{lo}-{hi}"


def _percentile_table(curves, slo) -> Table:
    from bench.metrics import THIN_SAMPLES

    headers = [
        "Run",
        "Load point",
        "Requests (n)",
        "Output tok/s per GPU",
        "Req/s per GPU",
        "TTFT P50 (ms)",
        "TTFT P99 (ms)",
        "TTFT P99 95% CI",
        "TPOT P50 (ms)",
        "TPOT P99 (ms)",
        "TPOT P99 95% CI",
        "ITL P99 (ms)",
        "E2EL P99 (ms)",
        "Meets SLO",
    ]
    rows: list[list[Cell]] = []
    thin = False
    for curve in curves:
        for p in curve.points:
            n = p.count("ttft")
            thin = thin or (n is not None and n < THIN_SAMPLES)
            rows.append(
                [
                    curve.legend,
                    p.title + (" (interrupted)" if p.partial else ""),
                    Num(n, 0, suffix=" (thin)" if n is not None and n < THIN_SAMPLES else ""),
                    Num(p.output_tps_per_gpu, 0),
                    Num(p.requests_per_s / curve.gpu_count, 2),
                    Num(p.latency("ttft", "p50"), 0),
                    Num(p.latency("ttft", "p99"), 0),
                    _ci_cell(p, "ttft", 0),
                    Num(p.latency("tpot", "p50"), 1),
                    Num(p.latency("tpot", "p99"), 1),
                    _ci_cell(p, "tpot", 1),
                    Num(p.latency("itl", "p99"), 1),
                    Num(p.latency("e2el", "p99"), 0),
                    _meets(p, slo),
                ]
            )
    note = (
        "95% CI: distribution-free (order-statistic) interval of the P99; 'open' where the "
        "requests cannot bound it."
        + (
            f" (thin): fewer than {THIN_SAMPLES} requests, the P99 is one of the slowest few."
            if thin
            else ""
        )  # fmt: skip
    )
    return Table("percentiles", "Latency percentiles per load point", headers, rows, note)


def _load_point_table(curves, slo) -> Table:
    stats: list[str] = []
    for curve in curves:
        for p in curve.points:
            for m in LATENCY_METRICS:
                stats += [s for s in p.metrics.get(f"{m}_ms", {}) if s not in stats]
    headers = [
        "Run id",
        "Run",
        "GPU",
        "GPUs",
        "Measured or simulated",
        "Load point",
        "Title",
        "Offered (req/s or concurrency)",
        "Completed",
        "Failed",
        "Error rate",
        "Req/s",
        "Output tok/s",
        "Total tok/s",
        "Output tok/s per GPU",
        "Total tok/s per GPU",
        "Goodput req/s",
        "Interactivity (tok/s per user)",
        "Meets SLO",
        "Partial (interrupted)",
        "Simulated endpoint late by (ms)",
    ] + [f"{m.upper()} {s} (ms)" for m in LATENCY_METRICS for s in stats]
    headers += [f"{m.upper()} samples" for m in LATENCY_METRICS]
    headers += [
        f"{m.upper()} {s} 95% {end} (ms)"
        for m in LATENCY_METRICS
        for s in stats
        if s.startswith("p")
        for end in ("low", "high")
    ]
    rows: list[list[Cell]] = []
    for curve in curves:
        for p in curve.points:
            rows.append(
                [
                    curve.run_id,
                    curve.legend,
                    curve.gpu_type or "",
                    Num(curve.gpu_count, 0),
                    _provenance(curve),
                    Num(p.load_point + 1, 0),
                    p.title,
                    Num(p.offered, 2),
                    Num(p.completed, 0),
                    Num(p.failed, 0),
                    Num(p.error_rate * 100, 2, suffix="%"),
                    Num(p.requests_per_s, 3),
                    Num(p.output_tps, 1),
                    Num(p.total_tps, 1),
                    Num(p.output_tps_per_gpu, 1),
                    Num(p.total_tps_per_gpu, 1),
                    Num(p.goodput_requests_per_s, 3),
                    Num(p.interactivity, 2),
                    _meets(p, slo),
                    "yes" if p.partial else "no",
                    Num(p.late_ms, 1),
                ]
                + [
                    Num(p.metrics.get(f"{m}_ms", {}).get(s), 2)
                    for m in LATENCY_METRICS
                    for s in stats
                ]
                + [Num(p.count(m), 0) for m in LATENCY_METRICS]
                + [
                    Num((p.ci(m, s) or (None, None))[end], 2)
                    for m in LATENCY_METRICS
                    for s in stats
                    if s.startswith("p")
                    for end in (0, 1)
                ]
            )
    return Table("load_points", "Raw load points", headers, rows)


def _prompt_cache_table(curves) -> Table:
    """Intended, simulated and measured prefix-cache hit rates side by side (issue 29)."""
    headers = [
        "Run id", "Run", "GPU", "Measured or simulated", "Load point", "Title",
        "Intended (trace, infinite cache)", "Served from cache (responses)",
        "Server counters", "Cached prompt tokens", "Prompt tokens",
    ]  # fmt: skip
    rows: list[list[Cell]] = []
    for curve in curves:
        for p in curve.points:
            if not p.prompt_cache:
                continue
            usage = p.prompt_cache.get("usage") or {}
            rows.append([
                curve.run_id, curve.legend, curve.gpu_type or "", _provenance(curve),
                Num(p.load_point + 1, 0), p.title,
                *(Num(None if (v := p.cache_share(k)) is None else v * 100, 1, suffix="%")
                  for k in ("intended", "usage", "server")),
                Num(usage.get("cached_tokens"), 0), Num(usage.get("prompt_tokens"), 0),
            ])  # fmt: skip
    return Table(
        "prompt_cache",
        "Prompt cache: intended, simulated and measured hit rates",
        headers,
        rows,
        note="Share of prompt tokens served from the prefix cache. Intended: what the "
        "replayed trace implies with a cache that keeps every block. Responses: "
        "usage.prompt_tokens_details.cached_tokens, the simulator's own cache on simulated "
        "runs, the server's on measured ones. Server counters: its /metrics.",
        empty_text="No run reported prompt-cache figures.",
    )


def _classes_table(curves, slo) -> Table:
    """Each traffic class at each load point of the runs that mixed classes: its requests,
    P99s, whether it meets its own SLO (CLASS:NAME thresholds) and its cache hit rates."""
    headers = [
        "Run id", "Run", "GPU", "Measured or simulated", "Load point", "Title", "Class",
        "Completed", "Failed", "Req/s", "Output tok/s", "TTFT p99 (ms)", "TPOT p99 (ms)",
        "Meets its own SLO", "Cache hit intended", "Cache hit served (responses)",
        "Cache hit server counters",
    ]  # fmt: skip
    rows: list[list[Cell]] = []
    for curve in curves:
        for r in class_rows(curve, slo):
            f = r.figures
            rows.append([
                curve.run_id, curve.legend, curve.gpu_type or "", _provenance(curve),
                Num(r.point.load_point + 1, 0), r.point.title, r.name,
                Num(f.completed, 0), Num(f.failed, 0), Num(f.requests_per_s, 2),
                Num(f.output_tps, 1), Num(f.latency("ttft", "p99"), 1),
                Num(f.latency("tpot", "p99"), 2),
                "—" if r.meets is None else "yes" if r.meets else "no",
                *(Num(None if (v := f.cache_share(k)) is None else v * 100, 1, suffix="%")
                  for k in ("intended", "usage", "server")),
            ])  # fmt: skip
    return Table(
        "classes",
        "Traffic classes: each class's own figures per load point",
        headers,
        rows,
        note="Each class is judged against its own SLO (CLASS:NAME thresholds of the report's "
        "SLO); the class that breaks first binds the capacity. Cache hit: share of the "
        "class's prompt tokens from the prefix cache; intended = what its prompts imply "
        "with a cache keeping every block; server counters only when the class alone sent "
        "the point's requests.",
        empty_text="No run mixed traffic classes.",
    )


# The figures of a simulated point the report gives with their expected error: (header,
# CurvePoint.value name, decimals); the error is RunCurve.expected_error of the same name.
SIM_ERROR_FIGURES = (
    ("Output tok/s/GPU", "output_tokens_per_s", 0),
    ("TTFT p50 (ms)", "p50_ttft_ms", 1),
    ("TTFT p99 (ms)", "p99_ttft_ms", 1),
    ("TPOT p50 (ms)", "p50_tpot_ms", 2),
    ("TPOT p99 (ms)", "p99_tpot_ms", 2),
)


def _sim_error_table(curves) -> Table:
    """Every simulated point's figures beside their expected error (bench.curves.
    run_error_bars: what `sim run` printed), its utilisation of the simulated maximum request
    rate and the near-saturation flag (issue 26). Measured runs have no row."""
    headers = ["Run id", "Run", "GPU", "Load point", "Title"]
    for label, _, _ in SIM_ERROR_FIGURES:
        headers += [label, f"{label.split(' (')[0]} expected error"]
    headers += ["Utilisation of simulated maximum", "Near saturation", "Where the error comes from"]
    rows: list[list[Cell]] = []
    for curve in curves:
        if not curve.error_bars:
            continue
        for p in sorted(curve.points, key=lambda q: q.load_point):
            row: list[Cell] = [curve.run_id, curve.legend, curve.gpu_type or "",
                               Num(p.load_point + 1, 0), p.title]  # fmt: skip
            for _, name, decimals in SIM_ERROR_FIGURES:
                value = p.output_tps_per_gpu if name == "output_tokens_per_s" else p.value(name)
                err = curve.expected_error(name)
                row += [
                    Num(value, decimals),
                    Num(None if err is None else round(err * 100, 3), 0, "±", "%"),
                ]
            bars = p.error_bars or {}
            util = bars.get("utilisation")
            row += [
                "unbounded rate"
                if util is not None and math.isinf(util)
                else Num(None if util is None else util * 100, 0, suffix="%"),
                "near saturation" if bars.get("near_saturation") else "no",
                f"simulated: {curve.error_bars['basis']}",
            ]
            rows.append(row)
    return Table(
        "sim_error",
        "Simulated figures: expected error and saturation",
        headers,
        rows,
        note="A simulated figure is a prediction: its expected error is the error that "
        f"{COVERAGE:.0%} of the published points held out of the simulator's fit were within, "
        "for the run's category (dense, MoE, AMD; a TTFT's at least that of the independent "
        "TTFT checks), or, for a run simulated with a calibration profile, the profile's own "
        "error per quantity; the value lies within x/÷ (1 + error). A point at "
        f"{NEAR_SATURATION:.0%} or more of the simulated maximum request rate is near "
        "saturation: its latency can be off by far more than the stated error. Measured runs "
        "carry no expected error and are not listed.",
        empty_text="No simulated runs: every figure is measured.",
    )


def _prices_table(curves, catalogue: Catalogue) -> Table:
    headers = ["GPU", "Tier", "Kind", "Provider", "$/GPU-hr", "Source", "Date"]
    rows: list[list[Cell]] = []
    seen: set[str] = set()
    for curve in curves:
        if not curve.gpu_type:
            continue
        try:
            gpu = catalogue.resolve_gpu(curve.gpu_type)
        except PriceCatalogueError:
            continue
        if gpu in seen:
            continue
        seen.add(gpu)
        for tier in catalogue.tiers(gpu):
            try:
                price: float | None = price_per_gpu_hour(tier, catalogue)
            except PriceCatalogueError:
                price = None
            rows.append(
                [
                    gpu,
                    tier.name,
                    tier.kind,
                    tier.provider,
                    Num(price, price_decimals(price), prefix="$"),
                    tier.source,
                    tier.date,
                ]
            )
    return Table(
        "prices",
        "Prices used (every tier, with source and date)",
        headers,
        rows,
        empty_text="No prices used: no run has a GPU type that the pricing catalogue lists.",
    )


def _energy_table(comparisons, db, catalogue: Catalogue) -> Table:
    """Energy per output token at each run's basis point: measured GPU power when the run's
    telemetry recorded it (bench.telemetry), else the GPU profile's TDP, and said which."""
    from bench.cost import PriceCatalogueError, energy_estimate
    from bench.telemetry import energy_per_output_token

    headers = ["Run", "Load point", "Power per GPU (W)", "Power from", "J per output token",
               "kWh per M output tokens", "Electricity $/Mtok"]  # fmt: skip
    rows: list[list[Cell]] = []
    for c in comparisons:
        point, curve = c.capacity, c.curve
        if point is None or not curve.gpu_type:
            continue
        measured = energy_per_output_token(curve.run_id, db, catalogue)
        match = measured[measured["load_point"] == point.load_point] if len(measured) else measured
        if len(match):
            m = match.iloc[0]
            power, source = float(m["mean_power_w_per_gpu"]), "measured (GPU telemetry)"
            j, kwh, usd = m["joules_per_output_token"], m["kwh_per_mtok"], m["energy_usd_per_mtok"]
        else:
            try:
                e = energy_estimate(curve.gpu_type, curve.gpu_count, point.output_tps, catalogue)
            except PriceCatalogueError:
                continue
            power, source = e.power_w, "GPU profile TDP (assumed)"
            j, kwh, usd = e.joules_per_token, e.kwh_per_mtok, e.energy_usd_per_mtok
        rows.append([curve.legend, point.title, Num(power, 0), source, Num(j, 3), Num(kwh, 3),
                     Num(usd, 4, prefix="$")])  # fmt: skip
    return Table(
        "energy",
        "Energy per output token at capacity",
        headers,
        rows,
        "Electricity at the catalogue's $/kWh and PUE (tco_defaults); measured power replaces "
        "TDP where GPU telemetry (DCGM or NVML) was recorded.",
        empty_text="No run has a GPU type and a capacity point, so energy is not shown.",
    )


def _runs_table(facts: Sequence[RunFacts]) -> Table:
    headers = [
        "Run",
        "Run id",
        "GPU",
        "GPUs",
        "Model",
        "Measured or simulated",
        "Software under test",
        "Scenario",
        "Status",
        "Created (UTC)",
    ]
    rows: list[list[Cell]] = [
        [
            f.legend,
            f.run_id[:8],
            f.gpu_type or "not recorded",
            Num(f.gpu_count, 0),
            f.model or "not recorded",
            f.provenance,
            f.software,
            f.scenario,
            f.status,
            f.created,
        ]
        for f in facts
    ]
    return Table("runs", "Runs, GPUs and software under test", headers, rows)


def _assumptions_table(
    report_slo, slo_source, utilisation, catalogue_label, facts, catalogue=None
) -> Table:
    if report_slo:
        slo_text = ", ".join(str(t) for t in report_slo) + f" ({slo_source})"
    else:
        slo_text = "none given: capacity is each run's peak-throughput load point"
    scenarios = sorted({f.scenario for f in facts})
    rows: list[list[Cell]] = [
        ["SLO", slo_text],
        ["Fleet utilisation", f"{utilisation:.0%} ($/Mtok divided by it)"],
        ["Pricing catalogue", catalogue_label],
        *_energy_assumptions(catalogue),
        ["Scenario", "; ".join(scenarios) or "not stored"],
        [
            "GPUs and counts",
            "; ".join(f"{f.gpu_type or 'GPU type not recorded'} x{f.gpu_count}" for f in facts),
        ],
        ["Measured or simulated", "; ".join(f"{f.legend}: {f.provenance}" for f in facts)],
        ["Software under test", "; ".join(f"{f.legend}: {f.software}" for f in facts)],
    ]
    return Table("assumptions", "Assumptions", ["Assumption", "Value"], rows)


LOG_SPAN = 20.0  # the dashboard's rule (dashboards.figures.LOG_SPAN): wider spans go log


def _wide(values) -> bool:
    positive = [v for v in values if v is not None and v > 0]
    return bool(positive) and max(positive) / min(positive) > LOG_SPAN


def _energy_assumptions(catalogue) -> list[list[Cell]]:
    """Electricity price and PUE (the energy table and owned-hardware tiers use them)."""
    tco = getattr(catalogue, "tco_defaults", None)
    rows: list[list[Cell]] = []
    for label, name, unit in (("Electricity price", "usd_per_kwh", "$/kWh"),
                              ("Facility PUE", "pue", "")):  # fmt: skip
        a = getattr(tco, name, None) if tco is not None else None
        if a is not None:
            why = a.source or a.note or ""
            rows.append([label, f"{a.value:g} {unit}".strip() + (f" ({why})" if why else "")])
    return rows


def _xy_series(curve: RunCurve, xs, ys, points, index: int, x_name: str | None = None) -> Series:
    """One run's line; with `x_name` (the x figure's Summary.value name) a simulated run's
    expected errors on x and on throughput (y) come with it."""
    return Series(
        curve.legend,
        curve.colour,
        list(xs),
        list(ys),
        [p.title for p in points],
        simulated=curve.simulated,
        style_index=index,
        x_error=curve.expected_error(x_name) if x_name else None,
        y_error=curve.expected_error("output_tokens_per_s") if x_name else None,
    )


def _latency_chart(curves, metric: str, slo, comparisons=()) -> Chart:
    """x = P99 latency (ms), y = output tokens/s per GPU, as the dashboard draws it: the SLO
    limit as a line, each capacity at the SLO as a marker, a log axis over wide spans."""
    series = []
    for i, curve in enumerate(curves):
        tps, latency = latency_curve(curve, metric, "p99")
        pts = [p for p in curve.points if p.latency(metric, "p99") is not None]
        series.append(_xy_series(curve, latency, tps, pts, i, f"p99_{metric}_ms"))
    xs = [x for s in series for x in s.x]
    ymax = max((max(v for v in s.y if v is not None) for s in series if s.y), default=0.0)
    limits = [t for t in slo if t.metric == f"p99_{metric}_ms" and t.op in ("<", "<=") and ymax]
    for t in limits:
        series.append(
            Series(f"SLO {t}", "#444444", [t.limit, t.limit], [0.0, ymax * 1.05], [], True)
        )
    marks = []
    for i, c in enumerate(comparisons):
        x = c.capacity.latency(metric, "p99") if c.capacity is not None else None
        if c.basis == "SLO capacity" and x is not None:
            marks.append(c.curve.legend)
            series.append(
                Series(
                    f"Capacity at the SLO: {c.curve.legend}",
                    c.curve.colour,
                    [x],
                    [c.capacity.output_tps_per_gpu],
                    [c.capacity.title],
                    marker_only=True,
                    style_index=i,
                )  # fmt: skip
            )
    name = metric.upper()
    log_x = _wide(xs + [t.limit for t in limits])
    alt = (
        f"Line chart: output tokens per second per GPU (y) against P99 {name} in ms (x"
        + (", log scale" if log_x else "")
        + "), one line per run: "
        + "; ".join(
            f"{c.legend} from {_span(latency_curve(c, metric, 'p99'))}" for c in curves if c.points
        )
        + "."
        + (f" A dashed line marks the SLO {', '.join(str(t) for t in limits)}." if limits else "")
        + (" Large markers show each run's capacity at the SLO." if marks else "")
    )
    return Chart(
        f"tput_vs_p99_{metric}",
        f"Throughput per GPU vs P99 {name}",
        "xy",
        f"P99 {name} (ms{', log scale' if log_x else ''})",
        "Output tokens/s per GPU",
        series,
        note=_sim_error_note(curves, f"p99_{metric}_ms"),
        log_x=log_x,
        alt_text=alt,
    )


def _sim_error_note(curves, name: str) -> str | None:
    """A chart's line on its simulated runs' expected error (the dashboard and the HTML/PNG
    charts draw it as error bars; the deck's native charts say it in words)."""
    parts = []
    for c in curves:
        e, t = c.expected_error(name), c.expected_error("output_tokens_per_s")
        if e is not None and t is not None:
            flagged = [p.title for p in c.points if (p.error_bars or {}).get("near_saturation")]
            near = f", near saturation at {', '.join(flagged)}" if flagged else ""
            parts.append(f"{c.legend}: ±{e:.0%} on latency, ±{t:.0%} on throughput{near}")
    if not parts:
        return None
    return "Expected error of simulated figures (appendix): " + "; ".join(parts) + "."


def _span(xy) -> str:
    """'120 tok/s/GPU at 95 ms to 950 tok/s/GPU at 1,400 ms' for alt text."""
    tps, lat = xy
    if not tps:
        return "no points"
    return f"{tps[0]:,.0f} tok/s/GPU at {lat[0]:,.0f} ms to {tps[-1]:,.0f} at {lat[-1]:,.0f} ms"


def _interactivity_chart(curves) -> Chart:
    """InferenceX's view: each run's Pareto front of throughput per GPU against tok/s/user."""
    from bench.frontier import pareto_front

    series = []
    for i, curve in enumerate(curves):
        front = pareto_front(curve.points)
        series.append(
            Series(
                curve.legend,
                curve.colour,
                [f.interactivity for f in front],
                [f.output_tps_per_gpu for f in front],
                [f.title for f in front],
                simulated=curve.simulated,
                style_index=i,
            )  # fmt: skip
        )
    alt = "Line chart: each run's Pareto front of output tokens/s per GPU (y) against " + (
        "interactivity in tokens/s per user (x): "
        + "; ".join(
            f"{s.name} from {s.y[0]:,.0f} tok/s/GPU at {s.x[0]:,.1f} tok/s/user to "
            f"{s.y[-1]:,.0f} at {s.x[-1]:,.1f}"
            for s in series
            if s.x
        )
        + "."
    )
    return Chart(
        "tput_vs_interactivity",
        "Throughput per GPU vs interactivity (Pareto front)",
        "xy",
        "Interactivity (tokens/s per user = 1000 / median TPOT)",
        "Output tokens/s per GPU",
        series,
        alt_text=alt,
    )


def _cost_interactivity_chart(curves, catalogue, utilisation, tier: str | None = None) -> Chart:
    """$/Mtok against interactivity along each run's front, on the tier the dashboard's view
    opens on (bench.frontier.cost_view_tier: the cheapest on-demand tier all GPUs have)."""
    from bench.cost import cost_at_utilisation, dollars_per_mtok
    from bench.frontier import cost_view_tier, pareto_front

    if tier is None or not _tier_everywhere(curves, catalogue, tier):
        tier = cost_view_tier(curves, catalogue)
    series = []
    for i, curve in enumerate(curves):
        if tier is None or not curve.gpu_type:
            continue
        try:
            price = price_per_gpu_hour(
                catalogue.tier(catalogue.resolve_gpu(curve.gpu_type), tier), catalogue
            )
        except PriceCatalogueError:
            continue
        by_lp = {p.load_point: p for p in curve.points}
        xs, ys, kept = [], [], []
        for f in pareto_front(curve.points):
            usd = cost_at_utilisation(
                dollars_per_mtok(price, curve.gpu_count, by_lp[f.load_point].output_tps),
                utilisation,
            )
            if usd is not None:
                xs.append(f.interactivity)
                ys.append(usd)
                kept.append(f)
        # a simulated run's errors: x (1000 / TPOT p50) TPOT p50's, y ($/Mtok = price /
        # throughput) its throughput's, x/÷ (1 + e) either way (bench.cost.cost_error_name)
        series.append(_xy_series(curve, xs, ys, kept, i, "p50_tpot_ms"))
    log_y = _wide([y for s in series for y in s.y])
    title = f"$/Mtok output vs interactivity: {tier or 'no prices'} ({utilisation:.0%} utilisation)"
    return Chart(
        "cost_vs_interactivity",
        title,
        "xy",
        "Interactivity (tokens/s per user = 1000 / median TPOT)",
        f"$ per million output tokens{' (log scale)' if log_y else ''}",
        series,
        note=None if tier else "No run has a GPU with prices.",
        log_y=log_y,
        alt_text=(
            f"Line chart: $ per million output tokens on the {tier} tier (y) against "
            "interactivity in tokens/s per user (x), along each run's Pareto front; lower is "
            "cheaper, further right is faster for each user."
        ),
    )


def _tier_everywhere(curves, catalogue, tier: str) -> bool:
    """Whether every run's GPU has a price on `tier` (else the default view's tier)."""
    try:
        return all(
            c.gpu_type
            and tier in [t.name for t in catalogue.tiers(catalogue.resolve_gpu(c.gpu_type))]
            for c in curves
        )
    except PriceCatalogueError:
        return False


def _cost_chart(comparisons, utilisation) -> Chart:
    tiers = _tiers(comparisons)
    series = []
    left_out = []
    for i, c in enumerate(comparisons):
        if not c.cost_rows:
            left_out.append(c.curve.legend)
            continue
        by_tier = {r.tier: r.output_usd_per_mtok_at_utilisation for r in c.cost_rows}
        # a simulated run's bars carry its throughput's error (bench.cost.cost_error_name)
        series.append(Series(c.curve.legend, c.curve.colour, [], [by_tier.get(t) for t in tiers],
                             simulated=c.curve.simulated, style_index=i,
                             y_error=c.curve.expected_error(cost_error_name("output"))))  # fmt: skip
    note = f"left out (no $/Mtok): {', '.join(left_out)}" if left_out else None
    return Chart(
        "cost_per_tier",
        f"$/Mtok of output tokens per pricing tier at capacity ({utilisation:.0%} utilisation)",
        "bar",
        "Pricing tier",
        "$ per million output tokens",
        series,
        categories=tiers,
        note=note,
        alt_text=(
            "Bar chart: $ per million output tokens at each run's capacity, one group of bars "
            "per pricing tier: "
            + "; ".join(
                f"{s.name} from ${min(v for v in s.y if v is not None):,.3f} to "
                f"${max(v for v in s.y if v is not None):,.3f}"
                for s in series
                if any(v is not None for v in s.y)
            )
            + "."
        ),
    )


def _plan_table(plan: Plan | None) -> Table:
    """The buying answer per system, as the answer slide lays it out (no new numbers: every
    cell is a field of report.plan, formatted)."""
    headers = ["System", "Capacity at the SLO", "GPUs (range)", "Nodes", "Cheapest tier",
               "$/GPU-hour", "$/month", "$/Mtok output at the demand",
               "$/Mtok at capacity (busy)"]  # fmt: skip
    rows: list[list] = []
    for s in plan.systems if plan else []:
        gpus = gpus_text(s)
        t = s.cheapest
        rows.append([
            s.legend, s.capacity_text, gpus, Num(s.nodes, 0),
            t.tier if t else "—",
            Num(
                t.price_usd_per_gpu_hr if t else None,
                price_decimals(t.price_usd_per_gpu_hr if t else None),
                prefix="$",
            ),
            Num(t.usd_per_month if t else None, 0, prefix="$",
                span=_closed(t.usd_per_month_range) if t else None),
            Num(t.usd_per_mtok if t else None, 3, prefix="$",
                span=_closed(t.usd_per_mtok_range) if t else None),
            Num(t.busy_usd_per_mtok if t else None, 3, prefix="$",
                span=_closed(t.busy_usd_per_mtok_range) if t else None),
        ])  # fmt: skip
    ranged = plan is not None and any(
        _closed(t.usd_per_month_range) for s in plan.systems for t in s.tiers
    )
    note = (
        "In brackets: what the GPU count's range costs; it follows the capacity's range "
        "(sampling, the bracket, reruns and, for a simulated run, the simulator's expected error)."
        if ranged
        else None
    )
    return Table("plan", "The answer", headers, rows, note=note,
                 empty_text="No plan: no demand was given and the runs' scenario has no mean "
                 "rate (export with a demand, e.g. --demand-rps).")  # fmt: skip


def _closed(span: tuple[float | None, float | None]) -> tuple[float, float] | None:
    """A plan figure's (low, high) for a Num cell where both ends are known; a half-open range
    shows in the GPUs column's words instead."""
    lo, hi = span
    return None if lo is None or hi is None else (lo, hi)


def _tier_note(curves, catalogue) -> str | None:
    """Which pricing tiers only some GPUs have: a cheapest-tier comparison must say so."""
    by_gpu: dict[str, list[str]] = {}
    for curve in curves:
        try:
            gpu = catalogue.resolve_gpu(curve.gpu_type) if curve.gpu_type else None
            by_gpu.setdefault(gpu, [t.name for t in catalogue.tiers(gpu)]) if gpu else None
        except PriceCatalogueError:
            continue
    if len(by_gpu) < 2:
        return None
    tiers = list(dict.fromkeys(t for names in by_gpu.values() for t in names))
    gaps = [
        f"{tier} (no price for {', '.join(g for g, names in by_gpu.items() if tier not in names)})"
        for tier in tiers
        if any(tier not in names for names in by_gpu.values())
    ]
    if not gaps:
        return None
    return (
        "Pricing tiers differ between the GPUs compared: " + "; ".join(gaps) + ". Each GPU's "
        "cheapest tier may be a kind of price the other GPU has no figure for."
    )


def _more_caveats(curves, plan, tier_note) -> list[str]:
    """What `_caveats` (capacity bounds and flags) does not say: thin tails anywhere on a
    curve, interrupted or late points, tiers that differ between GPUs, unsized systems."""
    from bench.metrics import THIN_SAMPLES

    out: list[str] = []
    for curve in curves:
        thin = [p.title for p in curve.points if (p.count("ttft") or THIN_SAMPLES) < THIN_SAMPLES]
        if thin:
            where = "every load point" if len(thin) == len(curve.points) else ", ".join(thin)
            out.append(
                f"{curve.legend}: P99s at {where} rest on fewer than {THIN_SAMPLES} requests, "
                "so each is one of the slowest few requests; the 95% intervals (appendix and "
                "workbook) show how far it could move."
            )
        partial = [p.title for p in curve.points if p.partial]
        if partial:
            out.append(
                f"{curve.legend}: {', '.join(partial)} was interrupted; shown, never used as "
                "a capacity."
            )
        late = [f"{p.title} ({p.late_ms:,.0f} ms)" for p in curve.points if p.late_ms]
        if late:
            out.append(
                f"{curve.legend}: the simulated endpoint ran late at {', '.join(late)}; "
                "latencies there include the simulator's own delay."
            )
    if tier_note:
        out.append(tier_note)
    if plan is not None:  # bounds are said by _caveats; other reasons a system is not sized
        out += [
            f"{s.legend}: {s.note}."
            for s in plan.systems
            if s.note and s.capacity_kind not in ("at_least", "below")
        ]
    return out


def _missing(curves, comparisons, slo, catalogue) -> list[str]:
    out: list[str] = []
    if not slo:
        out.append(
            "No SLO given or stored with the runs: capacity is each run's peak-throughput "
            "load point (give --slo, e.g. 'p99_ttft_ms<=2000,p99_tpot_ms<=50')."
        )
    for c in comparisons:
        who = c.curve.legend
        if not c.curve.points:
            out.append(f"{who}: no load points with results.")
            continue
        if slo and c.capacity is None:
            out.append(f"{who}: no load point met the SLO, so it has no capacity or $/Mtok.")
        if not c.curve.gpu_type:
            out.append(
                f"{who}: GPU type not recorded, so no $/Mtok and throughput per GPU assumes "
                f"{c.curve.gpu_count} GPU(s)."
            )
        elif c.capacity is not None and not c.cost_rows:
            try:
                catalogue.resolve_gpu(c.curve.gpu_type)
                out.append(f"{who}: no $/Mtok (no usable throughput at capacity).")
            except PriceCatalogueError:
                out.append(f"{who}: no prices for GPU {c.curve.gpu_type} in the catalogue.")
        if all(p.latency("tpot", "p50") is None for p in c.curve.points):
            out.append(f"{who}: no TPOT recorded, so no interactivity.")
    return out


def _caveats(comparisons: Sequence[RunComparison]) -> list[str]:
    out = []
    for c in comparisons:
        cap, who = c.at_slo, c.curve.legend
        if cap is None:
            continue
        if cap.kind == "at_least":
            out.append(f"{who}: every load tested met the SLO, so its capacity is a lower bound.")
        elif cap.kind == "below":
            out.append(f"{who}: no load tested met the SLO; its capacity is below the lowest.")
        if cap.covers():  # what the capacity's range includes, each part with its span
            out.append(f"{who}: {cap.covers()}.")
        out += [f"{who}: {flag}." for flag in cap.flags]
    if any(c.curve.simulated for c in comparisons):
        out.append(
            "Simulated results come from tokenbench's roofline model of each GPU, not hardware."
        )
    return out


def build_report(
    run_refs: Sequence[str],
    db: Any = None,
    slo: Sequence[Threshold] | str | None = None,
    catalogue: Catalogue | None = None,
    utilisation: float = 1.0,
    *,
    catalogue_label: str = "shipped bench/data/prices.yaml",
    title: str | None = None,
    demand: Demand | None = None,
    gpus_per_node: int = 8,
    tier: str | None = None,
) -> Report:
    """Read the runs and compute everything any export shows.

    `slo` None means "not given": the SLO the runs were swept against is used when they
    all stored the same one. An empty sequence means no SLO (capacity = peak throughput).
    Raises bench.store.StoreError (or KeyError) for an unknown run reference and
    ValueError for a bad SLO or utilisation; everything else missing goes to `missing`.
    """
    from bench.store import get_run

    if not run_refs:
        raise ValueError("give at least one run")
    if not 0 < utilisation <= 1:
        raise ValueError(f"utilisation must be in (0, 1], got {utilisation}")
    catalogue = catalogue or load_catalogue()
    infos = [get_run(ref, db) for ref in run_refs]
    curves = run_curves([i.id for i in infos], db)
    thresholds, slo_source = resolve_slo(slo, infos)
    comparisons = compare_runs(curves, thresholds, catalogue, utilisation)
    demand = demand or default_demand(infos)
    plan = (
        plan_capacity(
            comparisons, demand, catalogue, slo_source=slo_source, gpus_per_node=gpus_per_node
        )
        if demand is not None
        else None
    )
    tier_note = _tier_note(curves, catalogue)
    facts = [
        RunFacts(
            run_id=info.id,
            legend=curve.legend,
            gpu_type=curve.gpu_type,
            gpu_count=curve.gpu_count,
            model=curve.model,
            provenance=_provenance(curve),
            software=_software(info),
            scenario=_scenario_text(info.scenario_text),
            status=info.status,
            created=info.created_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M"),
        )
        for info, curve in zip(infos, curves, strict=True)
    ]
    gpus = " vs ".join(f"{c.gpu_type or 'GPU?'} x{c.gpu_count}" for c in curves)
    models = sorted({c.model for c in curves if c.model})
    subtitle = f"{gpus}" + (f" serving {', '.join(models)}" if models else "")
    if any(c.simulated for c in curves):
        subtitle += " (simulated results)" if all(c.simulated for c in curves) else ""
    return Report(
        title=title or "LLM inference: capacity and cost",
        subtitle=subtitle,
        generated_at=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        curves=curves,
        comparisons=comparisons,
        runs=facts,
        slo=thresholds,
        slo_source=slo_source,
        utilisation=utilisation,
        catalogue=catalogue,
        sentence=ratio_sentence(comparisons),
        missing=_missing(curves, comparisons, thresholds, catalogue),
        summary=_summary_table(comparisons, thresholds, utilisation),
        summary_cost=_summary_cost_table(comparisons, utilisation),
        cost=_cost_table(comparisons, utilisation),
        percentiles=_percentile_table(curves, thresholds),
        load_points=_load_point_table(curves, thresholds),
        prompt_cache=_prompt_cache_table(curves),
        classes=_classes_table(curves, thresholds),
        sim_error=_sim_error_table(curves),
        prices=_prices_table(curves, catalogue),
        energy=_energy_table(comparisons, db, catalogue),
        runs_table=_runs_table(facts),
        assumptions=_assumptions_table(
            thresholds, slo_source, utilisation, catalogue_label, facts, catalogue
        ),
        methodology=Table(
            "methodology",
            "Methodology: metric definitions",
            ["Metric", "Definition"],
            [[m, d] for m, d in METHODOLOGY],
        ),
        charts=[
            _interactivity_chart(curves),
            _cost_interactivity_chart(curves, catalogue, utilisation, tier),
            _latency_chart(curves, "ttft", thresholds, comparisons),
            _latency_chart(curves, "tpot", thresholds, comparisons),
            _cost_chart(comparisons, utilisation),
        ],
        plan=plan,
        caveats=_caveats(comparisons) + _more_caveats(curves, plan, tier_note),
        tier_note=tier_note,
        ranking=rank_settings(comparisons, infos),
    )
