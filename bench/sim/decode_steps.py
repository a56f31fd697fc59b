"""The simulator's decode step against real vLLM deployments measured at a known batch.

The published fronts (calibration.py) score throughput at an interactivity, the per-request
runs (per_request.py) whole requests; this checks the one quantity under both: the time of a
decode step with B sequences running. ML.ENERGY's leaderboard [S84] measured, on H100 and
B200, the inter-token latency of vLLM while its batch stayed full at each `--max-num-seqs`: for
the eight MoE and dense models this simulator has profiles for on reasoning traffic of thousands
of output tokens (gpqa), and for the dense ones at up to 64 sequences on chat (lm-arena-chat).
A step there rarely carries a prompt's prefill, so the median gap is the decode step. Each row
is simulated as one step of its measured batch at its mean context (the prompt plus the
length-biased mean of the tokens generated so far), on the engine's own step model
(roofline.Deployment.step_time, what `sim run` executes). The rows of at most 512 sequences,
less the runs the file leaves out (fit_rows), are in the efficiency fit since issue 25's fifth
round (calibration.decode_step_points): they are the only points that fix a step at a known
batch, and `benchmarks/simulator.py --validate --loso` gives their error with S84 held out of
the fit. `python -m bench.sim.decode_steps` prints every row and the summary.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from bench.sim.calibration import load_published
from bench.sim.profiles.decode_step_rows import Row, load_rows


@dataclass(frozen=True)
class StepError:
    row: Row
    simulated_ms: float
    fits: bool  # the simulated KV cache holds the batch at this context

    @property
    def error(self) -> float:
        """simulated / measured median gap - 1."""
        return self.simulated_ms / self.row.itl_p50 - 1


def step_errors(rows: list[Row] | None = None) -> list[StepError]:
    """Each row's simulated decode step against its measured median gap."""
    from bench.sim.roofline import Deployment, parse_parallel

    out = []
    deployments: dict[tuple, Deployment] = {}
    for row in rows if rows is not None else load_rows(sources=load_published().sources):
        key = (row.gpu, row.model, row.precision, row.parallel)
        if key not in deployments:
            tp, dp, ep = parse_parallel(row.parallel)
            deployments[key] = Deployment.build(
                row.gpu, row.model, row.precision, tp, None, dp=dp, ep=ep, engine="vllm"
            )
        dep = deployments[key]
        step = dep.step_time(row.batch, row.batch * row.context, 0, 0)
        fits = row.batch * row.context <= dep.kv_capacity_tokens(max_num_seqs=row.max_num_seqs)
        out.append(StepError(row, step * 1e3, fits))
    return out


def held_by_stated_range(errors: list[StepError]) -> int:
    """How many measured median gaps the TPOT range `sim run` prints for the deployment holds
    (x/÷ 1 + the expected error of its GPU and model on vLLM, the engine of every row:
    accuracy.expected_errors)."""
    from bench.sim.profiles.accuracy import expected_errors, range_error, relative_error

    stated: dict[tuple[str, str], float] = {}
    held = 0
    for x in errors:
        key = (x.row.gpu, x.row.model)
        if key not in stated:
            per = expected_errors(*key, engine="vllm")[0]
            stated[key] = relative_error(per, "p50_tpot_ms") or 0.0
        held += range_error(x.error) <= stated[key]
    return held


def summary(errors: list[StepError]) -> dict[str, float]:
    """The median and mean |error|, the share within 25%, the median signed error of the rows
    at small batches (at most 32 sequences) and large ones (more than 256), and how many the
    printed ranges hold."""
    e = np.array([x.error for x in errors])
    small = [x.error for x in errors if x.row.batch <= 32]
    large = [x.error for x in errors if x.row.batch > 256]
    return {
        "rows": len(errors),
        "median_abs": float(np.median(np.abs(e))),
        "mean_abs": float(np.mean(np.abs(e))),
        "within_25": float(np.mean(np.abs(e) <= 0.25)),
        "median_small_batch": float(np.median(small)) if small else float("nan"),
        "median_large_batch": float(np.median(large)) if large else float("nan"),
        "beyond_kv": sum(not x.fits for x in errors),
        "held_by_stated_range": held_by_stated_range(errors),
    }


def by_deployment(errors: list[StepError]) -> dict[str, list[StepError]]:
    out: dict[str, list[StepError]] = {}
    for x in errors:
        out.setdefault(x.row.label, []).append(x)
    return out


def report(errors: list[StepError]) -> str:
    """One line per deployment (its batches' simulated / measured median gap), then the
    summary."""
    lines = []
    for label, xs in by_deployment(errors).items():
        cells = " ".join(
            f"{x.row.batch:.0f}:{x.simulated_ms:.1f}/{x.row.itl_p50:.1f}({x.error:+.0%})"
            + ("" if x.fits else "!")
            for x in xs
        )
        lines.append(f"{label:56} {cells}")
    for task in sorted({x.row.task for x in errors}):
        t = summary([x for x in errors if x.row.task == task])
        lines.append(
            f"{task}: {t['rows']} rows, median |error| {t['median_abs']:.0%}, "
            f"{t['within_25']:.0%} within 25%"
        )
    s = summary(errors)
    lines.append(
        f"decode step at a measured batch (simulated / measured median inter-token ms, "
        f"{s['rows']} rows [S84]; ! = beyond the simulated KV cache): median |error| "
        f"{s['median_abs']:.0%}, mean {s['mean_abs']:.0%}, {s['within_25']:.0%} within 25%; "
        f"median error at <= 32 sequences {s['median_small_batch']:+.0%}, above 256 "
        f"{s['median_large_batch']:+.0%}; {s['beyond_kv']} rows beyond the simulated KV cache; "
        f"the TPOT ranges `sim run` prints hold {s['held_by_stated_range']} of the {s['rows']}"
    )
    return "\n".join(lines)


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
    print(report(step_errors()))


if __name__ == "__main__":
    main()
