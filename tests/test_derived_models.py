"""API answers derived from the library's dataclasses (server/derived.py) carry every field
of their source, so a field added to bench.curves reaches /api and /docs without a copy."""

from __future__ import annotations

import dataclasses
import math

from bench.curves import CurvePoint, Ratio
from server.models import CurvePointOut, RatioOut


def _point(**kw) -> CurvePoint:
    base = dict(load_point=2, title="8 req/s", offered=8.0, requests_per_s=7.9,
                output_tps_per_gpu=500.0, total_tps_per_gpu=900.0, output_tps=1000.0,
                total_tps=1800.0, completed=9, failed=1,
                metrics={"tpot_ms": {"p50": 20.0, "p99": 40.0}})  # fmt: skip
    return CurvePoint(**{**base, **kw})


def test_a_curve_point_answer_has_every_field_of_the_point():
    fields = {f.name for f in dataclasses.fields(CurvePoint)} - {"offered_kind"}
    assert set(CurvePointOut.model_fields) == fields | {"error_rate", "interactivity"}
    out = CurvePointOut.of(_point(late_ms=3.5, partial=True)).model_dump()
    assert out["error_rate"] == 0.1 and out["interactivity"] == 50.0
    assert (out["late_ms"], out["partial"], out["offered"]) == (3.5, True, 8.0)
    assert out["metrics"] == {"tpot_ms": {"p50": 20.0, "p99": 40.0}}
    assert CurvePointOut.of(_point(offered=math.inf)).offered is None  # JSON has no inf
    assert CurvePointOut.of(None) is None


def test_a_ratio_answer_reads_its_text():
    ratio = Ratio(2.0, 1.5, None, None, False)
    assert RatioOut.of(ratio).model_dump() == {
        "value": 2.0, "low": 1.5, "high": None, "bound": None, "flips": False,
        "sim_error": None, "sim_basis": None, "text": "2.00x (range 1.50x-open)",
    }  # fmt: skip
    # two simulated runs: the fit's error on a ratio of GPUs travels with the answer
    shared = Ratio(2.0, 1.6, 2.5, None, False, 0.12, "simulator's held-out error on a ratio")
    assert RatioOut.of(shared).model_dump()["sim_error"] == 0.12


def test_a_curve_answer_has_every_field_of_the_curve():
    from bench.curves import RunCurve
    from server.models import CurveOut

    fields = {f.name for f in dataclasses.fields(RunCurve)}
    assert set(CurveOut.model_fields) == fields | {"legend"}
    curve = RunCurve("r1", "n", "B200 x1", "B200-SXM", 1, "m", True, None, "completed",
                     points=[_point(offered=math.inf)])  # fmt: skip
    out = CurveOut.of(curve).model_dump()
    assert out["legend"] == "B200 x1 (simulated)" and out["points"][0]["offered"] is None
    assert out["points"][0]["interactivity"] == 50.0
