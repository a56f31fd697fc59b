"""How far the simulator's figures are expected to be from hardware, per kind of model.

The one place a simulated figure's range reads the simulator's error from. The figures come
from held_out.yaml (written by `python -m bench.sim.calibration --loso --write-held-out`):
each published point predicted by a fit that never saw its source (leave-one-source-out), or
added after the fit, which is the situation of every user's run. A range states the error
that COVERAGE of those points were within, not their mean: on the dense points the mean was
13% while 8 of 20 were off by more, so a range of +-13% covered 12 of 20. Time to first token
is not scored by the fitted points (they score throughput at an interactivity, which TPOT
sets), so a TTFT's error is at least that of the independent TTFT checks (NIM [S75]). A
disaggregated deployment's figures state at least the error of the published fronts whose
sources ran disaggregated splits, reproduced with those splits, each by a fit that never saw it
(its source held out, or added after the fit), as well as their own category's. A run with MTP (speculative
decoding) states at least the error of the published MTP speed-ups (never fitted on: how much
faster the same deployment runs with its drafts). A latency of a deployment whose engine and
category published per-request runs have measured (vLLM serving a mixture-of-experts model,
TensorRT-LLM a dense one: bench.sim.per_request) states at least the error COVERAGE of those
runs' same figure were within: the published points score throughput, and the confidence
they give a latency did not hold those runs (a TTFT p50 range of x/÷ 1.78 held 0 of 72).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import yaml

HELD_OUT_YAML = Path(__file__).with_name("held_out.yaml")
COVERAGE = 0.9  # share of held-out points a stated error covers
# The categories the validation table reports (published.yaml's `set`), and "all"
CATEGORIES = {"dense": "dense models", "moe": "mixture-of-experts models", "amd": "AMD GPUs",
              "all": "all published points",
              "disagg": "disaggregated prefill/decode", "mtp": "MTP speed-ups"}  # fmt: skip
SEPARATE = ("disagg", "mtp")  # scored another way, not among "all" (disagg: the same points)
DISAGG_BASIS = (
    "; disaggregated: at least the error of published fronts reproduced with their sources' "
    "xPyD splits ({err:.0%}: {n} of {m} within it)"
)
MTP_BASIS = (
    "; with MTP: at least the error of published MTP speed-ups ({err:.0%}: {n} of {m} within it)"
)
BASIS = "held-out error for {what} ({n} of {m} points held out of the fit within it)"
TTFT_BASIS = "; TTFT at least as far as the independent TTFT checks ({ttft:.0%})"
PER_REQUEST_BASIS = (
    "; per request, at least the error of the published {engine} runs {suites}: {parts}"
)


@lru_cache(maxsize=1)
def _held_out_doc() -> dict[str, Any]:
    """held_out.yaml, parsed once a process: libyaml's loader where PyYAML has it (its
    thousands of per-request rows take the pure-Python parser about a second)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(HELD_OUT_YAML.read_text(), Loader=loader)  # noqa: S506 (a safe loader)


def range_error(error: float) -> float:
    """The error a range x/÷ (1 + e) around a simulated figure must state to hold the measured
    one, for a point off by `error` (simulated / measured - 1): max(s/m, m/s) - 1. For a
    simulator too high it is the error itself; too low, more than its size: at -61% the measured
    figure is 2.56x the simulated, which a range of x/÷ 1.61 misses (stated from |error| until
    2026-12-05, so every range covered fewer under-predicted points than it said); -100% (a
    target beyond the simulated front) no finite range holds."""
    if error >= 0:
        return error
    return math.inf if error <= -1 else 1 / (1 + error) - 1


