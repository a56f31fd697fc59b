"""Dashboard pages: runs table, compare, one run, start a benchmark; plus plotly.js itself.

Pages are rendered on the server with the figures of dashboards/figures.py embedded as JSON
(the same figures the exports write), so a page needs one request for its HTML and the
cached plotly.js, served by the app from its vendored copy: no CDN, works offline.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated
from urllib.parse import parse_qs, quote

import plotly
from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from bench.choose import rank_settings
from bench.cost import cost_error_name, price_text
from bench.curves import (
    class_view,
    compare_runs,
    ratio_sentence,
    stored_slo,
)
from bench.frontier import cost_view_tier, default_interactivity
from bench.metrics import parse_thresholds, slo_text
from bench.plan import span_text
from bench.store import RunNotFoundError, get_run, list_runs
from bench.telemetry import load_telemetry
from dashboards import figures
from dashboards.data import point_details, run_time_series
from dashboards.telemetry import run_telemetry_figure
from server.auth import COOKIE, token_matches
from server.jobs import SCENARIOS_DIR

DASHBOARDS = Path(figures.__file__).resolve().parent
TEMPLATES = DASHBOARDS / "templates"
STATIC = DASHBOARDS / "static"
# plotly.js's "basic" bundle (scatter and bar: every trace the dashboard draws), vendored at
# the same plotly.js version the Python package builds figures for; a quarter of the full
# bundle's size, so pages become interactive sooner (dashboards/static/vendor/README.md).
PLOTLY_JS = (
    Path(__file__).resolve().parents[1] / "dashboards" / "static" / "vendor" / "plotly-basic.min.js"
)
PLOTLY_VERSION = plotly.__version__
CACHE_FOREVER = "public, max-age=31536000, immutable"

router = APIRouter(include_in_schema=False)
# Compare pages of finished runs (immutable) keep their figures' JSON: building plotly
# figures is most of a page's server time. Keyed by runs, SLO, utilisation and catalogue.
FIGURE_CACHE_SIZE = 64
_figure_cache: dict[tuple, tuple[str, list[str]]] = {}
static_router = APIRouter(prefix="/static", include_in_schema=False)

_env = Environment(
    loader=FileSystemLoader(str(TEMPLATES)),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
)


def _num(value, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return f"{value:,.{digits}f}"


def _pct(value) -> str:
    return "—" if value is None else f"{value:.1%}"


def _sim_err(curve, name: str) -> Markup:
    """±X% after a simulated run's figure (its expected error, bench.curves.RunCurve.
    expected_error, from the same functions `sim run` prints with); nothing on a measured run."""
    e = curve.expected_error(name)
    if e is None:
        return Markup("")
    basis = curve.error_bars["basis"]
    return Markup(' <small class="err" title="simulated: {}">±{:.0%}</small>').format(basis, e)


def _utilisation(value: float | None) -> str:
    """A simulated point's load over the simulated maximum rate; an unbounded offered rate
    (rate inf: every request at once) overloads by definition."""
    if value is None:
        return "—"
    return "unbounded rate" if math.isinf(value) else f"{value:.0%}"


def _near_saturation(point) -> Markup:
    """A flag on a simulated point at NEAR_SATURATION or more of the simulated maximum rate."""
    bars = point.error_bars or {}
    if not bars.get("near_saturation"):
        return Markup("")
    return Markup(
        ' <span class="flag" title="load at {} of the simulated maximum request rate: latency '
        'there moves by far more than the stated error for a few per cent of load">near '
        "saturation</span>"
    ).format(_utilisation(bars["utilisation"]))


_env.filters["num"] = _num
_env.filters["pct"] = _pct
_env.filters["err"] = _sim_err
_env.filters["near_saturation"] = _near_saturation
_env.filters["utilisation"] = _utilisation
_env.filters["price"] = price_text  # $/GPU-hour at the precision its $/month needs
_env.globals["span"] = span_text  # a plan's $ figure with its range, as the CLI prints it
_env.globals["cost_error_name"] = cost_error_name  # which throughput error a $/Mtok carries


def render(name: str, status: int = 200, **context) -> HTMLResponse:
    context.setdefault("plotly_src", f"/static/plotly.min.js?v={PLOTLY_VERSION}")
    return HTMLResponse(_env.get_template(name).render(**context), status_code=status)


def figures_json(figs: dict) -> str:
    """Figures as one JSON object, safe inside <script type="application/json">."""
    data = {name: json.loads(fig.to_json()) for name, fig in figs.items()}
    return json.dumps(data, separators=(",", ":")).replace("</", "<\\/")


def _login_redirect(request: Request) -> RedirectResponse | None:
    if request.app.state.tb.guard.read_allowed(request):
        return None
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?next={quote(target)}", status_code=303)


# ---------------------------------------------------------------- static files


@static_router.get("/plotly.min.js")
def plotly_js() -> FileResponse:
    """plotly.js from the installed plotly package (the version the figures were built for)."""
    return FileResponse(
        PLOTLY_JS, media_type="text/javascript", headers={"Cache-Control": CACHE_FOREVER}
    )


# Swagger UI for /docs, vendored from the npm package swagger-ui-dist (no CDN: /docs works
# offline). dashboards/static/vendor/README.md says which version and how to update it.
VENDOR = STATIC / "vendor"
SWAGGER_FILES = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "swagger-ui-favicon-32x32.png": "image/png",
}


@static_router.get("/vendor/{name}")
def vendor_file(name: str) -> Response:
    if name not in SWAGGER_FILES:
        return Response("not found", status_code=404, media_type="text/plain")
    return FileResponse(
        VENDOR / name, media_type=SWAGGER_FILES[name], headers={"Cache-Control": "no-cache"}
    )


@router.get("/docs")
def swagger_docs(request: Request) -> HTMLResponse:
    """FastAPI's Swagger UI page, with its script and styles served by this app."""
    from fastapi.openapi.docs import get_swagger_ui_html

    return get_swagger_ui_html(
        openapi_url=request.app.openapi_url,
        title=f"{request.app.title} API",
        swagger_js_url="/static/vendor/swagger-ui-bundle.js",
        swagger_css_url="/static/vendor/swagger-ui.css",
        swagger_favicon_url="/static/vendor/swagger-ui-favicon-32x32.png",
    )


