"""A scenario plus the values a user gave on top of it: one function for the CLI and the API.

The CLI's flags (`run`, `sweep`, `sim run`) and the API's job fields override a scenario
file the same way, through `resolve_scenario`:

- the file's values stand unless an override gives that field; defaults (a load point's
  prompt count, `sim run`'s rate) fill only what neither the file nor an override gives;
- a value that implies a load shape switches it: a rate makes the load Poisson (gamma with
  a burstiness other than 1), a burstiness alone makes it gamma, a concurrency alone makes
  it a closed loop, and a concurrency beside a rate caps in-flight requests (aiperf's
  meaning, vLLM's --max-concurrency);
- a GPU alias becomes its profile name ("h100" -> "H100-SXM"), so prices are found.

Bad values raise ValueError (ScenarioError for the file) with a message naming the field;
each surface words it its own way (one CLI line, a 422). Notes a user should see (a
reading of two flags together, a GPU without prices) are returned, not printed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from bench.scenario import DEFAULT_NUM_PROMPTS, Scenario, parse_scenario


@dataclass
class Overrides:
    """Values given on top of a scenario file; None means "not given, keep the file's"."""

    base_url: str | None = None
    endpoint: str | None = None
    backend: str | None = None
    model: str | None = None
    num_prompts: int | None = None
    request_rate: float | None = None
    burstiness: float | None = None
    max_concurrency: int | None = None
    concurrency: int | None = None
    think_time_s: float | None = None
    duration_s: float | None = None
    ramp_up_s: float | None = None
    input_len: int | None = None
    output_len: int | None = None
    range_ratio: float | None = None
    dataset: str | None = None
    dataset_path: str | None = None
    block_size: int | None = None  # a block-hashed trace's tokens per hash id (mooncake)
    tokenizer: str | None = None
    percentile_metrics: list[str] | None = None
    percentiles: list[float] | None = None
    goodput: list[str] | None = None
    seed: int | None = None
    ignore_eos: bool | None = None
    request_timeout_s: float | None = None
    gpu: str | None = None
    num_gpus: int | None = None
    label: str | None = None
    extra_body: dict | None = None  # added to every request body
    headers: dict[str, str] | None = None  # sent with every request
    num_warmups: int | None = None  # vLLM's --num-warmups: sent first, left out
    # vLLM's --ramp-up-strategy (linear, exponential) with its start and end rates
    ramp_up_strategy: str | None = None
    ramp_up_start_rps: float | None = None
    ramp_up_end_rps: float | None = None

    def given(self) -> dict[str, object]:
        """The fields given (not None), by name."""
        return {
            f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None
        }


def _put(tree: dict, path: str, value) -> None:
    if value is None:
        return
    node = tree
    *parents, leaf = path.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value


# Fields that land in one scenario field as they are.
_PLAIN = {
    "base_url": "target.base_url",
    "endpoint": "target.endpoint",
    "backend": "target.backend",
    "model": "target.model",
    "num_prompts": "load.num_prompts",
    "think_time_s": "load.think_time_s",
    "ramp_up_s": "load.ramp_up_s",
    "duration_s": "load.duration_s",
    "output_len": "workload.output.mean",
    "dataset": "workload.dataset",
    "dataset_path": "workload.dataset_path",
    "block_size": "workload.block_size",
    "tokenizer": "workload.tokenizer",
    "percentile_metrics": "percentile_metrics",
    "percentiles": "percentiles",
    "seed": "seed",
    "ignore_eos": "workload.ignore_eos",
    "request_timeout_s": "request_timeout_s",
    "gpu": "gpu.type",
    "num_gpus": "gpu.count",
    "label": "label",
    "extra_body": "target.extra_body",
    "headers": "target.headers",
    "num_warmups": "load.num_warmups",
}


def overrides_tree(o: Overrides) -> tuple[dict, list[str]]:
    """The overrides as a partial scenario (only what was given) and the notes to show."""
    from bench.metrics import parse_goodput

    tree: dict = {}
    notes: list[str] = []
    for name, path in _PLAIN.items():
        _put(tree, path, getattr(o, name))
    rate, burst = o.request_rate, o.burstiness
    if rate is not None:
        _put(tree, "load.request_rate", rate)
        _put(tree, "load.shape", "gamma" if burst not in (None, 1.0) else "poisson")
    _put(tree, "load.burstiness", burst)
    if burst is not None and rate is None:
        _put(tree, "load.shape", "gamma")
    _put(tree, "load.max_concurrency", o.max_concurrency)
    if o.concurrency is not None and (rate is not None or o.ramp_up_strategy is not None):
        if o.max_concurrency is not None and o.max_concurrency != o.concurrency:
            raise ValueError(
                f"concurrency {o.concurrency} with a request rate caps in-flight requests, as "
                f"max_concurrency {o.max_concurrency} does: give one of them"
            )
        _put(tree, "load.max_concurrency", o.concurrency)
        what = f"request rate {rate:g}" if rate is not None else "a ramp-up"
        notes.append(
            f"{what} with concurrency {o.concurrency}: an open loop at that "
            f"rate with at most {o.concurrency} requests in flight (aiperf's meaning; "
            "vLLM's --max-concurrency)"
        )
    elif o.concurrency is not None:
        _put(tree, "load.shape", "closed")
        _put(tree, "load.concurrency", o.concurrency)
    _ramp_up(tree, o)
    if o.input_len is not None or o.range_ratio is not None:
        _put(tree, "workload.input.mean", o.input_len)
    if o.range_ratio is not None:
        dist = "uniform" if o.range_ratio > 0 else "fixed"
        for side in ("input", "output"):
            _put(tree, f"workload.{side}.dist", dist)
            _put(tree, f"workload.{side}.range_ratio", o.range_ratio)
    if o.goodput:
        parse_goodput(o.goodput)  # raises ValueError naming the bad term
        _put(tree, "goodput", " ".join(o.goodput))
    return tree, notes


def _ramp_up(tree: dict, o: Overrides) -> None:
    """vLLM's ramp-up flags as load.shape ramp_up, checked by vLLM's own rules (a rate
    that the ramp sets is not given twice; a strategy needs both rates, they rise)."""
    rates = (o.ramp_up_start_rps, o.ramp_up_end_rps)
    if o.ramp_up_strategy is None:
        if any(r is not None for r in rates):
            raise ValueError(
                "--ramp-up-start-rps and --ramp-up-end-rps go with --ramp-up-strategy "
                "linear or exponential"
            )
        return
    from bench.arrivals import RAMP_STRATEGIES

    start, end = rates
    if o.ramp_up_strategy not in RAMP_STRATEGIES:
        raise ValueError(
            f"--ramp-up-strategy {o.ramp_up_strategy!r}: {' or '.join(RAMP_STRATEGIES)}"
        )
    if start is None or end is None:
        raise ValueError("--ramp-up-strategy needs both --ramp-up-start-rps and --ramp-up-end-rps")
    if o.request_rate is not None:
        raise ValueError(
            "--ramp-up-strategy sets the request rate from --ramp-up-start-rps to "
            "--ramp-up-end-rps: leave out --request-rate"
        )
    if start <= 0 or end <= 0 or not math.isfinite(start) or not math.isfinite(end):
        raise ValueError(
            f"--ramp-up-start-rps {start:g} and --ramp-up-end-rps {end:g}: each a finite "
            "rate above 0"
        )
    if start > end:
        raise ValueError(
            f"--ramp-up-start-rps {start:g} is above --ramp-up-end-rps {end:g}: vLLM's ramp-up "
            "only rises"
        )
    _put(tree, "load.shape", "ramp_up")
    _put(tree, "load.ramp_up", {"strategy": o.ramp_up_strategy, "start_rps": start,
                                "end_rps": end})  # fmt: skip


def resolve_scenario(
    text: str,
    source: str,
    overrides: Overrides,
    kind: str,
    defaults: dict | None = None,
) -> tuple[Scenario, list[str]]:
    """Scenario text (may be empty) < overrides, with `defaults` below both; returns the
    scenario and notes for the user. `kind` ("run" or "sweep") picks the prompt count used
    when neither a count nor a duration is given (bench.scenario.DEFAULT_NUM_PROMPTS)."""
    tree, notes = overrides_tree(overrides)
    sc = parse_scenario(text, source=source, overrides=tree, defaults=defaults)
    if sc.load.num_prompts is None and sc.load.duration_s is None:
        sc.load.num_prompts = DEFAULT_NUM_PROMPTS[kind]
    if sc.gpu.type:
        sc.gpu.type, note = canonical_gpu(sc.gpu.type)
        notes += [note] if note else []
    return sc, notes


def canonical_gpu(name: str) -> tuple[str, str | None]:
    """(the profile name for a GPU alias, a note when it has none): "b200" -> "B200-SXM".
    An unknown name passes through, so a GPU without a profile can still be benchmarked
    (it just has no prices)."""
    from bench.hardware import ProfileError, get_gpu

    try:
        return get_gpu(name).name, None
    except ProfileError:
        return name, f"GPU {name!r} has no profile; no prices for it"
