"""The simulator's per-request error against published runs of real engines on GPUs.

The published points (calibration.py) score throughput at an interactivity: a fit can meet
them while the latency a user sees per request is far off. Simulator studies score per-request
latency instead: the mean absolute percentage error over a run's TTFT, inter-token and
end-to-end percentiles at matched load, then the median over runs (issue 25, item 5). This
module does that against `profiles/per_request.yaml`: each published run replayed on the engine
clock (what `sim run` executes) with the run's own input and output lengths, closed-loop
concurrency and request count, each figure its source published (means, medians, p99s) read
over the requests its client read. Suites differ in what they can show (InferenceX's vLLM
MiniMax-M2.5 runs give p50 and p99 of every request; NIM's table gives means over a stable
window; InferenceX's DeepSeek-R1 runs on SGLang and TensorRT-LLM [S85], p50 and p99 with
prompt and output lengths drawn from a range), so each suite's figure is printed on its own,
then each source's suites pooled, then all. Scored, never fitted: `python -m
bench.sim.per_request` prints every run, figure and median (`--suite PREFIX` some suites). One
value is read from runs here, not fitted with the rest: the first-token latency of SGLang and
TensorRT-LLM serving DeepSeek-R1 (efficiency.yaml t_req_s), from their H200 runs alone
(FIRST_TOKEN_SUITES, `--first-token`), scored on every other suite.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.sim.profiles import published_sources
from bench.sim.profiles.accuracy import expected_errors, range_error, relative_error
from bench.sim.profiles.per_request_runs import (
    FIGURES,
    PER_REQUEST_YAML,
    Run,
    read_runs,
    steady_window,
)


@dataclass(frozen=True)
class RunError:
    run: Run
    simulated: dict[str, float]  # FIGURES, ms

    @property
    def errors(self) -> dict[str, float]:
        """simulated / measured - 1, per figure the run published."""
        return {k: self.simulated[k] / v - 1 for k, v in self.run.measured.items()}

    @property
    def mape(self) -> float:
        """The field's per-request error of this run: mean absolute error over its figures."""
        return float(np.mean([abs(e) for e in self.errors.values()]))


def load_runs(path: Path = PER_REQUEST_YAML) -> list[Run]:
    """Every run of every suite in the file, each suite's source checked against the published
    list (a suite citing another is refused with the file and suite named)."""
    return read_runs(path, published_sources())


def simulate(run: Run) -> dict[str, float]:
    """Every figure (ms) of the run from the simulated engine: `prompts` requests of the run's
    lengths (Run.lengths: exactly `isl` in and `osl` out, or drawn from its range), sent by
    `concurrency` users at once with no think time, as the client's measured phase sends them
    (a simulated engine needs no warm-up); TPOT per request is (end-to-end - TTFT) / (its
    output tokens - 1) (genai-perf's inter-token latency too); each
    figure the mean or the percentile (numpy's, linear) over the requests the client reads:
    vllm-bench and LLMPerf every request of the run, genai-perf those after the loop's first
    STEADY_ROUNDS rounds (per_request_runs.steady_window, as the calibration's TTFT checks read
    NIM's)."""
    from bench.sim.virtual import build_engine, replay_closed

    engine = build_engine(
        run.gpu, run.model, run.precision, parallel=run.parallel, engine=run.engine
    )  # a fresh engine per run: a reused one would keep the last run's prefix cache
    records = replay_closed(engine, run.lengths(), run.concurrency)
    completed = sum(r.ok for r in records)
    if completed != run.prompts:
        raise RuntimeError(f"{run.suite} {run.label}: {completed} of {run.prompts} completed")
    done = (
        steady_window(records, run.concurrency)
        if run.client == "genai-perf"
        else [r for r in records if r.ok]
    )
    ttft = np.array([(r.first_token_ns - r.sent_ns) / 1e6 for r in done])
    e2el = np.array([(r.end_ns - r.sent_ns) / 1e6 for r in done])
    tpot = (e2el - ttft) / (np.array([r.output_tokens for r in done]) - 1)
    out = {}
    for name, values in (("ttft", ttft), ("tpot", tpot), ("e2el", e2el)):
        out[f"{name}_mean"] = float(np.mean(values))
        out[f"{name}_p50"] = float(np.median(values))
        out[f"{name}_p99"] = float(np.percentile(values, 99))
    return out


