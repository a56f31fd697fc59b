"""`tokenbench sweep`: many load points in one stored run, its knee and SLO capacity."""

from __future__ import annotations

import typer

from bench.cli.common import (
    _catalogue,
    fail,
    flag_overrides,
    resolve_scenario,
    resolve_target,
    telemetry_config,
)
from bench.cli.options import (
    ApiKeyOpt,
    AutoOpt,
    BackendOpt,
    BaseUrlOpt,
    ConcurrencyPointsOpt,
    CooldownOpt,
    DatasetNameOpt,
    DatasetPathOpt,
    DbOpt,
    DcgmUrlOpt,
    EndpointOpt,
    ExtraBodyOpt,
    GoodputOpt,
    GpuOpt,
    HeaderOpt,
    HostOpt,
    IgnoreEosOpt,
    InputLenOpt,
    LabelOpt,
    MaxErrorRateOpt,
    MetricPercentilesOpt,
    MetricsIntervalOpt,
    MetricsUrlOpt,
    MinPOpt,
    ModelOpt,
    NoStoreOpt,
    NumGpusOpt,
    NumPromptsOpt,
    NumWarmupsOpt,
    NvmlOpt,
    OutputLenOpt,
    PointDurationOpt,
    PortOpt,
    PriceOpt,
    PricesFileOpt,
    RampUpEndRpsOpt,
    RampUpStartRpsOpt,
    RampUpStrategyOpt,
    RangeRatioOpt,
    RayOpt,
    RequestRatesOpt,
    RequestTimeoutOpt,
    ScenarioOpt,
    ScrapeOpt,
    SeedOpt,
    SkipTokenizerInitOpt,
    SloDrawsOpt,
    SloIterationsOpt,
    SloOpt,
    SummaryJsonOpt,
    SweepFailOnOpt,
    TemperatureOpt,
    TokenizerOpt,
    TopKOpt,
    TopPOpt,
    TransportOpt,
    UtilisationOpt,
    WarmupOpt,
    WorkersOpt,
)
from bench.cli.summary_json import summary_document, write_json
from bench.console import console, err_console, sweep_progress


