"""The `tokenbench` command: each sub-command is a thin shell over a library call.

Flag names follow `vllm bench serve` where one exists, so users can carry their commands over
(bench/vllm_compat.py: several values after one flag, vLLM flags we name differently).
Imports are lazy: `tokenbench --help` must not pay for numpy, pandas, SQLAlchemy or plotly.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Annotated

import typer

from bench.console import console, err_console
from bench.store.cli import DbOption
from bench.vllm_compat import VllmCommand

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help=(
        "Benchmark LLM inference endpoints: TTFT, TPOT, ITL, P99 under bursty load, $/Mtok. "
        "Runs are stored in $TOKENBENCH_DB (a SQLAlchemy URL or SQLite path) when it is set, "
        "else in results/tokenbench.db under the current folder; --db overrides both."
    ),
    pretty_exceptions_enable=False,
    # Plain help: rich's tables cut flag names and URLs at 80 columns ("--random-input-l…").
    rich_markup_mode=None,
)


@app.callback()
def _root() -> None:
    """tokenbench: measure what an LLM deployment costs and how it feels to its users."""


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print one clear line (no traceback) and return the Exit to raise."""
    from rich.markup import escape

    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
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
    tokenizer=None,
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
    if concurrency is not None and rate is not None:
        # aiperf's meaning of both: requests at the rate, at most `concurrency` in flight.
        if max_concurrency is not None and max_concurrency != concurrency:
            raise fail(
                f"--concurrency {concurrency} with --request-rate caps in-flight requests, as "
                f"--max-concurrency {max_concurrency} does: give one of them"
            )
        put("load.max_concurrency", concurrency)
        err_console.print(
            f"note: --request-rate {request_rate} with --concurrency {concurrency}: an open "
            f"loop at that rate with at most {concurrency} requests in flight (aiperf's "
            "meaning; vLLM's --max-concurrency)",
            highlight=False,
            soft_wrap=True,
        )
    elif concurrency is not None:
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
    put("workload.tokenizer", tokenizer)
    if percentile_metrics is not None:
        put("percentile_metrics", [m.strip() for m in percentile_metrics.split(",") if m.strip()])
    put("percentiles", _csv_floats(metric_percentiles, "--metric-percentiles"))
    if goodput:
        from bench.metrics import parse_goodput

        try:
            parse_goodput(goodput)
        except ValueError as exc:
            raise fail(str(exc)) from None
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
    from bench.scenario import ScenarioError, deep_merge, parse_scenario

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
InputLenOpt = Annotated[
    int | None,
    typer.Option("--random-input-len", "--input-len", min=1, help="Prompt tokens per request"),
]
OutputLenOpt = Annotated[
    int | None,
    typer.Option("--random-output-len", "--output-len", min=1, help="Output tokens per request"),
]
RangeRatioOpt = Annotated[
    float | None,
    typer.Option(
        "--random-range-ratio",
        min=0,
        max=0.999,
        help="Lengths uniform in mean x [1-r, 1+r]; 0 = every request the same",
    ),
]
DatasetNameOpt = Annotated[
    str | None, typer.Option("--dataset-name", help="random, sharegpt or jsonl")
]
DatasetPathOpt = Annotated[
    str | None,
    typer.Option("--dataset-path", help="ShareGPT JSON or JSONL prompts file (--dataset-name)"),
]
PercentileMetricsOpt = Annotated[
    str | None,
    typer.Option("--percentile-metrics", help="Metrics to show, e.g. ttft,tpot,itl,e2el"),
]
MetricPercentilesOpt = Annotated[
    str | None, typer.Option("--metric-percentiles", help="e.g. 50,90,99,99.9")
]
GoodputOpt = Annotated[
    list[str] | None,
    typer.Option("--goodput", help="SLOs in ms, one or more after the flag: ttft:500 tpot:50"),
]
TokenizerOpt = Annotated[
    str | None,
    typer.Option(
        "--tokenizer",
        help="Local tokenizer (folder with tokenizer.json, or the file): exact prompt lengths",
    ),
]
SeedOpt = Annotated[int | None, typer.Option("--seed", help="Same seed, same schedule and prompts")]
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
NumGpusOpt = Annotated[
    int | None, typer.Option("--num-gpus", min=1, help="GPUs behind the endpoint (for $/Mtok)")
]
LabelOpt = Annotated[str | None, typer.Option("--label", help="A name for this run")]
DbOpt = DbOption  # one --db option and help text for every command
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
    from bench.runner import UnreachableError, check_reachable, list_models

    key = api_key or os.environ.get(sc.target.api_key_env)
    if not sc.target.base_url:
        raise fail("no endpoint: give --base-url (or target.base_url in the scenario)")
    try:
        check_reachable(sc.target.base_url)
    except UnreachableError as exc:
        raise fail(str(exc)) from None
    listed = list_models(sc.target.base_url, key)
    if not sc.target.model:
        sc.target.model = listed[0] if listed else "default"
    elif listed and sc.target.model not in listed:
        err_console.print(
            f"[yellow]warning:[/] --model {sc.target.model!r} is not among the models "
            f"{sc.target.base_url}/v1/models lists ({', '.join(listed[:5])})"
        )
    return key


