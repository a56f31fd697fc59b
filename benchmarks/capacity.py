"""Capacity benchmark: does the buy decision depend on how the sweep was laid out? (issue 27)

The demo's deployments (bench/demo.py: Llama-3.3-70B FP8 on one B200 and on two H100s
with TP2, the bursty chat scenario, SLO p99_ttft_ms<=2000,p99_tpot_ms<=50) swept in virtual
time over grids that differ only in layout: mean rates 2 req/s apart, 0.5 apart, 1 apart,
and 1 apart with five-minute points instead of two. Each sweep runs the library's SLO search
(bench.sweep.Sweep.slo_search: fresh draws and longer points at the bracketing rates, then
bisection until the bracket is narrower than that spread). Prints, per layout, each GPU's
capacity with its range and the parts it covers, the B200/H100 ratio and its range, and
checks the targets: every ratio within 5% of the others, and the measured ranges (without
the simulator's error, which every layout shares) of every layout overlapping.

    python benchmarks/capacity.py [--db sqlite:///...]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (name, step between mean rates in req/s, seconds per point)
LAYOUTS = (
    ("coarse: 2 req/s grid", 2.0, 120.0),
    ("dense: 0.5 req/s grid", 0.5, 120.0),
    ("demo: 1 req/s grid", 1.0, 120.0),
    ("long: 1 req/s grid, 5-minute points", 1.0, 300.0),
)


def grid(step: float, low: float = 2.0, high: float = 16.0) -> list[float]:
    n = round((high - low) / step)
    return [low + i * step for i in range(n + 1)]


def measured_range(cap) -> tuple[float, float]:
    """The hull of the parts a rerun could move (no simulator error): what must overlap."""
    return min(lo for lo, _ in cap.parts.values()), max(hi for _, hi in cap.parts.values())


def sweep_layout(step: float, point_s: float, db: str):
    """(B200 capacity, H100 capacity, ratio) for one grid layout, from stored sweeps."""
    from bench.cost import load_catalogue
    from bench.curves import capacity_ratio, compare_runs, run_curves
    from bench.demo import DEMO_SLO, TARGETS, virtual_sweep
    from bench.metrics import parse_slo

    ids = [virtual_sweep(t, grid(step), point_s, DEMO_SLO, db) for t in TARGETS]
    comps = compare_runs(run_curves(ids, db), parse_slo(DEMO_SLO), load_catalogue())
    ratio, why = capacity_ratio(comps[0].at_slo, comps[1].at_slo)
    if ratio is None:
        raise SystemExit(f"no ratio: {why}")
    return comps[0].at_slo, comps[1].at_slo, ratio


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", help="database URL (default: a temporary SQLite file)")
    args = ap.parse_args()
    db = args.db or f"sqlite:///{Path(tempfile.mkdtemp()) / 'capacity.db'}"
    rows = []
    for name, step, point_s in LAYOUTS:
        t0 = time.monotonic()
        b200, h100, ratio = sweep_layout(step, point_s, db)
        rows.append((name, b200, h100, ratio))
        print(f"\n{name} ({time.monotonic() - t0:.0f} s)")
        for gpu, cap in (("B200", b200), ("H100 x2", h100)):
            lo, hi = measured_range(cap)
            print(f"  {gpu}: {cap.text()}; measured {lo:,.0f}-{hi:,.0f}")
            print(f"    {cap.covers()}")
        print(f"  ratio {ratio.text()}")
    ratios = [r.value for *_, r in rows]
    spread = max(ratios) / min(ratios) - 1
    print(f"\nratios {', '.join(f'{r:.2f}x' for r in ratios)}: largest/smallest - 1 = {spread:.1%}")
    ok = spread <= 0.05
    for i, gpu in ((1, "B200"), (2, "H100 x2")):
        spans = [measured_range(row[i]) for row in rows]
        overlap = max(lo for lo, _ in spans) <= min(hi for _, hi in spans)
        print(
            f"{gpu} measured ranges {'overlap' if overlap else 'DO NOT overlap'}: "
            + ", ".join(f"{lo:,.0f}-{hi:,.0f}" for lo, hi in spans)
        )
        ok = ok and overlap
    print("targets (ratios within 5%, ranges overlap):", "met" if ok else "MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
