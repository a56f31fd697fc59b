"""The procurement deck: a 16:9 PowerPoint with native, editable charts.

Charts are real PowerPoint charts (XY scatter with lines, clustered bars) holding the
numbers of the Report, so whoever edits the deck can restyle them or read the data behind
them; nothing is a pasted picture. python-pptx cannot measure text, so text is fitted by an
estimate (average glyph width of a sans font, conservatively high): a text box gets the
largest size at which its words wrap inside it, and tables are paginated by their rows'
estimated heights, repeating the header, so nothing runs off a slide.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from pptx import Presentation
from pptx.chart.data import CategoryChartData, XyChartData
from pptx.dml.color import RGBColor
from pptx.enum.chart import XL_CHART_TYPE, XL_LEGEND_POSITION, XL_MARKER_STYLE
from pptx.enum.dml import MSO_LINE_DASH_STYLE, MSO_PATTERN_TYPE
from pptx.enum.shapes import MSO_SHAPE
from pptx.enum.text import MSO_ANCHOR, MSO_AUTO_SIZE, PP_ALIGN
from pptx.oxml.ns import qn
from pptx.util import Emu, Inches, Pt

from bench.export.report import Chart, Report, Table

# ---------------------------------------------------------------- the theme

SLIDE_W, SLIDE_H = 13.333, 7.5  # inches, 16:9
MARGIN = 0.5
CONTENT_W = SLIDE_W - 2 * MARGIN
TITLE_TOP, TITLE_H = 0.3, 0.75
BODY_TOP = 1.2
BODY_BOTTOM = 6.85  # the footer sits below
FONT = "Calibri"
INK = RGBColor(0x22, 0x2B, 0x38)
MUTED = RGBColor(0x5F, 0x6B, 0x7A)
ACCENT = RGBColor(0x1F, 0x4E, 0x79)
HEADER_FILL = RGBColor(0x1F, 0x4E, 0x79)
ROW_FILL = (RGBColor(0xFF, 0xFF, 0xFF), RGBColor(0xEE, 0xF2, 0xF7))
WARN = RGBColor(0xB0, 0x3A, 0x2E)
TITLE_SLIDE, TITLE_ONLY = 0, 5  # layouts of python-pptx's default template

# The i-th run's marker and dash, as dashboards.figures.run_styles gives them on the web.
MARKERS = (XL_MARKER_STYLE.CIRCLE, XL_MARKER_STYLE.SQUARE, XL_MARKER_STYLE.DIAMOND,
           XL_MARKER_STYLE.TRIANGLE, XL_MARKER_STYLE.X, XL_MARKER_STYLE.PLUS)  # fmt: skip
DASHES = (MSO_LINE_DASH_STYLE.SOLID, MSO_LINE_DASH_STYLE.DASH, MSO_LINE_DASH_STYLE.DASH_DOT,
          MSO_LINE_DASH_STYLE.LONG_DASH, MSO_LINE_DASH_STYLE.ROUND_DOT,
          MSO_LINE_DASH_STYLE.LONG_DASH_DOT)  # fmt: skip

# Text-fit estimate: glyph advances of Calibri (and Carlito, its metric-compatible twin that
# LibreOffice renders it with) in em, rounded up. Without Carlito LibreOffice falls back to a
# wider font and text wraps more, still inside its box.
NARROW = set(" .,;:'!|()[]ijlrtf-/")
WIDE = set("mwMW%@")
LINE_EM = 1.22
CELL_MARGIN_X, CELL_MARGIN_Y = 0.06, 0.04  # inches


def _rgb(hex_colour: str) -> RGBColor:
    return RGBColor.from_string(hex_colour.lstrip("#").upper())


# ---------------------------------------------------------------- text fitting


def text_em(text: str) -> float:
    """Estimated width of `text` in em (a little wider than Calibri draws it)."""
    width = 0.0
    for ch in text:
        if ch in NARROW:
            width += 0.32
        elif ch in WIDE:
            width += 0.85
        elif ch.isupper() or ch in "$#&":
            width += 0.62
        else:
            width += 0.53
    return width


def wrapped_lines(text: str, width_in: float, pt: float) -> int:
    """How many lines `text` takes at `pt` points in a box `width_in` inches wide."""
    line_em = width_in * 72 / pt
    space = text_em(" ")
    lines = 0
    for para in text.split("\n"):
        count, used = 1, 0.0
        for word in para.split():
            w = text_em(word)
            need = w if used == 0 else used + space + w
            if need <= line_em:
                used = need
                continue
            if used:
                count += 1
            while w > line_em:  # a word longer than a line breaks anywhere
                count += 1
                w -= line_em
            used = w
        lines += count
    return lines


def fit_pt(text: str, width_in: float, height_in: float, max_pt: float, min_pt: float) -> float:
    """The largest size (half-point steps) at which `text` fits the box, else `min_pt`."""
    pt = max_pt
    while pt > min_pt:
        if wrapped_lines(text, width_in, pt) * pt * LINE_EM / 72 <= height_in:
            return pt
        pt -= 0.5
    return min_pt


def _longest_word(text: str) -> float:
    """Width in em of the widest word: a column narrower than that breaks words."""
    return max((text_em(w) for w in text.split()), default=0.0)


# ---------------------------------------------------------------- shapes


def _text(
    slide,
    x: float,
    y: float,
    w: float,
    h: float,
    text: str,
    *,
    max_pt: float = 18,
    min_pt: float = 9,
    bold: bool = False,
    colour: RGBColor = INK,
    align=PP_ALIGN.LEFT,
    anchor=MSO_ANCHOR.TOP,
):
    """A wrapped text box whose font is sized so the text fits it."""
    box = slide.shapes.add_textbox(Inches(x), Inches(y), Inches(w), Inches(h))
    tf = box.text_frame
    tf.word_wrap = True
    tf.auto_size = MSO_AUTO_SIZE.NONE
    tf.vertical_anchor = anchor
    for side in ("left", "right"):
        setattr(tf, f"margin_{side}", Inches(0.05))
    for side in ("top", "bottom"):
        setattr(tf, f"margin_{side}", Inches(0.03))
    pt = fit_pt(text, w - 0.1, h - 0.06, max_pt, min_pt)
    for i, line in enumerate(text.split("\n")):
        para = tf.paragraphs[0] if i == 0 else tf.add_paragraph()
        para.alignment = align
        run = para.add_run()
        run.text = line
        run.font.size = Pt(pt)
        run.font.bold = bold
        run.font.name = FONT
        run.font.color.rgb = colour
    return box


def _title_in_placeholder(slide, title: str, x, y, w, h, *, max_pt, min_pt, colour=INK):
    """Put the slide's title in its title placeholder (screen readers, the outline view and
    PowerPoint's accessibility checker read titles from there), placed and fitted like any
    other text box."""
    ph = slide.shapes.title
    ph.left, ph.top, ph.width, ph.height = Inches(x), Inches(y), Inches(w), Inches(h)
    tf = ph.text_frame
    tf.word_wrap = True
    tf.auto_size = MSO_AUTO_SIZE.NONE
    tf.vertical_anchor = MSO_ANCHOR.TOP
    for side in ("left", "right"):
        setattr(tf, f"margin_{side}", Inches(0.05))
    for side in ("top", "bottom"):
        setattr(tf, f"margin_{side}", Inches(0.03))
    tf.text = ""
    para = tf.paragraphs[0]
    para.alignment = PP_ALIGN.LEFT
    run = para.add_run()
    run.text = title
    run.font.size = Pt(fit_pt(title, w - 0.1, h - 0.06, max_pt, min_pt))
    run.font.bold = True
    run.font.name = FONT
    run.font.color.rgb = colour
    return ph


def _slide(prs, report: Report, title: str):
    slide = prs.slides.add_slide(prs.slide_layouts[TITLE_ONLY])
    bar = slide.shapes.add_shape(
        MSO_SHAPE.RECTANGLE, 0, 0, Inches(SLIDE_W), Inches(0.12)
    )  # the theme's one accent
    bar.fill.solid()
    bar.fill.fore_color.rgb = ACCENT
    bar.line.fill.background()
    _title_in_placeholder(slide, title, MARGIN, TITLE_TOP, CONTENT_W, TITLE_H, max_pt=28,
                          min_pt=16)  # fmt: skip
    _footer(slide, report, len(prs.slides))
    return slide


def _footer(slide, report: Report, number: int) -> None:
    y = SLIDE_H - 0.5
    _text(
        slide, MARGIN, y, 6.0, 0.35, f"tokenbench · {report.generated_at}", max_pt=10,
        colour=MUTED,
    )  # fmt: skip
    if report.any_simulated:
        _text(
            slide, 6.6, y, 5.4, 0.35, "Includes SIMULATED results, not measured on hardware",
            max_pt=10, bold=True, colour=WARN, align=PP_ALIGN.RIGHT,
        )  # fmt: skip
    _text(slide, SLIDE_W - MARGIN - 0.8, y, 0.8, 0.35, str(number), max_pt=10, colour=MUTED,
          align=PP_ALIGN.RIGHT)  # fmt: skip


# ---------------------------------------------------------------- tables


def column_widths(
    headers: Sequence[str], rows: Sequence[Sequence[str]], total: float, pt: float
) -> list[float] | None:
    """Widths in inches at `pt`: each column at least its longest word, the rest of the
    width shared by how much more each column's text wants; None when the words cannot fit.
    """
    char = pt / 72  # inches per em
    pad = 2 * CELL_MARGIN_X + 0.02
    least, want = [], []
    for j, head in enumerate(headers):
        texts = [r[j] for r in rows]
        longest_word = max([_longest_word(head)] + [_longest_word(t) for t in texts])
        # Headers may wrap onto two lines; cells are wanted on one line, up to 60 characters.
        wanted = max([min(text_em(t), 30) for t in texts] + [text_em(head) / 2, 1.5])
        least.append(longest_word * char + pad)
        want.append(max(wanted, longest_word) * char + pad)
    if sum(least) > total:
        return None
    if sum(want) <= total:
        return [w * total / sum(want) for w in want]
    share = (total - sum(least)) / (sum(want) - sum(least))
    return [lo + (w - lo) * share for lo, w in zip(least, want, strict=True)]


def _row_height(cells: Sequence[str], widths: Sequence[float], pt: float) -> float:
    lines = max(
        wrapped_lines(t, w - 2 * CELL_MARGIN_X, pt) for t, w in zip(cells, widths, strict=True)
    )
    return lines * pt * LINE_EM / 72 + 2 * CELL_MARGIN_Y + 0.02


def _table_layout(headers, rows, width, height, max_pt, min_pt, one_page_pt=None):
    """The largest font size (and column widths) at which no word breaks and every row fits
    a slide; with `one_page_pt`, shrink down to it if that puts the table on one slide."""
    pt, first = max_pt, None
    while pt >= min_pt:
        widths = column_widths(headers, rows, width, pt)
        if widths is not None:
            head_h = _row_height(headers, widths, pt)
            if all(head_h + _row_height(r, widths, pt) <= height for r in rows):
                first = first or (pt, widths)
                if one_page_pt is None or len(paginate(headers, rows, widths, height, pt)) == 1:
                    return pt, widths
                if pt <= one_page_pt:
                    break
        pt -= 0.5
    if first is not None:
        return first
    return min_pt, column_widths(headers, rows, width, min_pt) or [width / len(headers)] * len(
        headers
    )


def paginate(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    widths: Sequence[float],
    height: float,
    pt: float,
) -> list[list[Sequence[str]]]:
    """Split rows into pages whose estimated height (header included) fits `height`."""
    head_h = _row_height(headers, widths, pt)
    pages: list[list[Sequence[str]]] = [[]]
    used = head_h
    for row in rows:
        h = _row_height(row, widths, pt)
        if pages[-1] and used + h > height:
            pages.append([])
            used = head_h
        pages[-1].append(row)
        used += h
    return pages


def _add_table(slide, x, y, widths, headers, rows, pt, *, numeric_cols=()):
    n_rows = len(rows) + 1
    heights = [_row_height(headers, widths, pt)] + [_row_height(r, widths, pt) for r in rows]
    shape = slide.shapes.add_table(
        n_rows, len(headers), Inches(x), Inches(y), Inches(sum(widths)), Inches(sum(heights))
    )
    table = shape.table
    table.first_row = True
    for j, w in enumerate(widths):
        table.columns[j].width = Emu(int(Inches(w)))
    for i, h in enumerate(heights):
        table.rows[i].height = Emu(int(Inches(h)))
    for i, row in enumerate([headers, *rows]):
        for j, text in enumerate(row):
            cell = table.cell(i, j)
            cell.margin_left = cell.margin_right = Inches(CELL_MARGIN_X)
            cell.margin_top = cell.margin_bottom = Inches(CELL_MARGIN_Y)
            cell.vertical_anchor = MSO_ANCHOR.MIDDLE
            cell.fill.solid()
            cell.fill.fore_color.rgb = HEADER_FILL if i == 0 else ROW_FILL[i % 2]
            tf = cell.text_frame
            tf.word_wrap = True
            para = tf.paragraphs[0]
            para.alignment = PP_ALIGN.RIGHT if (j in numeric_cols and i > 0) else PP_ALIGN.LEFT
            run = para.add_run()
            run.text = text
            run.font.size = Pt(pt)
            run.font.name = FONT
            run.font.bold = i == 0
            run.font.color.rgb = RGBColor(0xFF, 0xFF, 0xFF) if i == 0 else INK
    return shape


def _numeric_cols(table: Table) -> set[int]:
    """Columns holding numbers are right-aligned (their "—" and "no tier" cells too)."""
    from bench.export.report import Num

    return {
        j
        for j in range(len(table.headers))
        if any(isinstance(r[j], Num) for r in table.rows)
        or (not table.headers[0] and j > 0)  # runs as columns: a transposed table
    }


def without_columns(table: Table, names: Sequence[str]) -> Table:
    """The table less the named columns (a slide has less room than a sheet)."""
    keep = [i for i, h in enumerate(table.headers) if h not in names]
    return replace(
        table,
        headers=[table.headers[i] for i in keep],
        rows=[[row[i] for i in keep] for row in table.rows],
    )


def table_slides(
    prs,
    report: Report,
    table: Table,
    *,
    title: str | None = None,
    top: float = BODY_TOP,
    left: float = MARGIN,
    width: float = CONTENT_W,
    max_pt: float = 14,
    min_pt: float = 8,
    one_page_pt: float | None = None,
    first_slide=None,
) -> list:
    """As many slides as the table needs; the title says "(2/3)" when it runs over."""
    headers, rows = table.headers, table.text_rows()
    if not rows:
        slide = first_slide or _slide(prs, report, title or table.title)
        _text(slide, left, top, width, 1.2, table.empty_text, max_pt=18, colour=WARN)
        return [slide]
    note_h = 0.4 if table.note else 0.0
    height = BODY_BOTTOM - top - note_h
    pt, widths = _table_layout(headers, rows, width, height, max_pt, min_pt, one_page_pt)
    pages = paginate(headers, rows, widths, height, pt)
    slides = []
    numeric = _numeric_cols(table)
    for k, page in enumerate(pages):
        name = title or table.title
        if len(pages) > 1:
            name += f" ({k + 1}/{len(pages)})"
        slide = first_slide if (k == 0 and first_slide is not None) else _slide(prs, report, name)
        page_top = top if (k == 0 and first_slide is not None) else BODY_TOP
        shape = _add_table(slide, left, page_top, widths, headers, page, pt, numeric_cols=numeric)
        if table.note:
            bottom = page_top + shape.height / 914400
            _text(slide, left, bottom + 0.05, width, 0.35, table.note, max_pt=11,
                  colour=MUTED)  # fmt: skip
        slides.append(slide)
    return slides


# ---------------------------------------------------------------- charts


def _style_axis(axis, title: str, number_format: str) -> None:
    axis.has_title = True
    axis.axis_title.text_frame.text = title
    font = axis.axis_title.text_frame.paragraphs[0].runs[0].font
    font.size, font.bold, font.name = Pt(14), False, FONT
    axis.tick_labels.font.size = Pt(12)
    axis.tick_labels.font.name = FONT
    axis.tick_labels.number_format = number_format
    axis.tick_labels.number_format_is_linked = False
    axis.has_major_gridlines = True
    axis.major_gridlines.format.line.color.rgb = RGBColor(0xD9, 0xD9, 0xD9)


def _log_axis(axis) -> None:
    """A logarithmic value axis (python-pptx has no property for it: c:scaling/c:logBase)."""
    scaling = axis._element.find(qn("c:scaling"))
    for old in scaling.findall(qn("c:logBase")) + scaling.findall(qn("c:min")):
        scaling.remove(old)
    log = scaling.makeelement(qn("c:logBase"), {"val": "10"})
    scaling.insert(0, log)


def _alt_text(frame, chart: Chart) -> None:
    """The chart's description for screen readers (PowerPoint's Alt Text pane)."""
    props = frame._element.nvGraphicFramePr.cNvPr
    props.set("descr", chart.alt_text or chart.title)
    props.set("title", chart.title)


def _num_lit(values: Sequence[float | None]):
    """Literal numbers for a chart part; a None (a bar for a tier the GPU lacks) is a point
    left out, as a blank cell is."""
    from lxml import etree

    lit = etree.Element(qn("c:numLit"))
    etree.SubElement(lit, qn("c:formatCode")).text = "General"
    etree.SubElement(lit, qn("c:ptCount")).set("val", str(len(values)))
    for i, v in enumerate(values):
        if v is None:
            continue
        pt = etree.SubElement(lit, qn("c:pt"))
        pt.set("idx", str(i))
        etree.SubElement(pt, qn("c:v")).text = repr(float(v))
    return lit


def _error_bars(
    plotted, axis: str | None, values: Sequence[float | None], error: float, colour: str
) -> None:
    """Native error bars on one series (python-pptx has no API for them): a simulated run's
    expected error, value x/÷ (1 + e) as bench.sim.profiles.accuracy.bounds gives it, thin,
    in the run's colour, so the deck's chart shows what the dashboard's does. `axis` "x" or
    "y" on a scatter series; None on a bar series, whose bars run along its value axis
    (c:errDir is for scatter charts). A missing value (a tier the GPU lacks) gets no bar."""
    from lxml import etree

    from bench.sim.profiles.accuracy import error_bar_widths

    up, down = error_bar_widths(values, error)
    bars = etree.Element(qn("c:errBars"))
    settings = (("c:errBarType", "both"), ("c:errValType", "cust"), ("c:noEndCap", "0"))
    for tag, val in ((("c:errDir", axis),) if axis else ()) + settings:
        etree.SubElement(bars, qn(tag)).set("val", val)
    plus, minus = etree.SubElement(bars, qn("c:plus")), etree.SubElement(bars, qn("c:minus"))
    plus.append(_num_lit(up))
    minus.append(_num_lit(down))
    ln = etree.SubElement(etree.SubElement(bars, qn("c:spPr")), qn("a:ln"))
    ln.set("w", str(Pt(1)))
    fill = etree.SubElement(ln, qn("a:solidFill"))
    etree.SubElement(fill, qn("a:srgbClr")).set("val", colour.lstrip("#").upper())
    ser = plotted._element
    # the schema's place: before xVal (scatter), before cat (bar)
    ser.find(qn("c:xVal" if axis else "c:cat")).addprevious(bars)


def _same_point_count(pc) -> None:
    """Give every series of a scatter chart the chart's largest point count (c:ptCount; the
    points a series lacks are blanks, which OOXML allows). LibreOffice 7.4 drops every series
    shorter than one after it when it reads a pptx scatter chart (checked: series of 4, 5 and
    6 points show only the last), which hid the first run of a B200-vs-H100 chart whenever
    the second had more load points; PowerPoint reads either form."""
    caches = [
        c
        for tag in ("c:xVal", "c:yVal")
        for v in pc._chartSpace.iter(qn(tag))
        for c in v.iter(qn("c:numCache"))
    ]
    counts = [c.find(qn("c:ptCount")) for c in caches]
    most = max((int(n.get("val")) for n in counts if n is not None), default=0)
    for n in counts:
        if n is not None:
            n.set("val", str(most))


def _xy_chart(slide, chart: Chart, x, y, w, h):
    data = XyChartData()
    drawn = [s for s in chart.series if s.x]
    for s in drawn:
        series = data.add_series(s.name)
        for xv, yv in zip(s.x, s.y, strict=True):
            if yv is not None:
                series.add_data_point(xv, yv)
    frame = slide.shapes.add_chart(
        XL_CHART_TYPE.XY_SCATTER_LINES, Inches(x), Inches(y), Inches(w), Inches(h), data
    )
    pc = frame.chart
    for s, plotted in zip(drawn, pc.plots[0].series, strict=True):
        plotted.smooth = False
        line = plotted.format.line
        marker = plotted.marker
        if s.reference:  # an SLO limit: grey dashes, no markers
            line.color.rgb = _rgb(s.colour)
            line.width = Pt(1.5)
            line.dash_style = MSO_LINE_DASH_STYLE.DASH
            marker.style = XL_MARKER_STYLE.NONE
            continue
        if s.marker_only:  # a capacity point: a large outlined marker, no line
            line.fill.background()
            marker.style = XL_MARKER_STYLE.DIAMOND
            marker.size = 15
            marker.format.fill.solid()
            marker.format.fill.fore_color.rgb = _rgb(s.colour)
            marker.format.line.color.rgb = RGBColor(0, 0, 0)
            marker.format.line.width = Pt(1.5)
            continue
        line.color.rgb = _rgb(s.colour)
        line.width = Pt(2.5)
        line.dash_style = DASHES[s.style_index % len(DASHES)]
        marker.style = MARKERS[s.style_index % len(MARKERS)]
        marker.size = 9
        marker.format.fill.solid()
        marker.format.fill.fore_color.rgb = _rgb(s.colour)
        marker.format.line.color.rgb = _rgb(s.colour)
        shown = [(xv, yv) for xv, yv in zip(s.x, s.y, strict=True) if yv is not None]
        if s.y_error is not None:  # throughput's (or $/Mtok's)
            _error_bars(plotted, "y", [yv for _, yv in shown], s.y_error, s.colour)
        if s.x_error is not None:  # the latency's or interactivity's, as the dashboard draws
            # it; PowerPoint draws it, LibreOffice 7.4 ignores x bars in a pptx, so the
            # caption says it too
            _error_bars(plotted, "x", [xv for xv, _ in shown], s.x_error, s.colour)
    _same_point_count(pc)
    _style_axis(pc.category_axis, chart.x_title, "#,##0")  # the X value axis of an XY chart
    _style_axis(pc.value_axis, chart.y_title, "#,##0.###" if chart.log_y else "#,##0")
    for axis, log in ((pc.category_axis, chart.log_x), (pc.value_axis, chart.log_y)):
        if log:
            _log_axis(axis)
        else:
            axis.minimum_scale = 0
    _legend(pc)
    _alt_text(frame, chart)
    return frame


def _bar_chart(slide, chart: Chart, x, y, w, h):
    data = CategoryChartData()
    data.categories = chart.categories
    for s in chart.series:
        data.add_series(s.name, s.y, number_format='"$"#,##0.000')
    frame = slide.shapes.add_chart(
        XL_CHART_TYPE.COLUMN_CLUSTERED, Inches(x), Inches(y), Inches(w), Inches(h), data
    )
    pc = frame.chart
    for s, plotted in zip(chart.series, pc.plots[0].series, strict=True):
        fill = plotted.format.fill
        if s.simulated:  # hatched, as the dashboard's bars: a measured run of the same GPU
            fill.patterned()  # shares the colour, and the legend must still tell them apart
            fill.pattern = MSO_PATTERN_TYPE.WIDE_UPWARD_DIAGONAL
            fill.fore_color.rgb = _rgb(s.colour)
            fill.back_color.rgb = RGBColor(0xFF, 0xFF, 0xFF)
        else:
            fill.solid()
            fill.fore_color.rgb = _rgb(s.colour)
        plotted.format.line.color.rgb = _rgb(s.colour)
        if s.y_error is not None:  # a simulated run's $/Mtok x/÷ (1 + e), as the dashboard's;
            # in ink, not the run's colour: the lower half lies on the bar and would vanish
            _error_bars(plotted, None, s.y, s.y_error, str(INK))
    plot = pc.plots[0]
    plot.gap_width = 60
    plot.has_data_labels = True
    labels = plot.data_labels
    labels.number_format = '"$"0.00'
    labels.number_format_is_linked = False
    labels.font.size = Pt(10)
    labels.font.name = FONT
    _style_axis(pc.value_axis, chart.y_title, '"$"#,##0.00')
    pc.category_axis.tick_labels.font.size = Pt(11)
    pc.category_axis.tick_labels.font.name = FONT
    pc.category_axis.has_title = True
    pc.category_axis.axis_title.text_frame.text = chart.x_title
    pc.category_axis.axis_title.text_frame.paragraphs[0].runs[0].font.size = Pt(14)
    _legend(pc)
    _alt_text(frame, chart)
    return frame


def _legend(pc) -> None:
    pc.has_legend = True
    pc.legend.position = XL_LEGEND_POSITION.BOTTOM
    pc.legend.include_in_layout = False
    pc.legend.font.size = Pt(12)
    pc.legend.font.name = FONT


CHART_CAPTIONS = {
    "tput_vs_p99_ttft": (
        "Each marker is one load point; up and to the left is better. Dashed: the SLO limit; "
        "large outlined diamonds: each run's capacity at the SLO."
    ),
    "tput_vs_p99_tpot": (
        "Each marker is one load point; up and to the left is better. Dashed: the SLO limit; "
        "large outlined diamonds: each run's capacity at the SLO."
    ),
    "tput_vs_interactivity": (
        "InferenceX's view: each run's Pareto front (load points no other point beats on both "
        "axes). Higher is more throughput per GPU, further right is faster for each user."
    ),
    "cost_vs_interactivity": (
        "Along each run's Pareto front, on one pricing tier every GPU has; lower is cheaper, "
        "further right is faster for each user."
    ),
    "cost_per_tier": "At each run's capacity point; lower is cheaper.",
}


def chart_slide(prs, report: Report, chart: Chart):
    slide = _slide(prs, report, chart.title)
    tiers = report.tier_note if chart.key == "cost_per_tier" else None
    caption = " ".join(x for x in (CHART_CAPTIONS.get(chart.key), chart.note, tiers) if x)
    chart_h = BODY_BOTTOM - BODY_TOP - 0.5
    if chart.empty:
        _text(slide, MARGIN, BODY_TOP + 1.0, CONTENT_W, 1.5,
              "No data for this chart: " + (chart.note or "the runs carry no such figures."),
              max_pt=20, colour=MUTED)  # fmt: skip
        return slide
    if chart.kind == "xy":
        _xy_chart(slide, chart, MARGIN, BODY_TOP, CONTENT_W, chart_h)
    else:
        _bar_chart(slide, chart, MARGIN, BODY_TOP, CONTENT_W, chart_h)
    _text(slide, MARGIN, BODY_TOP + chart_h + 0.05, CONTENT_W, 0.45, caption, max_pt=12,
          colour=MUTED)  # fmt: skip
    return slide


# ---------------------------------------------------------------- the deck


def _title_slide(prs, report: Report) -> None:
    slide = prs.slides.add_slide(prs.slide_layouts[TITLE_SLIDE])
    band = slide.shapes.add_shape(MSO_SHAPE.RECTANGLE, 0, Inches(2.2), Inches(SLIDE_W),
                                  Inches(2.6))  # fmt: skip
    band.fill.solid()
    band.fill.fore_color.rgb = ACCENT
    band.line.fill.background()
    # The band is drawn first, so the title and subtitle placeholders sit on top of it.
    slide.shapes._spTree.remove(band._element)
    slide.shapes._spTree.insert(2, band._element)
    white = RGBColor(0xFF, 0xFF, 0xFF)
    _title_in_placeholder(slide, report.title, MARGIN + 0.3, 2.4, CONTENT_W - 0.6, 1.2,
                          max_pt=40, min_pt=24, colour=white)  # fmt: skip
    sub = slide.placeholders[1]
    sub.left, sub.top = Inches(MARGIN + 0.3), Inches(3.6)
    sub.width, sub.height = Inches(CONTENT_W - 0.6), Inches(1.0)
    tf = sub.text_frame
    tf.word_wrap = True
    tf.auto_size = MSO_AUTO_SIZE.NONE
    tf.text = ""
    para = tf.paragraphs[0]
    para.alignment = PP_ALIGN.LEFT
    run = para.add_run()
    run.text = report.subtitle
    run.font.size = Pt(fit_pt(report.subtitle, CONTENT_W - 0.7, 0.94, 24, 14))
    run.font.name = FONT
    run.font.color.rgb = white
    runs = "Runs: " + "; ".join(f"{f.legend} [{f.run_id[:8]}]" for f in report.runs)
    _text(slide, MARGIN, 5.1, CONTENT_W, 0.9, runs, max_pt=16, min_pt=10, colour=INK)
    _text(slide, MARGIN, 6.0, CONTENT_W, 0.4, f"Generated {report.generated_at} by tokenbench",
          max_pt=14, colour=MUTED)  # fmt: skip
    if report.any_simulated:
        _text(slide, MARGIN, 1.2, CONTENT_W, 0.7,
              "SIMULATED results: from tokenbench's roofline-modelled endpoint, not from "
              "hardware", max_pt=20, bold=True, colour=WARN)  # fmt: skip


def _money(v: float | None, decimals: int = 0) -> str:
    return "—" if v is None else f"${v:,.{decimals}f}"


def _answer_slide(prs, report: Report) -> None:
    """The first content slide: which system, how many GPUs, $/month and $/Mtok at the SLO."""
    plan = report.plan
    rec = plan.recommendation if plan else None
    if rec is not None:
        title = f"The answer: {rec.gpus} x {rec.gpu_type} on {rec.tier.tier}"
    elif plan is None:
        title = "The answer: capacity and cost at the SLO (no demand given to size for)"
    else:
        title = "The answer: no system could be sized"
    slide = _slide(prs, report, title)
    top = BODY_TOP
    if plan is None:
        head = "No demand given, so no GPU count or $/month. " + (report.sentence or "")
    else:
        head = plan.sentence
    lines = wrapped_lines(head, CONTENT_W - 0.1, 20)
    box_h = min(1.6, lines * 20 * LINE_EM / 72 + 0.15)
    _text(slide, MARGIN, top, CONTENT_W, box_h, head, max_pt=20, min_pt=12, bold=True,
          colour=ACCENT, anchor=MSO_ANCHOR.MIDDLE)  # fmt: skip
    top += box_h + 0.1
    if plan is not None:
        demand = f"Demand: {plan.demand.text()}. " + (
            f"SLO: {', '.join(str(t) for t in plan.slo)} ({plan.slo_source})."
            if plan.slo
            else "No SLO: sized at peak throughput."
        )
        _text(slide, MARGIN, top, CONTENT_W, 0.4, demand, max_pt=13, colour=MUTED)
        top += 0.45
    if report.sentence and plan is not None:
        _text(slide, MARGIN, top, CONTENT_W, 0.6, report.sentence, max_pt=13, colour=INK)
        top += 0.65
    table = report.plan_table
    if table.rows:
        table_slides(prs, report, table, title=title, top=top, max_pt=13, one_page_pt=10,
                     first_slide=slide)  # fmt: skip
    if report.caveats:
        # Leave the caveats to their slide, but say here that they exist.
        _text(slide, MARGIN, BODY_BOTTOM - 0.35, CONTENT_W, 0.35,
              f"{len(report.caveats)} caveats apply (bounds, sample sizes, simulation): see "
              "'Caveats'.", max_pt=12, bold=True, colour=WARN)  # fmt: skip


def _bullets_slide(prs, report: Report, title: str, items: list[str], *, colour=INK) -> None:
    """A list of sentences, as many slides as it needs at a readable size."""
    pages: list[list[str]] = [[]]
    height = BODY_BOTTOM - BODY_TOP
    for item in items:
        trial = pages[-1] + [item]
        if pages[-1] and fit_pt("\n".join("• " + i for i in trial), CONTENT_W - 0.1,
                                height - 0.06, 16, 12) <= 12:  # fmt: skip
            pages.append([item])
        else:
            pages[-1] = trial
    for k, page in enumerate(pages):
        name = title + (f" ({k + 1}/{len(pages)})" if len(pages) > 1 else "")
        slide = _slide(prs, report, name)
        _text(slide, MARGIN, BODY_TOP, CONTENT_W, height, "\n".join("• " + i for i in page),
              max_pt=16, min_pt=10, colour=colour)  # fmt: skip


def _section_slide(prs, report: Report, title: str, subtitle: str) -> None:
    slide = _slide(prs, report, title)
    _text(slide, MARGIN, 3.0, CONTENT_W, 1.0, subtitle, max_pt=20, colour=MUTED)


def _ranking_slide(prs, report: Report) -> None:
    """An experiment's settings ranked (bench.choose): the winner and by how much on top."""
    table = replace(report.ranking_table, note=None)  # its note is the verdict, shown on top
    slide = _slide(prs, report, table.title)
    verdict = report.ranking.verdict
    lines = wrapped_lines(verdict, CONTENT_W - 0.1, 16)
    box_h = min(1.4, lines * 16 * LINE_EM / 72 + 0.15)
    _text(slide, MARGIN, BODY_TOP, CONTENT_W, box_h, verdict, max_pt=16, min_pt=11, bold=True,
          colour=ACCENT)  # fmt: skip
    table_slides(prs, report, table, title=table.title, top=BODY_TOP + box_h + 0.1, max_pt=13,
                 one_page_pt=9, first_slide=slide)  # fmt: skip


