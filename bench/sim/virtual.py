"""Virtual-time driver: the engine as a discrete-event simulation, no HTTP, no waiting.

Requests arrive at their intended offsets (the simulated client always sends on time), the
engine steps, and virtual time advances by each step's roofline duration. A sequence's tokens
come out at the end of consecutive steps, so the driver keeps only one array of step end times
and, per request, the [first, last) step ranges in which it emitted; token times are slices of
that array. Records come out exactly as the HTTP runner would have measured them against a
perfect network, marked by the caller as simulated.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from bench.executor import Progress, RunPlan, RunResult, StoredAs
from bench.records import (
    CANCELLED,
    COUNT_TOKENIZER,
    ERR_CANCELLED,
    ERR_HTTP_4XX,
    FAILED,
    RequestRecord,
)
from bench.sim.disagg import DisaggEngine
from bench.sim.engine import Engine, ServeOptions, engine_for
from bench.sim.prefix_cache import trace_block_keys
from bench.sim.roofline import Deployment
from bench.workload import prompt_words

VIRTUAL_URL = "http://sim.virtual"  # a plan's target in virtual time; nothing calls it
MAX_STEPS = 50_000_000  # engine steps a virtual run may take before it is called stuck
# steps in a row that run nothing (the clock cannot move) before a run is called stuck: the
# engine waits on a request it can never admit, which no later step changes
IDLE_STEPS = 10_000


class _Track:
    """Per-request bookkeeping: emission step ranges."""

    __slots__ = ("cached", "done", "index", "segments", "start")

    def __init__(self, index: int) -> None:
        self.index = index
        self.cached: int | None = None  # prompt tokens the prefix cache served
        self.segments: list[tuple[int, int]] = []
        self.start = -1
        self.done = False  # its last token was emitted (False: the run was stopped first)


def build_engine(
    gpu: str,
    model: str,
    precision: str = "fp8",
    tp: int = 1,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    kv_precision: str | None = None,
    *,
    parallel: str | None = None,
    engine: str = "vllm",
    mtp: bool | int | None = None,
    mtp_acceptance: float | None = None,
    mtp_acceptance_length: float | None = None,
    memory_fraction: float | None = None,
    prefix_cache: str | None = None,
    disagg: str | None = None,
    prefill_parallel: str | None = None,
    decode_parallel: str | None = None,
    kv_link: str | None = None,
    api_server_count: int | None = None,
) -> Engine | DisaggEngine:
    """An engine for a deployment, with the engine's own defaults for anything not given.

    parallel ("tp4", "dep8", "tep8") overrides tp. Each data-parallel rank is its own engine
    instance in a real server, so the per-instance limits (max_num_seqs,
    max_num_batched_tokens) are multiplied by dp for the one simulated scheduler.
    disagg ("1P1D", bench.sim.disagg): prefill and decode pools of that many instances, each
    of prefill_parallel / decode_parallel (default: the deployment's own), KV moved over
    kv_link (auto: NVLink within the scale-up domain, else the network).
    api_server_count: the front end's processes (vLLM --api-server-count); None = one per
    data-parallel rank.
    """
    from bench.sim.roofline import parse_parallel

    def deployment(par: str | None) -> Deployment:
        t, dp, ep = parse_parallel(par) if par else (tp, 1, 1)
        return Deployment.build(
            gpu, model, precision, t, kv_precision, dp=dp, ep=ep, engine=engine, mtp=mtp,
            mtp_acceptance=mtp_acceptance, mtp_acceptance_length=mtp_acceptance_length,
            api_servers=api_server_count,
        )  # fmt: skip

    if disagg is None:
        if prefill_parallel or decode_parallel or kv_link:
            raise ValueError(
                "--prefill-parallel, --decode-parallel and --kv-link describe a disaggregated "
                "deployment: give --disagg too (e.g. --disagg 1P1D)"
            )
        dep = deployment(parallel)
        return engine_for(dep, max_num_seqs, max_num_batched_tokens, memory_fraction, prefix_cache)
    from bench.sim.disagg import build_disagg

    return build_disagg(
        deployment(prefill_parallel or parallel), deployment(decode_parallel or parallel),
        disagg, kv_link or "auto", max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, memory_fraction=memory_fraction,
        prefix_cache=prefix_cache,
    )  # fmt: skip


def run_virtual(
    engine: Engine,
    requests: Iterable[tuple[float, int, int]],
    load_point: int = 0,
    max_steps: int = MAX_STEPS,
    stop: threading.Event | None = None,
    keys: list[list[int]] | None = None,
) -> list[RequestRecord]:
    """Simulate (send offset s, input tokens, output tokens) requests; one record per request
    sent. Setting `stop` ends the run at the next engine step: requests in flight then are
    recorded cancelled, as a stopped HTTP run records them. keys: each prompt's block keys
    for the prefix cache (plan_keys); None: prompts share nothing."""
    reqs = np.asarray(list(requests), dtype=float).reshape(-1, 3)
    lengths = reqs[:, 1:].astype(np.int64)
    arrivals = [(float(off), k) for k, off in enumerate(reqs[:, 0])]
    trace = _drive(engine, lengths, arrivals, max_steps, stop=stop, keys=keys)
    return _records(trace, lengths, load_point)


def plan_keys(engine: Engine, plan) -> list[list[int]] | None:
    """Each request's prompt block keys at the engine's cache granularity, from the prompt
    as the client would send it (bench.sim.prefix_cache): a block-hashed trace's keys come
    from its ids (equal ids are identical text); other prompts are rendered and their words
    hashed, words being the simulator's tokens. None when the cache is off or the workload
    cannot repeat a prompt block (random prompts without a shared prefix)."""
    cache, wl = engine.cache, plan.workload
    if cache is None:
        return None
    if wl.blocks is not None:
        bp = wl.blocks
        return [
            trace_block_keys(bp.hash_ids[s.index], s.input_len, bp.block_size, cache.block_tokens)
            for s in plan.specs
        ]
    if not wl.repeats_prompt_blocks:
        return None
    chat = plan.endpoint.endswith("chat/completions")
    return [cache.keys(prompt_words(wl, spec, chat)) for spec in plan.specs]


def _closed(
    engine, lengths, users, think_time_s, ramp_up_s, duration_s, max_steps, stop=None, keys=None
) -> _Trace:
    """A closed loop of `users` in virtual time: each user sends the next of the (input,
    output) `lengths` the moment its last request ends (plus think time), as the HTTP
    runner's closed loop does; starts are spread over ramp_up_s; no request is started
    after duration_s."""
    n = len(lengths)
    first = [(u * ramp_up_s / users, u) for u in range(min(users, n))]
    upcoming = [len(first)]

    def then(t: float) -> tuple[float, int] | None:
        k, at = upcoming[0], t + think_time_s
        if k >= n or (duration_s is not None and at >= duration_s):
            return None
        upcoming[0] += 1
        return at, k

    return _drive(engine, lengths, first, max_steps, then, stop, keys)


@dataclass
class _Trace:
    """What the event loop saw: per request its send time (NaN: never sent) and emission
    step ranges (or why it was refused), and the end time of every step."""

    sent_s: np.ndarray
    tracks: list[_Track | None]
    refused: dict[int, str]
    step_end: np.ndarray

    def times(self, k: int) -> np.ndarray:
        """Step indices at whose ends request k emitted its tokens (a sequence preempted
        before its first token has a segment starting at -1: nothing emitted)."""
        return np.concatenate([np.arange(a, b) for a, b in self.tracks[k].segments if a >= 0])


def _drive(
    engine: Engine,
    lengths: np.ndarray,
    arrivals: list[tuple[float, int]],
    max_steps: int,
    then: Callable[[float], tuple[float, int] | None] | None = None,
    stop: threading.Event | None = None,
    keys: list[list[int]] | None = None,
) -> _Trace:
    """The event loop of virtual time. `lengths` is (input, output) per request; `arrivals`
    (time s, request) are sent when due; `then(t)`, called when a request ends at t, may
    give the next arrival (a closed loop's user). Setting `stop` ends it before the next
    step (a cancelled run). An engine that ran an earlier trace to its end may run another
    (its clock and step count carry on; this trace counts its own steps from zero, and what
    the engine's prefix cache kept stays); one with requests still in flight is refused."""
    if engine.has_work():
        raise ValueError(
            "this simulated engine still holds requests of an earlier trace; replay on a "
            "fresh engine (bench.sim.virtual.build_engine)"
        )
    heapq.heapify(arrivals)
    front = engine.dep.eff.t_req_s  # the front end's time before the scheduler sees a request
    first_step = engine.step_index  # an engine reused after an earlier trace counts on
    n = len(lengths)
    trace = _Trace(np.full(n, np.nan), [None] * n, {}, np.zeros(0))
    step_end: list[float] = []
    t, idle = 0.0, 0

    def ended() -> None:
        nxt = then(t) if then is not None else None
        if nxt is not None:
            heapq.heappush(arrivals, nxt)

    for _ in range(max_steps):
        if stop is not None and stop.is_set():
            break
        if not engine.has_work():
            if not arrivals:
                break
            t = max(t, arrivals[0][0] + front)
        while arrivals and arrivals[0][0] + front <= t:
            at, k = heapq.heappop(arrivals)
            trace.sent_s[k] = at
            try:
                seq = engine.add_request(
                    k, int(lengths[k, 0]), int(lengths[k, 1]), tag=_Track(k),
                    keys=keys[k] if keys is not None else None, ago_s=t - at - front,
                )  # fmt: skip
                trace.tracks[k] = seq.tag
            except ValueError as exc:
                trace.refused[k] = str(exc)
                ended()
        res = engine.step()
        if res is None:
            continue
        idle = idle + 1 if res.duration_s <= 0 else 0
        if idle > IDLE_STEPS:
            raise RuntimeError(
                f"the simulated engine ran nothing for {IDLE_STEPS:,} steps with requests "
                f"waiting at {t:.3f} s: a request it can never admit (report this run's settings)"
            )
        t += res.duration_s
        step_end.append(t)
        s = res.index - first_step
        for seq in res.preempted:
            tr = seq.tag
            tr.segments.append((tr.start, s))
            tr.start = -1
        for seq in res.first_tokens:
            seq.tag.start = s
            if seq.tag.cached is None and seq.cached_tokens >= 0:
                seq.tag.cached = seq.cached_tokens
        for seq in res.finished:
            tr = seq.tag
            tr.segments.append((tr.start, s + 1))
            tr.done = True
            ended()
    else:
        raise RuntimeError(f"virtual run did not finish within {max_steps} steps")
    trace.step_end = np.asarray(step_end)
    return trace


def _records(trace: _Trace, lengths: np.ndarray, load_point: int) -> list[RequestRecord]:
    """One RequestRecord per request sent, as the HTTP runner would have measured it."""
    times_ns = np.round(trace.step_end * 1e9).astype(np.int64)
    records = []
    for k in np.flatnonzero(~np.isnan(trace.sent_s)).tolist():
        sent, prompt = int(round(trace.sent_s[k] * 1e9)), int(lengths[k, 0])
        request = dict(
            index=k,
            load_point=load_point,
            intended_ns=sent,
            sent_ns=sent,
            prompt_tokens=prompt,
            token_count_source=COUNT_TOKENIZER,
            expected_input_len=prompt,
            expected_output_len=int(lengths[k, 1]),
        )
        if k in trace.refused:
            records.append(
                RequestRecord(
                    **request,
                    first_byte_ns=sent,
                    end_ns=sent,
                    output_tokens=0,
                    http_status=400,
                    state=FAILED,
                    error_kind=ERR_HTTP_4XX,
                    error_message=trace.refused[k],
                )
            )
            continue
        if not trace.tracks[k].done:  # in flight when the run was stopped
            records.append(
                RequestRecord(
                    **request,
                    output_tokens=0,
                    state=CANCELLED,
                    error_kind=ERR_CANCELLED,
                    error_message="run stopped",
                )
            )
            continue
        chunks = times_ns[trace.times(k)]
        records.append(
            RequestRecord(
                **request,
                cached_prompt_tokens=trace.tracks[k].cached,
                first_byte_ns=int(chunks[0]),
                first_token_ns=int(chunks[0]),
                end_ns=int(chunks[-1]),
                chunk_times_ns=chunks,
                output_tokens=len(chunks),
                http_status=200,
            )
        )
    return records


def simulate(
    requests: Iterable[tuple[float, int, int]],
    gpu: str,
    model: str,
    precision: str = "fp8",
    tp: int = 1,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    kv_precision: str | None = None,
    load_point: int = 0,
) -> list[RequestRecord]:
    """Virtual-time run of a request list on a simulated deployment (results are simulated).

    requests: (intended send offset in seconds since run start, input tokens, output tokens).
    Returns one RequestRecord per request, in the order given; all times int ns since start.
    """
    engine = build_engine(
        gpu, model, precision, tp, max_num_seqs, max_num_batched_tokens, kv_precision
    )
    return run_virtual(engine, requests, load_point=load_point)


def virtual_requests(plan) -> list[tuple[float, int, int]]:
    """(offset s, input tokens, output tokens) of an open-loop single-turn RunPlan."""
    _single_turn(plan)
    return [
        (float(off), spec.input_len, spec.output_len)
        for off, spec in zip(plan.offsets_s, plan.specs, strict=False)
    ]


def _single_turn(plan) -> None:
    if any(spec.turn for spec in plan.specs):
        raise ValueError(
            "virtual time runs single-turn workloads only; for multi-turn use "
            "`tokenbench sim serve` and `tokenbench run`"
        )


@dataclass
class VirtualExecutor:
    """The Executor (bench.executor) in virtual time: each load point on a fresh simulated
    engine (build_engine's arguments), no HTTP, no waiting. Open loops send at their
    intended offsets; closed loops run their users back to back (_closed).
    Its runs are stored simulated, on the simulated GPUs, at endpoint sim://virtual."""

    gpu: str
    model: str
    precision: str = "fp8"
    tp: int = 1
    parallel: str | None = None
    engine: str = "vllm"
    options: ServeOptions = ServeOptions()
    # a calibration profile's source and expected errors (bench.sim.user_calibration), stored
    # with the run so a verdict on it widens by the profile's error, not the category's
    calibration: dict | None = None

    def build(self) -> Engine:
        o = self.options
        return build_engine(
            self.gpu, self.model, self.precision, self.tp, o.max_num_seqs,
            o.max_num_batched_tokens, o.kv_precision, parallel=self.parallel,
            engine=self.engine, mtp=o.mtp, mtp_acceptance=o.mtp_acceptance,
            mtp_acceptance_length=o.mtp_acceptance_length,
            memory_fraction=o.memory_fraction, prefix_cache=o.prefix_cache,
            disagg=o.disagg, prefill_parallel=o.prefill_parallel,
            decode_parallel=o.decode_parallel, kv_link=o.kv_link,
            api_server_count=o.api_server_count,
        )  # fmt: skip

    def adopt(self, scenario):
        """A copy of the scenario aimed at this deployment: its model, GPUs and a label
        saying virtual time (the plan needs a target URL, which nothing will call)."""
        engine = self.build()
        dep = engine.dep
        sc = scenario.model_copy(deep=True)
        sc.target.base_url = sc.target.base_url or VIRTUAL_URL
        sc.target.model = sc.target.model or dep.model.name
        sc.gpu.type, sc.gpu.count = dep.gpu.name, engine.gpus  # a disaggregated one: P + D
        split = f" {engine.spec}" if isinstance(engine, DisaggEngine) else ""
        sc.label = sc.label or (
            f"{dep.gpu.name} x{engine.gpus}{split} {dep.model.name} {self.precision} (virtual time)"
        )
        return sc

    def run(
        self,
        plan: RunPlan,
        sink: Callable[[RequestRecord], None],
        stop: threading.Event | None = None,
        on_tick: Callable[[Progress], None] | None = None,
    ) -> RunResult:
        _single_turn(plan)
        records: list[RequestRecord] = []
        if stop is None or not stop.is_set():
            lengths = np.array([(s.input_len, s.output_len) for s in plan.specs], np.int64)
            engine = self.build()
            keys = plan_keys(engine, plan)
            if plan.offsets_s is None:
                lengths = lengths.reshape(-1, 2)
                trace = _closed(
                    engine, lengths, plan.concurrency or 1, plan.think_time_s,
                    plan.ramp_up_s, plan.duration_s, MAX_STEPS, stop, keys,
                )  # fmt: skip
                records = _records(trace, lengths, plan.load_point)
            else:
                records = run_virtual(
                    engine, virtual_requests(plan), load_point=plan.load_point, stop=stop,
                    keys=keys,
                )  # fmt: skip
        for rec in records:
            sink(rec)
        if on_tick is not None:
            done = sum(r.ok for r in records)
            on_tick(Progress(len(records), len(records), done, len(records) - done, 0))
        end = max((r.end_ns or 0) for r in records) if records else 0
        return RunResult(
            records=records, duration_s=end / 1e9, loop_lag_p99_ms=0.0, loop_lag_max_ms=0.0,
            interrupted=stop is not None and stop.is_set(), t0_ns=0,
        )  # fmt: skip

    def stored_as(self) -> StoredAs:
        engine = self.build()
        dep = engine.dep
        hw = {
            "gpu": dep.gpu.name,
            "gpu_count": engine.gpus,  # a disaggregated deployment: prefill + decode GPUs
            "model": dep.model.name,
            "precision": self.precision,
            "tp": dep.tp,
            "parallel": dep.parallel,
            "engine": self.engine,
            "clock": "virtual",
            **engine.knobs(),
            **({"calibration": self.calibration} if self.calibration else {}),
        }
        return StoredAs(
            sim=hw, endpoint="sim://virtual", backend="sim", scrapes=False, exact_lengths=True
        )


def run_closed_loop(
    engine: Engine,
    concurrency: int,
    isl: tuple[int, int],
    osl: int,
    rounds: float = 2.0,
    seed: int = 0,
    max_steps: int = 2_000_000,
) -> dict[str, float]:
    """A closed loop in virtual time: `concurrency` clients, each sending its next request the
    moment the last one finishes (InferenceX's max-concurrency runs, trtllm-bench's offline runs).

    Prompt lengths are uniform in [isl[0], isl[1]]; every request asks for `osl` tokens. The
    first wave asks for uniform 1..osl tokens so the clients fall out of step, as they are after
    a real run's first minutes; measurement runs from the end of that wave until the last of
    `rounds` x concurrency requests is sent, while exactly `concurrency` are in flight.
    Returns output and total tok/s of the deployment and the median TPOT (s) of the requests
    that ran wholly inside the window.
    """
    rng = np.random.default_rng(seed)
    c = concurrency
    n = c + max(int(rounds * c), 1)
    prompts = rng.integers(isl[0], isl[1] + 1, n)
    warm = rng.integers(1, osl + 1, c)
    lengths = np.column_stack([prompts, np.concatenate([warm, np.full(n - c, osl)])])
    trace = _closed(engine, lengths, c, 0.0, 0.0, None, max_steps)
    steps = [trace.times(k) for k in range(n)]  # every request is sent: n users' worth
    i_lo = max(int(s[-1]) for s in steps[:c])  # the step that ended the warm wave
    i_hi = int(np.searchsorted(trace.step_end, trace.sent_s.max()))  # the last send's
    t_lo, t_hi = trace.step_end[i_lo], trace.step_end[i_hi]
    if t_hi <= t_lo:
        raise RuntimeError("closed loop too short to measure; raise rounds")
    tokens = sum(int(((s > i_lo) & (s <= i_hi)).sum()) for s in steps)
    out_tps = tokens / (t_hi - t_lo)
    spans = [(trace.sent_s[k], trace.step_end[s[0]], trace.step_end[s[-1]]) for k, s in
             enumerate(steps) if k >= c]  # fmt: skip
    inside = [(f, e) for sent, f, e in spans if sent >= t_lo and e <= t_hi] or [
        (f, e) for _, f, e in spans
    ]
    tpots = [(e - f) / max(osl - 1, 1) for f, e in inside]
    return {
        "output_tps": float(out_tps),
        "total_tps": float(out_tps * (1 + float(np.mean(prompts[c:])) / osl)),
        "tpot_s": float(np.median(tpots)),
    }


def replay_closed(
    engine: Engine, lengths: np.ndarray, users: int, max_steps: int = MAX_STEPS
) -> list[RequestRecord]:
    """(input, output) `lengths` sent in order by a closed loop of `users` with no think time,
    as a measured closed-loop point sent them (the calibration replays stored points)."""
    lengths = np.asarray(lengths, np.int64).reshape(-1, 2)
    return _records(_closed(engine, lengths, users, 0.0, 0.0, None, max_steps), lengths, 0)
