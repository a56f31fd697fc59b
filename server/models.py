"""Pydantic shapes of every API body and answer, so /docs and /openapi.json are exact.

Answers mirror the library's own facts (bench.store.RunInfo, bench.curves.CurvePoint,
bench.cost.CostRow, the Summary.to_json contract) and are built from them by the
`from_*` helpers here, never computed anew; where an answer is a dataclass's fields with a
few differences it is derived from the dataclass (server/derived.py), not copied. Request bodies forbid unknown fields, so a
typo is a 422 naming the field instead of a silently ignored option.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bench.backends.dialects import Backend
from bench.backends.openai import Endpoint
from bench.cost import CostRow, TierKind
from bench.curves import Capacity, ClassRow, CurvePoint, Ratio, RunComparison, RunCurve
from bench.plan import Demand, Plan, Recommendation, SystemPlan
from bench.store import LoadPointInfo, RunInfo
from bench.sweep import STOP_ERROR_RATE
from server.derived import Called, Finite, answer_model, finite


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------- runs


class Throughput(BaseModel):
    requests_per_s: float | None = None
    output_tokens_per_s: float | None = None
    total_tokens_per_s: float | None = None


class KindOut(BaseModel):
    name: str
    description: str


class RegistryOut(BaseModel):
    """One seam's registry (bench.registry): where a user names a kind, and its kinds."""

    registry: str = Field(examples=["load shape"])
    where: str = Field(examples=["load.shape"])
    kinds: list[KindOut]


class SummaryOut(BaseModel):
    """The summary JSON contract (bench.metrics.Summary.to_json); latencies in ms."""

    model_config = ConfigDict(extra="ignore")

    interrupted: bool = False
    completed: int = 0
    failed: int = 0
    errors: dict[str, int] = Field(default_factory=dict)
    duration_s: float | None = None
    throughput: Throughput = Field(default_factory=Throughput)
    metrics: dict[str, dict[str, float | None]] = Field(
        default_factory=dict,
        description='metric -> statistic -> ms, e.g. {"ttft_ms": {"mean": 80.1, "p99": 210.0}}',
    )
    goodput_requests_per_s: float | None = None
    send_lag_ms: dict[str, float | None] = Field(default_factory=dict)
    client_limited: bool = False
    client_limited_reasons: list[str] = Field(default_factory=list)
    self_check: str | None = Field(
        default=None, description='"ok", "client-limited" or "not judged: ..." (issue 15)'
    )
    slot_wait_ms: dict[str, float | None] = Field(
        default_factory=dict, description="waits for a --max-concurrency slot (not send lag)"
    )
    prompt_cache: dict[str, Any] = Field(
        default_factory=dict,
        description="prompt tokens served from the server's cache: per-request usage and the "
        "server's counters, and largely_cached",
    )
    notes: list[str] = Field(default_factory=list)
    classes: dict[str, SummaryOut] = Field(
        default_factory=dict,
        description="each traffic class's own figures (same keys), when the run mixed classes",
    )

    @classmethod
    def from_json(cls, data: dict | None) -> SummaryOut | None:
        return None if not data else cls.model_validate(data)


class RunOut(BaseModel):
    """One stored run as the runs table shows it."""

    id: str
    short_id: str
    name: str | None
    label: str | None
    created_at: datetime
    finished_at: datetime | None
    status: str = Field(description="running, completed, interrupted or failed")
    model: str | None
    gpu_type: str | None
    gpu_count: int | None
    simulated: bool
    imported_from: str | None
    endpoint: str | None
    backend: str | None
    request_count: int
    tool_version: str | None

    @classmethod
    def from_info(cls, run: RunInfo) -> RunOut:
        return cls(
            **{name: getattr(run, name) for name in cls.model_fields if name != "short_id"},
            short_id=run.short_id,
        )


