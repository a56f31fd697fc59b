"""The simulator's per-request error against published runs of real engines on GPUs.

The published points (calibration.py) score throughput at an interactivity: a fit can meet
them while the latency a user sees per request is far off. Simulator studies score per-request
latency instead: the mean absolute percentage error over a run's TTFT, inter-token and
end-to-end percentiles at matched load, then the median over runs (issue 25, item 5). This
module does that against `profiles/per_request.yaml`: each published run replayed on the engine
clock (what `sim run` executes) with the run's own input and output lengths, closed-loop
concurrency and request count, its percentiles read as its client read them. Scored, never
fitted: `python -m bench.sim.per_request` prints every run, figure and the median.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from bench.sim.calibration import load_published
from bench.sim.profiles.accuracy import expected_errors, range_error, relative_error

PER_REQUEST_YAML: Path = Path(__file__).parent / "profiles" / "per_request.yaml"
FIGURES = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "e2el_p50", "e2el_p99")
SUMMARY_NAMES = {"ttft_p50": "p50_ttft_ms", "ttft_p99": "p99_ttft_ms", "tpot_p50": "p50_tpot_ms",
                 "tpot_p99": "p99_tpot_ms", "e2el_p50": "p50_e2el_ms", "e2el_p99": "p99_e2el_ms"}  # fmt: skip


@dataclass(frozen=True)
class Run:
    """One published run: a deployment at one closed-loop load, and what its client measured."""

    suite: str
    source: str
    gpu: str
    model: str
    precision: str
    engine: str
    parallel: str
    isl: int
    osl: int
    concurrency: int
    prompts: int
    measured: dict[str, float]  # FIGURES, ms

    @property
    def label(self) -> str:
        return f"{self.parallel} isl {self.isl} c{self.concurrency}"


@dataclass(frozen=True)
class RunError:
    run: Run
    simulated: dict[str, float]  # FIGURES, ms

    @property
    def errors(self) -> dict[str, float]:
        """simulated / measured - 1, per figure."""
        return {k: self.simulated[k] / self.run.measured[k] - 1 for k in FIGURES}

    @property
    def mape(self) -> float:
        """The field's per-request error of this run: mean absolute error over its figures."""
        return float(np.mean([abs(e) for e in self.errors.values()]))


def load_runs(path: Path = PER_REQUEST_YAML) -> list[Run]:
    """Every run of every suite in the file; a suite citing a source the published list lacks
    is refused with the file and suite named."""
    data = yaml.safe_load(Path(path).read_text())
    sources = load_published().sources
    runs = []
    for s in data["suites"]:
        if s["source"] not in sources:
            raise ValueError(f"{path}: suite {s['id']} cites {s['source']}, not in the sources")
        for r in s["runs"]:
            runs.append(
                Run(
                    suite=s["id"],
                    source=s["source"],
                    gpu=s["gpu"],
                    model=s["model"],
                    precision=s["precision"],
                    engine=s["engine"],
                    parallel=r["parallel"],
                    isl=r["isl"],
                    osl=s["output_tokens"],
                    concurrency=r["concurrency"],
                    prompts=r["prompts"],
                    measured={k: float(r[k]) for k in FIGURES},
                )
            )
    return runs


def simulate(run: Run) -> dict[str, float]:
    """The run's figures (ms) from the simulated engine: `prompts` requests of exactly `isl`
    tokens in and `osl` out, sent by `concurrency` users at once with no think time, as the
    client's measured phase sends them after its warm-up (a simulated engine needs none); TPOT
    per request is (end-to-end - TTFT) / (osl - 1), and each figure the client's percentile
    (numpy's, linear) over the run's requests."""
    from bench.sim.virtual import build_engine, replay_closed

    engine = build_engine(
        run.gpu, run.model, run.precision, parallel=run.parallel, engine=run.engine
    )  # a fresh engine per run: a reused one would keep the last run's prefix cache
    records = replay_closed(engine, np.tile([run.isl, run.osl], (run.prompts, 1)), run.concurrency)
    done = [r for r in records if r.ok]
    if len(done) != run.prompts:
        raise RuntimeError(f"{run.suite} {run.label}: {len(done)} of {run.prompts} completed")
    ttft = np.array([(r.first_token_ns - r.sent_ns) / 1e6 for r in done])
    e2el = np.array([(r.end_ns - r.sent_ns) / 1e6 for r in done])
    tpot = (e2el - ttft) / (run.osl - 1)
    out = {}
    for name, values in (("ttft", ttft), ("tpot", tpot), ("e2el", e2el)):
        out[f"{name}_p50"] = float(np.median(values))
        out[f"{name}_p99"] = float(np.percentile(values, 99))
    return out


