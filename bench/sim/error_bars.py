"""The expected error of every simulated figure, and where a point sits against saturation.

A simulated figure is a prediction: it carries the error the simulator is expected to make
for its kind of deployment. Without a calibration that is the held-out (leave-one-source-out)
error of its category (bench.sim.profiles.accuracy, one figure for every quantity: throughput
is what the published points measure); with a calibration profile, the profile's own mean
error per quantity over the points it was fitted on. Near saturation, latency swings by
orders of magnitude for a few per cent of load, so a point at NEAR_SATURATION or more of the
deployment's maximum request rate is flagged: its TTFT can be off by far more than the error.
"""

from __future__ import annotations

from typing import Any

NEAR_SATURATION = 0.9  # achieved / maximum request rate at which a point is flagged
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
    from bench.sim.profiles.accuracy import expected_error

    err, basis = expected_error(gpu, model)
    return {q: err for _, _, q in FIGURES}, basis


def saturation_rate(engine: Any, isl: float, osl: float) -> float:
    """Requests/s the engine completes with every sequence slot busy (a closed loop at its
    max_num_seqs with the workload's mean lengths, in virtual time): the rate an open loop
    cannot exceed."""
    from bench.sim.virtual import run_closed_loop

    c = max(int(engine.cfg.max_num_seqs), 1)
    osl_i, isl_i = max(int(round(osl)), 2), max(int(round(isl)), 1)
    r = run_closed_loop(engine, c, (isl_i, isl_i), osl_i, rounds=3.0)
    return r["output_tps"] / osl_i


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
            # x/÷ (1 + e): a 200% error never makes a latency negative
            out[q] = {"value": v, "expected_error": e, "low": v / (1 + e), "high": v * (1 + e)}
    load = max(summary.requests_per_s, offered_rps or 0.0)
    util = load / sat_rps if sat_rps else None
    out["utilisation"] = util
    out["near_saturation"] = bool(util is not None and util >= NEAR_SATURATION)
    return out