class LoadPointOut(BaseModel):
    load_point: int
    label: str | None
    mode: str | None
    target_rate: float | None = Field(description="requests/s; null when unbounded (inf)")
    unbounded_rate: bool = Field(description="true for a 'rate inf' point (all at once)")
    concurrency: int | None
    duration_s: float | None
    warmup_s: float | None
    cooldown_s: float | None
    params: dict | None
    summary: SummaryOut | None

    @classmethod
    def from_info(cls, lp: LoadPointInfo) -> LoadPointOut:
        rate = lp.target_rate
        return cls(
            load_point=lp.load_point,
            label=lp.label,
            mode=lp.mode,
            target_rate=finite(rate),
            unbounded_rate=rate is not None and math.isinf(rate),
            concurrency=lp.concurrency,
            duration_s=(lp.ended_ns / 1e9) if lp.ended_ns is not None else None,
            warmup_s=lp.warmup_s,
            cooldown_s=lp.cooldown_s,
            params=lp.params_json,
            summary=SummaryOut.from_json(lp.summary_json),
        )


class RunDetail(RunOut):
    """A run with its summary, load points and the scenario it ran."""

    heartbeat_at: datetime | None
    scenario_text: str | None
    hostname: str | None
    summary: SummaryOut | None
    extra: dict | None
    load_points: list[LoadPointOut]

    @classmethod
    def from_info(cls, run: RunInfo) -> RunDetail:
        base = RunOut.from_info(run).model_dump()
        return cls(
            **base,
            heartbeat_at=run.heartbeat_at,
            scenario_text=run.scenario_text,
            hostname=run.hostname,
            summary=SummaryOut.from_json(run.summary_json),
            extra=run.extra_json,
            load_points=[LoadPointOut.from_info(lp) for lp in run.load_points],
        )


class RequestOut(BaseModel):
    """One stored request (a row of bench/store/models.py's Request); times are ns since the point's start."""

    id: int
    load_point: int
    request_index: int
    turn: int
    intended_ns: int
    sent_ns: int
    first_byte_ns: int | None
    first_token_ns: int | None
    end_ns: int | None
    n_chunks: int
    prompt_tokens: int | None
    output_tokens: int | None
    token_count_source: str | None
    http_status: int | None
    state: str
    error_kind: str | None
    error_message: str | None


class RequestsPage(BaseModel):
    run_id: str
    load_point: int | None
    items: list[RequestOut]
    next_after: int | None = Field(
        description="pass as ?after= for the next page; null on the last page"
    )


class DeletedOut(BaseModel):
    run_id: str
    deleted_requests: int


class Span(BaseModel):
    start_s: float
    end_s: float
    title: str


class TimeSeriesOut(BaseModel):
    """Per-bucket load and P99 TTFT (bench.metrics.time_series), load points back to back."""

    run_id: str
    bucket_s: float
    t_s: list[float]
    offered_rps: list[float]
    achieved_rps: list[float]
    p99_ttft_ms: list[float | None]
    output_tps: list[float]
    load_points: list[Span]


# ---------------------------------------------------------------- curves, comparison, cost


CurvePointOut = answer_model(
    CurvePoint,
    "CurvePointOut",
    doc="One load point in buyer's units (bench.curves.CurvePoint).",
    drop=("offered_kind",),
    fields={
        "offered": (
            Annotated[float | None, Finite],
            Field(description="target req/s or concurrency; null if unbounded"),
        ),
        "confidence": (
            dict[str, dict],
            Field(
                default_factory=dict,
                description='per metric: {"count": samples, "level": 0.95, "p99": [low, high], '
                "...}; an end null is open (too few samples to bound it)",
            ),
        ),
        "partial": (bool, Field(False, description="interrupted: never a capacity or a knee")),
        "late_ms": (
            float | None,
            Field(None, description="simulated endpoint's worst lateness during the point (ms)"),
        ),
        "error_rate": (float, ...),
        "interactivity": (
            float | None,
            Field(description="tokens/s per user = 1000 / median TPOT ms"),
        ),
    },
)


CurveOut = answer_model(
    RunCurve,
    "CurveOut",
    doc="One run's curve (bench.curves.RunCurve): its load points in buyer's units.",
    fields={
        "points": (list[CurvePointOut], ...),
        "colour": (
            str,
            Field(description="the GPU's colour on every chart (B200 green, H100 blue)"),
        ),
        "legend": (str, Field(description="label plus ' (simulated)' for simulated runs")),
    },
)


