"""The FastAPI service: REST API, dashboard pages, auth and background runs in one app.

`create_app` builds everything from its arguments (no globals), so tests make as many apps
as they like against throw-away databases. The app reads through bench.store and computes
every number with bench.curves / bench.cost / bench.metrics; it only adds HTTP, auth,
caching of finished runs' curves, and the job queue (server/jobs.py).
"""

from __future__ import annotations

import contextlib
import copy
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from bench.cost import Catalogue, PriceCatalogueError, load_catalogue
from bench.curves import RunCurve, gpu_colour, run_curve
from bench.extras import MissingExtraError
from bench.store import (
    RUNNING,
    DatabaseError,
    RunNotFoundError,
    StoreError,
    fault_message,
    get_engine,
    get_run,
)
from server.auth import AllowList, Guard, UpstreamKeys
from server.datafiles import DEFAULT_MAX_FILE_MB, DataFolder
from server.frontdoor import FrontDoor, ServedNames
from server.jobs import JobManager

CURVE_CACHE_SIZE = 512


class AppState:
    """What the routes share: database, auth policy, prices, the curve cache, the jobs."""

    def __init__(
        self,
        db_url: str | None,
        *,
        guard: Guard,
        allow: AllowList,
        prices_file: Path | None = None,
        data: DataFolder | None = None,
        keys: UpstreamKeys | None = None,
    ) -> None:
        self.db_url = db_url
        self.keys = keys or UpstreamKeys()
        self.data = data or DataFolder(None)
        self.guard = guard
        self.allow = allow
        self.prices_file = Path(prices_file) if prices_file else None
        self.jobs = JobManager(db_url)
        self._lock = threading.Lock()
        self._curves: OrderedDict[tuple, RunCurve] = OrderedDict()
        self._added_tiers: dict[str, dict[str, dict]] = {}
        # A prices file that does not exist yet is where added tiers will be saved.
        existing = self.prices_file if self.prices_file and self.prices_file.exists() else None
        self.catalogue: Catalogue = load_catalogue(existing)

    # ------------------------------------------------------------ curves

    def curve(self, ref: str, index: int = 0) -> RunCurve:
        """bench.curves.run_curve, cached for finished runs (their requests never change)."""
        run = get_run(ref, self.db_url)
        key = (run.id, run.status, run.request_count, run.finished_at, len(run.load_points))
        with self._lock:
            cached = self._curves.get(key)
            if cached is not None:
                self._curves.move_to_end(key)
        if cached is None:
            cached = run_curve(run.id, self.db_url, index=0)
            if run.status != RUNNING:
                with self._lock:
                    self._curves[key] = cached
                    while len(self._curves) > CURVE_CACHE_SIZE:
                        self._curves.popitem(last=False)
        # Colour follows the GPU; the index only matters for GPUs without a colour.
        return replace(cached, colour=gpu_colour(cached.gpu_type, index), points=cached.points)

    def curves(self, refs: Sequence[str]) -> list[RunCurve]:
        return [self.curve(ref, i) for i, ref in enumerate(refs)]

    def forget(self, run_id: str) -> None:
        with self._lock:
            for key in [k for k in self._curves if k[0] == run_id]:
                del self._curves[key]

    # ------------------------------------------------------------ prices

    def add_tier(self, tier: dict) -> Catalogue:
        """Add (or re-price) a flat-priced tier; validated by bench.cost.load_catalogue.

        Kept in memory, and merged into the --prices-file when the service has one, so the
        tier is still there after a restart.
        """
        gpu, name = tier.pop("gpu"), tier.pop("name")
        with self._lock:
            added = copy.deepcopy(self._added_tiers)
            gpu = _catalogue_gpu(self.catalogue, gpu)
            added.setdefault(gpu, {})[name] = {k: v for k, v in tier.items() if v is not None}
            user = self._user_prices(added)
            catalogue = _load_with(user)  # raises PriceCatalogueError before anything changes
            if self.prices_file is not None:
                self.prices_file.parent.mkdir(parents=True, exist_ok=True)
                self.prices_file.write_text(yaml.safe_dump(user, sort_keys=False))
                added = {}
            self._added_tiers = added
            self.catalogue = catalogue
        return catalogue

    def _user_prices(self, added: dict) -> dict:
        base: dict = {"gpus": {}}
        if self.prices_file is not None and self.prices_file.exists():
            base = yaml.safe_load(self.prices_file.read_text()) or {"gpus": {}}
            base.setdefault("gpus", {})
        for gpu, tiers in added.items():
            base["gpus"].setdefault(gpu, {}).update(tiers)
        return base