def per_request_errors(runs: list[Run] | None = None) -> list[RunError]:
    """Every published run against the shipped simulator."""
    return [RunError(r, simulate(r)) for r in (runs if runs is not None else load_runs())]


def held_out_rows(errors: list[RunError]) -> list[dict]:
    """held_out.yaml's `per_request` rows (what accuracy.per_request_errors reads): each run's
    published latency as the quantity a simulated figure states (a mean or median as the
    p50's, a p99 as the p99's), with its suite, engine and category. Each is scored, never
    fitted: the run replayed on the shipped fit."""
    from bench.sim.profiles import engine_family
    from bench.sim.profiles.accuracy import category

    rows = []
    for e in errors:
        run = e.run
        for figure, err in e.errors.items():
            rows.append({
                "suite": run.suite, "run": run.label, "engine": engine_family(run.engine),
                "category": category(run.gpu, run.model), "quantity": quantity(figure),
                "figure": figure, "error": float(err),  # unrounded: a range states one of them
            })  # fmt: skip
    return rows


# The runs the first-token latency of an engine serving DeepSeek-R1 is read from: H200's (S85's
# SGLang and TensorRT-LLM suites, S86's TensorRT-LLM one); every other suite scores it.
FIRST_TOKEN_SUITES = ("deepseek-r1-h200-",)
FIRST_TOKEN_STEP_S = 0.005  # the choice's resolution
FIRST_TOKEN_MAX_S = 0.4


def first_token_latency(errors: list[RunError], shipped_s: float) -> float:
    """The time (s) before the scheduler sees a request (efficiency.yaml t_req_s) that gives
    these runs the lowest per-request error (median over the runs of their MAPE), read from
    runs simulated with `shipped_s`: another value moves every TTFT and end-to-end figure by
    the difference and nothing else, which holds to within the closed loop's feedback (a
    user's next request reaches the engine that much later: a few per cent of a step's
    sequences at these loads). A grid of FIRST_TOKEN_STEP_S from 0, so the choice is the
    same on every machine."""
    if not errors:
        raise ValueError("no runs to read a first-token latency from")
    best, best_err = 0.0, float("inf")
    for step in range(int(round(FIRST_TOKEN_MAX_S / FIRST_TOKEN_STEP_S)) + 1):
        t = step * FIRST_TOKEN_STEP_S
        err = float(np.median([_shifted_mape(e, (t - shipped_s) * 1e3) for e in errors]))
        if err < best_err - 1e-12:
            best, best_err = t, err
    return best


def _shifted_mape(e: RunError, shift_ms: float) -> float:
    """The run's MAPE with every TTFT and end-to-end figure moved by `shift_ms`."""
    moved = {
        k: v + (shift_ms if k.startswith(("ttft", "e2el")) else 0.0) for k, v in e.simulated.items()
    }
    return RunError(e.run, moved).mape


@dataclass(frozen=True)
class FirstTokenChoice:
    """One engine's first-token latency: what efficiency.yaml ships and what its runs choose."""

    engine: str
    model: str
    suites: tuple[str, ...]
    runs: int
    shipped_s: float
    chosen_s: float


def first_token_choices(runs: list[Run]) -> list[FirstTokenChoice]:
    """Per engine, the first-token latency the FIRST_TOKEN_SUITES runs among `runs` choose
    (first_token_latency, read from them simulated with the shipped value) beside the one
    efficiency.yaml ships: `--first-token` prints them, a test holds them within 10 ms."""
    from bench.sim.profiles import efficiency_for, engine_family, get_gpu

    chosen = [r for r in runs if r.suite.startswith(FIRST_TOKEN_SUITES)]
    out = []
    by_engine = _grouped(per_request_errors(chosen), lambda e: engine_family(e.run.engine))
    for engine, errs in by_engine.items():
        r = errs[0].run
        shipped = efficiency_for(get_gpu(r.gpu), r.precision, r.engine, r.model).t_req_s
        suites = tuple(dict.fromkeys(e.run.suite for e in errs))
        out.append(FirstTokenChoice(
            engine, r.model, suites, len(errs), shipped, first_token_latency(errs, shipped)
        ))  # fmt: skip
    return out


