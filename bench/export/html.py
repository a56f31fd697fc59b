"""A standalone HTML report that opens offline: plotly.js is inlined, no CDN, no fetches.

Same content as the deck, in the same order: the answer, summary, what is missing, the
charts (the dashboard's figures, with the $/Mtok tier menu), assumptions (prices with
sources and dates), methodology, caveats, and the appendix tables.
"""

from __future__ import annotations

from dataclasses import replace
from html import escape
from pathlib import Path

from bench.export.figures import report_figures
from bench.export.report import Num, Report, Table, cell_text

CSS = """
body { font-family: Calibri, Carlito, "Segoe UI", Arial, sans-serif; color: #222b38;
       max-width: 1200px; margin: 2em auto; padding: 0 1em; }
h1 { color: #1f4e79; margin-bottom: 0.2em; }
h2 { color: #1f4e79; border-bottom: 3px solid #1f4e79; padding-bottom: 0.2em; margin-top: 1.6em; }
.sub { color: #5f6b7a; font-size: 1.2em; }
.sim { color: #b03a2e; font-weight: bold; }
.sentence { font-size: 1.25em; font-weight: bold; color: #1f4e79; }
.missing { background: #fdf1ef; border-left: 4px solid #b03a2e; padding: 0.5em 1em; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.95em; }
th { background: #1f4e79; color: #fff; text-align: left; padding: 0.35em 0.6em; }
td { padding: 0.3em 0.6em; border-bottom: 1px solid #dde3ea; vertical-align: top; }
tr:nth-child(even) td { background: #eef2f7; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.note { color: #5f6b7a; font-size: 0.9em; }
.chart { margin: 1em 0 2em; }
table { display: block; max-width: 100%; overflow-x: auto; }
"""


def table_html(table: Table, *, heading: bool = True) -> str:
    numeric = {
        j for j in range(len(table.headers)) if any(isinstance(r[j], Num) for r in table.rows)
    }
    parts = [f"<h2>{escape(table.title)}</h2>"] if heading else []
    if not table.rows:
        return "".join(parts) + f'<p class="missing">{escape(table.empty_text)}</p>'
    parts.append(f'<table id="table-{escape(table.name)}"><thead><tr>')
    parts += [f"<th>{escape(h)}</th>" for h in table.headers]
    parts.append("</tr></thead><tbody>")
    for row in table.rows:
        parts.append("<tr>")
        for j, cell in enumerate(row):
            cls = ' class="num"' if j in numeric else ""
            parts.append(f"<td{cls}>{escape(cell_text(cell))}</td>")
        parts.append("</tr>")
    parts.append("</tbody></table>")
    if table.note:
        parts.append(f'<p class="note">{escape(table.note)}</p>')
    return "".join(parts)


def render_html(report: Report) -> str:
    """The whole report as one HTML string (plotly.js inlined once, about 4.5 MB)."""
    figs = report_figures(report, height=560)
    body = [
        f"<h1>{escape(report.title)}</h1>",
        f'<p class="sub">{escape(report.subtitle)}</p>',
        f'<p class="note">Generated {escape(report.generated_at)} by tokenbench. Runs: '
        + escape("; ".join(f"{f.legend} [{f.run_id[:8]}]" for f in report.runs))
        + "</p>",
    ]
    if report.any_simulated:
        body.append(
            '<p class="sim">Includes SIMULATED results: from tokenbench\'s roofline-modelled '
            "endpoint, not measured on hardware.</p>"
        )
    body.append("<h2>The answer</h2>")
    if report.plan is not None:
        body.append(f'<p class="sentence" id="plan-sentence">{escape(report.plan.sentence)}</p>')
        body.append(table_html(report.plan_table, heading=False))
        body.append('<ul class="note">' + "".join(
            f"<li>{escape(a)}</li>" for a in report.plan.assumptions) + "</ul>")  # fmt: skip
    else:
        body.append('<p class="note">No demand given, so no GPU count or $/month (export '
                    "with a demand to size the fleet).</p>")  # fmt: skip
    if report.ranking is not None:
        table = replace(report.ranking_table, note=None)  # its note is the verdict, shown here
        body.append(f'<h2 id="settings-ranking">{escape(table.title)}</h2>')
        body.append(f'<p class="sentence">{escape(report.ranking.verdict)}</p>')
        body.append(table_html(table, heading=False))
    body.append("<h2>Executive summary</h2>")
    body.append(
        f'<p class="sentence">{escape(report.sentence or "No ratio between GPUs: see what is missing.")}</p>'
    )
    if report.missing:
        items = "".join(f"<li>{escape(m)}</li>" for m in report.missing)
        body.append(
            f'<div class="missing" id="missing"><b>What this report could not show</b>'
            f"<ul>{items}</ul></div>"
        )
    body.append(table_html(report.summary, heading=False))
    body.append(table_html(report.summary_cost, heading=False))
    first = True
    for chart in report.charts:
        body.append(f"<h2>{escape(chart.title)}</h2>")
        if chart.note:
            body.append(f'<p class="note">{escape(chart.note)}</p>')
        fig = figs[chart.key]
        body.append(
            '<div class="chart">'
            + fig.to_html(full_html=False, include_plotlyjs=first, div_id=f"chart-{chart.key}")
            + "</div>"
        )
        first = False
    for table in (report.assumptions, report.prices):
        body.append(table_html(table))
    if report.tier_note:
        body.append(f'<p class="note" id="tier-note">{escape(report.tier_note)}</p>')
    body.append(table_html(report.methodology))
    body.append("<h2>Caveats</h2>")
    items = report.caveats or ["None found."]
    body.append('<ul id="caveats">' + "".join(f"<li>{escape(c)}</li>" for c in items) + "</ul>")
    body.append("<h2>Appendix</h2>")
    for table in (report.percentiles, report.cost, report.runs_table, report.energy,
                  report.prompt_cache):  # fmt: skip
        body.append(table_html(table))
    if report.classes.rows:
        body.append(table_html(report.classes))
    if report.sim_error.rows:
        body.append(table_html(report.sim_error))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(report.title)}</title><style>{CSS}</style></head><body>"
        + "\n".join(body)
        + "</body></html>\n"
    )


def write_html(report: Report, out: Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(report), encoding="utf-8")
    return out
