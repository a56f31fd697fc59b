"""`tokenbench run`: one load point, like `vllm bench serve`, and vLLM's result JSON."""

from __future__ import annotations

import math
from typing import Annotated

import typer

from bench.cli.common import (
    _csv_floats,
    fail,
    flag_overrides,
    resolve_scenario,
    resolve_target,
    telemetry_config,
)
from bench.cli.options import (
    ApiKeyOpt,
    BackendOpt,
    BaseUrlOpt,
    BlockSizeOpt,
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
    PercentileMetricsOpt,
    PortOpt,
    RampUpEndRpsOpt,
    RampUpStartRpsOpt,
    RampUpStrategyOpt,
    RangeRatioOpt,
    RayOpt,
    RequestTimeoutOpt,
    ScenarioOpt,
    ScrapeOpt,
    SeedOpt,
    SkipTokenizerInitOpt,
    SummaryJsonOpt,
    TemperatureOpt,
    TokenizerOpt,
    TopKOpt,
    TopPOpt,
    TransportOpt,
    WorkersOpt,
)
from bench.cli.summary_json import summary_document, write_json
from bench.console import console, err_console


def run_command(
    base_url: BaseUrlOpt = None,
    endpoint: EndpointOpt = None,
    backend: BackendOpt = None,
    model: ModelOpt = None,
    scenario: ScenarioOpt = None,
    num_prompts: NumPromptsOpt = None,
    request_rate: Annotated[
        str | None, typer.Option("--request-rate", help="Requests/s, or inf to send all at once")
    ] = None,
    burstiness: Annotated[
        float | None,
        typer.Option("--burstiness", help="Gamma shape: 1 = Poisson, <1 burstier, >1 steadier"),
    ] = None,
    max_concurrency: Annotated[
        int | None,
        typer.Option("--max-concurrency", min=1, help="Open loop: at most N requests in flight"),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency",
            min=1,
            help="Closed loop: N users back to back; with --request-rate, a cap of N in flight",
        ),
    ] = None,
    think_time: Annotated[
        float | None, typer.Option("--think-time", min=0, help="Closed loop: s between requests")
    ] = None,
    duration: Annotated[
        float | None, typer.Option("--duration", help="Stop starting requests after this many s")
    ] = None,
    ramp_up: Annotated[
        float | None,
        typer.Option("--ramp-up", min=0, help="Closed loop: spread the users' starts over s"),
    ] = None,
    random_input_len: InputLenOpt = None,
    random_output_len: OutputLenOpt = None,
    random_range_ratio: RangeRatioOpt = None,
    dataset_name: DatasetNameOpt = None,
    dataset_path: DatasetPathOpt = None,
    block_size: BlockSizeOpt = None,
    tokenizer: TokenizerOpt = None,
    percentile_metrics: PercentileMetricsOpt = None,
    metric_percentiles: MetricPercentilesOpt = None,
    goodput: GoodputOpt = None,
    seed: SeedOpt = None,
    ignore_eos: IgnoreEosOpt = None,
    request_timeout: RequestTimeoutOpt = None,
    api_key: ApiKeyOpt = None,
    transport: TransportOpt = "raw",
    summary_json: SummaryJsonOpt = None,
    fail_on: Annotated[
        str | None,
        typer.Option("--fail-on", help="e.g. 'p99_ttft_ms<800,error_rate<0.01': exit 1 if broken"),
    ] = None,
    save_result: Annotated[
        bool, typer.Option("--save-result", help="Also write vLLM's result JSON (vllm bench serve)")
    ] = False,
    save_detailed: Annotated[
        bool,
        typer.Option("--save-detailed", help="vLLM result JSON: add per-request lists"),
    ] = False,
    result_dir: Annotated[
        str | None, typer.Option("--result-dir", help="Folder of the vLLM result JSON")
    ] = None,
    result_filename: Annotated[
        str | None,
        typer.Option(
            "--result-filename", help="Its name; default as vLLM's ({label}-{rate}qps-...)"
        ),
    ] = None,
    metadata: Annotated[
        list[str] | None,
        typer.Option("--metadata", help="KEY=VALUE ... copied into the vLLM result JSON"),
    ] = None,
    disable_tqdm: Annotated[
        bool, typer.Option("--disable-tqdm", help="No progress bar (vLLM's flag)")
    ] = False,
    workers: WorkersOpt = 1,
    ray: RayOpt = None,
    gpu: GpuOpt = None,
    num_gpus: NumGpusOpt = None,
    label: LabelOpt = None,
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
    """Benchmark one endpoint at one load point (like `vllm bench serve`)."""
    from bench.executor import plan_from_scenario
    from bench.metrics import broken_thresholds, parse_thresholds
    from bench.runner import defer_termination, interrupted_exit_code

    defer_termination()  # SIGTERM stops like Ctrl-C: flush, mark interrupted, exit 143

    try:
        thresholds = parse_thresholds(fail_on)
    except ValueError as exc:
        raise fail(str(exc)) from None
    vllm_options = vllm_result_options(
        save_result, save_detailed, result_dir, result_filename, metadata,
        percentile_metrics, metric_percentiles, tokenizer,
    )  # fmt: skip
    overrides = flag_overrides(
        base_url=base_url, endpoint=endpoint, backend=backend, model=model,
        num_prompts=num_prompts, request_rate=request_rate, burstiness=burstiness,
        max_concurrency=max_concurrency, concurrency=concurrency, think_time=think_time,
        duration=duration, ramp_up=ramp_up, random_input_len=random_input_len,
        random_output_len=random_output_len, random_range_ratio=random_range_ratio,
        dataset_name=dataset_name, dataset_path=dataset_path, block_size=block_size,
        tokenizer=tokenizer,
        percentile_metrics=percentile_metrics, metric_percentiles=metric_percentiles,
        goodput=goodput, seed=seed, ignore_eos=ignore_eos, request_timeout=request_timeout,
        gpu=gpu, num_gpus=num_gpus, label=label,
        num_warmups=num_warmups, ramp_up_strategy=ramp_up_strategy,
        ramp_up_start_rps=ramp_up_start_rps, ramp_up_end_rps=ramp_up_end_rps,
        vllm=dict(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                  extra_body=extra_body, header=header, host=host, port=port,
                  skip_tokenizer_init=skip_tokenizer_init),
    )  # fmt: skip
    sc = resolve_scenario(scenario, overrides, "run")
    key = resolve_target(sc, api_key)
    base_dir = scenario.parent if scenario else None
    try:
        plan = plan_from_scenario(sc, base_dir=base_dir, api_key=key, transport=transport)
    except ValueError as exc:
        raise fail(str(exc)) from None

    from bench.console import TerminalDisplay
    from bench.distributed import DistributedError
    from bench.drive import choose_executor, measure
    from bench.store import StoreError

    try:
        measured = measure(
            sc, executor=choose_executor(workers=workers, ray=ray), plan=plan, db=db,
            store=not no_store, display=None if disable_tqdm else TerminalDisplay(),
            telemetry=telemetry_config(scrape_metrics, metrics_url, metrics_interval, dcgm_url, nvml),
        )  # fmt: skip
    except (StoreError, DistributedError) as exc:
        raise fail(str(exc)) from None
    sc, run_id = measured.scenario, measured.run_id  # sc as run: a simulator's GPUs, say
    (point,) = measured.points
    result, summary = point.run, point.summary
    for line in result.warnings:  # a distributed run's per-worker findings
        err_console.print(f"[yellow]warning:[/] {line}")
    from bench.console import outcome, print_outcome, print_summary
    from bench.metrics import LATENCY_METRICS

    print_summary(
        summary,
        title=f"Results: {sc.name} → {sc.target.base_url}",
        metrics=tuple(m for m in sc.percentile_metrics if m in LATENCY_METRICS),
        slo=sc.capacity_slo() if sc.classes else (),
    )
    said = outcome(result.records, summary, sc.target.model, result.served_models)
    print_outcome(said, summary)
    if not sc.seed_fixed:  # fresh prompts: the seed that repeats them (also stored)
        console.print(f"Prompts: fresh, seed {sc.run_seed()} (--seed {sc.run_seed()} repeats them)")
    if result.workers:  # a distributed run: each worker, named
        from bench.cli.store import workers_table

        console.print(workers_table("run", [w.to_json() for w in result.workers]))
    if run_id:
        console.print(f"Stored as run [bold]{run_id}[/]  (tokenbench show {run_id})")
    if summary_json is not None:
        write_json(summary_json, {**summary_document(summary, sc, result.records, run_id), **said})
    if vllm_options is not None:
        save_vllm_result(vllm_options, sc, plan, summary, result.records, run_id)
    broken = broken_thresholds(summary, thresholds) if thresholds else []
    if not thresholds:
        broken = failed_share_broken(summary.failed, summary.completed + summary.failed)
    for line in broken:
        err_console.print(f"[bold red]FAIL[/] {line}", highlight=False, soft_wrap=True)
    if broken:
        raise typer.Exit(1)
    if summary.interrupted:
        raise typer.Exit(interrupted_exit_code())
    if summary.completed == 0 and summary.failed:
        raise typer.Exit(1)  # nothing measured: a script must not take this for a result


