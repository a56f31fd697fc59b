"""The expected error of every simulated figure, and where a point sits against saturation.

A simulated figure is a prediction: it carries the error the simulator is expected to make
for its kind of deployment. Without a calibration that is the held-out (leave-one-source-out)
error of its category (bench.sim.profiles.accuracy, one figure for every quantity: throughput
is what the published points measure); with a calibration profile, the profile's own mean
error per quantity over the points it was fitted on. Near saturation, latency swings by
orders of magnitude for a few per cent of load, so a point at NEAR_SATURATION or more of the
deployment's maximum request rate is flagged: its TTFT can be off by far more than the error.

A stored simulated run gets the same figures back (bench.curves.run_error_bars): its errors from its stored
metadata (a profile's, kept with the run, else its GPU and model's category), its saturation
rate from the artifact `sim run` keeps with it (ARTIFACT), so the dashboard and the exports
show what the CLI printed. A measured run gets none. The errors and their arithmetic live in
bench.sim.profiles.accuracy (which the analysis layer may read); the saturation rate, which
needs the engine, lives here.
"""

from __future__ import annotations

from typing import Any

from bench.sim.profiles.accuracy import (  # noqa: F401 - the error bars' one home, re-exported
    ARTIFACT,
    FIGURES,
    NEAR_SATURATION,
    bounds,
    expected_errors,
    point_error_bars,
    relative_error,
    utilisation,
)


def calibration_record(profile: Any) -> dict:
    """What a run simulated on a calibration profile stores of it (VirtualExecutor.calibration):
    the file, its expected error per quantity and their basis; every verdict on the run widens
    by these instead of the category's held-out error."""
    errors, basis = expected_errors(None, None, profile)
    return {"profile": str(profile.path), "expected_error": errors, "basis": basis}


def saturation_rate(engine: Any, isl: float, osl: float) -> float:
    """Requests/s the engine completes with every sequence slot busy (a closed loop at its
    max_num_seqs with the workload's mean lengths, in virtual time): the rate an open loop
    cannot exceed."""
    from bench.sim.virtual import run_closed_loop

    c = max(int(engine.cfg.max_num_seqs), 1)
    osl_i, isl_i = max(int(round(osl)), 2), max(int(round(isl)), 1)
    r = run_closed_loop(engine, c, (isl_i, isl_i), osl_i, rounds=3.0)
    return r["output_tps"] / osl_i


def mean_lengths(points: Any) -> tuple[float, float] | None:
    """Mean prompt and output tokens of a run's completed requests (its PointResults), the
    workload its saturation rate is computed for; None when nothing completed."""
    done = [p for p in points if p.summary is not None and p.summary.completed]
    n = sum(p.summary.completed for p in done)
    if not n:
        return None
    isl = sum(p.summary.total_input_tokens for p in done) / n
    return isl, sum(p.summary.total_output_tokens for p in done) / n


def keep_virtual_saturation(run_id: str, points: Any, engine: Any, db: Any = None) -> float | None:
    """Compute and keep the saturation rate of a virtual-time run's engine for the run's own
    workload (mean_lengths), whoever ran it (`sim run`, the demo, the service); returns it."""
    lengths = mean_lengths(points)
    sat = saturation_rate(engine, *lengths) if lengths else None
    save_saturation(run_id, sat, db)
    return sat


def save_saturation(run_id: str, sat_rps: float | None, db: Any = None) -> None:
    """Keep a simulated run's saturation rate with it (ARTIFACT), so a later view can say
    which of its points sat near saturation without re-simulating."""
    import json

    from bench.store import save_artifact

    doc = {"saturation_requests_per_s": sat_rps, "near_saturation_at": NEAR_SATURATION}
    save_artifact(run_id, ARTIFACT, json.dumps(doc), db=db)
