"""Calibration: the roofline against the worked example and the 7 published reference points.

If any of these fails, a profile figure or an efficiency parameter changed: re-check it
against reference/published.md section 4a before loosening a tolerance.
"""

import pytest

from bench.sim.calibration import calibrate
from bench.sim.engine import Engine
from bench.sim.roofline import Deployment


def _ideal(gpu: str) -> Deployment:
    """No efficiency loss, no overhead: the pure bandwidth floor of the worked example."""
    return Deployment.build(gpu, "llama-3.3-70b", "fp8", mbu=1.0, mfu=1.0, t_fix_s=0.0)


@pytest.mark.parametrize("gpu,ms", [("B200", 9.0), ("H100", 21.0)])
def test_worked_example_bandwidth_floor(gpu: str, ms: float) -> None:
    # seed 000: 70 GB / 7.7 TB/s ~ 9 ms per step (~110 tok/s); H100 at 3.35 TB/s ~ 21 ms
    step = _ideal(gpu).step_time(1, 1, 0, 0)
    assert step * 1e3 == pytest.approx(ms, rel=0.05)


def test_worked_example_b200_tokens_per_second() -> None:
    assert 1 / _ideal("B200").step_time(1, 1, 0, 0) == pytest.approx(110, rel=0.05)


def test_calibrated_batch1_is_floor_plus_losses() -> None:
    # with MBU 0.8 and 2 ms overhead the realistic step sits above the floor, by a bounded amount
    for gpu, floor in [("B200", 9.16e-3), ("H100", 21.06e-3)]:
        step = Deployment.build(gpu, "llama-3.3-70b", "fp8").step_time(1, 1000, 0, 0)
        assert floor * 1.2 < step < floor * 1.6


def test_kv_capacity_worked_example() -> None:
    # seed 000: 180 GB B200, ~10 GB reserved -> ~100 GB of KV ~ 610k tokens. vLLM's
    # gpu_memory_utilization 0.9 reserves 18 GB instead, so ~558k tokens: within 10%.
    dep = Deployment.build("B200", "llama-3.3-70b", "fp8")
    assert dep.kv_bytes_per_token == 163840
    assert dep.kv_capacity_tokens(0.90) == pytest.approx(610_000, rel=0.10)
    assert Engine(dep).capacity_tokens == dep.kv_capacity_tokens(0.90)


def test_nvfp4_halves_weight_read() -> None:
    fp8 = Deployment.build("B200", "llama-3.3-70b", "fp8")
    fp4 = Deployment.build("B200", "llama-3.3-70b", "fp4")
    assert fp4.weight_bytes / fp8.weight_bytes == pytest.approx(0.5625)


def test_reference_points_within_tolerance() -> None:
    results, tol = calibrate()
    assert len(results) == 7 and tol == 0.25
    report = "\n".join(
        f"{r.name}: measured {r.measured} model {r.model:.0f} ({r.error:+.1%})" for r in results
    )
    for r in results:
        assert abs(r.error) <= tol, report
    mean_abs = sum(abs(r.error) for r in results) / len(results)
    assert mean_abs < 0.16, report


def test_b200_beats_h100_per_gpu() -> None:
    # MLPerf ratio check (published.md 2a): B200 : H100 per GPU ~ 3-4x on 70B at max throughput
    from bench.sim.roofline import steady_state

    def best(gpu: str, prec: str, tp: int) -> float:
        dep = Deployment.build(gpu, "llama-3.3-70b", prec, tp)
        c = dep.kv_capacity_tokens() / 1500
        return steady_state(dep, 1000, 1000, c)["output_tps_per_gpu"]

    ratio = best("B200", "fp4", 1) / best("H100", "fp8", 2)
    assert 2.5 < ratio < 5.0