def _summary_slide(prs, report: Report) -> None:
    """Capacity at the SLO side by side (the verdict sentence is on the answer slide)."""
    slide = _slide(prs, report, "Executive summary")
    top = BODY_TOP
    if report.missing:
        _text(slide, MARGIN, top, CONTENT_W, 0.35,
              f"Some figures are missing ({len(report.missing)} notes): see 'What this report "
              "could not show' on the next slide.", max_pt=12, bold=True, colour=WARN)  # fmt: skip
        top += 0.4
    # Capacity across the slide (its cells carry intervals and brackets); $/Mtok on the next.
    table_slides(prs, report, report.summary, title="Executive summary: capacity", top=top,
                 max_pt=13, min_pt=8, one_page_pt=9, first_slide=slide)  # fmt: skip
    if report.summary_cost.rows:
        table_slides(prs, report, report.summary_cost, title="Executive summary: $/Mtok at "
                     "capacity, every pricing tier", max_pt=14, one_page_pt=10)  # fmt: skip
    else:
        _text(slide, MARGIN, BODY_BOTTOM - 0.8, CONTENT_W, 0.7,
              "No $/Mtok: no run has both a GPU type with prices and a capacity point (see "
              "'What this report could not show').", max_pt=16, colour=WARN)  # fmt: skip