SummaryJsonOpt = Annotated[
    Path | None,
    typer.Option("--summary-json", help="Write the summary JSON contract (for CI) here"),
]


@app.command("run", cls=VllmCommand, short_help="One load point (like vllm bench serve).")
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
    from bench.metrics import broken_thresholds, parse_thresholds
    from bench.runner import defer_termination, interrupted_exit_code, plan_from_scenario

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
        dataset_name=dataset_name, dataset_path=dataset_path, tokenizer=tokenizer,
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
                sc, plan, workers=workers, ray_address=ray, db_url=db, store=not no_store,
                show_progress=not disable_tqdm,
            )  # fmt: skip
            for line in result.warnings:
                err_console.print(f"[yellow]warning:[/] {line}")
        else:
            result, summary, run_id = run_and_store(
                sc, plan, db_url=db, store=not no_store, show_progress=not disable_tqdm,
                telemetry=telemetry_config(scrape_metrics, metrics_url, metrics_interval, dcgm_url, nvml),
            )  # fmt: skip
    except (StoreError, DistributedError) as exc:
        raise fail(str(exc)) from None
    from bench.console import outcome, print_outcome, print_summary

    print_summary(
        summary,
        title=f"Results: {sc.name} → {sc.target.base_url}",
        metrics=tuple(m for m in sc.percentile_metrics if m in ("ttft", "tpot", "itl", "e2el")),
    )
    said = outcome(result.records, summary, sc.target.model, getattr(result, "served_models", []))
    print_outcome(said, summary)
    if run_id:
        console.print(f"Stored as run [bold]{run_id}[/]  (tokenbench show {run_id})")
    if summary_json is not None:
        write_json(summary_json, {**summary_document(summary, sc, result.records, run_id), **said})
    if vllm_options is not None:
        save_vllm_result(vllm_options, sc, plan, summary, result.records, run_id)
    broken = broken_thresholds(summary, thresholds)
    for line in broken:
        err_console.print(f"[bold red]FAIL[/] {line}")
    if broken:
        raise typer.Exit(1)
    if summary.interrupted:
        raise typer.Exit(interrupted_exit_code())
    if summary.completed == 0 and summary.failed:
        raise typer.Exit(1)  # nothing measured: a script must not take this for a result


