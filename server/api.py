"""The REST API under /api: reads of runs, curves and costs; writes that start, follow and
cancel background runs, delete runs and add pricing tiers.

Every answer is a pydantic model from server/models.py. A bad body or query gets a 422
whose `detail` has FastAPI's shape (`loc` names the field, `msg` says what is wrong), also
for problems found past pydantic (a scenario's YAML, an SLO string, a catalogue rule).
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.responses import Response, StreamingResponse

from bench.cost import PriceCatalogueError, price_per_gpu_hour
from bench.curves import (
    capacity_ratio,
    class_view,
    compare_runs,
    cost_rows_at,
    ratio_sentence,
    resolve_slo,
)
from bench.export.formats import EXPORT_FORMATS, downloads
from bench.metrics import parse_thresholds
from bench.overrides import Overrides, canonical_gpu, resolve_scenario
from bench.scenario import API_KEY_ENV, ScenarioError
from bench.store import (
    RunBusyError,
    delete_run,
    get_run,
    list_runs,
    request_page,
    resolve_run,
)
from dashboards.data import run_time_series
from server.datafiles import DataFileError, TooLargeError, without_contents
from server.jobs import SCENARIOS_DIR, JobPlan, QueueFullError
from server.models import (
    CapacityOut,
    ClassesOut,
    ClassRowOut,
    CompareOut,
    ComparisonOut,
    CurveOut,
    DataFileOut,
    DeletedOut,
    ErrorOut,
    JobIn,
    JobOut,
    KindOut,
    PlanOut,
    RatioOut,
    RegistryOut,
    RequestOut,
    RequestsPage,
    RunCostOut,
    RunDetail,
    RunOut,
    Span,
    TierIn,
    TierOut,
    TimeSeriesOut,
)

SSE_POLL_S = 0.25
SSE_KEEPALIVE_S = 15.0
SSE_MAX_S = 24 * 3600.0  # a follower is cut off after a day, whatever happens
REACH_TIMEOUT_S = 2.0
MAX_ROW_ID = 2**63 - 1  # SQL BIGINT: a larger ?after= overflowed the driver (a 500)

RunRef = Annotated[
    str, Path(min_length=1, max_length=100, description="run id, unique id prefix or name")
]
RunRefs = Annotated[
    list[str],
    Query(
        alias="run",
        min_length=1,
        max_length=20,
        description="run ids, prefixes or names (repeat ?run=); the first is the reference",
    ),
]
Slo = Annotated[
    str | None,
    Query(max_length=500, description="e.g. p99_ttft_ms<=500,p99_tpot_ms<=50"),
]
Utilisation = Annotated[float, Query(gt=0, le=1, description="fleet utilisation for $/Mtok")]

NOT_FOUND = {404: {"model": ErrorOut, "description": "no such run or job"}}
AUTH = {401: {"model": ErrorOut, "description": "missing or wrong bearer token"}}


def tb(request: Request):
    return request.app.state.tb


def read_access(request: Request) -> None:
    tb(request).guard.read(request)


def write_access(request: Request) -> None:
    tb(request).guard.write(request)


router = APIRouter(prefix="/api", dependencies=[Depends(read_access)], responses=AUTH)
Write = Depends(write_access)


def invalid(loc: list, message: str) -> HTTPException:
    """A 422 shaped like FastAPI's own validation errors, naming the field."""
    return HTTPException(422, detail=[{"loc": loc, "msg": message, "type": "value_error"}])


def thresholds(slo: str | None, loc: list):
    try:
        return parse_thresholds(slo, flag="slo")
    except ValueError as exc:
        raise invalid(loc, str(exc)) from None


# ---------------------------------------------------------------- runs