class CapacityOut(BaseModel):
    """bench.curves.Capacity: the capacity every view prints, with its bracket and flags."""

    kind: Literal["interpolated", "at_least", "below", "peak", "none"]
    text: str = Field(description="the figure as printed, with its interval or bound")
    slo: list[str]
    output_tps_per_gpu: float | None = Field(description="null when below the lowest load")
    requests_per_s_per_gpu: float | None
    low: float | None = Field(description="95% interval, output tok/s per GPU (null: open)")
    high: float | None
    last_pass: str | None = Field(description="title of the last load meeting the SLO")
    first_fail: str | None = Field(description="title of the first load breaking it")
    deciding: str | None = Field(description="the threshold that fails first, measured")
    flags: list[str] = Field(description="why the figure might be wrong")

    @classmethod
    def from_capacity(cls, c: Capacity | None, gpus: int) -> CapacityOut | None:
        if c is None:
            return None
        return cls(
            kind=c.kind,
            text=c.text(),
            slo=[str(t) for t in c.slo],
            output_tps_per_gpu=c.value,
            requests_per_s_per_gpu=c.point.requests_per_s / gpus if c.point else None,
            low=c.low,
            high=c.high,
            last_pass=c.last_pass.title if c.last_pass else None,
            first_fail=c.first_fail.title if c.first_fail else None,
            deciding=c.deciding,
            flags=c.flags,
        )


RatioOut = answer_model(
    Ratio,
    "RatioOut",
    doc="The first run's capacity over the second's (bench.curves.Ratio).",
    fields={
        "bound": (
            str | None,
            Field(description="'at least' / 'at most' when a side is a bound"),
        ),
        "flips": (bool, Field(description="which is larger is within the 95% confidence")),
        "text": (Annotated[str, Called], ...),
    },
)


class ComparisonOut(BaseModel):
    run_id: str
    legend: str
    colour: str
    simulated: bool
    basis: str = Field(description="'SLO capacity' or 'peak throughput'")
    capacity: CurvePointOut | None = Field(description="the point priced (null: none met the SLO)")
    at_matched_load: CurvePointOut | None
    cost: list[CostRow]
    at_slo: CapacityOut | None = None

    @classmethod
    def from_comparison(cls, c: RunComparison) -> ComparisonOut:
        return cls(
            run_id=c.curve.run_id,
            legend=c.curve.legend,
            colour=c.curve.colour,
            simulated=c.curve.simulated,
            basis=c.basis,
            capacity=CurvePointOut.of(c.capacity),
            at_matched_load=CurvePointOut.of(c.at_matched_load),
            cost=c.cost_rows,
            at_slo=CapacityOut.from_capacity(c.at_slo, c.curve.gpu_count),
        )


class CompareOut(BaseModel):
    slo: list[str]
    slo_source: str = Field("given", description="given, stored with the runs, or none")
    utilisation: float
    runs: list[ComparisonOut]
    sentence: str | None = Field(description="first run against the second, in one sentence")
    ratio: RatioOut | None = None


class PlanOut(BaseModel):
    """bench.plan.Plan: GPUs, nodes, $/month and $/Mtok per tier, the cheapest option."""

    demand: Demand
    slo: list[str]
    slo_source: str
    gpus_per_node: int
    systems: list[SystemPlan]
    recommendation: Recommendation | None
    assumptions: list[str]
    sentence: str

    @classmethod
    def from_plan(cls, p: Plan) -> PlanOut:
        return cls(
            demand=p.demand, slo=[str(t) for t in p.slo], slo_source=p.slo_source,
            gpus_per_node=p.gpus_per_node, systems=p.systems, recommendation=p.recommendation,
            assumptions=p.assumptions, sentence=p.sentence,
        )  # fmt: skip


class ClassRowOut(BaseModel):
    """One traffic class at one load point (bench.curves.ClassRow)."""

    load_point: int
    title: str
    traffic_class: str
    completed: int
    failed: int
    requests_per_s: float
    output_tps: float
    p50_ttft_ms: float | None
    p99_ttft_ms: float | None
    p99_tpot_ms: float | None
    meets_slo: bool | None = Field(description="meets its own SLO; null: it has none")
    prompt_cache: dict[str, float | None] = Field(
        description="share of prompt tokens from the prefix cache: intended (what its "
        "prompts imply, cache keeping every block), usage (its responses: the simulator's "
        "cache on a simulated run), server (counters; only when it alone sent the point)"
    )

    @classmethod
    def from_row(cls, r: ClassRow) -> ClassRowOut:
        f = r.figures
        return cls(
            load_point=r.point.load_point, title=r.point.title, traffic_class=r.name,
            completed=f.completed, failed=f.failed, requests_per_s=f.requests_per_s,
            output_tps=f.output_tps, p50_ttft_ms=f.latency("ttft", "p50"),
            p99_ttft_ms=f.latency("ttft", "p99"), p99_tpot_ms=f.latency("tpot", "p99"),
            meets_slo=r.meets,
            prompt_cache={k: f.cache_share(k) for k in ("intended", "usage", "server")},
        )  # fmt: skip