def first_token_report(runs: list[Run]) -> str:
    """`--first-token`: one line per engine, first_token_choices'."""
    return "\n".join(
        f"{c.engine} serving {c.model}: {c.chosen_s * 1e3:.0f} ms chosen on {c.runs} runs "
        f"({', '.join(c.suites)}); efficiency.yaml ships {c.shipped_s * 1e3:.0f} ms"
        for c in first_token_choices(runs)
    )


def quantity(figure: str) -> str:
    """The stated quantity a published figure is read against (accuracy.FIGURES): a mean or
    median as the p50's, a p99 as the p99's (ttft_mean -> ttft_p50)."""
    kind, stat = figure.split("_")
    return f"{kind}_{'p99' if stat == 'p99' else 'p50'}"


def summary_name(figure: str) -> str:
    """The Summary name a figure's stated error is read under (accuracy.relative_error)."""
    kind, stat = quantity(figure).split("_")
    return f"{stat}_{kind}_ms"


def stated_coverage(errors: list[RunError]) -> dict[str, tuple[int, int]]:
    """Per figure, (held, runs): how many measured figures the range a simulated figure states
    holds, x/÷ (1 + its expected error) as `sim run` prints it for the run's GPU, model and
    engine (accuracy.expected_errors: the category's held-out error, TTFT's at least the TTFT
    checks', each latency at least what 90% of these runs' same figure were within). The
    latencies' ranges are read from these runs, so this is their coverage by construction,
    not a test of it; before they were, it showed the printed ranges did not hold."""
    out: dict[str, tuple[int, int]] = {}
    stated_by: dict[tuple[str, str, str], dict] = {}  # one lookup per deployment, not per run
    for e in errors:
        key = gpu, model, engine = (e.run.gpu, e.run.model, e.run.engine)
        if key not in stated_by:
            stated_by[key] = expected_errors(gpu, model, engine=engine)[0]
        stated = stated_by[key]
        for k, err in e.errors.items():
            held, n = out.get(k, (0, 0))
            ok = range_error(err) <= (relative_error(stated, summary_name(k)) or 0.0)
            out[k] = (held + ok, n + 1)
    return {k: out[k] for k in FIGURES if k in out}


def summary(
    errors: list[RunError], cover: dict[str, tuple[int, int]] | None = None
) -> dict[str, float]:
    """The field's per-request error (median over runs of each run's MAPE), the spread of the
    runs' MAPEs, each figure's median signed error over the runs that publish it (which way
    the simulator misses), and how many figures the stated ranges hold (`cover`:
    stated_coverage's, computed when not given)."""
    mapes = [e.mape for e in errors]
    out = {
        "runs": len(errors),
        "median_mape": float(np.median(mapes)),
        "min_mape": float(min(mapes)),
        "max_mape": float(max(mapes)),
    }
    for k in FIGURES:
        signed = [e.errors[k] for e in errors if k in e.errors]
        if signed:
            out[f"median_error_{k}"] = float(np.median(signed))
    cover = cover if cover is not None else stated_coverage(errors)
    out["held_by_stated_range"] = sum(h for h, _ in cover.values())
    out["figures"] = sum(n for _, n in cover.values())
    return out


def by_suite(errors: list[RunError]) -> dict[str, list[RunError]]:
    """The runs' errors grouped by suite, in the file's order."""
    return _grouped(errors, lambda e: e.run.suite)


def _grouped(errors: list[RunError], key: Callable[[RunError], str]) -> dict[str, list[RunError]]:
    out: dict[str, list[RunError]] = {}
    for e in errors:
        out.setdefault(key(e), []).append(e)
    return out


