"""Options shared by several commands, defined once (names follow `vllm bench serve`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bench.backends.dialects import DIALECTS
from bench.datasets import DATASETS

DB_HELP = (
    "Database URL or SQLite path (default: $TOKENBENCH_DB, else results/tokenbench.db "
    "under the current folder)."
)
DbOption = Annotated[str | None, typer.Option("--db", help=DB_HELP)]

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


# Options shared by run and sweep, defined once (names follow `vllm bench serve`).
BaseUrlOpt = Annotated[
    str | None, typer.Option("--base-url", help="Server URL, e.g. http://127.0.0.1:8000")
]
EndpointOpt = Annotated[
    str | None, typer.Option("--endpoint", help="/v1/completions or /v1/chat/completions")
]
BackendOpt = Annotated[
    str | None,
    typer.Option(
        "--backend",
        help=f"{DIALECTS.help()}: the server's wire format and the fields that force the "
        "length; openai-chat: vllm on /v1/chat/completions (vLLM's)",
    ),
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
    str | None,
    typer.Option("--dataset-name", help=f"{DATASETS.help()}: where the prompts come from"),
]
DatasetPathOpt = Annotated[
    str | None,
    typer.Option(
        "--dataset-path",
        help="ShareGPT JSON, JSONL prompts or Mooncake trace file (--dataset-name)",
    ),
]
BlockSizeOpt = Annotated[
    int | None,
    typer.Option(
        "--block-size",
        min=1,
        help="Tokens per hash id of a block-hashed trace (--dataset-name mooncake; default 512)",
    ),
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


SummaryJsonOpt = Annotated[
    Path | None,
    typer.Option("--summary-json", help="Write the summary JSON contract (for CI) here"),
]


# How a load point's records are produced (bench.executor): `run` and `sweep`.
WorkersOpt = Annotated[
    int, typer.Option("--workers", min=1, help="Split the load over N processes")
]
RayOpt = Annotated[
    str | None,
    typer.Option("--ray", help="Run workers as Ray actors: auto, local or a cluster address"),
]

# A sweep's plan (bench.sweep.SweepPlan): `sweep` and `sim run`.
RequestRatesOpt = Annotated[
    str | None, typer.Option("--request-rates", help="Open-loop points, e.g. 1,2,4,8,inf")
]
ConcurrencyPointsOpt = Annotated[
    str | None, typer.Option("--concurrency", help="Closed-loop points, e.g. 1,4,16,64,256")
]
AutoOpt = Annotated[
    int | None,
    typer.Option("--auto", min=1, help="Synchronous + saturated baseline, then N rates"),
]
SloOpt = Annotated[
    str | None,
    typer.Option("--slo", help="e.g. 'p99_ttft_ms<=500,p99_tpot_ms<=50': find the capacity"),
]
SloIterationsOpt = Annotated[
    int | None,
    typer.Option(
        "--slo-iterations",
        min=0,
        help="Most points the SLO search adds to bracket and narrow the boundary "
        "(it stops once the bracket is narrower than the capacity's range) [default: 8]",
    ),
]
SloDrawsOpt = Annotated[
    int | None,
    typer.Option(
        "--slo-draws",
        min=0,
        help="Fresh prompt draws measured at the two loads bracketing the SLO boundary, "
        "plus one pair twice as long: the spread a rerun would show, in the capacity's "
        "range (0: not measured) [default: 2]",
    ),
]
PointDurationOpt = Annotated[
    float | None, typer.Option("--point-duration", help="Seconds of load per point")
]
WarmupOpt = Annotated[
    float, typer.Option("--warmup", min=0, help="Seconds at each point's start left out")
]
CooldownOpt = Annotated[
    float, typer.Option("--cooldown", min=0, help="Seconds at each point's end left out")
]
MaxErrorRateOpt = Annotated[
    float | None,
    typer.Option(
        "--max-error-rate", help="Stop when a point fails more than this share (default: half)"
    ),
]
SweepFailOnOpt = Annotated[
    str | None,
    typer.Option(
        "--fail-on",
        help="e.g. 'p99_ttft_ms<800,error_rate<0.01': exit 1 if any load point breaks it",
    ),
]


# vLLM's request-shaping flags (`vllm bench serve`), sent as vLLM sends them: `run`, `sweep`.
TemperatureOpt = Annotated[
    float | None, typer.Option("--temperature", help="Sent in every request (default: not sent)")
]
TopPOpt = Annotated[float | None, typer.Option("--top-p", help="Sent in every request")]
TopKOpt = Annotated[int | None, typer.Option("--top-k", help="Sent in every request")]
MinPOpt = Annotated[float | None, typer.Option("--min-p", help="Sent in every request")]
ExtraBodyOpt = Annotated[
    str | None,
    typer.Option("--extra-body", help="JSON added to every request body, e.g. '{\"seed\": 1}'"),
]
HeaderOpt = Annotated[
    list[str] | None,
    typer.Option("--header", help="KEY=VALUE ... headers sent with every request"),
]
HostOpt = Annotated[
    str | None, typer.Option("--host", help="vLLM's: with --port, the server when no --base-url")
]
PortOpt = Annotated[int | None, typer.Option("--port", help="vLLM's: default 8000", min=1)]
SkipTokenizerInitOpt = Annotated[
    bool,
    typer.Option(
        "--skip-tokenizer-init", help="Accepted for vLLM: tokenbench loads no tokenizer anyway"
    ),
]


# vLLM's warm-up and ramp-up flags (`vllm bench serve`): `run`, `sweep`, `sim run`.
NumWarmupsOpt = Annotated[
    int | None,
    typer.Option(
        "--num-warmups",
        min=0,
        help="Requests sent before each point and waited for, left out of every figure "
        "and not stored (vLLM's)",
    ),
]
RampUpStrategyOpt = Annotated[
    str | None,
    typer.Option(
        "--ramp-up-strategy",
        help="linear or exponential: request by request, the rate goes from "
        "--ramp-up-start-rps to --ramp-up-end-rps (vLLM's; no --request-rate)",
    ),
]
RampUpStartRpsOpt = Annotated[
    float | None, typer.Option("--ramp-up-start-rps", help="The ramp-up's first rate (req/s)")
]
RampUpEndRpsOpt = Annotated[
    float | None, typer.Option("--ramp-up-end-rps", help="The ramp-up's last rate (req/s)")
]
