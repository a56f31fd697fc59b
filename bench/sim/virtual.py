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
) -> Engine:
    """An engine for a deployment, with vLLM defaults for anything not given."""
    dep = Deployment.build(gpu, model, precision, tp, kv_precision)
    cfg = EngineConfig.default(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens
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
):
    """A run (one or many load points) in virtual time, stored like a measured run and
    marked simulated. Returns (run id, [(PointSpec, Summary), ...])."""
    from bench.metrics import parse_goodput, summarize
    from bench.runner import plan_from_scenario
    from bench.store.writer import RunWriter
    from bench.sweep import scenario_at

    engine_args = (gpu, model, precision, tp)
    dep = build_engine(*engine_args).dep
    scenario = scenario.model_copy(deep=True)
    scenario.target.base_url = scenario.target.base_url or "http://sim.virtual"
    scenario.target.model = scenario.target.model or dep.model.name
    scenario.gpu.type, scenario.gpu.count = dep.gpu.name, tp
    scenario.label = scenario.label or (
        f"{dep.gpu.name} x{tp} {dep.model.name} {precision} (virtual time)"
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
        gpu_count=tp,
        simulated=True,
        extra={"sim": {"precision": precision, "tp": tp, "clock": "virtual"}},
    )
    results = []
    status = "failed"
    try:
        for i, spec in enumerate(specs):
            sc = scenario_at(scenario, spec, point_duration_s=point_duration_s)
            plan = plan_from_scenario(sc, base_dir=base_dir, load_point=i)
            records = run_virtual(build_engine(*engine_args), virtual_requests(plan), load_point=i)
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