def _by_category(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """range_error of the rows by their category, and of all of them ("all")."""
    out: dict[str, list[float]] = {c: [] for c in CATEGORIES}
    for row in rows:
        err = range_error(row["error"])
        out[row["category"]].append(err)
        if row["category"] not in SEPARATE:
            out["all"].append(err)
    return out


def held_out_errors() -> dict[str, list[float]]:
    """range_error of every held-out point by category ("all" too), and of the TTFT checks
    ("ttft"), as held_out.yaml records them."""
    doc = _held_out_doc()
    ttft = [range_error(t["error"]) for t in doc.get("ttft", [])]
    return _by_category(doc["points"]) | {"ttft": ttft}


def per_request_errors(engine: str | None, gpu: str | None, model: str | None) -> dict[str, list]:
    """{quantity: [(range_error, suite), ...]} of the published per-request runs (held_out.yaml's
    `per_request` rows, bench.sim.per_request) of the deployment's engine and category (any
    category for a model or GPU not in the profiles); {} when none: the engine's runs say
    nothing of another engine's front end and scheduler."""
    if not engine:
        return {}
    from bench.sim.profiles import engine_family

    family, key = engine_family(engine), category(gpu, model)
    out: dict[str, list] = {}
    for row in _held_out_doc().get("per_request", []):
        if row["engine"] == family and key in ("all", row["category"]):
            out.setdefault(row["quantity"], []).append((range_error(row["error"]), row["suite"]))
    return out


def gpu_pair_errors() -> dict[str, list[float]]:
    """|error| of the ratio of two GPUs' held-out points (calibration.gpu_pairs) by category
    ("all" too)."""
    return _by_category(_held_out_doc().get("gpu_pairs", []))


def ratio_error(category_a: str, category_b: str) -> tuple[float, str]:
    """(relative error, basis) of the ratio of two runs simulated with the published fit: the
    error that COVERAGE of held-out pairs of GPUs (one source, one model, the GPU alone
    differing) were within, in their category ("all" when the two runs' differ or a category
    has no pair). Their errors are the same fit's, so a ratio is off by far less than the
    two errors compounded (dense pairs: within 12% where each GPU's points were within 35%)."""
    pairs = gpu_pair_errors()
    key = category_a if category_a == category_b and pairs[category_a] else "all"
    errors = pairs[key]
    if not errors:
        return 0.0, "no held-out pair of GPUs"
    err, within = _covered(errors)
    return err, (
        f"simulator's held-out error on a ratio of two GPUs for {CATEGORIES[key]} ({within} of "
        f"{len(errors)} pairs within it)"
    )


def covering_error(errors: Sequence[float], coverage: float = COVERAGE) -> float:
    """The smallest error that `coverage` of `errors` are within (an observed error, so the
    stated range is one a held-out point reached)."""
    x = np.sort(np.asarray(errors, float))
    return float(x[max(int(np.ceil(coverage * len(x))) - 1, 0)])


def _covered(errors: Sequence[float]) -> tuple[float, int]:
    """(the error COVERAGE of `errors` are within, how many are), what each basis states."""
    err = covering_error(errors)
    return err, sum(e <= err for e in errors)


def category(gpu: str | None, model: str | None) -> str:
    """The validation category of a simulated run: "amd", "moe", "dense", else "all"."""
    from bench.sim.profiles import get_gpu, get_model

    try:
        vendor = get_gpu(gpu).vendor.lower() if gpu else None
        arch = get_model(model).arch if model else None
    except (KeyError, ValueError):
        return "all"
    if vendor == "amd":
        return "amd"
    return arch if arch in ("moe", "dense") else "all"


def held_out_error(
    gpu: str | None, model: str | None, disagg: bool = False, mtp: bool = False
) -> tuple[float, str]:
    """(relative error, where it comes from in words) of a simulated run's throughput and TPOT
    (the points score throughput at an interactivity, which TPOT sets) for `model` on `gpu`;
    the all-points figure when the model or GPU is not in the simulator's profiles; for a
    disaggregated deployment (disagg), at least the disaggregated fronts' error too; with MTP
    drafts (mtp), at least the published MTP speed-ups' too."""
    key, by_category = category(gpu, model), held_out_errors()
    errors = by_category[key]
    err, within = _covered(errors)
    basis = BASIS.format(what=CATEGORIES[key], n=within, m=len(errors))
    for kind, on, words in (("disagg", disagg, DISAGG_BASIS), ("mtp", mtp, MTP_BASIS)):
        rows = by_category[kind] if on else []
        if rows:
            e_kind, n = _covered(rows)
            basis += words.format(err=e_kind, n=n, m=len(rows))
            err = max(err, e_kind)
    return err, basis


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
# End-to-end latency has an error of its own only where per-request runs measured it (else the
# widest of the figures above, relative_error): TTFT, TPOT and throughput bound it.
E2E_FIGURES = (("E2E p50 ms", "p50_e2el_ms", "e2el_p50"), ("E2E p99 ms", "p99_e2el_ms", "e2el_p99"))


def expected_errors(
    gpu: str | None,
    model: str | None,
    profile: Any = None,
    disagg: bool = False,
    mtp: bool = False,
    engine: str | None = None,
) -> tuple[dict, str]:
    """({quantity: relative error}, its basis in words); disagg: a disaggregated deployment;
    mtp: one that drafts tokens (MTP / speculative decoding); engine: the serving engine, whose
    published per-request runs of the category widen the latencies they measured."""
    if profile is not None:
        errs = profile.expected_error()
        where = f" {profile.path}" if profile.path else ""
        return errs, (
            f"error of calibration profile{where}: its fit's residuals and the measurements' "
            "own sampling intervals"
        )
    err, basis = held_out_error(gpu, model, disagg, mtp)
    checks = held_out_errors()["ttft"]
    ttft = covering_error(checks) if checks else 0.0
    errors = {q: max(err, ttft) if q.startswith("ttft") else err for _, _, q in FIGURES}
    basis += TTFT_BASIS.format(ttft=ttft) if ttft > err else ""
    basis += _widen_by_runs(errors, per_request_errors(engine, gpu, model), engine)
    return errors, basis


def _widen_by_runs(errors: dict[str, float], runs: dict[str, list], engine: str | None) -> str:
    """Raise each latency in `errors` to what COVERAGE of the per-request runs' same figure
    were within, and give end-to-end latency the runs' own (at least the throughput's); the
    basis words for those it set ("" when none)."""
    parts, suites = [], set()
    for label, _, q in FIGURES + E2E_FIGURES:
        rows = runs.get(q)
        if not rows:
            continue
        err, within = _covered([e for e, _ in rows])
        if err > errors.get(q, errors["output_tps"]):
            errors[q] = err
            parts.append(
                f"{label.removesuffix(' ms')} {err:.0%} ({within} of {len(rows)} within it)"
            )
            suites |= {suite for _, suite in rows}
    if not parts:
        return ""
    return PER_REQUEST_BASIS.format(engine=engine, suites=", ".join(sorted(suites)),
                                    parts=", ".join(parts))  # fmt: skip


def run_errors(
    calibration: dict | None,
    disagg: Any,
    gpu: str | None,
    model: str | None,
    mtp: Any = None,
    engine: str | None = None,
) -> tuple[dict, str] | None:
    """A simulated run's own expected errors where its category's alone would not do: its
    calibration profile's (kept with the run), else, for a disaggregated deployment, one
    with MTP drafts (mtp: their count) or an engine with published per-request runs of the
    category, the published fit's at least as wide as the disaggregated fronts', the MTP
    speed-ups' or those runs'; None: the category's applies. Stored runs
    (bench.curves), a sweep's live capacity (bench.sweep) and `sim run` ask here."""
    if calibration and calibration.get("expected_error"):
        basis = str(calibration.get("basis") or "calibration profile")
        return dict(calibration["expected_error"]), basis
    if disagg or mtp or per_request_errors(engine, gpu, model):
        return expected_errors(gpu, model, disagg=bool(disagg), mtp=bool(mtp), engine=engine)
    return None


def relative_error(errors: dict[str, float], name: str) -> float | None:
    """The expected error of one figure named as Summary.value names it (p99_ttft_ms,
    output_tokens_per_s, ...): its own quantity's (E2E's where per-request runs gave it one),
    else (E2E, ITL, request rate, a per-GPU rate) the largest of the quantities' errors; None
    when there are none."""
    for _, key, q in FIGURES + E2E_FIGURES:
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
