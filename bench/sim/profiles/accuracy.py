"""How far the simulator's figures are expected to be from hardware, per kind of model.

The one place a simulated capacity's range reads the simulator's error from. The figures
are the leave-one-source-out mean absolute errors of throughput per GPU over the published
points (README, "Simulator validation"; pinned by tests/test_sim_calibration.py): each
source's points predicted by a fit that never saw that source, so they say how far a point
the simulator was not tuned on is off, which is the situation of every user's run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Held-out (leave-one-source-out) mean absolute error, by the category the validation table
# reports: dense Llama models, mixture-of-experts models, AMD GPUs, and all points.
HELD_OUT_ERROR = {"dense": 0.131, "moe": 0.252, "amd": 0.439, "all": 0.221}
BASIS = "held-out (leave-one-source-out) mean error for {what}"


def expected_error(gpu: str | None, model: str | None) -> tuple[float, str]:
    """(relative error, where it comes from in words) for a simulated run of `model` on
    `gpu`; the all-points figure when the model or GPU is not in the simulator's profiles."""
    from bench.sim.profiles import get_gpu, get_model

    try:
        vendor = get_gpu(gpu).vendor.lower() if gpu else None
        arch = get_model(model).arch if model else None
    except (KeyError, ValueError):
        vendor = arch = None
    if vendor == "amd":
        key, what = "amd", "AMD GPUs"
    elif arch == "moe":
        key, what = "moe", "mixture-of-experts models"
    elif arch == "dense":
        key, what = "dense", "dense models"
    else:
        key, what = "all", "all published points"
    return HELD_OUT_ERROR[key], BASIS.format(what=what)


# -- error bars: each simulated figure's expected error (bench.sim.error_bars adds the
# saturation rate, which needs the engine; bench.curves reads both back for a stored run)

NEAR_SATURATION = 0.9  # achieved / maximum request rate at which a point is flagged
ARTIFACT = "sim/error_bars.json"  # the run artifact holding a simulated run's saturation rate
# The figures a simulated point shows with an error bar: (label, Summary lookup, quantity)
FIGURES = (
    ("TTFT p50 ms", "p50_ttft_ms", "ttft_p50"),
    ("TTFT p99 ms", "p99_ttft_ms", "ttft_p99"),
    ("TPOT p50 ms", "p50_tpot_ms", "tpot_p50"),
    ("TPOT p99 ms", "p99_tpot_ms", "tpot_p99"),
    ("out tok/s", "output_tokens_per_s", "output_tps"),
)


def expected_errors(gpu: str | None, model: str | None, profile: Any = None) -> tuple[dict, str]:
    """({quantity: relative error}, its basis in words)."""
    if profile is not None:
        errs = profile.expected_error()
        where = f" {profile.path}" if profile.path else ""
        return errs, f"mean error of calibration profile{where} on the points it was fitted on"
    err, basis = expected_error(gpu, model)
    return {q: err for _, _, q in FIGURES}, basis


def relative_error(errors: dict[str, float], name: str) -> float | None:
    """The expected error of one figure named as Summary.value names it (p99_ttft_ms,
    output_tokens_per_s, ...): its own quantity's, else (E2E, ITL, request rate, a per-GPU
    rate) the largest of the quantities' errors; None when there are none."""
    for _, key, q in FIGURES:
        if key == name and q in errors:
            return errors[q]
    if name in ("output_tps_per_gpu", "output_tokens_per_s_per_gpu") and "output_tps" in errors:
        return errors["output_tps"]
    return max(errors.values()) if errors else None


def bounds(value: float, error: float) -> tuple[float, float]:
    """[low, high] of a figure with a relative expected error: x/÷ (1 + e), so a 200% error
    never makes a latency negative."""
    return value / (1 + error), value * (1 + error)


def error_bar_widths(
    values: Sequence[float | None], error: float
) -> tuple[list[float | None], list[float | None]]:
    """The upper and lower half-widths of `bounds` for each value, as charts draw error bars
    (plotly's array/arrayminus, the deck's c:plus/c:minus); None where a value is missing (a
    bar for a tier the GPU lacks)."""
    spans = [(v, *bounds(v, error)) if v is not None else None for v in values]
    return (
        [None if s is None else s[2] - s[0] for s in spans],
        [None if s is None else s[0] - s[1] for s in spans],
    )


def utilisation(
    requests_per_s: float, offered_rps: float | None, sat_rps: float | None
) -> float | None:
    """A point's load over the saturation rate (the offered rate where one was set: an
    overloaded point completes only what the engine can, which would hide the overload)."""
    load = max(requests_per_s or 0.0, offered_rps or 0.0)
    return load / sat_rps if sat_rps else None


def point_error_bars(
    summary: Any, errors: dict[str, float], sat_rps: float | None, offered_rps: float | None = None
) -> dict:
    """One point's figures with [low, high] from the expected errors, its utilisation of the
    saturation rate (the offered rate where one was set: an overloaded point completes only
    what the engine can, which would hide the overload) and whether it is near saturation."""
    out: dict[str, Any] = {}
    for _, key, q in FIGURES:
        try:
            v = summary.value(key)
        except KeyError:
            v = None
        e = errors.get(q)
        if v is not None and e is not None:
            low, high = bounds(v, e)
            out[q] = {"value": v, "expected_error": e, "low": low, "high": high}
    util = utilisation(summary.requests_per_s, offered_rps, sat_rps)
    out["utilisation"] = util
    out["near_saturation"] = bool(util is not None and util >= NEAR_SATURATION)
    return out