def per_request_errors(runs: list[Run] | None = None) -> list[RunError]:
    """Every published run against the shipped simulator."""
    return [RunError(r, simulate(r)) for r in (runs if runs is not None else load_runs())]


def stated_coverage(errors: list[RunError]) -> dict[str, tuple[int, int]]:
    """Per figure, (held, runs): how many measured figures the range a simulated figure states
    holds, x/÷ (1 + its expected error) as `sim run` prints it for the run's GPU and model
    (accuracy.expected_errors: the category's held-out error, TTFT's at least the TTFT
    checks'). The published points behind those errors score throughput at an interactivity;
    this asks whether the printed confidence holds real runs' latencies too."""
    out = {k: (0, 0) for k in FIGURES}
    stated_by: dict[tuple[str, str], dict] = {}  # one lookup per deployment, not per run
    for e in errors:
        key = (e.run.gpu, e.run.model)
        if key not in stated_by:
            stated_by[key] = expected_errors(*key)[0]
        stated = stated_by[key]
        for k, err in e.errors.items():
            held, n = out[k]
            ok = range_error(err) <= (relative_error(stated, SUMMARY_NAMES[k]) or 0.0)
            out[k] = (held + ok, n + 1)
    return out


def summary(
    errors: list[RunError], cover: dict[str, tuple[int, int]] | None = None
) -> dict[str, float]:
    """The field's per-request error (median over runs of each run's MAPE), the spread of the
    runs' MAPEs, each figure's median signed error (which way the simulator misses), and how
    many figures the stated ranges hold (`cover`: stated_coverage's, computed when not given)."""
    mapes = [e.mape for e in errors]
    out = {
        "runs": len(errors),
        "median_mape": float(np.median(mapes)),
        "min_mape": float(min(mapes)),
        "max_mape": float(max(mapes)),
    }
    for k in FIGURES:
        out[f"median_error_{k}"] = float(np.median([e.errors[k] for e in errors]))
    cover = cover if cover is not None else stated_coverage(errors)
    out["held_by_stated_range"] = sum(h for h, _ in cover.values())
    out["figures"] = sum(n for _, n in cover.values())
    return out


def report(errors: list[RunError]) -> str:
    """One line per run (simulated and measured p50s, every figure's error, the run's MAPE),
    then the summary line."""
    lines = [
        f"{'run':24} {'TTFT p50 ms':>16} {'TPOT p50 ms':>14}  "
        + " ".join(f"{k:>8}" for k in FIGURES)
        + "    MAPE"
    ]
    for e in errors:
        r, s = e.run, e.simulated
        lines.append(
            f"{r.label:24} {s['ttft_p50']:7.0f} / {r.measured['ttft_p50']:6.0f} "
            f"{s['tpot_p50']:6.1f} / {r.measured['tpot_p50']:5.1f}  "
            + " ".join(f"{e.errors[k]:+8.0%}" for k in FIGURES)
            + f"  {e.mape:6.0%}"
        )
    cover = stated_coverage(errors)
    s = summary(errors, cover)
    lines.append(
        f"per-request error (median over {s['runs']} runs of the MAPE of TTFT, TPOT and "
        f"end-to-end p50/p99): {s['median_mape']:.0%} (runs {s['min_mape']:.0%}-"
        f"{s['max_mape']:.0%}); median error by figure: "
        + ", ".join(f"{k} {s[f'median_error_{k}']:+.0%}" for k in FIGURES)
    )
    lines.append(
        f"the ranges a simulated figure states (x/÷ its expected error) hold "
        f"{s['held_by_stated_range']} of {s['figures']} measured figures: "
        + ", ".join(f"{k} {h} of {n}" for k, (h, n) in cover.items())
    )
    return "\n".join(lines)


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
    runs = load_runs()
    suites = sorted({(r.suite, r.source) for r in runs})
    print("; ".join(f"{s} [{src}]" for s, src in suites))
    print(report(per_request_errors(runs)))


if __name__ == "__main__":
    main()