@static_router.get("/{name}")
def static_file(name: str) -> Response:
    path = (STATIC / name).resolve()
    if path.parent != STATIC or not path.is_file():
        return Response("not found", status_code=404, media_type="text/plain")
    media = {"js": "text/javascript", "css": "text/css"}.get(path.suffix.lstrip("."), "text/plain")
    return FileResponse(path, media_type=media, headers={"Cache-Control": "no-cache"})


# ---------------------------------------------------------------- login (reads off loopback)


@router.get("/login")
def login_page(next: str = "/") -> HTMLResponse:  # noqa: A002 - the usual name
    return render("login.html", next=next if next.startswith("/") else "/", error=None)


@router.post("/login")
async def login(request: Request) -> Response:
    """The login form (urlencoded, parsed here: no python-multipart dependency)."""
    form = parse_qs((await request.body())[:10_000].decode("utf-8", "replace"))
    token = (form.get("token") or [""])[0]
    next = (form.get("next") or ["/"])[0]  # noqa: A001 - the usual name
    guard = request.app.state.tb.guard
    target = next if next.startswith("/") and not next.startswith("//") else "/"
    if not token_matches(token, guard.token):
        return render("login.html", next=target, error="That is not the service's token.")
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict", max_age=7 * 24 * 3600)
    return response


# ---------------------------------------------------------------- pages


@router.get("/favicon.ico")
def favicon() -> Response:
    return Response(status_code=204)


@router.get("/")
def home() -> RedirectResponse:
    return RedirectResponse("/runs", status_code=307)


@router.get("/runs")
def runs_page(
    request: Request,
    gpu: Annotated[str | None, Query(max_length=64)] = None,
    model: Annotated[str | None, Query(max_length=200)] = None,
    label: Annotated[str | None, Query(max_length=200)] = None,
    source: Annotated[str | None, Query(max_length=16)] = None,
) -> Response:
    if (redirect := _login_redirect(request)) is not None:
        return redirect
    runs = list_runs(request.app.state.tb.db_url, gpu=gpu, model=model, label=label, limit=2000)
    if source == "simulated":
        runs = [r for r in runs if r.simulated]
    elif source == "measured":
        runs = [r for r in runs if not r.simulated and not r.imported_from]
    elif source == "imported":
        runs = [r for r in runs if r.imported_from]
    return render(
        "runs.html",
        runs=runs,
        filters={
            "gpu": gpu or "",
            "model": model or "",
            "label": label or "",
            "source": source or "",
        },
    )


def _default_slo(run_ids: list[str], db) -> str:
    """The SLO the runs were swept against, when they all share one (bench.curves.stored_slo,
    the default of the CLI's compare, the API and the exports too)."""
    return slo_text(stored_slo([get_run(rid, db) for rid in run_ids]))


def _reference(curves, ref: str | None):
    """The reference (baseline) run: `ref` as a run id or unique prefix, else the first."""
    if ref:
        for c in curves:
            if c.run_id == ref or (len(ref) >= 4 and c.run_id.startswith(ref)):
                return c
    return curves[0]


def _query(curves, **params) -> str:
    """The compare page's query string for these runs with `params` (None values dropped)."""
    parts = [f"run={quote(c.run_id)}" for c in curves]
    parts += [f"{k}={quote(str(v))}" for k, v in params.items() if v not in (None, "")]
    return "&".join(parts)


