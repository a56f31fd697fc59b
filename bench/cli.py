"""The `tokenbench` command: each sub-command is a thin shell over a library call.

Flag names follow `vllm bench serve` where one exists, so users can carry their commands over.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Annotated

import typer

from bench.console import console, err_console, print_summary
from bench.metrics import (
    broken_thresholds,
    parse_goodput,
    parse_thresholds,
    summarize,
)
from bench.scenario import ScenarioError, deep_merge, parse_scenario

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Benchmark LLM inference endpoints: TTFT, TPOT, ITL, P99 under bursty load, $/Mtok.",
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """tokenbench: measure what an LLM deployment costs and how it feels to its users."""


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print one clear line (no traceback) and return the Exit to raise."""
    err_console.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code)


def _rate(value: str | None) -> float | None:
    if value is None:
        return None
    if value.strip().lower() in ("inf", "infinity"):
        return math.inf
    try:
        rate = float(value)
    except ValueError:
        raise fail(f"--request-rate {value!r}: expected a number of requests/s or 'inf'") from None
    if rate <= 0:
        raise fail(f"--request-rate {value!r}: must be > 0 (or 'inf')")
    return rate


def _csv_floats(value: str | None, flag: str) -> list[float] | None:
    if value is None:
        return None
    try:
        return [float(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise fail(f"{flag} {value!r}: expected comma-separated numbers, e.g. 50,90,99") from None


def flag_overrides(
    *,
    base_url=None,
    endpoint=None,
    backend=None,
    model=None,
    num_prompts=None,
    request_rate=None,
    burstiness=None,
    max_concurrency=None,
    concurrency=None,
    think_time=None,
    duration=None,
    ramp_up=None,
    random_input_len=None,
    random_output_len=None,
    random_range_ratio=None,
    dataset_name=None,
    dataset_path=None,
    percentile_metrics=None,
    metric_percentiles=None,
    goodput=None,
    seed=None,
    ignore_eos=None,
    request_timeout=None,
    gpu=None,
    num_gpus=None,
    label=None,
) -> dict:
    """Flags -> a partial scenario dict; only flags the user gave are present."""
    o: dict = {}

    def put(path: str, value) -> None:
        if value is None:
            return
        node = o
        *parents, leaf = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value

    put("target.base_url", base_url)
    put("target.endpoint", endpoint)
    put("target.backend", backend)
    put("target.model", model)
    put("load.num_prompts", num_prompts)
    rate = _rate(request_rate)
    if rate is not None:
        put("load.request_rate", rate)
        put("load.shape", "gamma" if burstiness not in (None, 1.0) else "poisson")
    put("load.burstiness", burstiness)
    if burstiness is not None and rate is None:
        put("load.shape", "gamma")
    put("load.max_concurrency", max_concurrency)
    if concurrency is not None:
        put("load.shape", "closed")
        put("load.concurrency", concurrency)
    put("load.think_time_s", think_time)
    put("load.ramp_up_s", ramp_up)
    put("load.duration_s", duration)
    if random_input_len is not None or random_range_ratio is not None:
        put("workload.input.mean", random_input_len)
    if random_output_len is not None:
        put("workload.output.mean", random_output_len)
    if random_range_ratio is not None:
        dist = "uniform" if random_range_ratio > 0 else "fixed"
        for side in ("input", "output"):
            put(f"workload.{side}.dist", dist)
            put(f"workload.{side}.range_ratio", random_range_ratio)
    put("workload.dataset", dataset_name)
    put("workload.dataset_path", dataset_path)
    if percentile_metrics is not None:
        put("percentile_metrics", [m.strip() for m in percentile_metrics.split(",") if m.strip()])
    put("percentiles", _csv_floats(metric_percentiles, "--metric-percentiles"))
    if goodput:
        put("goodput", " ".join(goodput))
    put("seed", seed)
    put("workload.ignore_eos", ignore_eos)
    put("request_timeout_s", request_timeout)
    put("gpu.type", gpu)
    put("gpu.count", num_gpus)
    put("label", label)
    return o


def resolve_scenario(scenario_file: Path | None, overrides: dict, defaults: dict | None = None):
    """Scenario file (if any) < flags. Errors name the file line or the flag."""
    text, source = "", "<flags>"
    if scenario_file is not None:
        try:
            text = scenario_file.read_text()
        except OSError as exc:
            raise fail(f"--scenario {scenario_file}: {exc.strerror or exc}") from None
        source = str(scenario_file)
    merged = deep_merge(defaults or {}, overrides)
    try:
        sc = parse_scenario(text, source=source, overrides=merged)
    except ScenarioError as exc:
        raise fail(str(exc)) from None
    if sc.gpu.type:
        sc.gpu.type = canonical_gpu(sc.gpu.type)
    return sc


def canonical_gpu(name: str) -> str:
    """The profile name for a GPU alias ("b200" -> "B200-SXM"); unknown names pass through,
    so a GPU without a profile can still be benchmarked (it just has no prices)."""
    from bench.sim.profiles import ProfileError, get_gpu

    try:
        return get_gpu(name).name
    except ProfileError:
        err_console.print(f"[yellow]note:[/] GPU {name!r} has no profile; no prices for it")
        return name


RUN_DEFAULTS = {"load": {"num_prompts": 1000}}

# Server telemetry flags, shared by run and sweep (bench/telemetry.py).
SCRAPE_OPT = typer.Option(
    "--scrape-metrics/--no-scrape-metrics",
    help="Scrape the server's Prometheus /metrics during the run (a failure only warns)",
)
METRICS_URL_OPT = typer.Option(
    "--metrics-url", help="Default {base_url}/metrics (then /prometheus/metrics for trtllm-serve)"
)
METRICS_INTERVAL_OPT = typer.Option("--metrics-interval", help="Seconds between scrapes")
DCGM_URL_OPT = typer.Option(
    "--dcgm-url", help="DCGM exporter /metrics URL: GPU power, clocks, memory, throttling"
)
NVML_OPT = typer.Option("--nvml", help="Read this host's GPUs through NVML (nvidia-ml-py)")


def telemetry_config(scrape: bool, url: str | None, interval: float, dcgm: str | None,
                     nvml: bool):  # fmt: skip
    """The flags as a bench.telemetry.TelemetryConfig (None when nothing is scraped)."""
    from bench.telemetry import TelemetryConfig

    try:
        config = TelemetryConfig(scrape, url, interval, dcgm, nvml)
    except ValueError as exc:
        raise fail(str(exc)) from None
    return config if config.enabled else None


# Options shared by run and sweep, defined once (names follow `vllm bench serve`).
BaseUrlOpt = Annotated[
    str | None, typer.Option("--base-url", help="Server URL, e.g. http://127.0.0.1:8000")
]
EndpointOpt = Annotated[
    str | None, typer.Option("--endpoint", help="/v1/completions or /v1/chat/completions")
]
BackendOpt = Annotated[
    str | None,
    typer.Option("--backend", help="vllm, sglang, trtllm or openai: fields that force the length"),
]
ModelOpt = Annotated[
    str | None, typer.Option("--model", help="Model name; default: the first /v1/models lists")
]
ScenarioOpt = Annotated[
    Path | None, typer.Option("--scenario", help="Scenario YAML; flags override its values")
]
NumPromptsOpt = Annotated[
    int | None, typer.Option("--num-prompts", min=1, help="Requests (per point in a sweep)")
]
InputLenOpt = Annotated[int | None, typer.Option("--random-input-len", min=1)]
OutputLenOpt = Annotated[int | None, typer.Option("--random-output-len", min=1)]
RangeRatioOpt = Annotated[float | None, typer.Option("--random-range-ratio", min=0, max=0.999)]
DatasetNameOpt = Annotated[
    str | None, typer.Option("--dataset-name", help="random, sharegpt or jsonl")
]
DatasetPathOpt = Annotated[str | None, typer.Option("--dataset-path")]
MetricPercentilesOpt = Annotated[
    str | None, typer.Option("--metric-percentiles", help="e.g. 50,90,99,99.9")
]
GoodputOpt = Annotated[
    list[str] | None,
    typer.Option("--goodput", help="SLO per metric in ms, e.g. ttft:500 tpot:50"),
]
SeedOpt = Annotated[int | None, typer.Option("--seed")]
IgnoreEosOpt = Annotated[
    bool | None,
    typer.Option("--ignore-eos/--no-ignore-eos", help="Force exactly the requested output length"),
]
RequestTimeoutOpt = Annotated[
    float | None, typer.Option("--request-timeout", help="Seconds one request may take")
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option("--api-key", help="Bearer token; default from $OPENAI_API_KEY. Never stored."),
]
TransportOpt = Annotated[str, typer.Option("--transport", help="raw (default, leanest) or httpx")]
GpuOpt = Annotated[
    str | None, typer.Option("--gpu", help="GPU type served (for $/Mtok), e.g. H100-SXM")
]
NumGpusOpt = Annotated[int | None, typer.Option("--num-gpus", min=1)]
LabelOpt = Annotated[str | None, typer.Option("--label", help="A name for this run")]
DbOpt = Annotated[
    str | None,
    typer.Option("--db", help="SQLAlchemy URL; default $TOKENBENCH_DB or results/tokenbench.db"),
]
NoStoreOpt = Annotated[bool, typer.Option("--no-store", help="Do not write to the database")]
ScrapeOpt = Annotated[bool, SCRAPE_OPT]
MetricsUrlOpt = Annotated[str | None, METRICS_URL_OPT]
MetricsIntervalOpt = Annotated[float, METRICS_INTERVAL_OPT]
DcgmUrlOpt = Annotated[str | None, DCGM_URL_OPT]
NvmlOpt = Annotated[bool, NVML_OPT]
PricesFileOpt = Annotated[Path | None, typer.Option("--prices-file", help="Your own price tiers")]
PriceOpt = Annotated[
    list[str] | None, typer.Option("--price", help="GPU:tier=USD_per_GPU_hour (repeatable)")
]
UtilisationOpt = Annotated[
    float, typer.Option("--utilisation", min=0.01, max=1.0, help="Fleet utilisation for $/Mtok")
]


def resolve_target(sc, api_key: str | None) -> str | None:
    """Check the endpoint answers (one line if not) and fill in the model; returns the key."""
    from bench.runner import UnreachableError, check_reachable, discover_model

    key = api_key or os.environ.get(sc.target.api_key_env)
    if not sc.target.base_url:
        raise fail("no endpoint: give --base-url (or target.base_url in the scenario)")
    try:
        check_reachable(sc.target.base_url)
    except UnreachableError as exc:
        raise fail(str(exc)) from None
    if not sc.target.model:
        sc.target.model = discover_model(sc.target.base_url, key) or "default"
    return key


@app.command("run")
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
    max_concurrency: Annotated[int | None, typer.Option("--max-concurrency", min=1)] = None,
    concurrency: Annotated[
        int | None,
        typer.Option("--concurrency", min=1, help="Closed loop: this many users, back to back"),
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
    percentile_metrics: Annotated[
        str | None, typer.Option("--percentile-metrics", help="e.g. ttft,tpot,itl,e2el")
    ] = None,
    metric_percentiles: MetricPercentilesOpt = None,
    goodput: GoodputOpt = None,
    seed: SeedOpt = None,
    ignore_eos: IgnoreEosOpt = None,
    request_timeout: RequestTimeoutOpt = None,
    api_key: ApiKeyOpt = None,
    transport: TransportOpt = "raw",
    summary_json: Annotated[
        Path | None, typer.Option("--summary-json", help="Write the summary JSON contract here")
    ] = None,
    fail_on: Annotated[
        str | None,
        typer.Option("--fail-on", help="e.g. 'p99_ttft_ms<800,error_rate<0.01': exit 1 if broken"),
    ] = None,
    workers: Annotated[
        int, typer.Option("--workers", min=1, help="Split the load over N processes")
    ] = 1,
    ray: Annotated[
        str | None,
        typer.Option("--ray", help="Run workers as Ray actors: auto, local or a cluster address"),
    ] = None,
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
) -> None:
    """Benchmark one endpoint at one load point (like `vllm bench serve`)."""
    from bench.runner import plan_from_scenario

    try:
        thresholds = parse_thresholds(fail_on)
    except ValueError as exc:
        raise fail(str(exc)) from None
    overrides = flag_overrides(
        base_url=base_url, endpoint=endpoint, backend=backend, model=model,
        num_prompts=num_prompts, request_rate=request_rate, burstiness=burstiness,
        max_concurrency=max_concurrency, concurrency=concurrency, think_time=think_time,
        duration=duration, ramp_up=ramp_up, random_input_len=random_input_len,
        random_output_len=random_output_len, random_range_ratio=random_range_ratio,
        dataset_name=dataset_name, dataset_path=dataset_path,
        percentile_metrics=percentile_metrics, metric_percentiles=metric_percentiles,
        goodput=goodput, seed=seed, ignore_eos=ignore_eos, request_timeout=request_timeout,
        gpu=gpu, num_gpus=num_gpus, label=label,
    )  # fmt: skip
    sc = resolve_scenario(scenario, overrides, RUN_DEFAULTS)
    key = resolve_target(sc, api_key)
    base_dir = scenario.parent if scenario else None
    try:
        plan = plan_from_scenario(sc, base_dir=base_dir, api_key=key, transport=transport)
    except ValueError as exc:
        raise fail(str(exc)) from None

    from bench.distributed import DistributedError, run_distributed_and_store
    from bench.session import run_and_store
    from bench.store.errors import StoreError

    try:
        if workers > 1 or ray is not None:
            result, summary, run_id = run_distributed_and_store(
                sc, plan, workers=workers, ray_address=ray, db_url=db, store=not no_store
            )
            for line in result.warnings:
                err_console.print(f"[yellow]warning:[/] {line}")
        else:
            result, summary, run_id = run_and_store(
                sc, plan, db_url=db, store=not no_store,
                telemetry=telemetry_config(scrape_metrics, metrics_url, metrics_interval, dcgm_url, nvml),
            )  # fmt: skip
    except (StoreError, DistributedError) as exc:
        raise fail(str(exc)) from None
    print_summary(
        summary,
        title=f"Results: {sc.name} → {sc.target.base_url}",
        metrics=tuple(m for m in sc.percentile_metrics if m in ("ttft", "tpot", "itl", "e2el")),
    )
    if run_id:
        console.print(f"Stored as run [bold]{run_id}[/]  (tokenbench show {run_id})")
    if summary_json is not None:
        summary_json.parent.mkdir(parents=True, exist_ok=True)
        summary_json.write_text(json.dumps(summary.to_json(), indent=2))
    broken = broken_thresholds(summary, thresholds)
    for line in broken:
        err_console.print(f"[bold red]FAIL[/] {line}")
    if broken:
        raise typer.Exit(1)
    if summary.interrupted:
        raise typer.Exit(130)


@app.command("sweep")
def sweep_command(
    base_url: BaseUrlOpt = None,
    endpoint: EndpointOpt = None,
    backend: BackendOpt = None,
    model: ModelOpt = None,
    scenario: ScenarioOpt = None,
    request_rates: Annotated[
        str | None, typer.Option("--request-rates", help="Open-loop points, e.g. 1,2,4,8,inf")
    ] = None,
    concurrency: Annotated[
        str | None, typer.Option("--concurrency", help="Closed-loop points, e.g. 1,4,16,64,256")
    ] = None,
    auto: Annotated[
        int | None,
        typer.Option("--auto", min=1, help="Synchronous + saturated baseline, then N rates"),
    ] = None,
    slo: Annotated[
        str | None,
        typer.Option("--slo", help="e.g. 'p99_ttft_ms<=500,p99_tpot_ms<=50': find the capacity"),
    ] = None,
    slo_iterations: Annotated[
        int, typer.Option("--slo-iterations", min=0, help="Bisection steps for the SLO capacity")
    ] = 4,
    num_prompts: NumPromptsOpt = None,
    point_duration: Annotated[
        float | None, typer.Option("--point-duration", help="Seconds of load per point")
    ] = None,
    warmup: Annotated[
        float, typer.Option("--warmup", min=0, help="Seconds at each point's start left out")
    ] = 0.0,
    cooldown: Annotated[
        float, typer.Option("--cooldown", min=0, help="Seconds at each point's end left out")
    ] = 0.0,
    max_error_rate: Annotated[
        float, typer.Option("--max-error-rate", help="Stop when a point fails more than this")
    ] = 0.5,
    random_input_len: InputLenOpt = None,
    random_output_len: OutputLenOpt = None,
    random_range_ratio: RangeRatioOpt = None,
    dataset_name: DatasetNameOpt = None,
    dataset_path: DatasetPathOpt = None,
    metric_percentiles: MetricPercentilesOpt = None,
    goodput: GoodputOpt = None,
    seed: SeedOpt = None,
    ignore_eos: IgnoreEosOpt = None,
    request_timeout: RequestTimeoutOpt = None,
    api_key: ApiKeyOpt = None,
    transport: TransportOpt = "raw",
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
) -> None:
    """Measure the throughput-versus-latency curve: many load points in one stored run."""
    from bench.sweep import PointSpec, parse_values

    modes = [m for m in (request_rates, concurrency, auto) if m is not None]
    if len(modes) != 1:
        raise fail("give exactly one of --request-rates, --concurrency or --auto N")
    try:
        thresholds = parse_thresholds(slo, flag="--slo")
        if request_rates is not None:
            specs = [PointSpec("rate", v) for v in parse_values(request_rates, "--request-rates")]
        elif concurrency is not None:
            specs = [
                PointSpec("concurrency", int(v)) for v in parse_values(concurrency, "--concurrency")
            ]
        else:
            specs = []
    except ValueError as exc:
        raise fail(str(exc)) from None
    overrides = flag_overrides(
        base_url=base_url, endpoint=endpoint, backend=backend, model=model,
        num_prompts=num_prompts, random_input_len=random_input_len,
        random_output_len=random_output_len, random_range_ratio=random_range_ratio,
        dataset_name=dataset_name, dataset_path=dataset_path,
        metric_percentiles=metric_percentiles, goodput=goodput, seed=seed,
        ignore_eos=ignore_eos, request_timeout=request_timeout, gpu=gpu, num_gpus=num_gpus,
        label=label,
    )  # fmt: skip
    sc = resolve_scenario(scenario, overrides, {"load": {"num_prompts": 200}})
    if slo is None and sc.slo:  # the scenario file's SLO, same grammar
        thresholds = parse_thresholds(sc.slo, flag="slo")
    key = resolve_target(sc, api_key)
    catalogue = _catalogue(prices_file, price)
    from bench.store.errors import StoreError
    from bench.sweep import SweepPlan, run_sweep

    plan = SweepPlan(
        specs=specs, auto=auto, thresholds=thresholds, slo_iterations=slo_iterations,
        point_duration_s=point_duration, warmup_s=warmup, cooldown_s=cooldown,
        max_error_rate=max_error_rate,
    )  # fmt: skip
    try:
        result = run_sweep(
            sc, plan, api_key=key, transport=transport, db=db, store=not no_store,
            base_dir=scenario.parent if scenario else None, on_point=sweep_progress,
            telemetry=telemetry_config(scrape_metrics, metrics_url, metrics_interval, dcgm_url, nvml),
        )  # fmt: skip
    except (ValueError, StoreError) as exc:
        raise fail(str(exc)) from None
    print_sweep_result(result, sc, catalogue, utilisation)
    if result.interrupted:
        raise typer.Exit(130)


def sweep_progress(point, remaining) -> None:
    """One console line per finished point: what was measured and what is left."""
    s = point.summary
    left = "" if remaining is None else f"  ({remaining} planned points left)"
    if s.interrupted:
        left += "  [bold yellow]interrupted: partial point, not used for the capacity or knee[/]"
    console.print(
        f"[bold]point {point.index + 1}[/] {point.spec.title}: {s.requests_per_s:.2f} req/s, "
        f"{s.output_tokens_per_s:,.0f} out tok/s, p99 TTFT {s.value('p99_ttft_ms') or 0:,.0f} ms, "
        f"p99 TPOT {s.value('p99_tpot_ms') or 0:,.1f} ms, failed {s.failed}{left}"
    )


def _catalogue(prices_file, price):
    from bench.cost import PriceCatalogueError, load_catalogue

    try:
        return load_catalogue(prices_file, price or ())
    except PriceCatalogueError as exc:
        raise fail(str(exc)) from None


def print_sweep_result(result, sc, catalogue, utilisation: float) -> None:
    from bench.console import cost_rows_table, sweep_table
    from bench.cost import PriceCatalogueError, cost_table
    from bench.metrics import slo_text

    gpus = sc.gpu.count
    console.print(
        sweep_table(result.points, gpus=gpus, title=f"Sweep: {sc.name} (run {result.run_id})")
    )
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


def main() -> None:  # pragma: no cover - console entry point
    app()


__all__ = ["app", "fail", "flag_overrides", "parse_goodput", "resolve_scenario", "summarize"]


# ---------------------------------------------------------------- other rooms' commands
from bench.cost_cli import prices_command  # noqa: E402

app.command("prices", help="List the GPU pricing catalogue ($/GPU-hour per tier, with sources).")(
    prices_command
)


@app.command("compare")
def compare_command(
    runs: Annotated[list[str], typer.Argument(help="Run ids (or unique prefixes or names)")],
    slo: Annotated[
        str | None, typer.Option("--slo", help="e.g. 'p99_ttft_ms<=500,p99_tpot_ms<=50'")
    ] = None,
    utilisation: Annotated[float, typer.Option("--utilisation", min=0.01, max=1.0)] = 1.0,
    prices_file: Annotated[Path | None, typer.Option("--prices-file")] = None,
    price: Annotated[list[str] | None, typer.Option("--price")] = None,
    db: Annotated[str | None, typer.Option("--db")] = None,
) -> None:
    """Side by side: capacity at SLO, P99s at matched load, $/Mtok per tier, the ratio.

    Without --slo, the SLO stored with the runs (when they share one) is used, as the
    dashboard and the exports do; the line 'SLO used: ...' says which.
    """
    from bench.console import comparison_tables
    from bench.curves import compare_runs, ratio_sentence, resolve_slo, run_curves, slo_line
    from bench.store.errors import StoreError
    from bench.store.read import get_run

    try:
        curves = run_curves(runs, db)
        thresholds, source = resolve_slo(slo, [get_run(c.run_id, db) for c in curves])
    except (ValueError, StoreError, KeyError) as exc:
        raise fail(str(exc)) from None
    catalogue = _catalogue(prices_file, price)
    comparisons = compare_runs(curves, thresholds, catalogue, utilisation)
    console.print(slo_line(thresholds, source))
    for table in comparison_tables(comparisons, utilisation):
        console.print(table)
    for c in comparisons:
        for flag in c.at_slo.flags if c.at_slo else ():
            console.print(f"[yellow]caution[/] ({c.curve.legend}): {flag}")
    sentence = ratio_sentence(comparisons)
    if sentence:
        console.print(f"[bold]{sentence}[/]")


from bench.plan_cli import plan_command  # noqa: E402

app.command("plan", help="GPUs, nodes, $/month and $/Mtok per tier for a demand at the SLO.")(
    plan_command
)

from bench.sim.cli import sim_app  # noqa: E402
from bench.store.cli import (  # noqa: E402
    db_upgrade_command,
    export_raw_command,
    import_command,
    rm_command,
    runs_command,
    show_command,
)

app.command("runs", help="List stored runs.")(runs_command)
app.command("show", help="Print a stored run's summary.")(show_command)
app.command("rm", help="Delete a stored run.")(rm_command)
app.command("export-raw", help="Write a run's requests as json, csv or parquet.")(
    export_raw_command
)
app.command("import", help="Import vLLM, guidellm or aiperf result files as runs.")(import_command)
db_app = typer.Typer(help="Database maintenance.", no_args_is_help=True)
db_app.command("upgrade", help="Apply schema migrations.")(db_upgrade_command)
app.add_typer(db_app, name="db")
app.add_typer(sim_app, name="sim", help="The simulated GPU endpoint (no GPU needed).")


@app.command("demo")
def demo_command(
    db: Annotated[str | None, typer.Option("--db", help="Where to store the two runs")] = None,
) -> None:
    """B200 beside H100 on simulated endpoints: a short bursty-chat sweep of each (~2 min)."""
    from bench.sim.demo import run_demo
    from bench.store.errors import StoreError

    try:
        run_demo(db)
    except StoreError as exc:
        raise fail(str(exc)) from None


from bench.export.cli import export_command  # noqa: E402

app.command("export", help="Export runs as pptx, xlsx, csv, html, png or svg.")(export_command)

from server.cli import serve_command  # noqa: E402

app.command("serve", help="Serve the REST API and the dashboard (B200 beside H100).")(serve_command)