def sweep_command(
    base_url: BaseUrlOpt = None,
    endpoint: EndpointOpt = None,
    backend: BackendOpt = None,
    model: ModelOpt = None,
    scenario: ScenarioOpt = None,
    request_rates: RequestRatesOpt = None,
    concurrency: ConcurrencyPointsOpt = None,
    auto: AutoOpt = None,
    slo: SloOpt = None,
    slo_iterations: SloIterationsOpt = None,
    slo_draws: SloDrawsOpt = None,
    num_prompts: NumPromptsOpt = None,
    point_duration: PointDurationOpt = None,
    warmup: WarmupOpt = 0.0,
    cooldown: CooldownOpt = 0.0,
    max_error_rate: MaxErrorRateOpt = None,
    random_input_len: InputLenOpt = None,
    random_output_len: OutputLenOpt = None,
    random_range_ratio: RangeRatioOpt = None,
    dataset_name: DatasetNameOpt = None,
    dataset_path: DatasetPathOpt = None,
    tokenizer: TokenizerOpt = None,
    metric_percentiles: MetricPercentilesOpt = None,
    goodput: GoodputOpt = None,
    seed: SeedOpt = None,
    ignore_eos: IgnoreEosOpt = None,
    request_timeout: RequestTimeoutOpt = None,
    api_key: ApiKeyOpt = None,
    transport: TransportOpt = "raw",
    summary_json: SummaryJsonOpt = None,
    fail_on: SweepFailOnOpt = None,
    workers: WorkersOpt = 1,
    ray: RayOpt = None,
    gpu: GpuOpt = None,
    num_gpus: NumGpusOpt = None,
    label: LabelOpt = None,
    prices_file: PricesFileOpt = None,
    price: PriceOpt = None,
    utilisation: UtilisationOpt = 1.0,
    db: DbOpt = None,
    no_store: NoStoreOpt = False,
    scrape_metrics: ScrapeOpt = True,
    metrics_url: MetricsUrlOpt = None,
    metrics_interval: MetricsIntervalOpt = 1.0,
    dcgm_url: DcgmUrlOpt = None,
    nvml: NvmlOpt = False,
    temperature: TemperatureOpt = None,
    top_p: TopPOpt = None,
    top_k: TopKOpt = None,
    min_p: MinPOpt = None,
    extra_body: ExtraBodyOpt = None,
    header: HeaderOpt = None,
    host: HostOpt = None,
    port: PortOpt = None,
    skip_tokenizer_init: SkipTokenizerInitOpt = False,
    num_warmups: NumWarmupsOpt = None,
    ramp_up_strategy: RampUpStrategyOpt = None,
    ramp_up_start_rps: RampUpStartRpsOpt = None,
    ramp_up_end_rps: RampUpEndRpsOpt = None,
) -> None:
    """Measure the throughput-versus-latency curve: many load points in one stored run."""
    from bench.runner import defer_termination

    defer_termination()  # SIGTERM stops like Ctrl-C: flush, mark interrupted, exit 143

    if len([m for m in (request_rates, concurrency, auto) if m is not None]) != 1:
        raise fail("give exactly one of --request-rates, --concurrency or --auto N")
    overrides = flag_overrides(
        base_url=base_url, endpoint=endpoint, backend=backend, model=model,
        num_prompts=num_prompts, random_input_len=random_input_len,
        random_output_len=random_output_len, random_range_ratio=random_range_ratio,
        dataset_name=dataset_name, dataset_path=dataset_path, tokenizer=tokenizer,
        metric_percentiles=metric_percentiles, goodput=goodput, seed=seed,
        ignore_eos=ignore_eos, request_timeout=request_timeout, gpu=gpu, num_gpus=num_gpus,
        label=label,
        num_warmups=num_warmups, ramp_up_strategy=ramp_up_strategy,
        ramp_up_start_rps=ramp_up_start_rps, ramp_up_end_rps=ramp_up_end_rps,
        vllm=dict(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                  extra_body=extra_body, header=header, host=host, port=port,
                  skip_tokenizer_init=skip_tokenizer_init),
    )  # fmt: skip
    sc = resolve_scenario(scenario, overrides, "sweep")
    plan, gates = sweep_plan(
        sc, request_rates, concurrency, auto, slo, slo_iterations, point_duration, warmup,
        cooldown, max_error_rate, fail_on, slo_draws=slo_draws,
    )  # fmt: skip
    key = resolve_target(sc, api_key)
    catalogue = _catalogue(prices_file, price)
    from bench.console import TerminalDisplay
    from bench.drive import choose_executor

    result = measure_sweep(
        sc, plan, executor=choose_executor(workers=workers, ray=ray), api_key=key,
        transport=transport, db=db, store=not no_store, display=TerminalDisplay(),
        base_dir=scenario.parent if scenario else None,
        telemetry=telemetry_config(scrape_metrics, metrics_url, metrics_interval, dcgm_url, nvml),
    )  # fmt: skip
    sc = result.scenario  # as run: a simulator's GPUs, when the endpoint is one
    print_sweep_result(result, sc, catalogue, utilisation)
    conclude_sweep(result, sc, db, gates, summary_json)


def sweep_plan(
    sc, request_rates, concurrency, auto, slo, slo_iterations, point_duration, warmup,
    cooldown, max_error_rate, fail_on, *, slo_draws=None,
):  # fmt: skip
    """The sweep flags as (bench.sweep.SweepPlan, --fail-on thresholds); a bad flag is one
    line naming it. No --slo: the scenario file's SLO, same grammar; a scenario's traffic
    classes add their own SLOs (CLASS:NAME thresholds)."""
    from bench.metrics import parse_thresholds
    from bench.sweep import STOP_ERROR_RATE, PointSpec, SweepPlan, parse_values

    try:
        if request_rates is not None:
            specs = [PointSpec("rate", v) for v in parse_values(request_rates, "--request-rates")]
        elif concurrency is not None:
            values = parse_values(concurrency, "--concurrency")
            specs = [PointSpec("concurrency", int(v)) for v in values]
        else:
            specs = []
        # --slo, else the scenario's own; each traffic class's own SLO is added either way
        thresholds = sc.capacity_slo(slo)
        gates = parse_thresholds(fail_on)
    except ValueError as exc:
        raise fail(str(exc)) from None
    plan = SweepPlan(
        specs=specs, auto=auto, thresholds=thresholds,
        point_duration_s=point_duration, warmup_s=warmup, cooldown_s=cooldown,
        max_error_rate=STOP_ERROR_RATE if max_error_rate is None else max_error_rate,
    )  # fmt: skip
    if slo_iterations is not None:  # else the library's default
        plan.slo_iterations = slo_iterations
    if slo_draws is not None:
        plan.slo_draws = slo_draws
    return plan, gates