def report(errors: list[RunError]) -> str:
    """Per suite: one line per run (simulated and measured TTFT and TPOT, every published
    figure's error, the run's MAPE), then the suite's summary; then all runs together."""
    lines = []
    suites = by_suite(errors)
    for suite, errs in suites.items():
        figs = [k for k in FIGURES if k in errs[0].run.measured]
        # the first published TTFT and TPOT figure; the median where the source gave none
        ttft, tpot = (
            next((k for k in figs if k.startswith(q)), f"{q}_p50") for q in ("ttft", "tpot")
        )
        r0 = errs[0].run
        lines.append(
            f"{suite} [{r0.source}]: {r0.model} {r0.precision} on {r0.gpu}, {r0.engine}, "
            f"client {r0.client}"
        )
        lines.append(
            f"{'run':24} {ttft + ' ms':>16} {tpot + ' ms':>14}  "
            + " ".join(f"{k:>9}" for k in figs)
            + "    MAPE"
        )
        for e in errs:
            r, s = e.run, e.simulated
            lines.append(
                f"{r.label:24} {s[ttft]:7.0f} / {_published(r, ttft, '6.0f')} "
                f"{s[tpot]:6.1f} / {_published(r, tpot, '5.1f')}  "
                + " ".join(f"{e.errors[k]:+9.0%}" for k in figs)
                + f"  {e.mape:6.0%}"
            )
        lines += _summary_lines(errs, f"{suite}: ")
    for source, errs in _grouped(errors, lambda e: e.run.source).items():
        if len({e.run.suite for e in errs}) > 1:  # one source's suites pooled (S85's twelve)
            lines += _summary_lines(errs, f"{source}'s suites: ")
    if len(suites) > 1:
        lines += _summary_lines(errors, "all suites: ")
    return "\n".join(lines)


def _published(run: Run, figure: str, fmt: str) -> str:
    """The run's published figure in `fmt`, or a dash as wide where its source gave none."""
    if figure in run.measured:
        return format(run.measured[figure], fmt)
    return "-".rjust(int(fmt.split(".")[0]))


def _summary_lines(errors: list[RunError], prefix: str) -> list[str]:
    cover = stated_coverage(errors)
    s = summary(errors, cover)
    medians = [k for k in FIGURES if f"median_error_{k}" in s]
    return [
        f"{prefix}per-request error (median over {s['runs']} runs of the MAPE of their published "
        f"TTFT, TPOT and end-to-end figures): {s['median_mape']:.0%} (runs {s['min_mape']:.0%}-"
        f"{s['max_mape']:.0%}); median error by figure: "
        + ", ".join(f"{k} {s[f'median_error_{k}']:+.0%}" for k in medians),
        f"{prefix}the ranges a simulated figure states (x/÷ its expected error) hold "
        f"{s['held_by_stated_range']} of {s['figures']} measured figures: "
        + ", ".join(f"{k} {h} of {n}" for k, (h, n) in cover.items()),
    ]


def select(runs: list[Run], suites: list[str] | None) -> list[Run]:
    """The runs of the suites whose id starts with one of `suites` (all runs when none given);
    a prefix no suite has is refused with the suites named."""
    if not suites:
        return runs
    ids = list(dict.fromkeys(r.suite for r in runs))
    for prefix in suites:
        if not any(i.startswith(prefix) for i in ids):
            raise SystemExit(f"no suite starts with {prefix!r}; suites: {', '.join(ids)}")
    return [r for r in runs if r.suite.startswith(tuple(suites))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--suite", action="append", metavar="PREFIX",
        help="only the suites whose id starts with PREFIX (repeatable; default: every suite)",
    )  # fmt: skip
    ap.add_argument(
        "--first-token", action="store_true",
        help="print the first-token latency (t_req_s) the H200 DeepSeek-R1 runs choose per engine",
    )  # fmt: skip
    args = ap.parse_args()
    if args.first_token:
        print(first_token_report(load_runs()))
        return
    print(report(per_request_errors(select(load_runs(), args.suite))))


if __name__ == "__main__":
    main()
