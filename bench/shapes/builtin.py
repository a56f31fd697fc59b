"""The shipped load shapes, in the order scenario files and the README list them."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from bench import arrivals
from bench.shapes import SHAPES, LoadShape


def _renewal(burstiness: float | None):
    """Offsets at load.request_rate; burstiness None means the scenario's own (gamma)."""

    def offsets(scenario, rng: np.random.Generator, base_dir: Path | None) -> np.ndarray:
        load = scenario.load
        shape = load.burstiness if burstiness is None else burstiness
        n = load.num_prompts
        if n is None:
            if load.duration_s is None or math.isinf(load.request_rate):
                from bench.scenario import ScenarioError

                raise ScenarioError("give load.num_prompts (or a duration and a finite rate)")
            n = int(math.ceil(load.request_rate * load.duration_s)) + 1
            out = arrivals.renewal(load.request_rate, n * 2, rng, burstiness=shape)
            return out[out < load.duration_s]
        return arrivals.renewal(load.request_rate, n, rng, burstiness=shape)

    return offsets


def _rate(load) -> float:
    return load.request_rate


for _name, _burstiness, _description in (
    ("poisson", 1.0, "Poisson arrivals at load.request_rate (vLLM's default)"),
    ("constant", math.inf, "evenly spaced arrivals at load.request_rate"),
    ("gamma", None, "gamma inter-arrivals at load.request_rate with load.burstiness (vLLM's)"),
):
    SHAPES.register(
        _name, _description, LoadShape(_renewal(_burstiness), mean_rate=_rate, rate_shape=True)
    )


def _on_off(scenario, rng, base_dir):
    load = scenario.load
    return arrivals.on_off(
        load.burst.rate,
        load.burst.duration_s,
        load.quiet.rate,
        load.quiet.duration_s,
        rng,
        num_requests=load.num_prompts,
        duration_s=load.duration_s,
        process=load.process,
    )


def _on_off_mean(load) -> float:
    b, q = load.burst, load.quiet
    return (b.rate * b.duration_s + q.rate * q.duration_s) / (b.duration_s + q.duration_s)


def _on_off_scale(load, factor: float) -> None:
    load.burst.rate *= factor
    load.quiet.rate *= factor


SHAPES.register(
    "on_off",
    "bursts at load.burst.rate, then load.quiet.rate, cycling",
    LoadShape(_on_off, needs=("burst", "quiet"), mean_rate=_on_off_mean, scale=_on_off_scale),
)


def _ramp(scenario, rng, base_dir):
    load = scenario.load
    r = load.ramp
    return arrivals.ramp(
        r.start_rate,
        r.end_rate,
        r.duration_s,
        rng,
        num_requests=load.num_prompts,
        process=load.process,
    )


def _ramp_scale(load, factor: float) -> None:
    load.ramp.start_rate *= factor
    load.ramp.end_rate *= factor


SHAPES.register(
    "ramp",
    "a rate rising (or falling) linearly from load.ramp.start_rate to end_rate",
    LoadShape(
        _ramp,
        needs=("ramp",),
        mean_rate=lambda load: (load.ramp.start_rate + load.ramp.end_rate) / 2,
        scale=_ramp_scale,
    ),
)


def _ramp_up_count(load) -> int:
    if load.num_prompts is None:
        from bench.scenario import ScenarioError

        raise ScenarioError(
            "load.shape ramp_up moves the rate over the requests, as vLLM's --ramp-up-strategy "
            "does: give load.num_prompts (--num-prompts), not only a duration"
        )
    return load.num_prompts


def _ramp_up(scenario, rng, base_dir):
    load = scenario.load
    r = load.ramp_up
    return arrivals.ramp_up(
        r.strategy, r.start_rps, r.end_rps, _ramp_up_count(load), rng, burstiness=load.burstiness
    )


def _ramp_up_mean(load) -> float:
    """Requests over the time their gaps add up to on average: n / sum(1 / rate_i)."""
    r = load.ramp_up
    rates = arrivals.ramp_up_rates(r.strategy, r.start_rps, r.end_rps, _ramp_up_count(load))
    return float(len(rates) / (1.0 / rates).sum())


def _ramp_up_scale(load, factor: float) -> None:
    load.ramp_up.start_rps *= factor
    load.ramp_up.end_rps *= factor


SHAPES.register(
    "ramp_up",
    "vLLM's --ramp-up-strategy: request by request, load.ramp_up's rate goes from start_rps "
    "to end_rps (linear or exponential)",
    LoadShape(_ramp_up, needs=("ramp_up",), mean_rate=_ramp_up_mean, scale=_ramp_up_scale),
)


def _steps(scenario, rng, base_dir):
    load = scenario.load
    levels = [(s.rate, s.duration_s) for s in load.steps]
    return arrivals.steps(levels, rng, num_requests=load.num_prompts, process=load.process)


def _steps_mean(load) -> float:
    total = sum(s.duration_s for s in load.steps)
    return sum(s.rate * s.duration_s for s in load.steps) / total


def _steps_scale(load, factor: float) -> None:
    for s in load.steps:
        s.rate *= factor


SHAPES.register(
    "steps",
    "a staircase of load.steps (rate, duration_s), each in turn",
    LoadShape(_steps, needs=("steps",), mean_rate=_steps_mean, scale=_steps_scale),
)


def _trace_at_rate(load, rate: float) -> None:
    load.trace.request_rate = rate


def _trace_lengths(scenario, base_dir):
    if not scenario.load.trace.use_lengths:
        return None
    trace = scenario.trace(base_dir)
    return trace.input_lens, trace.output_lens


SHAPES.register(
    "trace",
    "replays the arrival times (and lengths) of a CSV or JSONL trace file (load.trace)",
    LoadShape(
        lambda scenario, rng, base_dir: scenario.trace(base_dir).offsets_s,
        needs=("trace",),
        session_lengths=_trace_lengths,
        at_rate=_trace_at_rate,
    ),
)
SHAPES.register(
    "closed",
    "a closed loop: load.concurrency users, each sending when its last reply ends",
    LoadShape(lambda scenario, rng, base_dir: None, needs=("concurrency",)),
)
