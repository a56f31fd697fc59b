"""Energy per token: measured board power integrated over each load point, divided by the
output tokens its completed requests delivered.

The price of that energy (and the fallback from a GPU's rated power when none was measured)
is bench.cost's; this module only turns power samples into a mean power per GPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from bench.telemetry.readers import load_telemetry, power_w

if TYPE_CHECKING:
    import pandas as pd


def mean_power(t_s: np.ndarray, watts: np.ndarray, duration_s: float) -> float | None:
    """Time-weighted mean power over [0, duration_s] from samples (trapezoids between
    them, each end held flat), None without a sample in the window."""
    inside = (t_s >= 0) & (t_s <= duration_s)
    t, w = t_s[inside], watts[inside]
    if len(t) == 0:
        return None
    order = np.argsort(t)
    t, w = t[order], w[order]
    if len(t) == 1 or duration_s <= 0:
        return float(np.mean(w))
    t = np.concatenate([[0.0], t, [duration_s]])
    w = np.concatenate([[w[0]], w, [w[-1]]])
    return float(np.sum((w[1:] + w[:-1]) / 2 * np.diff(t)) / duration_s)


ENERGY_COLUMNS = [
    "load_point",
    "source",
    "gpus",
    "duration_s",
    "mean_power_w_per_gpu",
    "energy_j",
    "output_tokens",
    "output_tokens_per_s",
    "joules_per_output_token",
    "kwh_per_mtok",
    "energy_usd_per_mtok",
]


def energy_per_output_token(run_id: str, db: Any = None, catalogue: Any = None) -> pd.DataFrame:
    """Measured energy per delivered output token, one row per load point with power samples.

    Energy = each GPU's time-weighted mean board power over the whole load point x its
    duration, summed over the GPUs the telemetry saw; output tokens = those of its completed
    requests. J/token, kWh/Mtok and electricity $/Mtok come from bench.cost.energy_estimate
    with the measured power (so $/kWh and PUE are the catalogue's). Empty when no GPU power
    was recorded: callers then fall back to energy_estimate's profile-TDP figure.
    """
    import pandas as pd

    from bench.cost import energy_estimate
    from bench.records import OK
    from bench.store import get_run, load_columns

    run = get_run(run_id, db)
    power = power_w(load_telemetry(run.id, db))
    rows = []
    for lp in run.load_points:
        part = power[power["load_point"] == lp.load_point]
        if part.empty or lp.ended_ns is None:
            continue
        duration = (lp.ended_ns - (lp.started_ns or 0)) / 1e9
        means = [
            mean_power(g["t_s"].to_numpy(), g["power_w"].to_numpy(), duration)
            for _, g in part.groupby("gpu")
        ]
        means = [m for m in means if m is not None]
        if not means or duration <= 0:
            continue
        cols = load_columns(run.id, lp.load_point, db)
        tokens = float(np.nansum(cols.output_tokens[cols.state == OK]))
        gpus = len(means)
        per_gpu = sum(means) / gpus
        est = energy_estimate(
            run.gpu_type or "unknown",
            gpus,
            tokens / duration,
            catalogue,
            measured_power_w=per_gpu,
        )
        rows.append(
            {
                "load_point": lp.load_point,
                "source": part["source"].iloc[0],
                "gpus": gpus,
                "duration_s": duration,
                "mean_power_w_per_gpu": per_gpu,
                "energy_j": per_gpu * gpus * duration,
                "output_tokens": tokens,
                "output_tokens_per_s": tokens / duration,
                "joules_per_output_token": est.joules_per_token,
                "kwh_per_mtok": est.kwh_per_mtok,
                "energy_usd_per_mtok": est.energy_usd_per_mtok,
            }
        )
    return pd.DataFrame(rows, columns=ENERGY_COLUMNS)
