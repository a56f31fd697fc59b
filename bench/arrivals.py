"""Load shapes -> a numpy array of intended send offsets in seconds from the run start.

Every open-loop shape is one of two mechanisms:
- renewal processes at a fixed rate (constant, Poisson, gamma with vLLM's burstiness);
- piecewise-linear rate functions (on/off bursts, ramps, steps), sampled as an
  inhomogeneous Poisson process by inverting the cumulative intensity (or evenly spaced,
  with process='constant'), so a burst of 40 req/s really is Poisson at 40 req/s.
Trace replay reads timestamps from a file (its format: bench.traces). All randomness
comes from one seeded Generator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal, get_args

import numpy as np

from bench.traces import format_for

# How arrivals are drawn inside a rate function: at random (Poisson) or evenly spaced.
Process = Literal["poisson", "constant"]
PROCESSES: tuple[str, ...] = get_args(Process)


def renewal(
    rate: float, n: int, rng: np.random.Generator, *, burstiness: float = 1.0
) -> np.ndarray:
    """n offsets at `rate` req/s with gamma inter-arrivals of shape `burstiness`.

    As in vLLM: burstiness 1 is Poisson, < 1 burstier, > 1 more even; the mean inter-arrival
    stays 1/rate (scale = 1 / (rate * burstiness)). The first request goes at t=0.
    rate=inf sends everything at once; burstiness=inf gives a constant rate.
    """
    if n <= 0:
        return np.zeros(0)
    if math.isinf(rate):
        return np.zeros(n)
    if rate <= 0:
        raise ValueError(f"request rate must be > 0, got {rate}")
    if burstiness <= 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    if math.isinf(burstiness):
        gaps = np.full(n - 1, 1.0 / rate)
    else:
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


@dataclass(frozen=True)
class Segment:
    """A stretch of `duration_s` seconds whose rate goes linearly from start to end."""

    duration_s: float
    start_rate: float
    end_rate: float


def piecewise(
    segments: Sequence[Segment],
    rng: np.random.Generator,
    *,
    process: str = "poisson",
    max_requests: int | None = None,
    repeat: bool = False,
) -> np.ndarray:
    """Arrivals of a piecewise-linear rate function.

    Unit-rate arrival "clock" values are mapped through the inverse of the cumulative
    intensity Λ(t); Poisson uses exponential clock gaps, 'constant' uses gaps of exactly 1.
    With repeat=True the segments cycle until max_requests arrivals exist.
    """
    if process not in PROCESSES:
        raise ValueError(f"process must be one of {', '.join(PROCESSES)}, got {process!r}")
    if not segments:
        return np.zeros(0)
    for s in segments:
        if s.duration_s <= 0 or s.start_rate < 0 or s.end_rate < 0:
            raise ValueError(f"bad segment {s}: duration must be > 0 and rates >= 0")
    if repeat and not max_requests:
        raise ValueError("a repeating load shape needs a number of requests")
    # Cumulative intensity at each segment boundary (one cycle).
    mass = np.array([(s.start_rate + s.end_rate) / 2 * s.duration_s for s in segments])
    if mass.sum() <= 0:
        return np.zeros(0)
    cycle_mass = float(mass.sum())
    cycle_len = sum(s.duration_s for s in segments)
    total_mass = cycle_mass
    if repeat:  # enough whole cycles that max_requests arrivals exist with near certainty
        needed = max_requests + 10 * math.sqrt(max_requests) + 10
        total_mass = cycle_mass * math.ceil(needed / cycle_mass)

    # Generate clock values (unit-rate process) up to total_mass.
    expected = int(total_mass + 10 * math.sqrt(total_mass) + 10)
    if process == "poisson":
        clock = np.cumsum(rng.exponential(1.0, size=expected))
    else:
        clock = np.arange(expected, dtype=np.float64) + 0.5
    clock = clock[clock < total_mass]
    if max_requests is not None:
        clock = clock[:max_requests]

    cycles, within = np.divmod(clock, cycle_mass)
    bounds = np.concatenate([[0.0], np.cumsum(mass)])
    starts = np.concatenate([[0.0], np.cumsum([s.duration_s for s in segments])])
    idx = np.clip(np.searchsorted(bounds, within, side="right") - 1, 0, len(segments) - 1)
    out = np.empty_like(within)
    for i, s in enumerate(segments):
        sel = idx == i
        if not sel.any():
            continue
        m = within[sel] - bounds[i]  # intensity mass into this segment
        slope = (s.end_rate - s.start_rate) / s.duration_s
        if abs(slope) < 1e-12:
            dt = m / s.start_rate
        else:
            # Solve r0*t + slope*t^2/2 = m for t >= 0.
            dt = (-s.start_rate + np.sqrt(s.start_rate**2 + 2 * slope * m)) / slope
        out[sel] = starts[i] + dt
    return cycles * cycle_len + out


def on_off(
    burst_rate: float,
    burst_s: float,
    quiet_rate: float,
    quiet_s: float,
    rng: np.random.Generator,
    *,
    num_requests: int | None = None,
    duration_s: float | None = None,
    process: str = "poisson",
) -> np.ndarray:
    """Bursts of `burst_rate` for `burst_s` seconds, then `quiet_rate` for `quiet_s`, cycling."""
    segments = [Segment(burst_s, burst_rate, burst_rate), Segment(quiet_s, quiet_rate, quiet_rate)]
    return _cycled(segments, rng, num_requests, duration_s, process)


def ramp(
    start_rate: float,
    end_rate: float,
    duration_s: float,
    rng: np.random.Generator,
    *,
    num_requests: int | None = None,
    process: str = "poisson",
) -> np.ndarray:
    """Rate rising (or falling) linearly from start_rate to end_rate over duration_s."""
    return piecewise(
        [Segment(duration_s, start_rate, end_rate)],
        rng,
        process=process,
        max_requests=num_requests,
    )


# vLLM's --ramp-up-strategy values: how the rate moves from its start to its end RPS.
RampStrategy = Literal["linear", "exponential"]
RAMP_STRATEGIES: tuple[str, ...] = get_args(RampStrategy)


def ramp_up_rates(strategy: str, start_rps: float, end_rps: float, n: int) -> np.ndarray:
    """The rate of each of n requests under vLLM's ramp-up (`vllm bench serve
    --ramp-up-strategy`): request i's rate is start + (end - start) * p (linear) or
    start * (end / start) ** p (exponential), p = i / max(n - 1, 1), so the first request
    is at the start rate and the last at the end rate."""
    if strategy not in RAMP_STRATEGIES:
        raise ValueError(
            f"ramp-up strategy must be {' or '.join(RAMP_STRATEGIES)}, got {strategy!r}"
        )
    if start_rps <= 0 or end_rps <= 0:
        raise ValueError(f"ramp-up rates must be > 0, got {start_rps:g} and {end_rps:g}")
    progress = np.arange(n, dtype=np.float64) / max(n - 1, 1)
    if strategy == "linear":
        return start_rps + (end_rps - start_rps) * progress
    return start_rps * (end_rps / start_rps) ** progress


def ramp_up(
    strategy: str,
    start_rps: float,
    end_rps: float,
    n: int,
    rng: np.random.Generator,
    *,
    burstiness: float = 1.0,
) -> np.ndarray:
    """n send offsets whose rate moves from start_rps to end_rps request by request, as
    vLLM's get_request computes them: request i waits a gamma gap of shape `burstiness` and
    mean 1 / rate_i (exactly 1 / rate_i when burstiness is inf) after the one before, the
    first one too, and the offsets are the running sum of the gaps. Unlike a fixed rate,
    vLLM does not rescale a ramp's gaps to a target length, and neither does this."""
    if n <= 0:
        return np.zeros(0)
    if burstiness <= 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    rates = ramp_up_rates(strategy, start_rps, end_rps, n)
    if math.isinf(burstiness):
        gaps = 1.0 / rates
    else:
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (rates * burstiness))
    return np.cumsum(gaps)


def steps(
    levels: Sequence[tuple[float, float]],
    rng: np.random.Generator,
    *,
    num_requests: int | None = None,
    process: str = "poisson",
) -> np.ndarray:
    """A staircase: each (rate, duration_s) in turn."""
    return piecewise(
        [Segment(d, r, r) for r, d in levels], rng, process=process, max_requests=num_requests
    )


def _cycled(segments, rng, num_requests, duration_s, process) -> np.ndarray:
    if duration_s is not None:
        cycle = sum(s.duration_s for s in segments)
        n_cycles = math.ceil(duration_s / cycle)
        offsets = piecewise(segments * n_cycles, rng, process=process, max_requests=num_requests)
        return offsets[offsets < duration_s]
    if not num_requests:
        raise ValueError("give a number of requests or a duration")
    return piecewise(segments, rng, process=process, max_requests=num_requests, repeat=True)


# ---------------------------------------------------------------- trace replay

# Column names of the public traces users replay, lower-cased.
_TIME_COLUMNS = ("timestamp", "time", "arrival_time", "t", "ts")
_INPUT_COLUMNS = ("input_len", "input_tokens", "contexttokens", "request tokens", "prompt_tokens")
_OUTPUT_COLUMNS = (
    "output_len",
    "output_tokens",
    "generatedtokens",
    "response tokens",
    "completion_tokens",
)


@dataclass
class Trace:
    offsets_s: np.ndarray
    input_lens: np.ndarray | None
    output_lens: np.ndarray | None


def load_trace(
    path: str | Path,
    *,
    time_scale: float = 1.0,
    max_requests: int | None = None,
    format: str | None = None,  # noqa: A002 - the scenario's load.trace.format
) -> Trace:
    """Read a trace of arrival timestamps, relative to its first row.

    The file is read by its trace format (bench.traces: csv, jsonl, ...), named or chosen
    by the file's suffix.

    Timestamps may be seconds (float) or ISO datetimes (the Azure LLM inference trace);
    input/output lengths are read when present (Azure: ContextTokens/GeneratedTokens;
    BurstGPT: Request tokens/Response tokens). time_scale > 1 replays faster.
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"trace file {path} does not exist")
    rows = format_for(path, format).rows(path)
    if not rows:
        raise ValueError(f"trace file {path} has no rows")
    columns = {k.strip().lower(): k for k in rows[0]}
    tcol = _pick(columns, _TIME_COLUMNS)
    if tcol is None:
        raise ValueError(
            f"trace file {path}: no timestamp column; expected one of {', '.join(_TIME_COLUMNS)}"
            f" (found {', '.join(rows[0])})"
        )
    icol, ocol = _pick(columns, _INPUT_COLUMNS), _pick(columns, _OUTPUT_COLUMNS)
    if max_requests is not None:
        rows = rows[:max_requests]
    times = np.array([_parse_time(r[tcol], path, i + 2) for i, r in enumerate(rows)])
    order = np.argsort(times, kind="stable")
    times = (times[order] - times[order][0]) / time_scale

    def lens(col):
        if col is None:
            return None
        out = np.empty(len(order), dtype=np.int64)
        for j, i in enumerate(order):
            try:
                out[j] = int(float(rows[i][col]))
            except (KeyError, TypeError, ValueError):
                raise ValueError(
                    f"trace file {path} row {i + 1}: {col!r} missing or not a number"
                ) from None
        return out

    return Trace(times, lens(icol), lens(ocol))


def scaled_to_rate(offsets_s: np.ndarray, rate: float) -> np.ndarray:
    """A trace's offsets stretched or squeezed so its mean rate, (n - 1) / span, is `rate`
    req/s; the order and the relative gaps stay. inf (or a trace of one instant) sends all
    at once."""
    span = float(offsets_s[-1] - offsets_s[0]) if len(offsets_s) else 0.0
    if not math.isfinite(rate) or span <= 0 or len(offsets_s) < 2:
        return np.zeros_like(offsets_s)
    return (offsets_s - offsets_s[0]) * ((len(offsets_s) - 1) / span / rate)


def _pick(columns: dict[str, str], names: Sequence[str]) -> str | None:
    for name in names:
        if name in columns:
            return columns[name]
    return None


def _parse_time(value, path: Path, line: int) -> float:
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise ValueError(
            f"trace file {path} line {line}: timestamp {text!r} is neither seconds nor ISO time"
        ) from None