@router.get("/runs", response_model=list[RunOut], summary="List stored runs, newest first")
def runs(
    request: Request,
    gpu: Annotated[str | None, Query(max_length=64, description="substring of GPU type")] = None,
    model: Annotated[str | None, Query(max_length=200)] = None,
    label: Annotated[str | None, Query(max_length=200)] = None,
    status: Literal["running", "completed", "interrupted", "failed"] | None = None,
    simulated: Annotated[bool | None, Query(description="true: simulated only")] = None,
    imported: Annotated[bool | None, Query(description="true: imported results only")] = None,
    since: Annotated[datetime | None, Query(description="created at or after (ISO 8601)")] = None,
    until: Annotated[datetime | None, Query(description="created before (ISO 8601)")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 500,
) -> list[RunOut]:
    found = list_runs(
        tb(request).db_url,
        gpu=gpu,
        model=model,
        label=label,
        status=status,
        imported=imported,
        limit=None if (simulated is not None or since or until) else limit,
    )
    out = []
    for run in found:
        if simulated is not None and run.simulated != simulated:
            continue
        if since is not None and run.created_at < _aware(since):
            continue
        if until is not None and run.created_at >= _aware(until):
            continue
        out.append(RunOut.from_info(run))
        if len(out) >= limit:
            break
    return out


def _aware(when: datetime) -> datetime:
    from datetime import UTC

    return when if when.tzinfo else when.replace(tzinfo=UTC)


@router.get("/runs/{ref}", response_model=RunDetail, responses=NOT_FOUND)
def run_detail(request: Request, ref: RunRef) -> RunDetail:
    """One run: metadata, summary, scenario, and each load point with its summary."""
    return RunDetail.from_info(get_run(ref, tb(request).db_url))


@router.get("/runs/{ref}/classes", response_model=ClassesOut, responses=NOT_FOUND)
def run_classes(request: Request, ref: RunRef) -> ClassesOut:
    """A run's traffic classes at each load point: requests, P99s, whether each meets its own
    SLO, its prompt-cache hit rates, and a sweep's capacity naming the class that binds
    (the run page's table; rows are empty for a run without classes)."""
    state = tb(request)
    run = get_run(ref, state.db_url)
    curve = state.curve(run.id)
    view = class_view(curve, run)
    return ClassesOut(
        run_id=run.id,
        simulated=run.simulated,
        slo=[str(t) for t in view.slo],
        capacity=CapacityOut.from_capacity(view.capacity, curve.gpu_count),
        binding_class=view.binding,
        rows=[ClassRowOut.from_row(r) for r in view.rows],
    )


@router.get("/runs/{ref}/requests", response_model=RequestsPage, responses=NOT_FOUND)
def run_requests(
    request: Request,
    ref: RunRef,
    load_point: Annotated[int | None, Query(ge=0, le=1_000_000)] = None,
    state: Literal["ok", "failed", "cancelled"] | None = None,
    after: Annotated[
        int, Query(ge=0, le=MAX_ROW_ID, description="row id to continue after (next_after)")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
) -> RequestsPage:
    """A page of a run's requests, by load point then stored order (keyset paging).

    Paging follows the (run_id, load_point) index, id included, so a page costs the same
    at the millionth request as at the first: pass next_after back as ?after=.
    """
    db = tb(request).db_url
    run_id = resolve_run(ref, db)
    page = request_page(run_id, db, load_point=load_point, state=state, after=after, limit=limit)
    return RequestsPage(
        run_id=run_id,
        load_point=load_point,
        items=[
            RequestOut.model_validate({k: v for k, v in r.items() if k != "run_id"})
            for r in page.rows
        ],
        next_after=page.next_after,
    )


@router.get("/runs/{ref}/timeseries", response_model=TimeSeriesOut, responses=NOT_FOUND)
def run_timeseries(
    request: Request,
    ref: RunRef,
    bucket_s: Annotated[float, Query(ge=0.1, le=3600)] = 1.0,
) -> TimeSeriesOut:
    """Offered vs achieved requests/s and P99 TTFT per bucket, so a burst's effect shows."""
    run = get_run(ref, tb(request).db_url)
    series, spans = run_time_series(run, tb(request).db_url, bucket_s)
    return TimeSeriesOut(
        run_id=run.id,
        bucket_s=bucket_s,
        t_s=series["t_s"],
        offered_rps=series["offered_rps"],
        achieved_rps=series["achieved_rps"],
        p99_ttft_ms=series["p99_ttft_ms"],
        output_tps=series["output_tps"],
        load_points=[Span(start_s=a, end_s=b, title=t) for a, b, t in spans],
    )


@router.delete(
    "/runs/{ref}",
    response_model=DeletedOut,
    dependencies=[Write],
    responses={**NOT_FOUND, 409: {"model": ErrorOut, "description": "a job is writing it"}},
)
def run_delete(request: Request, ref: RunRef) -> DeletedOut:
    """Delete a run and all its requests (not one a background job is still writing)."""
    state = tb(request)
    run_id = resolve_run(ref, state.db_url)
    if run_id in state.jobs.active_run_ids():
        raise HTTPException(409, detail=f"run {run_id[:8]} is being written by a job; cancel it")
    try:
        n = delete_run(run_id, state.db_url)
    except RunBusyError as exc:  # written by another process (a CLI run, another service)
        raise HTTPException(409, detail=str(exc)) from None
    state.forget(run_id)
    return DeletedOut(run_id=run_id, deleted_requests=n)


# ---------------------------------------------------------------- curves and costs


@router.get("/curves", response_model=list[CurveOut], responses=NOT_FOUND)
def curves(request: Request, run: RunRefs) -> list[CurveOut]:
    """Each run's load points as a curve (per-GPU throughput, latency percentiles, ...)."""
    return [CurveOut.of(c) for c in tb(request).curves(run)]


@router.get("/compare", response_model=CompareOut, responses=NOT_FOUND)
def compare(
    request: Request, run: RunRefs, slo: Slo = None, utilisation: Utilisation = 1.0
) -> CompareOut:
    """Capacity at the SLO (or peak), the point at matched load and $/Mtok on every tier.

    Without `slo`, the SLO stored with the runs (when they share one) is used, as the CLI's
    `compare`, the dashboard and the exports do; `slo_source` says which.
    """
    state = tb(request)
    curves = state.curves(run)
    slo_t, source = slo_for(slo, curves, state)
    comps = compare_runs(curves, slo_t, state.catalogue, utilisation)
    ratio = capacity_ratio(comps[0].at_slo, comps[1].at_slo)[0] if len(comps) > 1 else None
    return CompareOut(
        slo=[str(t) for t in slo_t],
        slo_source=source,
        utilisation=utilisation,
        runs=[ComparisonOut.from_comparison(c) for c in comps],
        sentence=ratio_sentence(comps),
        ratio=RatioOut.of(ratio),
    )


def slo_for(slo: str | None, curves, state):
    """The given SLO, else the one stored with the runs (bench.curves.resolve_slo)."""
    try:
        return resolve_slo(slo, [get_run(c.run_id, state.db_url) for c in curves])
    except ValueError as exc:
        raise invalid(["query", "slo"], str(exc)) from None


@router.get("/plan", response_model=PlanOut, responses=NOT_FOUND)
def plan(
    request: Request,
    run: RunRefs,
    requests_per_s: Annotated[
        float | None, Query(gt=0, description="mean demand in requests/s")
    ] = None,
    tokens_per_day: Annotated[
        float | None, Query(gt=0, description="mean demand in output tokens/day")
    ] = None,
    peak_factor: Annotated[float, Query(ge=1, le=100, description="peak / mean")] = 1.0,
    gpus_per_node: Annotated[int, Query(ge=1, le=1024)] = 8,
    slo: Slo = None,
    mix: Annotated[
        str | None,
        Query(
            max_length=1000,
            description="demand as a mix of traffic classes, CLASS=REQ_PER_S: "
            "'chat=30,agent=10' (as `tokenbench plan --mix`); not with the other demands",
        ),
    ] = None,
) -> PlanOut:
    """The buying answer: GPUs and nodes each run's system needs for the demand at the SLO,
    $/month and $/Mtok on every pricing tier, and the cheapest option meeting the SLO.
    Without a demand, the first run's scenario mean rate is used (`demand.source` says so)."""
    from bench.plan import Demand, default_demand, parse_mix, plan_capacity

    state = tb(request)
    curves = state.curves(run)
    slo_t, source = slo_for(slo, curves, state)
    if requests_per_s is not None and tokens_per_day is not None:
        raise invalid(
            ["query", "tokens_per_day"], "give requests_per_s or tokens_per_day, not both"
        )
    if mix is not None:
        if requests_per_s is not None or tokens_per_day is not None:
            raise invalid(["query", "mix"], "give mix, or requests_per_s, or tokens_per_day (one)")
        try:
            classes = parse_mix(mix)
        except ValueError as exc:
            raise invalid(["query", "mix"], str(exc)) from None
        demand = Demand(requests_per_s=sum(classes.values()), peak_factor=peak_factor, mix=classes)
    elif requests_per_s is None and tokens_per_day is None:
        demand = default_demand([get_run(curves[0].run_id, state.db_url)])
        if demand is None:
            raise invalid(
                ["query", "requests_per_s"],
                "give requests_per_s or tokens_per_day (none stored with the run, and its "
                "scenario has no mean rate)",
            )
        if "peak_factor" in request.query_params:
            demand = Demand(demand.requests_per_s, demand.output_tokens_per_day, peak_factor,
                            demand.source)  # fmt: skip
    else:
        demand = Demand(requests_per_s, tokens_per_day, peak_factor)
    comps = compare_runs(curves, slo_t, state.catalogue)
    return PlanOut.from_plan(
        plan_capacity(
            comps, demand, state.catalogue, slo_source=source, gpus_per_node=gpus_per_node
        )
    )


# The formats the API serves as one download, from the export-format registry.
EXPORT_TYPES = {name: kind.media_type for name, kind in downloads().items()}
ExportName = EXPORT_FORMATS.name_type(only=lambda kind: kind.downloadable)


@router.get(
    "/export",
    responses={
        **NOT_FOUND,
        400: {"model": ErrorOut, "description": "pptx/xlsx need pip install 'tokenbench[export]'"},
        200: {"content": {t: {} for t in EXPORT_TYPES.values()}},
    },
    response_class=Response,
)
def export(
    request: Request,
    run: RunRefs,
    format: Annotated[ExportName, Query()] = "pptx",
    slo: Slo = None,
    utilisation: Utilisation = 1.0,
    tier: Annotated[str | None, Query(max_length=100, description="tier of the cost view")] = None,
    demand_rps: Annotated[float | None, Query(gt=0, le=1e7, description="mean req/s")] = None,
    peak: Annotated[float | None, Query(ge=1, le=100, description="peak / mean")] = None,
) -> Response:
    """The compare page's download: the same report `tokenbench export` writes (csv as a
    zip), for the page's SLO, utilisation, tier and demand (its links carry them)."""
    import tempfile
    from pathlib import Path as FilePath

    from bench.export.formats import write
    from bench.export.report import build_report
    from bench.plan import resolve_demand

    state = tb(request)
    slo_t = thresholds(slo, ["query", "slo"]) if slo else None
    refs = [resolve_run(r, state.db_url) for r in run]
    demand = resolve_demand([get_run(r, state.db_url) for r in refs], demand_rps, peak)
    report = build_report(
        refs, state.db_url, slo_t, state.catalogue, utilisation, demand=demand, tier=tier
    )
    suffix = EXPORT_FORMATS.get(format).download_suffix
    with tempfile.TemporaryDirectory() as tmp:
        written = write(report, format, FilePath(tmp) / f"report.{suffix}")
        data = FilePath(written).read_bytes()
    name = f"tokenbench-{'-'.join(r[:8] for r in refs)}.{suffix}"
    return Response(
        data,
        media_type=EXPORT_FORMATS.get(format).media_type,
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )


@router.get("/costs", response_model=list[RunCostOut], responses=NOT_FOUND)
def costs(
    request: Request,
    run: RunRefs,
    tier: Annotated[
        list[str] | None, Query(max_length=50, description="tier names (repeat); all if none")
    ] = None,
    at: Annotated[
        Literal["capacity", "peak", "all"],
        Query(description="capacity: at the SLO (peak without one); all: every load point"),
    ] = "capacity",
    slo: Slo = None,
    utilisation: Utilisation = 1.0,
) -> list[RunCostOut]:
    """$/Mtok (output and total tokens) per pricing tier for each run."""
    state = tb(request)
    curves = state.curves(run)
    slo_t = slo_for(slo, curves, state)[0] if at == "capacity" else []
    out = []
    for comp in compare_runs(curves, slo_t, state.catalogue, utilisation):
        curve = comp.curve
        if at == "all":
            chosen = [(p, "load point", None) for p in curve.points]
        else:
            chosen = [(comp.capacity, comp.basis, comp.cost_rows)]
        for point, basis, priced in chosen:
            rows = (
                priced
                if priced is not None
                else cost_rows_at(curve, point, state.catalogue, utilisation)
            )
            if tier:
                rows = [r for r in rows if r.tier in tier]
            out.append(
                RunCostOut(
                    run_id=curve.run_id,
                    legend=curve.legend,
                    load_point=point.load_point if point else None,
                    point_title=point.title if point else None,
                    basis=basis,
                    rows=rows,
                )
            )
    return out


@router.get("/kinds", response_model=list[RegistryOut])
def kinds() -> list[RegistryOut]:
    """What each seam accepts (bench.registry): load shapes, datasets, dialects, export
    formats, telemetry sources and metric vocabularies, each kind with its description."""
    from bench.registry import all_registries

    return [
        RegistryOut(
            registry=r.noun,
            where=r.where,
            kinds=[KindOut(name=n, description=d) for n, d in r.describe().items()],
        )
        for r in all_registries()
    ]


@router.get("/prices", response_model=list[TierOut])
def prices(
    request: Request, gpu: Annotated[str | None, Query(max_length=64)] = None
) -> list[TierOut]:
    """The pricing catalogue: every tier's effective $/GPU-hour, with its source and date."""
    cat = tb(request).catalogue
    try:
        tiers = cat.tiers(gpu)
    except PriceCatalogueError as exc:
        raise invalid(["query", "gpu"], str(exc)) from None
    return [_tier_out(t, cat) for t in tiers]


def _tier_out(t, cat) -> TierOut:
    try:
        price, note = price_per_gpu_hour(t, cat), None
    except PriceCatalogueError as exc:
        price, note = None, str(exc)
    return TierOut(
        gpu=t.gpu,
        name=t.name,
        kind=t.kind,
        provider=t.provider,
        price_usd_per_gpu_hr=price,
        low=t.low,
        high=t.high,
        term_years=t.term_years,
        source=t.source,
        date=t.date,
        note=t.note,
        price_note=note,
    )


@router.post("/prices/tiers", response_model=TierOut, status_code=201, dependencies=[Write])
def add_tier(request: Request, body: TierIn) -> TierOut:
    """Add a flat-priced tier to a GPU (or re-price one); every $/Mtok then includes it."""
    state = tb(request)
    try:
        cat = state.add_tier(body.model_dump())
    except PriceCatalogueError as exc:
        raise invalid(["body"], str(exc)) from None
    return _tier_out(cat.tier(body.gpu, body.name), cat)


# ---------------------------------------------------------------- data folder


@router.get("/data", response_model=list[DataFileOut])
def data_files(request: Request) -> list[DataFileOut]:
    """Files in the service's data folder: what scenarios sent here may read (trace, dataset)."""
    return [DataFileOut(**f) for f in tb(request).data.listing()]


@router.put(
    "/data/{name}",
    response_model=DataFileOut,
    status_code=201,
    dependencies=[Write],
    responses={413: {"model": ErrorOut, "description": "over the per-file size limit"}},
)
async def upload_data(
    request: Request, name: Annotated[str, Path(min_length=1, max_length=100)]
) -> DataFileOut:
    """Put a file (the raw body) in the data folder, replacing one of the same name."""
    try:
        _, size = await tb(request).data.save(name, request.stream())
    except TooLargeError as exc:
        raise HTTPException(413, detail=str(exc)) from None
    except DataFileError as exc:
        raise invalid(["path", "name"], str(exc)) from None
    return DataFileOut(name=name, bytes=size)


# ---------------------------------------------------------------- background runs


@router.post(
    "/jobs",
    response_model=JobOut,
    status_code=202,
    dependencies=[Write],
    responses={
        403: {"model": ErrorOut, "description": "target host not in the allow-list"},
        429: {"model": ErrorOut, "description": "too many jobs waiting"},
    },
)
def start_job(request: Request, body: JobIn) -> JobOut:
    """Start a run or a sweep in the background; follow it at /api/jobs/{id}/events."""
    state = tb(request)
    plan = build_plan(body, state)
    try:
        job = state.jobs.submit(plan)
    except QueueFullError as exc:
        raise HTTPException(429, detail=str(exc)) from None
    return job.to_out()


@router.get("/jobs", response_model=list[JobOut])
def jobs(request: Request) -> list[JobOut]:
    """Jobs since the service started, newest first."""
    return [j.to_out() for j in tb(request).jobs.list()]


def _job(request: Request, job_id: str):
    job = tb(request).jobs.get(job_id)
    if job is None:
        raise HTTPException(404, detail=f"no job {job_id!r} (jobs live as long as the service)")
    return job


JobId = Annotated[str, Path(min_length=1, max_length=64)]


@router.get("/jobs/{job_id}", response_model=JobOut, responses=NOT_FOUND)
def job(request: Request, job_id: JobId) -> JobOut:
    return _job(request, job_id).to_out()


@router.post(
    "/jobs/{job_id}/cancel", response_model=JobOut, dependencies=[Write], responses=NOT_FOUND
)
def cancel_job(request: Request, job_id: JobId) -> JobOut:
    """Stop a job gently: what it measured is kept and the run is stored as interrupted."""
    state = tb(request)
    return state.jobs.cancel(_job(request, job_id)).to_out()


@router.get(
    "/jobs/{job_id}/events",
    responses={
        **NOT_FOUND,
        200: {
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
            "description": "`event: progress` with a JobOut as data on every change; "
            "`event: end` with the final JobOut",
        },
    },
    response_class=StreamingResponse,
)
async def job_events(request: Request, job_id: JobId) -> StreamingResponse:
    """Server-sent events: the job's state on every change until it ends."""
    job = _job(request, job_id)

    async def events():
        seen, quiet = -1, 0.0
        for _ in range(int(SSE_MAX_S / SSE_POLL_S)):
            if job.version != seen:
                seen = job.version
                quiet = 0.0
                kind = "end" if job.done else "progress"
                yield f"event: {kind}\ndata: {job.to_out().model_dump_json()}\n\n"
                if job.done:
                    return
            elif quiet >= SSE_KEEPALIVE_S:
                quiet = 0.0
                yield ": keepalive\n\n"
            if await request.is_disconnected():
                return
            await asyncio.sleep(SSE_POLL_S)
            quiet += SSE_POLL_S

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


def build_plan(body: JobIn, state) -> JobPlan:
    """Resolve and check a job body: the scenario, its target and the sweep's points.

    Everything that can be wrong is found here, so a bad job is a 4xx now, not a failure later.
    """
    from bench.executor import plan_from_scenario
    from bench.runner import UnreachableError, check_reachable
    from bench.sweep import PointSpec, SweepPlan, scenario_at

    base_dir = None
    if body.scenario_name is not None:
        path = SCENARIOS_DIR / f"{body.scenario_name.removesuffix('.yaml')}.yaml"
        if not path.is_file():
            shipped = ", ".join(sorted(p.stem for p in SCENARIOS_DIR.glob("*.yaml")))
            raise invalid(
                ["body", "scenario_name"],
                f"no shipped scenario {body.scenario_name!r}; have {shipped}",
            )
        text, source, base_dir = path.read_text(), path.name, SCENARIOS_DIR
    else:
        text, source = body.scenario or "", "scenario"
    try:
        sc, _notes = resolve_scenario(text, source, _overrides(body), body.kind)
    except ValueError as exc:  # ScenarioError too
        raise invalid(["body", "scenario"], str(exc)) from None
    files = _confine_files(sc, state.data, (SCENARIOS_DIR,) if base_dir else ())
    if sc.target.api_key_env != API_KEY_ENV:
        raise invalid(
            ["body", "scenario"],
            f"target.api_key_env: the service only sends ${API_KEY_ENV} to targets",
        )

    simulate = None
    if body.simulate is not None:
        simulate = _check_simulate(body)
        sc.target.base_url = None
        sc.target.model = sc.target.model or body.simulate.model
        sc.gpu.type = sc.gpu.type if body.gpu else canonical_gpu(body.simulate.gpu)[0]
        sc.gpu.count = body.num_gpus or body.simulate.tp
        sc.label = (
            body.label
            or sc.label
            or (
                f"{body.simulate.gpu} x{body.simulate.tp} {body.simulate.model} {body.simulate.precision}"
            )
        )
    else:
        if not sc.target.base_url:
            raise invalid(["body", "target", "base_url"], "give target.base_url, or simulate")
        reason = state.allow.check(sc.target.base_url)
        if reason is not None:
            raise HTTPException(403, detail=f"target.base_url: {reason}")
        try:
            check_reachable(sc.target.base_url, timeout_s=REACH_TIMEOUT_S)
        except UnreachableError as exc:
            raise invalid(["body", "target", "base_url"], str(exc)) from None

    # The key goes only to a host the operator named for it (--upstream-key), never to
    # one a token holder chose; a simulated endpoint needs none.
    api_key = None if simulate else state.keys.key_for(sc.target.base_url)
    plan = JobPlan(
        kind=body.kind, scenario=sc, base_dir=base_dir, simulate=simulate, api_key=api_key
    )
    if body.deadline_s is not None:
        plan.deadline_s = body.deadline_s
    if body.sweep is not None:
        s = body.sweep
        # the body's SLO, and each traffic class's own (the scenario's classes)
        slo = thresholds(s.slo, ["body", "sweep", "slo"]) + sc.class_slo()
        if s.request_rates:
            specs = [PointSpec("rate", float(v)) for v in s.request_rates]
        else:
            specs = [PointSpec("concurrency", int(v)) for v in s.concurrency or ()]
        plan.sweep = SweepPlan(
            specs=specs, auto=s.auto, thresholds=slo, slo_iterations=s.slo_iterations if slo else 0,
            point_duration_s=s.point_duration_s, warmup_s=s.warmup_s, cooldown_s=s.cooldown_s,
            max_error_rate=s.max_error_rate,
        )  # fmt: skip
    # Resolve the (first) point's plan now: a dataset path or load shape that cannot work
    # is the caller's to fix, so it is a 422 rather than a failed job.
    probe = sc.model_copy(deep=True)
    probe.target.base_url = probe.target.base_url or "http://127.0.0.1:9"
    if plan.sweep.specs:
        probe = scenario_at(
            probe, plan.sweep.specs[0], point_duration_s=plan.sweep.point_duration_s
        )
    try:
        first = plan_from_scenario(probe, base_dir=base_dir)
    except (ScenarioError, ValueError, OSError) as exc:
        raise invalid(["body", "scenario"], without_contents(str(exc), files)) from None
    if simulate and simulate["clock"] == "virtual" and any(s.turn for s in first.specs):
        raise invalid(
            ["body", "simulate", "clock"],
            "virtual time runs single-turn workloads only; give simulate.clock 'real' to "
            "measure this multi-turn scenario against a simulated endpoint over HTTP",
        )
    return plan


def _confine_files(sc, data, extra_roots: tuple) -> list:
    """Point the scenario's files at regular files in the data folder (server/datafiles.py).

    Each path is replaced by the checked absolute one, so the job reads exactly that file.
    """
    files = []
    trace = sc.load.trace
    try:
        if trace is not None:
            path = data.resolve(trace.path, "load.trace.path", extra_roots)
            trace.path = str(path)
            files.append(path)
        if sc.workload.dataset_path:
            path = data.resolve(sc.workload.dataset_path, "workload.dataset_path", extra_roots)
            sc.workload.dataset_path = str(path)
            files.append(path)
        if sc.workload.tokenizer:
            path = data.resolve_tokenizer(sc.workload.tokenizer, "workload.tokenizer", extra_roots)
            sc.workload.tokenizer = str(path)
            files.append(path)
    except DataFileError as exc:
        raise invalid(["body", "scenario"], str(exc)) from None
    return files


def _overrides(body: JobIn) -> Overrides:
    """The body's fields as overrides of its scenario, applied as the CLI's flags are."""
    target = body.target.model_dump() if body.target is not None else {}
    return Overrides(
        **target,
        gpu=body.gpu,
        num_gpus=body.num_gpus,
        num_prompts=body.num_prompts,
        request_rate=body.request_rate,
        label=body.label,
        request_timeout_s=body.request_timeout_s,
        num_warmups=body.num_warmups,
        ramp_up_strategy=body.ramp_up_strategy,
        ramp_up_start_rps=body.ramp_up_start_rps,
        ramp_up_end_rps=body.ramp_up_end_rps,
    )


def _check_simulate(body: JobIn) -> dict:
    from bench.sim.virtual import build_engine

    s = body.simulate
    try:
        build_engine(s.gpu, s.model, s.precision, s.tp)
    except (ValueError, KeyError, LookupError) as exc:
        raise invalid(["body", "simulate"], str(exc)) from None
    return s.model_dump()
