"""Published per-request runs of real engines (per_request.yaml): the records and their reader.

Data only, so both the per-request check (bench.sim.per_request) and the calibration's
independent TTFT checks (bench.sim.calibration, which reads NIM's table [S75] from here) use one
transcription of each run.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

# A closed loop's first rounds start together, so their prompts queue for one another: a client
# that reads a stable window (genai-perf) is replayed as TTFT_ROUNDS rounds of the loop, read
# after the first STEADY_ROUNDS, when arrivals have spread out as in a run of minutes (mean TTFT
# at NIM's concurrency 25 on the engine clock: 628 ms over 4 rounds, 534 over 10, 464 over 20)
STEADY_ROUNDS, TTFT_ROUNDS = 3, 20

PER_REQUEST_YAML: Path = Path(__file__).with_name("per_request.yaml")
# Every figure a published run may give (ms): each run has those its source published
FIGURES = tuple(f"{k}_{s}" for k in ("ttft", "tpot", "e2el") for s in ("mean", "p50", "p99"))
# which requests a client read (per_request.simulate)
CLIENTS = ("vllm-bench", "genai-perf", "llmperf")
RUN_FIELDS = ("parallel", "isl", "osl", "concurrency", "prompts", "output_tps")


@dataclass(frozen=True)
class Run:
    """One published run: a deployment at one closed-loop load, and what its client measured."""

    suite: str
    source: str
    client: str
    gpu: str
    model: str
    precision: str
    engine: str
    parallel: str
    isl: int
    osl: int
    concurrency: int
    prompts: int
    measured: dict[str, float]  # the FIGURES its source published, ms
    output_tps: float | None = None  # output tokens/s where its source published it (not scored)
    range_ratio: float = 1.0  # lengths drawn from [ratio x isl, isl] and [ratio x osl, osl]

    @property
    def label(self) -> str:
        out = f"/{self.osl}" if self.range_ratio < 1 else ""
        return f"{self.parallel} isl {self.isl}{out} c{self.concurrency}"

    def lengths(self) -> np.ndarray:
        """(input, output) tokens of each of the run's prompts, in send order: exactly isl and
        osl, or with a range ratio below 1 uniform integers from int(ratio x length) to the
        length, as vLLM's bench copy in InferenceX draws them (sample_uniform, both lengths;
        --ignore-eos holds each output to its draw). A fixed seed per run: the same draws on
        every replay, so the figure is reproducible; which draws it is moves a run's medians by
        far less than the errors scored."""
        if self.range_ratio >= 1:
            return np.tile([self.isl, self.osl], (self.prompts, 1))
        rng = np.random.default_rng([self.isl, self.osl, self.concurrency, self.prompts])
        return np.column_stack([
            rng.integers(int(n * self.range_ratio), n + 1, size=self.prompts)
            for n in (self.isl, self.osl)
        ])  # fmt: skip


def read_runs(path: Path = PER_REQUEST_YAML, sources: Collection[str] | None = None) -> list[Run]:
    """Every run of every suite in the file; a suite citing a source not in `sources` (the
    published list's, where given), or naming a client or figure this module does not know,
    is refused with the file and suite named."""
    data = yaml.safe_load(Path(path).read_text())
    runs = []
    for s in data["suites"]:
        if sources is not None and s["source"] not in sources:
            raise ValueError(f"{path}: suite {s['id']} cites {s['source']}, not in the sources")
        client = s.get("client", CLIENTS[0])
        if client not in CLIENTS:
            raise ValueError(f"{path}: suite {s['id']}: client {client!r}, not one of {CLIENTS}")
        for r in s["runs"]:
            measured = {k: float(v) for k, v in r.items() if k in FIGURES}
            unknown = set(r) - set(FIGURES) - set(RUN_FIELDS)
            if unknown or not measured:
                raise ValueError(
                    f"{path}: suite {s['id']}: a run with {sorted(unknown) or 'no figure'}; "
                    f"figures are {', '.join(FIGURES)}"
                )
            conc, osl = r["concurrency"], r.get("osl", s.get("output_tokens"))
            if not osl:
                raise ValueError(
                    f"{path}: suite {s['id']}: a run without output tokens (the run's `osl` or "
                    "the suite's `output_tokens`)"
                )
            runs.append(
                Run(
                    suite=s["id"],
                    source=s["source"],
                    client=client,
                    gpu=s["gpu"],
                    model=s["model"],
                    precision=s["precision"],
                    engine=s["engine"],
                    parallel=r["parallel"],
                    isl=r["isl"],
                    osl=osl,
                    concurrency=conc,
                    prompts=r.get("prompts", TTFT_ROUNDS * conc),
                    measured=measured,
                    output_tps=r.get("output_tps"),
                    range_ratio=float(s.get("range_ratio", 1.0)),
                )
            )
    return runs


def steady_window(records: list, concurrency: int) -> list:
    """The completed records a stable-window client (genai-perf) reads from a closed loop, in
    send order: those sent after its first STEADY_ROUNDS rounds (all of them when there are no
    more)."""
    done = sorted((r for r in records if r.ok), key=lambda r: r.sent_ns)
    return done[STEADY_ROUNDS * concurrency :] or done


def nim_runs() -> list[Run]:
    """NIM's table [S75] as per_request.yaml holds it: one deployment (its GPU, model,
    precision, parallelism and engine on every run) at each load."""
    return [r for r in read_runs() if r.source == "S75"]


def nim_s75() -> list[tuple[int, int, int, float, float, float]]:
    """NVIDIA NIM 1.8.0 (TensorRT-LLM) on 2x H100 TP2, Llama-3.3-70B FP8, genai-perf [S75], as
    (input, output, concurrency, mean TTFT ms, mean ITL ms, output tok/s): the rows below the
    table's saturation. Moderate batch, which no fitted point covers; never fitted on. A row is
    saturated when it is not its workload's lowest concurrency and its throughput is within
    NEAR_SATURATION of the workload's highest (100-250 users at 917-921 tok/s): there TTFT is the
    queue a few per cent of capacity sets, which the simulated ranges flag rather than hold."""
    from bench.sim.profiles.accuracy import NEAR_SATURATION

    runs = nim_runs()
    out = []
    for r in runs:
        same = [o for o in runs if (o.isl, o.osl) == (r.isl, r.osl)]
        top = max(o.output_tps or 0.0 for o in same)
        lowest = r.concurrency == min(o.concurrency for o in same)
        if r.output_tps and (lowest or r.output_tps < NEAR_SATURATION * top):
            m = r.measured
            out.append((r.isl, r.osl, r.concurrency, m["ttft_mean"], m["tpot_mean"], r.output_tps))
    return out