def measure_sweep(sc, plan, **kw):
    """bench.drive.measure with a progress line per point; its errors as one line."""
    from bench.distributed import DistributedError
    from bench.drive import measure
    from bench.store import StoreError

    try:
        return measure(sc, plan, on_point=sweep_progress, **kw)
    except (ValueError, StoreError, DistributedError) as exc:
        raise fail(str(exc)) from None


def conclude_sweep(
    result, sc, db: str | None, gates, summary_json, sim_error: dict | None = None
) -> None:
    """--summary-json, the --fail-on verdict and the exit code of a finished sweep;
    `sim_error` (a simulated sweep's expected errors, bench.sim.error_bars) goes in the JSON."""
    from bench.cli.run import failed_share_broken
    from bench.runner import interrupted_exit_code

    completed = sum(p.summary.completed for p in result.points)
    failed = sum(p.summary.failed for p in result.points)
    if failed:
        print_first_failure(result, db, failed, completed + failed)
    if completed == 0 and failed:
        err_console.print("[bold red]No request succeeded.[/]")
    broken = (
        sweep_gates(result, gates) if gates else failed_share_broken(failed, completed + failed)
    )
    if summary_json is not None:
        doc = sweep_document(result, sc, db, broken)
        if sim_error is not None:
            doc["simulation_error"] = {k: v for k, v in sim_error.items() if k != "points"}
            for point in doc["points"]:
                point["expected_error"] = sim_error["points"].get(point["index"])
        write_json(summary_json, doc)
    for line in broken:
        err_console.print(f"[bold red]FAIL[/] {line}", highlight=False, soft_wrap=True)
    if broken:
        raise typer.Exit(1)
    if result.interrupted:
        raise typer.Exit(interrupted_exit_code())
    if completed == 0 and failed:
        raise typer.Exit(1)  # nothing measured: a script must not take this for a result


def print_first_failure(result, db: str | None, failed: int, total: int) -> None:
    """The sweep's first failure in one line (read back from the store), with how many
    requests had succeeded before it over the whole sweep."""
    from rich.markup import escape

    from bench.console import failure_line, outcome

    point = next(p for p in result.points if p.summary.failed)
    earlier = sum(p.summary.completed for p in result.points if p.index < point.index)
    records = _stored_records(result.run_id, point.index, db)
    first = outcome(records, point.summary, None, [])["first_failure"]
    if first is None:  # not stored (--no-store): the kinds are all that is known
        kinds = ", ".join(f"{k} x{n}" for k, n in point.summary.errors.items())
        first = {"error_kind": kinds, "message": "", "succeeded_before": 0}
    first["succeeded_before"] += earlier
    later = sum(p.summary.completed for p in result.points if p.index > point.index)
    first["succeeded_after"] = first.get("succeeded_after", 0) + later
    line = f"point {point.index + 1} ({point.spec.title}): " + failure_line(first, failed, total)
    err_console.print(f"[bold red]{escape(line)}[/]", highlight=False, soft_wrap=True)


def sweep_gates(result, gates) -> list[str]:
    """--fail-on on a sweep: every measured load point must hold every threshold."""
    from bench.metrics import broken_thresholds

    return [
        f"point {p.index + 1} ({p.spec.title}): {line}"
        for p in result.points
        for line in broken_thresholds(p.summary, gates)
    ]


def sweep_document(result, sc, db: str | None, broken: list[str]) -> dict:
    """`sweep --summary-json`: the run, its target and settings, and per load point the
    same summary contract as `run --summary-json` (with its failure examples, read back
    from the store), plus the knee, the SLO capacity and the --fail-on verdict."""
    points = []
    for p in result.points:
        records = _stored_failures(result.run_id, p.index, db) if p.summary.failed else []
        doc = summary_document(p.summary, sc, records, result.run_id)
        doc["load"] = {**doc["load"], "point": p.spec.title}
        points.append({"index": p.index, "role": p.role, "meets_slo": p.meets_slo, **doc})
    return {
        "run_id": result.run_id,
        "model": sc.target.model,
        "base_url": sc.target.base_url,
        "endpoint": sc.target.endpoint,
        "backend": sc.target.backend,
        "interrupted": result.interrupted,
        "stopped_early": result.stopped_early,
        "knee_point": result.knee.index if result.knee else None,
        "capacity_point": result.capacity.index if result.capacity else None,
        "capacity_note": result.capacity_note,
        "failed_gates": broken,
        "points": points,
    }


