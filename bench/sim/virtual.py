"""Virtual-time driver: the engine as a discrete-event simulation, no HTTP, no waiting.

Requests arrive at their intended offsets (the simulated client always sends on time), the
engine steps, and virtual time advances by each step's roofline duration. A sequence's tokens
come out at the end of consecutive steps, so the driver keeps only one array of step end times
and, per request, the [first, last) step ranges in which it emitted; token times are slices of
that array. Records come out exactly as the HTTP runner would have measured them against a
perfect network, marked by the caller as simulated.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from bench.records import COUNT_TOKENIZER, ERR_HTTP_4XX, FAILED, RequestRecord
from bench.sim.engine import Engine, EngineConfig
from bench.sim.roofline import Deployment


class _Track:
    """Per-request bookkeeping: emission step ranges."""

    __slots__ = ("index", "segments", "start")

    def __init__(self, index: int) -> None:
        self.index = index
        self.segments: list[tuple[int, int]] = []
        self.start = -1


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
    mtp: bool | None = None,
) -> Engine:
    """An engine for a deployment, with vLLM defaults for anything not given.

    parallel ("tp4", "dep8", "tep8") overrides tp. Each data-parallel rank is its own engine
    instance in a real server, so the per-instance limits (max_num_seqs,
    max_num_batched_tokens) are multiplied by dp for the one simulated scheduler.
    """
    from bench.sim.roofline import parse_parallel

    tp, dp, ep = parse_parallel(parallel) if parallel else (tp, 1, 1)
    dep = Deployment.build(
        gpu, model, precision, tp, kv_precision, dp=dp, ep=ep, engine=engine, mtp=mtp
    )
    d = EngineConfig.default()
    cfg = EngineConfig.default(
        max_num_seqs=(max_num_seqs or d.max_num_seqs) * dp,
        max_num_batched_tokens=(max_num_batched_tokens or d.max_num_batched_tokens) * dp,
    )
    return Engine(dep, cfg)


def run_virtual(
    engine: Engine,
    requests: Iterable[tuple[float, int, int]],
    load_point: int = 0,
    max_steps: int = 50_000_000,
) -> list[RequestRecord]:
    """Simulate (send offset s, input tokens, output tokens) requests; one record per request."""
    reqs = np.asarray(list(requests), dtype=float).reshape(-1, 3)
    n = len(reqs)
    order = np.argsort(reqs[:, 0], kind="stable")
    offsets = reqs[:, 0]
    records: list[RequestRecord | None] = [None] * n
    tracks: list[_Track | None] = [None] * n
    step_end: list[float] = []
    t, i = 0.0, 0
    for _ in range(max_steps):
        if not engine.has_work():
            if i >= n:
                break
            t = max(t, float(offsets[order[i]]))
        while i < n and offsets[order[i]] <= t:
            k = int(order[i])
            i += 1
            prompt, out = int(reqs[k, 1]), int(reqs[k, 2])
            try:
                tracks[k] = engine.add_request(k, prompt, out, tag=_Track(k)).tag
            except ValueError as exc:
                records[k] = _rejected(k, load_point, offsets[k], prompt, out, str(exc))
        res = engine.step()
        if res is None:
            continue
        t += res.duration_s
        step_end.append(t)
        s = res.index
        for seq in res.preempted:
            tr = seq.tag
            tr.segments.append((tr.start, s))
            tr.start = -1
        for seq in res.first_tokens:
            seq.tag.start = s
        for seq in res.finished:
            tr = seq.tag
            tr.segments.append((tr.start, s + 1))
    else:
        raise RuntimeError(f"virtual run did not finish within {max_steps} steps")
    times_ns = np.round(np.asarray(step_end) * 1e9).astype(np.int64)
    for k in range(n):
        tr = tracks[k]
        if tr is None:
            continue
        chunks = np.concatenate([times_ns[a:b] for a, b in tr.segments])
        sent = int(round(offsets[k] * 1e9))
        records[k] = RequestRecord(
            index=k,
            load_point=load_point,
            intended_ns=sent,
            sent_ns=sent,
            first_byte_ns=int(chunks[0]),
            first_token_ns=int(chunks[0]),
            end_ns=int(chunks[-1]),
            chunk_times_ns=chunks,
            prompt_tokens=int(reqs[k, 1]),
            output_tokens=len(chunks),
            token_count_source=COUNT_TOKENIZER,
            http_status=200,
            expected_input_len=int(reqs[k, 1]),
            expected_output_len=int(reqs[k, 2]),
        )
    return records  # type: ignore[return-value]


def _rejected(
    k: int, load_point: int, offset: float, prompt: int, out: int, msg: str
) -> RequestRecord:
    sent = int(round(offset * 1e9))
    return RequestRecord(
        index=k,
        load_point=load_point,
        intended_ns=sent,
        sent_ns=sent,
        first_byte_ns=sent,
        end_ns=sent,
        prompt_tokens=prompt,
        output_tokens=0,
        token_count_source=COUNT_TOKENIZER,
        http_status=400,
        state=FAILED,
        error_kind=ERR_HTTP_4XX,
        error_message=msg,
        expected_input_len=prompt,
        expected_output_len=out,
    )


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
    if plan.offsets_s is None:
        raise ValueError(
            "virtual time runs open-loop shapes only; for a closed loop use "
            "`tokenbench sim serve` and `tokenbench run --concurrency N`"
        )
    if any(spec.turn for spec in plan.specs):
        raise ValueError(
            "virtual time runs single-turn workloads only; for multi-turn use "
            "`tokenbench sim serve` and `tokenbench run`"
        )
    return [
        (float(off), spec.input_len, spec.output_len)
        for off, spec in zip(plan.offsets_s, plan.specs, strict=False)
    ]


def run_virtual_sweep(
    scenario,
    specs,
    *,
    gpu: str,
    model: str,
    precision: str = "fp8",
    tp: int = 1,
    point_duration_s: float | None = None,
    db: str | None = None,
    base_dir=None,
    parallel: str | None = None,
    engine: str = "vllm",
):
    """A run (one or many load points) in virtual time, stored like a measured run and
    marked simulated. Returns (run id, [(PointSpec, Summary), ...])."""
    from bench.metrics import parse_goodput, summarize
    from bench.runner import plan_from_scenario
    from bench.store.writer import RunWriter
    from bench.sweep import scenario_at

    engine_args = (gpu, model, precision, tp)
    engine_kw = {"parallel": parallel, "engine": engine}
    dep = build_engine(*engine_args, **engine_kw).dep
    n_gpus = dep.gpus
    scenario = scenario.model_copy(deep=True)
    scenario.target.base_url = scenario.target.base_url or "http://sim.virtual"
    scenario.target.model = scenario.target.model or dep.model.name
    scenario.gpu.type, scenario.gpu.count = dep.gpu.name, n_gpus
    scenario.label = scenario.label or (
        f"{dep.gpu.name} x{n_gpus} {dep.model.name} {precision} (virtual time)"
    )
    writer = RunWriter(
        db,
        name=scenario.name,
        label=scenario.label,
        scenario=scenario.model_dump(mode="json"),
        endpoint="sim://virtual",
        backend="sim",
        model=dep.model.name,
        gpu_type=dep.gpu.name,
        gpu_count=n_gpus,
        simulated=True,
        extra={
            "sim": {
                "precision": precision,
                "tp": dep.tp,
                "parallel": dep.parallel,
                "engine": engine,
                "clock": "virtual",
            }
        },  # fmt: skip
    )
    results = []
    status = "failed"
    try:
        for i, spec in enumerate(specs):
            sc = scenario_at(scenario, spec, point_duration_s=point_duration_s)
            plan = plan_from_scenario(sc, base_dir=base_dir, load_point=i)
            eng = build_engine(*engine_args, **engine_kw)
            records = run_virtual(eng, virtual_requests(plan), load_point=i)
            writer.start_load_point(
                i,
                label=f"point {i + 1}: {spec.title}",
                mode=sc.load.shape,
                target_rate=spec.value,
            )
            for rec in records:
                writer.submit(rec)
            summary = summarize(
                records, percentiles=sc.percentiles, goodput=parse_goodput(sc.goodput)
            )
            end = max((r.end_ns or 0) for r in records) if records else 0
            writer.end_load_point(i, ended_ns=end, summary_json=summary.to_json())
            results.append((spec, summary))
        status = "completed"
    finally:
        writer.finish(status, results[-1][1].to_json() if results else None)
    return writer.run_id, results


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
    first: dict[int, float] = {}
    sent_at: dict[int, float] = {}
    finished: list[tuple[int, float]] = []
    t, steps, tokens = 0.0, 0, 0
    t_lo = t_hi = None
    tok_lo = tok_hi = 0
    for k in range(c):
        engine.add_request(k, int(prompts[k]), int(warm[k]))
        sent_at[k] = 0.0
    started, warm_left = c, c
    while engine.has_work():
        steps += 1
        if steps > max_steps:
            raise RuntimeError(f"closed loop did not finish within {max_steps} steps")
        res = engine.step()
        if res is None:
            break
        t += res.duration_s
        tokens += res.n_decode + len(res.first_tokens)
        for seq in res.first_tokens:
            first.setdefault(seq.id, t)
        for seq in res.finished:
            if seq.id < c:
                warm_left -= 1
            else:
                finished.append((seq.id, t))
            if started < n:
                engine.add_request(started, int(prompts[started]), osl)
                sent_at[started] = t
                started += 1
        if t_lo is None and warm_left == 0:
            t_lo, tok_lo = t, tokens
        if t_hi is None and started >= n:
            t_hi, tok_hi = t, tokens
    if t_lo is None or t_hi is None or t_hi <= t_lo:
        raise RuntimeError("closed loop too short to measure; raise rounds")
    out_tps = (tok_hi - tok_lo) / (t_hi - t_lo)
    inside = [(first[k], e) for k, e in finished if sent_at[k] >= t_lo and e <= t_hi]
    tpots = [(e - f) / max(osl - 1, 1) for f, e in inside] or [
        (e - first[k]) / max(osl - 1, 1) for k, e in finished
    ]
    mean_prompt = float(np.mean(prompts[c:]))
    return {
        "output_tps": float(out_tps),
        "total_tps": float(out_tps * (1 + mean_prompt / osl)),
        "tpot_s": float(np.median(tpots)),
    }