def failed_share_broken(failed: int, total: int) -> list[str]:
    """Without --fail-on: one FAIL line when more than DEFAULT_MAX_FAILED_SHARE failed."""
    from bench.metrics import DEFAULT_MAX_FAILED_SHARE

    if not total or failed / total <= DEFAULT_MAX_FAILED_SHARE:
        return []
    return [
        f"{failed:,} of {total:,} requests failed ({failed / total:.0%}), over the "
        f"{DEFAULT_MAX_FAILED_SHARE:.0%} a run may lose (--fail-on sets your own gates)"
    ]


def vllm_result_options(
    save_result, save_detailed, result_dir, result_filename, metadata,
    percentile_metrics, metric_percentiles, tokenizer,
):  # fmt: skip
    """vLLM's result-file flags as VllmResultOptions, or None when no file is asked for.
    --result-dir, --result-filename or --save-detailed alone also ask for one (vLLM would
    silently write nothing)."""
    if not (save_result or save_detailed or result_dir or result_filename):
        if metadata:
            raise fail("--metadata goes into the vLLM result JSON: add --save-result")
        return None
    from bench.vllm_result import VllmResultOptions, parse_metadata

    try:
        parse_metadata(metadata or [])
    except ValueError as exc:
        raise fail(str(exc)) from None
    metrics = [m.strip() for m in (percentile_metrics or "").split(",") if m.strip()]
    return VllmResultOptions(
        result_dir=result_dir,
        result_filename=result_filename,
        save_detailed=save_detailed,
        metadata=list(metadata or []),
        percentile_metrics=metrics or None,
        metric_percentiles=_csv_floats(metric_percentiles, "--metric-percentiles"),
        tokenizer=tokenizer,
    )


def save_vllm_result(options, sc, plan, summary, records, run_id: str | None) -> None:
    """Write vLLM's result JSON for this run and say where."""
    from bench.metrics import parse_goodput
    from bench.vllm_result import vllm_result, write_vllm_result

    load = sc.load
    closed = plan.offsets_s is None
    ramp = load.ramp_up.model_dump() if load.shape == "ramp_up" and load.ramp_up else None
    doc = vllm_result(
        records=records,
        summary=summary,
        backend=sc.target.backend,
        model_id=sc.target.model or "default",
        num_prompts=len(plan.specs),
        request_rate=math.inf if closed or ramp else load.request_rate,
        burstiness=load.burstiness,
        max_concurrency=plan.concurrency if closed else plan.max_concurrency,
        goodput=parse_goodput(sc.goodput) if sc.goodput else None,
        options=options,
        label=sc.label,
        run_id=run_id,
        ramp_up=ramp,
    )
    try:
        path = write_vllm_result(doc, options)
    except OSError as exc:
        raise fail(f"cannot write the vLLM result JSON: {exc.strerror or exc}") from None
    console.print(f"vLLM result JSON: {path}", highlight=False, soft_wrap=True)