def _stored_failures(run_id: str | None, load_point: int, db: str | None) -> list:
    return [r for r in _stored_records(run_id, load_point, db) if r.state != "ok"]


def _stored_records(run_id: str | None, load_point: int, db: str | None) -> list:
    if run_id is None:
        return []
    from bench.store import StoreError, load_records

    try:
        return load_records(run_id, load_point, db)
    except StoreError:
        return []


def cache_line(cache: dict, served: str) -> str | None:
    """'intended 73.4% (the trace, infinite cache), simulated 63.1%, server counters -'."""
    basis = "the prompts" if "basis" in (cache.get("intended") or {}) else "the trace"
    parts = [
        f"{name} {part['share']:.1%}{why}"
        for key, name, why in (
            ("intended", "intended", f" ({basis}, infinite cache)"),
            ("usage", served, ""),
            ("server", "server counters", ""),
        )
        if (part := cache.get(key)) and part.get("share") is not None
    ]
    return ", ".join(parts) if parts else None


def print_sweep_result(
    result, sc, catalogue, utilisation: float, title: str = "", served: str = "served"
) -> None:
    """The sweep's table, knee, SLO capacity and $/Mtok; `served` names what the responses'
    cached tokens are ("simulated" for a virtual-time run)."""
    from bench.console import cost_rows_table, sweep_table
    from bench.cost import PriceCatalogueError, cost_table
    from bench.metrics import slo_text

    gpus = sc.gpu.count
    title = title or f"Sweep: {sc.name} (run {result.run_id})"
    console.print(sweep_table(result.points, gpus=gpus, title=title))
    for k, point in enumerate(result.points):
        if line := cache_line(point.summary.prompt_cache, served):
            console.print(f"Prompt cache, point {k + 1} ({point.spec.title}): {line}")
        for name, sub in point.summary.classes.items():  # and each traffic class's own
            if line := cache_line(sub.prompt_cache, served):
                console.print(f"  class {name}: {line}", highlight=False)
    if result.stopped_early:
        console.print(f"[yellow]{result.stopped_early}[/]")
    if result.knee is not None:
        console.print(
            f"Knee of the curve: point {result.knee.index + 1} ({result.knee.spec.title})"
        )
    if result.interrupted:
        console.print(
            "[bold yellow]Sweep interrupted[/]: the last point is partial and is neither the "
            "knee nor the capacity."
        )
    cap = result.at_slo
    if cap is not None:
        colour = {"interpolated": "green", "at_least": "yellow"}.get(cap.kind, "red")
        console.print(f"[bold {colour}]SLO capacity[/] ({slo_text(cap.slo)}): {cap.text()}")
        if cap.last_pass is not None or cap.first_fail is not None:
            between = " and ".join(
                f"{p.title} ({p.output_tps_per_gpu:,.0f} tok/s/GPU)"
                for p in (cap.last_pass, cap.first_fail)
                if p is not None
            )
            console.print(
                f"  bracket: {between}" + (f"; decided by {cap.deciding}" if cap.deciding else "")
            )
        if cap.covers():
            console.print(f"  {cap.covers()}")
        for flag in cap.flags:
            console.print(f"  [yellow]caution:[/] {flag}")
    at_point = cap.point if cap is not None and cap.point is not None else None
    at = result.capacity or result.knee
    if at is None or not sc.gpu.type:
        if not sc.gpu.type:
            console.print("Give --gpu (and --num-gpus) to see $/Mtok per pricing tier.")
        return
    out_tps, tot_tps = at.summary.output_tokens_per_s, at.summary.total_tokens_per_s
    if at_point is not None:  # priced at the interpolated capacity, as `compare` prices it
        out_tps, tot_tps = at_point.output_tps, at_point.total_tps
    try:
        rows = cost_table(sc.gpu.type, gpus, out_tps, tot_tps, catalogue, utilisation)
    except PriceCatalogueError as exc:
        console.print(f"[yellow]no cost: {exc}[/]")
        return
    where = "SLO capacity" if result.capacity else "the knee"
    console.print(cost_rows_table(rows, title=f"$/Mtok on {sc.gpu.type} x{gpus} at {where}"))