def write_json(path: Path, doc: dict) -> None:
    """Write a JSON document a script will read; a bad path is one line, not a traceback."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=2))
    except OSError as exc:
        raise fail(f"cannot write {path}: {exc.strerror or exc}") from None


def failure_examples(records) -> dict[str, str]:
    """One example message per failure kind: the first one seen, as the server said it."""
    examples: dict[str, str] = {}
    for r in records:
        kind = r.error_kind or (None if r.state == "ok" else r.state)
        if kind and kind not in examples:
            examples[kind] = r.error_message or kind
    return examples


def summary_document(summary, sc, records, run_id: str | None) -> dict:
    """The --summary-json contract: the Summary's keys (unchanged) plus what a CI job needs
    to know what was measured: run id, target, load settings, token totals, the self-check's
    reasons and one example message per failure kind."""
    load = sc.load
    return {
        **summary.to_json(),
        "run_id": run_id,
        "model": sc.target.model,
        "base_url": sc.target.base_url,
        "endpoint": sc.target.endpoint,
        "backend": sc.target.backend,
        "load": {
            "shape": load.shape,
            "request_rate": load.request_rate if math.isfinite(load.request_rate) else "inf",
            "burstiness": load.burstiness,
            "max_concurrency": load.max_concurrency,
            "concurrency": load.concurrency,
            "num_prompts": load.num_prompts,
            "duration_s": load.duration_s,
        },
        "total_input_tokens": summary.total_input_tokens,
        "total_output_tokens": summary.total_output_tokens,
        "client_limited_reasons": list(summary.client_limited_reasons),
        "failure_examples": failure_examples(records),
    }


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
    doc = vllm_result(
        records=records,
        summary=summary,
        backend=sc.target.backend,
        model_id=sc.target.model or "default",
        num_prompts=len(plan.specs),
        request_rate=math.inf if closed else load.request_rate,
        burstiness=load.burstiness,
        max_concurrency=plan.concurrency if closed else plan.max_concurrency,
        goodput=parse_goodput(sc.goodput) if sc.goodput else None,
        options=options,
        label=sc.label,
        run_id=run_id,
    )
    try:
        path = write_vllm_result(doc, options)
    except OSError as exc:
        raise fail(f"cannot write the vLLM result JSON: {exc.strerror or exc}") from None
    console.print(f"vLLM result JSON: {path}", highlight=False, soft_wrap=True)


@app.command("sweep", cls=VllmCommand, short_help="Many load points: a latency curve.")
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
    tokenizer: TokenizerOpt = None,
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
        typer.Option(
            "--fail-on",
            help="e.g. 'p99_ttft_ms<800,error_rate<0.01': exit 1 if any load point breaks it",
        ),
    ] = None,
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
    from bench.metrics import parse_thresholds
    from bench.runner import defer_termination, interrupted_exit_code
    from bench.sweep import PointSpec, parse_values

    defer_termination()  # SIGTERM stops like Ctrl-C: flush, mark interrupted, exit 143

    modes = [m for m in (request_rates, concurrency, auto) if m is not None]
    if len(modes) != 1:
        raise fail("give exactly one of --request-rates, --concurrency or --auto N")
    try:
        thresholds = parse_thresholds(slo, flag="--slo")
        gates = parse_thresholds(fail_on)
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
        dataset_name=dataset_name, dataset_path=dataset_path, tokenizer=tokenizer,
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
    broken = sweep_gates(result, gates)
    if summary_json is not None:
        write_json(summary_json, sweep_document(result, sc, db, broken))
    for line in broken:
        err_console.print(f"[bold red]FAIL[/] {line}", highlight=False, soft_wrap=True)
    if broken:
        raise typer.Exit(1)
    if result.interrupted:
        raise typer.Exit(interrupted_exit_code())


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
    if run_id is None:
        return []
    from bench.store.errors import StoreError
    from bench.store.read import load_records

    try:
        return [r for r in load_records(run_id, load_point, db) if r.state != "ok"]
    except StoreError:
        return []


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
        + (f"  [yellow]CACHED PROMPTS {s.cached_share:.0%}[/]" if s.largely_cached else "")
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


__all__ = ["app", "fail", "flag_overrides", "resolve_scenario"]


# ---------------------------------------------------------------- other rooms' commands
from bench.cost_cli import prices_command  # noqa: E402

app.command(
    "prices",
    help="List the GPU pricing catalogue ($/GPU-hour per tier, with sources).",
    short_help="GPU prices per tier, with sources.",
)(prices_command)


@app.command("compare", short_help="Runs side by side: capacity, P99s, $/Mtok.")
def compare_command(
    runs: Annotated[list[str], typer.Argument(help="Run ids (or unique prefixes or names)")],
    slo: Annotated[
        str | None,
        typer.Option("--slo", help="e.g. 'p99_ttft_ms<=500,p99_tpot_ms<=50': capacity at it"),
    ] = None,
    utilisation: UtilisationOpt = 1.0,
    prices_file: PricesFileOpt = None,
    price: PriceOpt = None,
    db: DbOpt = None,
) -> None:
    """Side by side: capacity at SLO, P99s at matched load, $/Mtok per tier, the ratio.

    Without --slo, the SLO stored with the runs (when they share one) is used, as the
    dashboard and the exports do; the line 'SLO used: ...' says which.
    """
    from bench.console import comparison_tables
    from bench.curves import compare_runs, ratio_sentence, resolve_slo, run_curves, slo_line
    from bench.store.cli import existing_database
    from bench.store.errors import StoreError
    from bench.store.read import get_run

    try:
        existing_database(db)
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

app.command(
    "plan",
    help="GPUs, nodes, $/month and $/Mtok per tier for a demand at the SLO.",
    short_help="GPUs and $/month to serve a demand at the SLO.",
)(plan_command)

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


@app.command("demo", short_help="B200 beside H100, simulated (about 40 s).")
def demo_command(
    db: Annotated[str | None, typer.Option("--db", help="Where to store the demo's runs")] = None,
) -> None:
    """B200 beside H100 on simulated endpoints: dense virtual-time sweeps of each, then a
    real-time check of one point each through the real load generator (about 40 s)."""
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
