"""The Executor seam: whatever turns a RunPlan into RequestRecords, and its own types.

The local runner (bench.runner.LocalExecutor), the plan split over processes or Ray workers
(bench.distributed.DistributedExecutor) and the virtual-time simulator
(bench.sim.virtual.VirtualExecutor) all take a RunPlan and return a RunResult, defined here
below all three (bench.drive.choose_executor picks one). RunSession and Sweep are written
once over it, so each gets warm-up, telemetry, the self-check, SLO search, stop rules,
Ctrl-C and the fallback file from the same code.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from bench.backends.dialects import Dialect, get_dialect
from bench.backends.urls import normalize_base_url
from bench.records import RequestRecord
from bench.workload import MixedWorkload, RequestSpec, Workload


@dataclass
class RunPlan:
    """Everything one load point needs, resolved from the scenario and flags."""

    base_url: str
    endpoint: str
    dialect: Dialect
    model: str
    workload: Workload
    specs: list[RequestSpec]
    offsets_s: np.ndarray | None = None  # open loop: one offset per session; None = closed
    concurrency: int | None = None  # closed loop users
    max_concurrency: int | None = None  # open loop cap on in-flight requests
    think_time_s: float = 0.0
    ramp_up_s: float = 0.0  # closed loop: users start evenly spread over this many seconds
    duration_s: float | None = None  # closed loop: stop starting requests after this
    request_timeout_s: float = 600.0
    ignore_eos: bool = True
    api_key: str | None = None
    transport: str = "raw"
    load_point: int = 0
    extra_body: dict | None = None  # added to every body (sampling flags, --extra-body)
    headers: dict | None = None  # sent with every request (--header)
    num_warmups: int = 0  # requests sent before the point, left out of it (warmup_plan)


@dataclass
class Progress:
    """Live counters the CLI and sweeps display; updated on the loop, read from anywhere."""

    total: int = 0
    sent: int = 0
    completed: int = 0
    failed: int = 0
    in_flight: int = 0
    recent_ttft_ms: list[float] = field(default_factory=list)

    def live_p99_ttft_ms(self, last: int = 500) -> float | None:
        """P99 TTFT of the last `last` requests, as progress displays show it (None yet)."""
        recent = self.recent_ttft_ms[-last:]
        return float(np.percentile(recent, 99)) if recent else None


@dataclass(repr=False)
class RunResult:
    """What every executor returns for one load point (local, distributed, virtual time).

    The fields after `served_models` are filled in by the distributed executor only; the
    others leave their defaults, so a caller reads every result the same way.
    """

    records: list[RequestRecord]
    duration_s: float
    loop_lag_p99_ms: float
    loop_lag_max_ms: float
    interrupted: bool
    t0_ns: int
    # share of the run the event-loop thread was running or waiting for a CPU (not asleep
    # waiting for I/O): near 1, every read queues behind others (see _loop_busy_s)
    loop_cpu_share: float | None = None
    # share of the run the event-loop thread was ready to run but waited for a CPU (the run
    # queue): what other processes on the machine took from the client (None: unknown)
    loop_cpu_wait_share: float | None = None
    # share of reads that waited > 2 ms in the socket before the client read them (kernel
    # arrival stamps; None where there are none: httpx, non-Linux)
    late_read_share: float | None = None
    # share of tokens read together with the next one (ReadStats.merged_share)
    merged_token_share: float | None = None
    # model names the server answered with (each stream's `model` field), sorted
    served_models: list[str] = field(default_factory=list)
    # Distributed (bench.distributed): "processes" or "ray"; None for one process.
    backend: str | None = None
    # a worker died, so records are missing; `interrupted` is then set too, so callers that
    # read only `interrupted` (summaries, exit codes) never present a short run as complete
    partial: bool = False
    workers: list[Any] = field(default_factory=list)  # bench.distributed.WorkerStats, each
    warnings: list[str] = field(default_factory=list)  # per-worker findings, one line each

    def detail_json(self) -> dict[str, Any]:
        """What the summary JSON of a distributed run adds: `partial` and per-worker detail;
        nothing for one process."""
        if self.backend is None:
            return {}
        return {
            "partial": self.partial,
            "distributed": {
                "backend": self.backend,
                "workers": [w.to_json() for w in self.workers],
                "warnings": list(self.warnings),
            },
        }

    def __repr__(self) -> str:
        # asyncio (uvloop) formats a finished task's result; the default dataclass repr
        # of thousands of records with their arrays took ~0.5 s of CPU per run.
        return (
            f"RunResult({len(self.records)} records, {self.duration_s:.3f} s, "
            f"interrupted={self.interrupted})"
        )


@dataclass
class StoredAs:
    """What a stored run says about where its records came from, beyond the plan."""

    extra: dict = field(default_factory=dict)  # kept in the run's `extra`
    # The simulated hardware (bench.sim.detect's {gpu, gpu_count, ...}): the run is stored
    # simulated, on these GPUs. None: ask the endpoint whether it is a simulator.
    sim: dict | None = None
    endpoint: str | None = None  # instead of the plan's base URL (virtual time has none)
    backend: str | None = None  # instead of the plan's dialect
    scrapes: bool = True  # there is a server whose /metrics telemetry can scrape
    exact_lengths: bool = False  # requests are token counts, not rendered text (virtual time)


class Executor(Protocol):
    """Runs one load point's plan to its end and returns what it measured.

    `sink` gets every record as it is finished (the session stores it); setting `stop`
    (from any thread) stops the point gently, keeping what was measured, as Ctrl-C does;
    `on_tick` sees live counters a few times a second.
    """

    def run(
        self,
        plan: RunPlan,
        sink: Callable[[RequestRecord], None],
        stop: threading.Event | None = None,
        on_tick: Callable[[Progress], None] | None = None,
    ) -> RunResult: ...

    def stored_as(self) -> StoredAs: ...


def warmup_plan(plan: RunPlan) -> RunPlan | None:
    """The requests sent before a load point and left out of it, as vLLM's --num-warmups:
    plan.num_warmups requests like the point's first one, all at once, at most
    --max-concurrency (or a closed loop's users) in flight; None when there are none.

    The one difference from vLLM, on purpose: vLLM repeats its first prompt, which puts the
    first measured prompt in the server's prefix cache; synthetic prompts here are fresh
    (indices past the point's own), so no measured request is answered from the warm-up.
    A dataset's or a block-hashed trace's first prompt is sent as vLLM sends it.
    """
    n = plan.num_warmups
    if n <= 0 or not plan.specs:
        return None
    first = plan.specs[0]
    blocks = plan.workload.blocks is not None  # its prompts are by index: the first's
    base = max(len(plan.specs), first.session + 1)
    specs = [
        replace(first, index=first.index if blocks else base + k, session=base + k, turn=0)
        for k in range(n)
    ]
    cap = plan.max_concurrency if plan.offsets_s is not None else plan.concurrency
    return replace(
        plan, specs=specs, offsets_s=np.zeros(n), concurrency=None, max_concurrency=cap,
        think_time_s=0.0, ramp_up_s=0.0, duration_s=None, num_warmups=0,
    )  # fmt: skip


def plan_from_scenario(
    scenario,
    *,
    base_dir=None,
    api_key: str | None = None,
    transport: str = "raw",
    load_point: int = 0,
) -> RunPlan:
    """Resolve a Scenario (bench.scenario) into the plan of one load point."""
    target, load = scenario.target, scenario.load
    if not target.base_url:
        raise ValueError("no endpoint: give --base-url (or target.base_url in the scenario)")
    workload = scenario.workload_plan(base_dir, load_point)
    offsets = scenario.offsets(base_dir)
    if offsets is not None:
        n_sessions = len(offsets)
        specs = workload.specs(n_sessions * max(1, workload.turns))
        # a trace's own lengths, unless prompts come from a dataset or a mix's classes
        own = workload.dataset is not None or isinstance(workload, MixedWorkload)
        lengths = None if own else scenario.session_lengths(base_dir)
        if lengths is not None:
            input_lens, output_lens = lengths
            for spec in specs:
                if input_lens is not None:
                    spec.input_len = int(input_lens[spec.session])
                if output_lens is not None:
                    spec.output_len = max(1, int(output_lens[spec.session]))
    else:
        n = load.num_prompts
        if n is None:
            if load.duration_s is None:
                raise ValueError("a closed loop needs load.num_prompts or load.duration_s")
            n = 1_000_000  # bounded by the duration instead
        specs = workload.specs(n)
    return RunPlan(
        base_url=normalize_base_url(target.base_url),
        endpoint=target.endpoint,
        dialect=get_dialect(target.backend),
        model=target.model or "",
        workload=workload,
        specs=specs,
        offsets_s=offsets,
        concurrency=load.concurrency if offsets is None else None,
        max_concurrency=load.max_concurrency,
        think_time_s=load.think_time_s,
        ramp_up_s=load.ramp_up_s,
        duration_s=load.duration_s if offsets is None else None,
        request_timeout_s=scenario.request_timeout_s,
        ignore_eos=scenario.workload.forces_length(),
        extra_body=dict(target.extra_body) or None,
        headers=dict(target.headers) or None,
        num_warmups=load.num_warmups,
        api_key=api_key,
        transport=transport,
        load_point=load_point,
    )