def _catalogue_gpu(catalogue: Catalogue, gpu: str) -> str:
    try:
        return catalogue.resolve_gpu(gpu)
    except PriceCatalogueError:
        return gpu  # a GPU the shipped catalogue does not price


def _load_with(user: dict) -> Catalogue:
    """load_catalogue over a user prices mapping (it reads files, so write a temporary one)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "prices.yaml"
        path.write_text(yaml.safe_dump(user, sort_keys=False))
        return load_catalogue(path)


def create_app(
    db_url: str | None,
    *,
    api_token: str | None,
    allow_hosts: list[str],
    open_reads: bool,
    prices_file: Path | None = None,
    data_dir: Path | None = None,
    max_data_file_mb: float = DEFAULT_MAX_FILE_MB,
    server_names: Sequence[str] = (),
    upstream_key_hosts: Sequence[str] = (),
) -> FastAPI:
    """The service for one database.

    api_token: the bearer token writes need (None: $TOKENBENCH_API_TOKEN, else a random one,
    readable as app.state.tb.guard.token); allow_hosts: hosts/CIDRs a background run may
    target besides loopback; open_reads: serve reads without the token (the CLI sets it when
    bound to loopback, or when the operator opts out); prices_file: a user prices file,
    merged over the shipped catalogue, that tiers added through the API are saved to;
    data_dir: the only folder scenarios sent to the API may read files from (uploads land
    there too; None: they read none), each file at most max_data_file_mb; server_names:
    host names the service is reached by, besides IP addresses and localhost (any other
    Host is refused: DNS rebinding; see server/frontdoor.py); upstream_key_hosts: the only
    HOST[:PORT]s a job sends the service's $OPENAI_API_KEY to (server/auth.py UpstreamKeys).
    """
    from server.api import router as api_router
    from server.auth import resolve_token
    from server.pages import router as pages_router
    from server.pages import static_router

    token, _ = resolve_token(api_token)
    get_engine(db_url)  # fail at start, with the store's message, if the database is unusable
    state = AppState(
        db_url,
        guard=Guard(token, open_reads=open_reads),
        allow=AllowList(allow_hosts),
        prices_file=prices_file,
        data=DataFolder(data_dir, max_data_file_mb),
        keys=UpstreamKeys(list(upstream_key_hosts)),
    )

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        state.jobs.shutdown()

    app = FastAPI(
        # /docs is served by server/pages.py with Swagger UI's assets vendored (no CDN);
        # ReDoc has no vendored copy, so it is off rather than blank offline.
        docs_url=None,
        redoc_url=None,
        title="tokenbench",
        version=_version(),
        summary="LLM inference benchmarks: throughput-vs-latency curves and $/Mtok per GPU tier",
        description=(
            "Reads are open on loopback; elsewhere they need `Authorization: Bearer <token>`. "
            "Every write needs the token. Background runs may only target allow-listed hosts."
        ),
        lifespan=lifespan,
    )
    app.state.tb = state
    app.add_middleware(
        FrontDoor,
        token=lambda: state.guard.token,
        served=ServedNames(server_names),
        upload_limit=lambda: state.data.max_bytes,
    )

    @app.exception_handler(RunNotFoundError)
    async def _not_found(request: Request, exc: RunNotFoundError) -> JSONResponse:
        # A job's run id is announced at submission: until its process stores the run, the
        # id answers 202 with the job's state rather than 404 (issue 28).
        job = state.jobs.pending_run(str(request.path_params.get("ref", "")))
        if job is not None:
            detail = f"run {job.run_id} is not stored yet: its job {job.id} is {job.status}"
            body = {"detail": detail, "job_id": job.id, "status": job.status}
            return JSONResponse(body, status_code=202, headers={"Retry-After": "1"})
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(MissingExtraError)
    async def _missing_extra(_request: Request, exc: MissingExtraError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    @app.exception_handler(StoreError)
    async def _store(_request: Request, exc: StoreError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=503)

    @app.exception_handler(DatabaseError)
    async def _database(_request: Request, exc: DatabaseError) -> JSONResponse:
        """A database fault met while reading (a damaged page, a lost server): 503, said."""
        return JSONResponse({"detail": fault_message(exc, db_url)}, status_code=503)

    app.include_router(api_router)
    app.include_router(static_router)
    app.include_router(pages_router)
    return app


def _version() -> str:
    from bench.store import tool_version

    return tool_version()