class ClassesOut(BaseModel):
    """A run's traffic classes at each load point, judged against their own SLOs."""

    run_id: str
    simulated: bool
    slo: list[str] = Field(description="the classes' SLOs (CLASS:NAME thresholds)")
    capacity: CapacityOut | None = Field(description="a sweep's capacity at those SLOs")
    binding_class: str | None = Field(description="the class whose own SLO breaks first")
    rows: list[ClassRowOut]


class RunCostOut(BaseModel):
    run_id: str
    legend: str
    load_point: int | None
    point_title: str | None
    basis: str
    rows: list[CostRow]


class TierOut(BaseModel):
    gpu: str
    name: str
    kind: str
    provider: str
    price_usd_per_gpu_hr: float | None = Field(description="effective price (derived/TCO too)")
    low: float | None
    high: float | None
    term_years: float | None
    source: str
    date: str
    note: str | None
    price_note: str | None = None


class TierIn(Strict):
    """A flat-priced tier to add (or re-price) for one GPU; kept while the service runs, and
    in its --prices-file when one is given."""

    gpu: str = Field(min_length=1, max_length=64, examples=["B200-SXM"])
    name: str = Field(
        min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", examples=["my-deal"]
    )
    kind: TierKind = "custom"
    provider: str = Field(default="user", min_length=1, max_length=64)
    price_usd_per_gpu_hr: float = Field(gt=0, le=10_000)
    low: float | None = Field(default=None, ge=0, le=10_000)
    high: float | None = Field(default=None, ge=0, le=10_000)
    term_years: float | None = Field(default=None, gt=0, le=20)
    source: str = Field(min_length=1, max_length=500, examples=["quote from vendor, 2026-05"])
    date: str = Field(pattern=r"^\d{4}-\d{2}(-\d{2})?$", examples=["2026-05"])
    note: str | None = Field(default=None, max_length=500)

    @model_validator(mode="after")
    def _kind(self) -> TierIn:
        if self.kind == "owned":
            raise ValueError("kind 'owned' needs a TCO model; add it with a prices file")
        return self


# ---------------------------------------------------------------- background runs


class TargetIn(Strict):
    base_url: str | None = Field(
        default=None,
        max_length=500,
        description="OpenAI-compatible server; its host must be in the service's allow-list",
        examples=["http://127.0.0.1:8001"],
    )
    model: str | None = Field(default=None, max_length=200)
    endpoint: Endpoint | None = None
    backend: Backend | None = None


class SimulateIn(Strict):
    """Run on a simulated deployment (no GPU needed): in virtual time, as `tokenbench sim run`
    does (default; single-turn workloads), or against a simulated endpoint started on
    loopback for this job and measured over HTTP in real time."""

    gpu: str = Field(default="B200-SXM", max_length=64)
    model: str = Field(default="llama-3.3-70b", max_length=100)
    precision: str = Field(default="fp8", max_length=16)
    tp: int = Field(default=1, ge=1, le=8)
    clock: Literal["virtual", "real"] = Field(
        default="virtual", description="virtual: no HTTP, far faster than real time"
    )


