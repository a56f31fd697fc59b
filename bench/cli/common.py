"""Helpers every command shares: one-line errors, flags -> scenario, target checks, prices.

The CLI imports everything and nothing imports it (DESIGN.md): library code never calls these.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from bench.console import err_console


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print one clear line (no traceback) and return the Exit to raise."""
    from rich.markup import escape

    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


def _rate(value: str | None) -> float | None:
    """--request-rate: one rate, read by the rule --request-rates reads each of its values by."""
    if value is None:
        return None
    from bench.sweep import parse_values

    try:
        rates = parse_values(value, "--request-rate")
    except ValueError as exc:
        raise fail(str(exc)) from None
    if len(rates) != 1:
        raise fail(f"--request-rate {value!r}: one rate (a sweep takes --request-rates)")
    return rates[0]


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
    block_size=None,
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
    put("workload.block_size", block_size)
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


def resolve_scenario(
    scenario_file: Path | None, overrides: dict, kind: str, defaults: dict | None = None
):
    """Scenario file (if any) < flags. `kind` ("run" or "sweep") picks the default prompt
    count (bench.scenario.DEFAULT_NUM_PROMPTS). Errors name the file line or the flag."""
    from bench.scenario import DEFAULT_NUM_PROMPTS, ScenarioError, deep_merge, parse_scenario

    text, source = "", "<flags>"
    if scenario_file is not None:
        try:
            text = scenario_file.read_text()
        except OSError as exc:
            raise fail(f"--scenario {scenario_file}: {exc.strerror or exc}") from None
        source = str(scenario_file)
    defaults = deep_merge({"load": {"num_prompts": DEFAULT_NUM_PROMPTS[kind]}}, defaults or {})
    merged = deep_merge(defaults, overrides)
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
    from bench.hardware import ProfileError, get_gpu

    try:
        return get_gpu(name).name
    except ProfileError:
        err_console.print(f"[yellow]note:[/] GPU {name!r} has no profile; no prices for it")
        return name


def telemetry_config(scrape: bool, url: str | None, interval: float, dcgm: str | None,
                     nvml: bool):  # fmt: skip
    """The flags as a bench.telemetry.TelemetryConfig (None when nothing is scraped)."""
    from bench.telemetry import TelemetryConfig

    try:
        config = TelemetryConfig(scrape, url, interval, dcgm, nvml)
    except ValueError as exc:
        raise fail(str(exc)) from None
    return config if config.enabled else None


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


def _catalogue(prices_file, price):
    from bench.cost import PriceCatalogueError, load_catalogue

    try:
        return load_catalogue(prices_file, price or ())
    except PriceCatalogueError as exc:
        raise fail(str(exc)) from None