@router.get("/compare")
def compare_page(
    request: Request,
    run: Annotated[list[str], Query(max_length=20)] = [],  # noqa: B006 - FastAPI reads it
    slo: Annotated[str | None, Query(max_length=500)] = None,
    utilisation: Annotated[float, Query(gt=0, le=1)] = 1.0,
    ref: Annotated[str | None, Query(max_length=64)] = None,
    at: Annotated[float | None, Query(gt=0, le=1e6)] = None,
    tier: Annotated[str | None, Query(max_length=100)] = None,
    demand_rps: Annotated[float | None, Query(gt=0, le=1e7)] = None,
    peak: Annotated[float | None, Query(ge=1, le=100)] = None,
) -> Response:
    """Runs side by side; `ref` is the baseline every other run's ratio is taken against,
    `at` the interactivity (tok/s per user) where the throughput fronts are read."""
    if (redirect := _login_redirect(request)) is not None:
        return redirect
    state = request.app.state.tb
    if not run:
        return render("message.html", title="Compare", message="Select runs on the Runs page.")
    try:
        curves = state.curves(run)
    except RunNotFoundError as exc:
        return render("message.html", title="Compare", message=str(exc), status=404)
    if slo is None:
        slo = _default_slo([c.run_id for c in curves], state.db_url)
    error = None
    try:
        slo_t = parse_thresholds(slo, flag="SLO")
    except ValueError as exc:
        slo_t, error = [], str(exc)
    comps = compare_runs(curves, slo_t, state.catalogue, utilisation)
    # an experiment's settings ranked, when the runs are its settings (tune, sim tune)
    ranking = rank_settings(comps, [get_run(c.run_id, state.db_url) for c in curves])
    reference = _reference(curves, ref)
    ref_comp = next(c for c in comps if c.curve is reference)
    sentences = [ratio_sentence([c, ref_comp]) for c in comps if c is not ref_comp]
    tpot_limits = [t.limit for t in slo_t if t.metric == "p99_tpot_ms" and t.op in ("<", "<=")]
    chosen_at = at or default_interactivity(curves, min(tpot_limits, default=None))
    tiers = figures.run_tiers(curves, state.catalogue)
    chosen_tier = tier if tier in tiers else cost_view_tier(curves, state.catalogue)
    key = (
        tuple((c.run_id, c.status, len(c.points), c.colour) for c in curves),
        tuple(str(t) for t in slo_t),
        utilisation,
        chosen_at,
        chosen_tier,
        id(state),
        id(state.catalogue),
    )
    finished = all(c.status != "running" for c in curves)
    charts = _figure_cache.get(key) if finished else None
    if charts is None:
        figs = figures.compare_figures(
            curves,
            state.catalogue,
            slo=slo_t,
            utilisation=utilisation,
            interactivity=chosen_at,
            tier=chosen_tier,
            comparisons=comps,
            tier_menu=False,  # the form's tier field picks it: fewer traces to draw
        )
        charts = (figures_json(figs), list(figs))
        if finished:
            if len(_figure_cache) >= FIGURE_CACHE_SIZE:
                _figure_cache.pop(next(iter(_figure_cache)))
            _figure_cache[key] = charts
    plan = _plan(comps, curves, state, demand_rps, peak, "given" if slo_t else "none")
    readout = figures.interactivity_readout(curves, chosen_at) if chosen_at else []
    ref_value = next((v for c, v in readout if c is reference), None)
    # runs read faster than their SLO capacity: the read-out is then another question
    caps = {c.curve.run_id: c.at_slo.value for c in comps if c.at_slo and c.at_slo.value}
    past_slo = [
        c.legend for c, v in readout if v and c.run_id in caps and v > caps[c.run_id] * 1.0001
    ]
    keep = {"slo": slo or None, "utilisation": utilisation if utilisation != 1.0 else None}
    return render(
        "compare.html",
        curves=curves,
        styles=dict(zip([c.run_id for c in curves], figures.run_styles(curves), strict=True)),
        glyphs=GLYPHS,
        comparisons=comps,
        ranking=ranking,
        reference=reference,
        sentences=[s for s in sentences if s],
        slo=slo or "",
        utilisation=utilisation,
        at=chosen_at,
        tiers=tiers,
        tier=chosen_tier,
        plan=plan,
        demand_rps=demand_rps,
        peak=peak,
        readout=readout,
        ref_value=ref_value,
        past_slo=past_slo,
        error=error,
        figures_json=charts[0],
        chart_names=charts[1],
        run_query=_query(curves),
        # every download and JSON link carries the page's SLO, utilisation, tier and demand,
        # so each renders the report this page shows (bench.export.report.build_report)
        download_query=_query(
            curves,
            slo=slo or None,
            utilisation=utilisation,
            tier=chosen_tier,
            demand_rps=demand_rps,
            peak=peak,
        ),
        plan_query=_query(
            curves,
            slo=slo or None,
            requests_per_s=demand_rps,
            peak_factor=peak if demand_rps is not None or peak is not None else None,
        ),
        ref_query=lambda c: _query(curves, ref=c.run_id, at=at, tier=tier, **keep),
        cheapest=_cheapest,
        unavailable=unavailable_downloads(),
        downloads=download_labels(),
        thin=figures.THIN_SAMPLE,
        ci=_ci_text,
    )


