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
    request_rate: str | None = None,
    percentile_metrics: str | None = None,
    metric_percentiles: str | None = None,
    think_time=None,
    duration=None,
    ramp_up=None,
    random_input_len=None,
    random_output_len=None,
    random_range_ratio=None,
    dataset_name=None,
    request_timeout=None,
    vllm: dict | None = None,
    **same_name,
):
    """Flags -> bench.overrides.Overrides (what was given); the flags' text read here.
    `vllm`: vLLM's request flags (vllm_request_flags), folded in as vLLM applies them."""
    from bench.overrides import Overrides

    same_name.update(vllm_request_overrides(same_name, **(vllm or {})))
    metrics = None
    if percentile_metrics is not None:
        metrics = [m.strip() for m in percentile_metrics.split(",") if m.strip()]
    return Overrides(
        request_rate=_rate(request_rate),
        percentile_metrics=metrics,
        percentiles=_csv_floats(metric_percentiles, "--metric-percentiles"),
        think_time_s=think_time,
        duration_s=duration,
        ramp_up_s=ramp_up,
        input_len=random_input_len,
        output_len=random_output_len,
        range_ratio=random_range_ratio,
        dataset=dataset_name,
        request_timeout_s=request_timeout,
        **same_name,
    )


def vllm_request_overrides(
    given: dict,
    *,
    temperature=None,
    top_p=None,
    top_k=None,
    min_p=None,
    extra_body: str | None = None,
    header: list[str] | None = None,
    host: str | None = None,
    port: int | None = None,
    skip_tokenizer_init: bool = False,
) -> dict:
    """vLLM's request flags as Overrides fields, meaning what they mean in `vllm bench serve`:
    sampling values and --extra-body go into every body (--extra-body wins), --header
    KEY=VALUE into every request, --host/--port name the server when --base-url does not,
    and --backend openai-chat is the chat endpoint."""
    import json

    out: dict = {}
    body = {
        k: v
        for k, v in (("temperature", temperature), ("top_p", top_p), ("top_k", top_k),
                     ("min_p", min_p))
        if v is not None
    }  # fmt: skip
    if extra_body is not None:
        try:
            extra = json.loads(extra_body)
        except json.JSONDecodeError as exc:
            raise fail(f"--extra-body {extra_body!r}: not JSON ({exc.msg})") from None
        if not isinstance(extra, dict):
            raise fail(
                f"--extra-body {extra_body!r}: expected a JSON object, e.g. '{{\"seed\": 1}}'"
            )
        body.update(extra)
    if body:
        out["extra_body"] = body
    if header:
        headers = {}
        for item in header:
            name, sep, value = item.partition("=")
            if not sep or not name.strip():
                raise fail(f"--header {item!r}: expected KEY=VALUE")
            headers[name.strip()] = value.strip()
        out["headers"] = headers
    if (host is not None or port is not None) and given.get("base_url") is None:
        out["base_url"] = f"http://{host or '127.0.0.1'}:{port or 8000}"  # vLLM's defaults
    if given.get("backend") == "openai-chat":  # vLLM's chat backend
        from bench.backends.openai import CHAT

        out["backend"] = "vllm"
        out["endpoint"] = given.get("endpoint") or CHAT
    if skip_tokenizer_init:
        err_console.print(
            "note: --skip-tokenizer-init has nothing to skip: tokenbench loads a tokenizer "
            "only when --tokenizer is given",
            highlight=False,
        )
    return out


def resolve_scenario(
    scenario_file: Path | None,
    overrides,
    kind: str,
    defaults: dict | None = None,
    *,
    rate_default: float | None = None,
):
    """Scenario file (if any) < flags, through bench.overrides.resolve_scenario (the API's
    jobs use the same function). Errors are one line naming the file line or the flag.
    `rate_default` is the request rate when neither gives one (the simulator's 4 req/s),
    never for a replayed trace: a rate given to a trace scales its timestamps, and its own
    timestamps are what it replays when none is."""
    from bench.overrides import resolve_scenario as resolve
    from bench.scenario import deep_merge

    text, source = "", "<flags>"
    if scenario_file is not None:
        try:
            text = scenario_file.read_text()
        except OSError as exc:
            raise fail(f"--scenario {scenario_file}: {exc.strerror or exc}") from None
        source = str(scenario_file)
    try:
        sc, notes = resolve(text, source, overrides, kind, None if rate_default else defaults)
        if rate_default and not (
            sc.load.shape == "trace" or "request_rate" in sc.load.model_fields_set
        ):
            sc, notes = resolve(
                text, source, overrides, kind,
                deep_merge(defaults or {}, {"load": {"request_rate": rate_default}}),
            )  # fmt: skip
    except ValueError as exc:  # ScenarioError too
        raise fail(str(exc)) from None
    for note in notes:
        err_console.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
    return sc


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