class SweepIn(Strict):
    """The load points of a sweep: rates or concurrencies, or an automatic sweep."""

    request_rates: list[float] | None = Field(
        default=None, min_length=1, max_length=32, description="req/s per point"
    )
    concurrency: list[int] | None = Field(default=None, min_length=1, max_length=32)
    auto: int | None = Field(default=None, ge=1, le=16, description="guidellm-style N rates")
    point_duration_s: float | None = Field(default=None, gt=0, le=3600)
    slo: str | None = Field(
        default=None, max_length=500, examples=["p99_ttft_ms<=500,p99_tpot_ms<=50"]
    )
    slo_iterations: int = Field(default=0, ge=0, le=8)
    warmup_s: float = Field(default=0.0, ge=0, le=600)
    cooldown_s: float = Field(default=0.0, ge=0, le=600)
    max_error_rate: float = Field(default=STOP_ERROR_RATE, gt=0, le=1)

    @model_validator(mode="after")
    def _one_mode(self) -> SweepIn:
        given = [n for n in ("request_rates", "concurrency", "auto") if getattr(self, n)]
        if len(given) != 1:
            raise ValueError("give exactly one of request_rates, concurrency or auto")
        if self.request_rates and any(not (r > 0) for r in self.request_rates):
            raise ValueError("request_rates must be positive (use a large number, not inf)")
        if self.concurrency and any(c < 1 or c > 4096 for c in self.concurrency):
            raise ValueError("concurrency values must be between 1 and 4096")
        if self.request_rates and any(math.isinf(r) or r > 1e6 for r in self.request_rates):
            raise ValueError("request_rates must be finite and at most 1e6 req/s")
        return self


class JobIn(Strict):
    """Start a run (the scenario's own load) or a sweep (many load points) in the background.

    The scenario is YAML text (`scenario`) or a shipped one by name (`scenario_name`, e.g.
    "chat-bursty"); the other fields override it like the CLI's flags do.
    """

    kind: Literal["run", "sweep"] = "run"
    scenario: str | None = Field(default=None, max_length=200_000, description="YAML text")
    scenario_name: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=100
    )
    target: TargetIn | None = None
    simulate: SimulateIn | None = None
    gpu: str | None = Field(default=None, max_length=64, description="GPU type served")
    num_gpus: int | None = Field(default=None, ge=1, le=1024)
    label: str | None = Field(default=None, max_length=200)
    num_prompts: int | None = Field(default=None, ge=1, le=1_000_000)
    request_rate: float | None = Field(default=None, gt=0, le=1e6)
    request_timeout_s: float | None = Field(default=None, gt=0, le=3600)
    # vLLM's --num-warmups and --ramp-up-* (load.num_warmups, load.shape ramp_up)
    num_warmups: int | None = Field(default=None, ge=0, le=10_000)
    ramp_up_strategy: Literal["linear", "exponential"] | None = None
    ramp_up_start_rps: float | None = Field(default=None, gt=0, le=1e6)
    ramp_up_end_rps: float | None = Field(default=None, gt=0, le=1e6)
    sweep: SweepIn | None = None
    deadline_s: float | None = Field(
        default=None, gt=0, le=7 * 86400,
        description="stop the job this many seconds after it starts (default 24 h)",
    )  # fmt: skip

    @model_validator(mode="after")
    def _consistent(self) -> JobIn:
        if self.scenario is not None and self.scenario_name is not None:
            raise ValueError("give scenario (YAML text) or scenario_name, not both")
        if self.kind == "sweep" and self.sweep is None:
            raise ValueError(
                "kind 'sweep' needs a sweep block (request_rates, concurrency or auto)"
            )
        if self.kind == "run" and self.sweep is not None:
            raise ValueError("a sweep block goes with kind 'sweep'")
        if self.simulate is not None and self.target is not None and self.target.base_url:
            raise ValueError("give target.base_url or simulate, not both")
        return self


class ProgressOut(BaseModel):
    point: int = Field(description="index of the load point running (0-based)")
    point_title: str | None
    points_planned: int | None
    total: int = Field(description="requests planned in this point")
    sent: int
    completed: int
    failed: int
    in_flight: int
    p99_ttft_ms: float | None = Field(description="P99 TTFT of the last 500 requests")


class PointDone(BaseModel):
    index: int
    title: str
    requests_per_s: float
    output_tokens_per_s: float
    p99_ttft_ms: float | None
    p99_tpot_ms: float | None
    failed: int


JobStatus = Literal["queued", "running", "completed", "interrupted", "failed", "cancelled"]


class JobOut(BaseModel):
    id: str
    kind: str
    status: JobStatus
    label: str | None
    target: str | None = Field(description="base URL, or 'simulated GPU xTP model'")
    simulated: bool
    run_id: str | None = Field(
        description="the stored run: chosen when the job is submitted, written from its start"
    )
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    cancel_requested: bool
    error: str | None
    progress: ProgressOut | None
    points: list[PointDone]


class ErrorOut(BaseModel):
    detail: str


class DataFileOut(BaseModel):
    name: str = Field(description="what a scenario sent to the API names it by")
    bytes: int