def download_labels() -> list[tuple[str, str]]:
    """(format, button label) of every format the API serves as a download (the registry)."""
    from bench.export.formats import downloads

    return [(fmt, kind.label) for fmt, kind in downloads().items()]


def unavailable_downloads() -> dict[str, str]:
    """Download formats whose optional extra is not installed -> what to install, so the
    page shows the hint instead of a link that answers 400."""
    from bench.export.formats import downloads
    from bench.extras import available, missing_message

    return {
        fmt: missing_message(*kind.extra)
        for fmt, kind in downloads().items()
        if kind.extra is not None and not available(kind.extra[0])
    }


def _plan(comps, curves, state, demand_rps: float | None, peak: float, slo_source: str):
    """The buying answer (bench.plan) for the demand given, else bench.plan.default_demand
    (the one the CLI's plan, the API and the exports use); None when there is none. A peak
    factor given replaces the default's."""
    from bench.plan import plan_capacity, resolve_demand

    demand = resolve_demand([get_run(c.run_id, state.db_url) for c in curves], demand_rps, peak)
    if demand is None:
        return None
    return plan_capacity(comps, demand, state.catalogue, slo_source=slo_source)


def _ci_text(point, metric: str) -> Markup:
    """' <small>(95% 140-171)</small>' after a P99 cell; nothing without an interval."""
    ci = point.ci(metric, "p99")
    if ci is None:
        return Markup("")
    lo, hi = (_num(v, 1) if v is not None else "open" for v in ci)
    return Markup(" <small class='ci'>({}–{})</small>").format(lo, hi)


# Each plotly marker symbol as a character, so tables show the mark the charts draw.
GLYPHS = {
    "circle": "●",
    "square": "■",
    "diamond": "◆",
    "triangle-up": "▲",
    "x": "✕",
    "star-triangle-down": "▼",
    "cross": "✚",
    "hexagon": "⬢",
}


def _cheapest(rows):
    priced = [r for r in rows if r.output_usd_per_mtok_at_utilisation is not None]
    return min(priced, key=lambda r: r.output_usd_per_mtok_at_utilisation) if priced else None


@router.get("/runs/{ref}")
def run_page(request: Request, ref: str) -> Response:
    if (redirect := _login_redirect(request)) is not None:
        return redirect
    state = request.app.state.tb
    try:
        run = get_run(ref, state.db_url)
    except RunNotFoundError as exc:
        return render("message.html", title="Run", message=str(exc), status=404)
    curve = state.curve(run.id)
    details = point_details(run, state.db_url)
    series, spans = run_time_series(run, state.db_url)
    cdfs = {d.load_point: d.cdfs for d in details}
    figs = {}
    if series["t_s"]:
        figs["timeseries"] = figures.run_time_series(curve, series, load_points=spans)
    if not load_telemetry(run.id, state.db_url).empty:
        figs["telemetry"] = run_telemetry_figure(run.id, state.db_url)
    if details:
        figs["cdf_ttft"] = figures.latency_cdfs(curve, cdfs, "ttft")
        figs["cdf_tpot"] = figures.latency_cdfs(curve, cdfs, "tpot")
        figs["cdf_e2el"] = figures.latency_cdfs(curve, cdfs, "e2el")
        figs["errors"] = figures.errors_by_kind(curve, {d.load_point: d.errors for d in details})
    classes = class_view(curve, run)
    return render(
        "run.html",
        run=run,
        curve=curve,
        class_rows=classes.rows,
        class_slo=", ".join(str(t) for t in classes.slo),
        capacity=classes.capacity,
        figures_json=figures_json(figs),
        chart_names=list(figs),
    )


@router.get("/new")
def new_page(request: Request) -> Response:
    if (redirect := _login_redirect(request)) is not None:
        return redirect
    state = request.app.state.tb
    scenarios = sorted(p.stem for p in SCENARIOS_DIR.glob("*.yaml"))
    return render(
        "new.html",
        scenarios=scenarios,
        allow=state.allow.describe(),
        gpus=["B200-SXM", "H100-SXM", "H200-SXM", "B300-SXM", "MI300X", "MI355X"],
    )
