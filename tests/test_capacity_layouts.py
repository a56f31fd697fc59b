"""The buy decision does not depend on the sweep's layout (issue 27), in virtual time.

The demo's deployments swept over a 2 req/s and a 0.5 req/s grid of mean rates (the SLO
search following each): the B200/H100 ratios agree within 5%, and each GPU's measured range
(bracket, sampling, fresh draws, longer points; the simulator's error left out, as both
layouts share it) overlaps between the layouts. benchmarks/capacity.py adds 1 req/s and
five-minute layouts and prints the figures.
"""

from __future__ import annotations

import pytest

from bench.cost import load_catalogue
from bench.curves import capacity_ratio, compare_runs, run_curves
from bench.demo import DEMO_POINT_S, DEMO_SLO, TARGETS, virtual_sweep
from bench.metrics import parse_slo


def _layout(step: float, db: str):
    n = round((16 - 2) / step)
    rates = [2 + i * step for i in range(n + 1)]
    ids = [virtual_sweep(t, rates, DEMO_POINT_S, DEMO_SLO, db) for t in TARGETS]
    comps = compare_runs(run_curves(ids, db), parse_slo(DEMO_SLO), load_catalogue())
    ratio, why = capacity_ratio(comps[0].at_slo, comps[1].at_slo)
    assert ratio is not None, why
    return [c.at_slo for c in comps], ratio


def _measured(cap) -> tuple[float, float]:
    return min(lo for lo, _ in cap.parts.values()), max(hi for _, hi in cap.parts.values())


@pytest.mark.slow
def test_coarse_and_dense_grids_give_the_same_answer(tmp_path):
    db = f"sqlite:///{tmp_path / 'layouts.db'}"
    coarse_caps, coarse = _layout(2.0, db)
    dense_caps, dense = _layout(0.5, db)
    assert abs(coarse.value / dense.value - 1) <= 0.05, (coarse.text(), dense.text())
    for c, d in zip(coarse_caps, dense_caps, strict=True):
        (clo, chi), (dlo, dhi) = _measured(c), _measured(d)
        assert max(clo, dlo) <= min(chi, dhi), (c.covers(), d.covers())
        # each range says what it covers, and is ordered around its estimate
        assert {"bracket", "draws", "long"} <= set(c.parts)
        assert c.low <= c.value <= c.high and c.sim_error > 0
