"""The simulator against published measurements (profiles/reference_points.yaml).

Uses the closed-loop steady state of the roofline (bench.sim.roofline.steady_state), the same
step-time function the engine runs, and reproduces each source's method: batch-1 decode,
offline max throughput with the KV cache full, or InferenceX's Pareto front over TP and
concurrency interpolated at a target interactivity.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from bench.sim.profiles import HERE, serving_defaults
from bench.sim.roofline import Deployment, steady_state

POINTS_YAML: Path = HERE / "reference_points.yaml"


@dataclass(frozen=True)
class CalibrationResult:
    name: str
    measured: float
    model: float
    source: str

    @property
    def error(self) -> float:
        return self.model / self.measured - 1


def _kv_concurrency(dep: Deployment, isl: int, osl: int) -> float:
    """Sequences the KV cache holds at mean context ISL + OSL/2."""
    util = serving_defaults().gpu_memory_utilization
    return dep.kv_capacity_tokens(util) / (isl + osl / 2)


def _pareto_at(p: dict, tps: list[int], concs: list[int]) -> float:
    pts = []
    for tp in tps:
        dep = Deployment.build(p["gpu"], p["model"], p["precision"], tp)
        cap = _kv_concurrency(dep, p["isl"], p["osl"])
        for c in concs:
            s = steady_state(dep, p["isl"], p["osl"], min(c, cap))
            pts.append((s["interactivity"], s["total_tps_per_gpu"]))
    front, best = [], -1.0
    for x, y in sorted(pts, reverse=True):  # from most interactive down: keep rising throughput
        if y > best:
            front.append((x, y))
            best = y
    xs, ys = zip(*sorted(front), strict=True)
    return float(np.interp(p["interactivity"], xs, ys))


def model_value(p: dict, tps: list[int], concs: list[int]) -> float:
    """The simulator's figure for one reference point, by that point's method."""
    if p["kind"] == "interactivity":
        return _pareto_at(p, tps, concs)
    dep = Deployment.build(p["gpu"], p["model"], p["precision"], p["tp"])
    if p["kind"] == "batch1":
        return steady_state(dep, p["isl"], p["osl"], 1)["interactivity"]
    if p["kind"] == "max_tput":
        c = _kv_concurrency(dep, p["isl"], p["osl"])
        return steady_state(dep, p["isl"], p["osl"], c)["output_tps_per_gpu"]
    raise ValueError(f"unknown reference point kind {p['kind']!r}")


def calibrate(path: Path = POINTS_YAML) -> tuple[list[CalibrationResult], float]:
    """Model vs measured for every reference point, and the tolerance they must meet."""
    data = yaml.safe_load(path.read_text())
    tps, concs = data["sweep_tp"], data["sweep_concurrency"]
    results = [
        CalibrationResult(p["name"], p["measured"], model_value(p, tps, concs), p["source"])
        for p in data["points"]
    ]
    return results, float(data["tolerance"])