def _assumptions_slides(prs, report: Report) -> None:
    table_slides(prs, report, report.assumptions, title="Assumptions", max_pt=14)
    if report.plan is not None:
        _bullets_slide(prs, report, "Assumptions: sizing and $/month", report.plan.assumptions)
    prices = report.prices
    if report.tier_note:
        prices = Table(prices.name, prices.title, prices.headers, prices.rows,
                       note=report.tier_note, empty_text=prices.empty_text)  # fmt: skip
    table_slides(prs, report, prices, title="Assumptions: prices, sources and dates", max_pt=12,
                 one_page_pt=9)  # fmt: skip


def write_pptx(report: Report, out: Path) -> Path:
    """Write the deck to `out` (a .pptx path); returns it.

    Order: title; the answer; executive summary; what is missing; the charts (InferenceX's
    two views, then latency with SLO lines, then cost per tier); assumptions (prices with
    sources and dates); methodology; caveats; appendix (percentiles, runs, energy).
    """
    prs = Presentation()
    prs.slide_width, prs.slide_height = Inches(SLIDE_W), Inches(SLIDE_H)
    _title_slide(prs, report)
    _answer_slide(prs, report)
    _summary_slide(prs, report)
    if report.ranking is not None:
        _ranking_slide(prs, report)
    if report.missing:
        table_slides(prs, report, report.missing_table, max_pt=16)
    for chart in report.charts:
        chart_slide(prs, report, chart)
    _assumptions_slides(prs, report)
    table_slides(prs, report, report.methodology, max_pt=14, one_page_pt=10)
    _bullets_slide(prs, report, "Caveats", report.caveats or ["None found: every capacity "
                   "is bracketed by a passing and a failing load, on at least 100 requests "
                   "per point."])  # fmt: skip
    _section_slide(prs, report, "Appendix", "The measured data behind every figure: "
                   "percentiles per load point, runs and software, energy.")  # fmt: skip
    table_slides(prs, report, report.percentiles, title="Appendix: latency percentiles per "
                 "load point", max_pt=11, one_page_pt=10)  # fmt: skip
    table_slides(prs, report, report.runs_table, title="Appendix: runs and software",
                 max_pt=13)  # fmt: skip
    if report.energy.rows:
        table_slides(prs, report, report.energy, title="Appendix: energy per output token",
                     max_pt=13)  # fmt: skip
    if report.classes.rows:  # the run's legend already says its GPU and simulated or not
        deck = without_columns(report.classes, ("Run id", "GPU", "Measured or simulated"))
        table_slides(prs, report, deck, title="Appendix: traffic classes, each against its "
                     "own SLO", max_pt=11, one_page_pt=10)  # fmt: skip
    if report.sim_error.rows:
        table_slides(prs, report, report.sim_error, title="Appendix: expected error of the "
                     "simulated figures", max_pt=11, one_page_pt=9)  # fmt: skip
    if report.prompt_cache.rows:
        table_slides(prs, report, report.prompt_cache, title="Appendix: prompt cache hit "
                     "rates, intended, simulated and measured", max_pt=12)  # fmt: skip
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    prs.save(str(out))
    return out


__all__ = ["column_widths", "fit_pt", "paginate", "wrapped_lines", "write_pptx"]
